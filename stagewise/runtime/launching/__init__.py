"""Starting and ending ranks: ``launch`` spawns and watches local ranks (they never outlive the launcher and
the first failure ends them all, naming the rank), ``local`` is ``stagewise.launch`` (a user's function on
local ranks), ``groups`` the process group's life, ``memory`` the CPU ranks' allocator settings.

May import: the core, `stagewise.runtime.resilience`, `stagewise.runtime.config`, `stagewise.runtime.result`, `torch`.
"""
