"""The planner: from a measured profile (local) or a model and hardware description costed analytically
(cluster scale), search schedule family x p x dp x v x micro-batch size x recomputation x split (and t, ep,
sharding), simulate each candidate with the one simulator, rank them with error bands, and write the winner
and each framework's command, in three folders: ``search`` (a measured profile, and the machinery every
search shares), ``cluster`` (model and hardware files costed analytically) and ``auto`` (orders under a
memory cap, the proven optimum); ``highs`` wraps the HiGHS solver, ``errors`` holds ``PlanError``. No torch
and no runtime (tests/test_architecture.py runs it with torch blocked).

May import: the core, `stagewise.schedules`, `stagewise.lowering`, `highspy`.
"""
