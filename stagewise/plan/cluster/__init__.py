"""Planning a cluster from model and hardware files: no profile, no torch.

A ``TransformerSpec`` (shipped names or a file: head sizes, MLA, MTP, dense and MoE blocks per index) and a
``Hardware`` type (rates, memory, links, FP8, the reserve, the calibrated efficiency, overhead and bands) make a
``Job``; ``cluster_search`` costs it analytically (``analytic_profile``) over every layout (``layouts``: t x p x
dp, the expert layout and device order, sharding, recomputation) with the shared search machinery of
``plan.search``, under each framework's overlap rules (``overlap_rules``), and ranks ``ClusterCandidate``s. The rest
says the result: each framework's command (``commands``), what moves the winner (``sensitivity``), why it wins
(``cluster_why``), the plan written down (``cluster_plan``, ``markdown``).

May import: the core, `stagewise.schedules`, `stagewise.lowering`, `stagewise.plan.errors`, `stagewise.plan.search`.

Example:
    >>> from stagewise.plan.cluster import Hardware, Job, TransformerSpec, cluster_search
    >>> job = Job(spec=TransformerSpec.load("llama3-8b"), hardware=Hardware.load("h100"), gpus=8,
    ...           global_batch_tokens=2**20, tensor=(8,), pipeline=(1,))
    >>> cluster_search(job, keep=1).ranking[0].parallelism.tp
    8
"""

from .activations import RECOMPUTE_MODULES, kept_bytes
from .analytic import (DEFAULT_MODULES, RECOMPUTE, Compute, ExpertParallel, TensorParallel, analytic_profile,
                       block_activation_bytes, boundary_bytes, expert_a2a_time, score_bytes, tp_allreduce_time)
from .candidate import ClusterCandidate, MemoryParts
from .data_parallel import (CHECKPOINT_BYTES_PER_PARAM, exposed_gather, exposed_reduction, gathered_factor, reduce_scatter_time, reduction_cost,
                            state_factor)
from .datafile import SpecError, shipped
from .verdict import cluster_why
from .frameworks import VERSIONS, block_counts, commands
from .placement import PLACEMENTS, StageGrid, expert_layouts, group_nodes
from .hardware import PRECISIONS, Fp8, Hardware, Reserve, parse_reserve
from .job import Job, check_job, shardings, tensor_degrees
from .long_sequence import OFFLOAD, option_commands
from .layouts import recompute_modes, searchers, unsearched_recompute
from .overlap_rules import (DEEPSPEED, FRAMEWORKS, MEGATRON, STAGEWISE, TORCHTITAN, Framework, framework,
                      refusal)
from .search import Result, cluster_search
from .searcher import ClusterSearcher, pipeline_bound
from .sensitivity import sensitivity
from .steady import extend, short_m
from .transformer import MLA, MoE, TransformerSpec
from .written import cluster_plan, markdown

__all__ = ["CHECKPOINT_BYTES_PER_PARAM", "ClusterCandidate", "ClusterSearcher", "Compute", "DEEPSPEED", "DEFAULT_MODULES", "ExpertParallel",
           "FRAMEWORKS", "Fp8", "Framework", "Hardware", "Job", "MEGATRON", "MLA", "MemoryParts", "MoE", "OFFLOAD", "PLACEMENTS",
           "PRECISIONS", "RECOMPUTE", "RECOMPUTE_MODULES", "Reserve", "Result", "STAGEWISE", "SpecError",
           "StageGrid", "TORCHTITAN", "TensorParallel", "TransformerSpec", "VERSIONS", "analytic_profile",
           "block_activation_bytes", "block_counts", "boundary_bytes", "check_job", "cluster_plan", "cluster_search",
           "cluster_why", "commands", "expert_a2a_time", "expert_layouts", "exposed_gather", "exposed_reduction",
           "extend", "framework", "gathered_factor", "group_nodes", "kept_bytes", "markdown", "option_commands", "parse_reserve",
           "pipeline_bound", "recompute_modes", "reduce_scatter_time", "reduction_cost", "refusal", "score_bytes",
           "searchers", "sensitivity", "shardings", "shipped", "short_m", "state_factor", "tensor_degrees",
           "tp_allreduce_time", "unsearched_recompute"]
