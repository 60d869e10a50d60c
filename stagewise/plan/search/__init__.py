"""Planning from a measured profile, and the machinery every plan search shares.

A ``Profile`` (measured by ``stagewise profile``, or made analytically by ``plan.cluster``) and a ``Cluster`` of
devices go into a ``Searcher``: every p x dp, family, v, micro-batch size and recomputation, each schedule's
``Holding`` split by the exact partitioner (``partition``; ``block_split`` for identical blocks) and simulated
with ``stage_costs``. ``bands`` says which candidates tie and which one the planner recommends, ``verdict``
what it prints, ``written`` the plan written down, ``lowered`` the data-parallel traffic as a lowered program.

May import: the core, `stagewise.schedules`, `stagewise.lowering`, `stagewise.plan.errors`, `stagewise.plan.highs`.

Example:
    >>> from stagewise.plan.search import Searcher, Space, search
"""

from .bands import (LOCAL_MEMORY_BAND, RESOLUTION, RULE, Recommendation, interval, memory_cell, profile_band,
                    recommend, tie, tied_with_first)
from .block_split import block_split, busiest_floor, is_block_model
from .devices import Cluster, fmt_bytes, parse_bytes
from .verdict import fmt_seconds, table, train_command, why
from .holding import Holding, holding
from .layer_costs import LayerCosts, runs_of
from .lowered import exposure, local_data_parallel, network
from .profile_costs import (blocking_p2p, layer_costs, piece_layer_bytes, rank_fixed_bytes, rank_optimizer_time,
                    rank_transient_bytes, stage_costs, stage_param_bytes, step_sync_time)
from .overhead import KEY, fit_overhead, fit_slowdown, step_overhead
from .partition import Partition, PartitionError, best_split, evaluate, partition
from .profile import MAX_SPREAD, LayerProfile, Link, Profile, ProfileError
from .search import Candidate, Config, Searcher, Space, peak_activation_bytes, rank, search, timing
from .written import FORMAT, VERSION, local_markdown, local_plan

__all__ = ["Candidate", "Cluster", "Config", "FORMAT", "Holding", "KEY", "LOCAL_MEMORY_BAND", "LayerCosts",
           "LayerProfile", "Link", "MAX_SPREAD", "Partition", "PartitionError", "Profile", "ProfileError", "RESOLUTION", "RULE",
           "Recommendation", "Searcher", "Space", "VERSION", "best_split", "block_split", "blocking_p2p",
           "busiest_floor", "evaluate", "fit_overhead", "fit_slowdown", "fmt_bytes", "fmt_seconds", "holding",
           "interval", "is_block_model",
           "exposure", "layer_costs", "local_data_parallel", "local_markdown", "local_plan", "memory_cell", "network", "parse_bytes", "partition", "piece_layer_bytes",
           "peak_activation_bytes", "profile_band", "rank", "rank_fixed_bytes", "rank_optimizer_time",
           "rank_transient_bytes", "recommend", "runs_of", "search", "stage_costs", "stage_param_bytes", "step_overhead",
           "step_sync_time", "table", "tie", "tied_with_first", "timing", "train_command", "why"]
