"""The parallelisms besides pipeline, each hung on the lowered plan's points: ``mesh`` (the grid of named
dimensions, torch's DeviceMesh of it), ``dp`` (replicas' gradient sums), ``fsdp`` (FSDP2 per stage),
``tp`` (DTensor tensor parallel from a plan), ``ep`` (experts over an ep group), ``replicas`` (tied and
duplicated copies, the global norm) and ``memory`` (the state bytes each rank holds, and its share).

May import: the core, `stagewise.runtime.execution`, `stagewise.runtime.run`, `stagewise.runtime.stages`,
`torch`.
"""
