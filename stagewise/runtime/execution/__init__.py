"""Running one rank's program: ``program`` lowers the schedule once per rank (the core lowering's program, with
its message channels), ``executor`` walks it action by action, one handler per kind, knowing no family,
``split_backward`` (I and W), ``recompute``, ``activation_memory`` (the bytes held, measured), ``timing``
(measured timelines) and ``fb_pair`` (an F&B pair's halves interleaved at their all-to-alls).

May import: the core, `stagewise.lowering`, `stagewise.runtime.messages`, `stagewise.runtime.dtensor`,
`stagewise.runtime.resilience`, `stagewise.runtime.config`, `stagewise.runtime.stages`, `torch`.
"""
