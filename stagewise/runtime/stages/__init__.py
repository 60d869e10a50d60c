"""How a model becomes this rank's stages: ``layers`` (``Layers``, the one model interface, and the three
forms a model comes in), ``stage`` (cutting layers into stages, ``StageMap``), ``names`` (original names,
ties by name, state dicts and the optimizer's flattened form), ``pytree`` (what crosses a boundary),
``moe`` (the MoE block, ``stagewise.MoE``), ``rng`` (dropout seeded by layer and micro-batch, whatever the
schedule) and ``kv`` (sequence slices: the keys and values a slice attends to, ``stagewise.kv``). A rank builds only its own layers.

May import: the core, `stagewise.runtime.dtensor`, `stagewise.runtime.config`, `torch`.
"""
