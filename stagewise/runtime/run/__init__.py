"""Config-driven runs, the one run path of the CLI, ``plan --verify``, ``profile`` and the benchmarks,
the runtime's top: ``train`` (where the ranks come from), ``worker`` (``RankTrainer``: one rank's loop around a
``Pipeline``), ``models`` (the built-in GPT, ``LayerModel``), ``reference`` (the unpipelined oracle)
and ``restart`` (a run that outlives its ranks: restarts, and the
layout re-planned for the ranks left by ``stagewise.plan.elastic``).

May import: the core, `stagewise.schedules`, `stagewise.plan.elastic`, `stagewise.runtime.pipeline`,
the runtime's floor (`stagewise.runtime.config`, `stagewise.runtime.arguments`, `stagewise.runtime.resolve`,
`stagewise.runtime.result`), `stagewise.runtime.dtensor`, `stagewise.runtime.execution`,
`stagewise.runtime.launching`, `stagewise.runtime.parallel`, `stagewise.runtime.resilience`,
`stagewise.runtime.stages`, `stagewise.data` (packed documents), `torch`.
"""
