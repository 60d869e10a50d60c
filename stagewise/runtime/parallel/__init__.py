"""The parallelisms besides pipeline, each hung on the lowered plan's points: ``mesh`` (the grid of named
dimensions, torch's DeviceMesh of it), ``dp`` (replicas' gradient sums), ``fsdp`` (FSDP2 per stage),
``tp`` (DTensor tensor parallel from a plan), ``ep`` (experts over an ep group), ``replicas`` (tied and
duplicated copies, the global norm) and ``memory`` (the state bytes each rank holds, and its share). dp, fsdp,
ep and replicas write each collective they issue to the rank's flight recorder, under the lowering's name.

May import: the core, `stagewise.runtime.dtensor`, `stagewise.runtime.execution`, `stagewise.runtime.resilience` (the flight recorder),
`stagewise.runtime.config`, `stagewise.runtime.stages`, `torch`.
"""
