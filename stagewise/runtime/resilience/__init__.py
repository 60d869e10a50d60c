"""What keeps a run safe: ``flight`` (each rank's last events, readable after a crash), ``nonfinite`` (a NaN or
infinite loss stops or skips the step), ``checkpoint`` / ``checkpoint_files`` / ``checkpoint_manifest`` /
``checkpoint_layers`` (DCP checkpoints, their files and hashes, the manifest's schema and the run it names,
earlier layer-keyed checkpoints), ``preempt`` (a stop notice saves the step in flight: ``--save-on-signal``)
and ``faults`` (failures on purpose, for tests).

May import: the core, `stagewise.runtime.config`, `stagewise.runtime.stages`, `torch`, `numpy`.
"""
