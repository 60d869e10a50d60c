"""A cluster plan's steps are its lowered programs played (plan/cluster/lowered.py): the data-parallel traffic as
actions on the layout's own links, exact for the top and for each framework's best."""

from dataclasses import replace

import pytest

from stagewise.lowering import Lowered, LoweringOptions
from stagewise.lowering.options import PIPELINE_OUTERMOST
from stagewise.parallelism import DIMS, Parallelism
from stagewise.plan.cluster import Hardware, Job, StageGrid, TransformerSpec, cluster_search
from stagewise.plan.cluster.lowered import network
from stagewise.plan.search import Link, Space
from stagewise.schedules import generate

H100 = Hardware.load("h100")
NO_DUALPIPE = Space(families=("1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), chunks=(2,))


def job(model="llama3-70b", gpus=64, tokens=2**21, **kw):
    return Job(spec=TransformerSpec.load(model), hardware=H100, gpus=gpus, global_batch_tokens=tokens, **kw)


def test_every_ranked_step_is_its_lowered_program_and_compute_alone_bounds_it():
    res = cluster_search(job(space=NO_DUALPIPE, tensor=(4, 8)), keep=5)
    assert res.ranking and res.lowered >= 5
    for row in res.ranking:
        c = row.candidate
        assert row.lowered and row.to_dict()["lowered"] is True
        assert row.step_time >= c.makespan + c.optimizer + c.overhead - 1e-12
        assert row.exposed_dp >= 0 and row.exposed_gather >= 0
        assert row.step_time == pytest.approx(c.makespan + row.exposed_dp + row.exposed_gather + c.optimizer
                                              + c.overhead + (c.allreduce - row.exposed_dp - row.exposed_gather))


def test_without_gathers_or_copies_the_lowered_steps_are_the_rules_steps():
    """ddp on whole-node t-groups (every data-parallel link crosses nodes, no weights to gather, no DualPipe
    copies to sum; a long step's exposure is its stand-in's, whose cool-down is the step's): the lowered program's REDUCE_GRADs, in buckets, after the
    last backward or after the drain, under each framework, cost what the planner's O(stages) rules say, so
    the wiring (bytes per stage and layer, groups, links, blocking P2P) is the rules'."""
    j = job(space=NO_DUALPIPE, tensor=(8,), pipeline=(2, 4), sharding=("ddp",))
    low = cluster_search(j, keep=10**6)
    rules = {row.label(): row for row in cluster_search(j, keep=10**6, lowered=False).ranking}
    assert {row.framework for row in low.ranking} >= {"megatron", "torchtitan", "deepspeed", "stagewise"}
    for row in low.ranking:
        assert row.exposed_gather == 0
        assert row.step_time == pytest.approx(rules[row.label()].step_time, rel=1e-9)
    assert any(row.exposed_dp > 0 for row in low.ranking)


def test_pruning_keeps_the_exact_top_and_each_frameworks_best():
    j = job(model="llama3-8b", space=Space(families=("1f1b", "interleaved-1f1b", "zb-h1", "dualpipe-v"),
                                           chunks=(2,)))
    lazy, full = cluster_search(j, keep=3), cluster_search(j, keep=10**6)
    assert lazy.lowered < full.lowered
    assert [r.step_time for r in lazy.ranking[:3]] == [r.step_time for r in full.ranking[:3]]
    assert {k: v.step_time for k, v in lazy.best.items()} == {k: v.step_time for k, v in full.best.items()}


def test_free_links_leave_only_the_compute():
    free = replace(H100, intra=Link(latency=0.0, bandwidth=1e30), inter=Link(latency=0.0, bandwidth=1e30))
    res = cluster_search(replace(job(space=NO_DUALPIPE, tensor=(4,)), hardware=free), keep=4)
    for row in res.ranking:
        assert row.exposed_dp == row.exposed_gather == 0
        c = row.candidate
        assert row.step_time == pytest.approx(c.makespan + c.optimizer + c.overhead + c.allreduce)


@pytest.mark.parametrize("placement", ["within", "across"])
@pytest.mark.parametrize("t,p,dp", [(1, 2, 4), (1, 3, 3), (2, 2, 4), (4, 2, 2), (8, 2, 2), (2, 4, 2)])
def test_the_lowerings_data_parallel_groups_sit_where_the_grid_puts_them(placement, t, p, dp):
    """The lowering numbers ranks in the grid's device order (Megatron-Core's, the pipeline outermost, for
    "within"): a replica group is inside one node for every rank exactly when the grid's link is the node's."""
    intra, inter = Link(latency=1e-6, bandwidth=1e12), Link(latency=1e-5, bandwidth=1e10)
    par = Parallelism(pp=p, dp=dp, tp=t)
    grid = StageGrid(devices=p * dp, per_node=8 // t, memory=None, intra=intra, inter=inter, parallelism=par,
                     node=8, placement=placement)
    net = network(grid)
    assert net.order == (PIPELINE_OUTERMOST if placement == "within" else DIMS) and net.gpus_per_node == 8
    low = Lowered(schedule=generate("1f1b", p, p), parallelism=par, programs=(), options=LoweringOptions(network=net))
    inside = all(low.inside(low.global_ranks(r, "dp")) for r in range(p))
    assert inside == (grid.data_parallel_link(p, dp) is intra)
    if 8 % (t * dp) == 0 and placement == "within":  # a pool that tiles a node
        assert inside
    assert sorted(g for r in range(p) for d in low.global_ranks(r, "dp") for g in range(d, d + t)) == \
        list(range(p * dp * t))  # every GPU once


# ---- FSDP's per-block rhythm without pipeline parallelism (Framework.reshard_after_forward)

def _fsdp(fw, p=1, **kw):
    """Llama 3 8B on 8 GPUs, FSDP, 16 sequences a step: at p = 1 one micro-batch of 2 per GPU."""
    from stagewise.plan.cluster import Reserve

    return replace(job(model="llama3-8b", gpus=8, tokens=16 * 8192, tensor=(1,), pipeline=(p,),
                       micro_batch_sizes=(2,), frameworks=(fw,), sharding=("fsdp",), space=Space(families=("1f1b",)),
                       reserve=Reserve(), recompute=("full",), **kw), hardware=replace(H100, memory=2.0**50))


def test_without_pp_torchtitan_holds_two_blocks_gathered_and_gathers_again_for_the_backward():
    """torchtitan reshards each block after its forward when p = 1: the plan holds the two largest neighbouring
    layers' weights and gradients (its one backward reduce-scatters each layer as it leaves it) where the same
    job kept gathered holds the whole model's; the rest of its memory is the same. Its step gathers the weights
    again ahead of the backward (more exposed gather) and overlaps the reductions with the backward."""
    from stagewise.plan.cluster import TORCHTITAN

    kept_fw = replace(TORCHTITAN, name="torchtitan-kept", reshard_after_forward="never")
    block, kept = (cluster_search(_fsdp(fw), keep=1).ranking[0] for fw in (TORCHTITAN, kept_fw))
    assert block.config.m == kept.config.m == 1 and block.lowered and kept.lowered
    assert block.parallelism.reshard_after_forward and not kept.parallelism.reshard_after_forward
    gathered = block.memory_parts.gathered
    assert 0 < gathered < kept.memory_parts.gathered / 8
    assert max(kept.candidate.memory) - max(block.candidate.memory) == pytest.approx(
        kept.memory_parts.gathered - gathered, rel=1e-9)
    assert block.memory_parts.activations == kept.memory_parts.activations
    assert block.exposed_gather > kept.exposed_gather
    assert block.exposed_dp < kept.exposed_dp


def test_the_lowered_walk_holds_what_the_per_block_rule_says():
    """The prepared memory (data_parallel.held_gathered) and the lowered program's walk agree on a per-block
    plan, with one micro-batch and with two: torchtitan leaves FSDP's gradient sync on between accumulation
    steps, so each backward reduce-scatters what it made and the gradients held are a window either way."""
    from stagewise.plan.cluster import TORCHTITAN

    gathered = []
    for mbs in (2, 1):
        j = replace(_fsdp(TORCHTITAN), micro_batch_sizes=(mbs,))
        walked = cluster_search(j, keep=1).ranking[0]
        rules = cluster_search(j, keep=1, lowered=False).ranking[0]
        assert walked.config == rules.config and walked.config.m == 2 // mbs
        assert walked.memory_parts.gathered == pytest.approx(rules.memory_parts.gathered, rel=1e-9)
        assert max(walked.candidate.memory) == pytest.approx(max(rules.candidate.memory), rel=1e-9)
        gathered.append(walked.memory_parts.gathered)
    assert gathered[0] == pytest.approx(gathered[1], rel=1e-9)


def test_every_accumulation_step_reduce_scatters_under_torchtitan_without_pp():
    """torchtitan's train_step runs its accumulation steps with FSDP's gradient sync on: at m = 2 each backward
    reduce-scatters what it made (the lowering's "each" rule), and the rules and the lowered program agree on
    what that exposes."""
    from stagewise.plan.cluster import TORCHTITAN
    from stagewise.plan.cluster.lowered import overlap

    assert overlap(TORCHTITAN, per_block=True).fsdp_reduce == "each"
    assert overlap(TORCHTITAN, per_block=False).fsdp_reduce == TORCHTITAN.overlap.fsdp_reduce
    j = replace(_fsdp(TORCHTITAN), micro_batch_sizes=(1,))
    walked, rules = cluster_search(j, keep=1).ranking[0], cluster_search(j, keep=1, lowered=False).ranking[0]
    assert walked.config.m == 2 and walked.exposed_dp > 0
    assert walked.step_time == pytest.approx(rules.step_time, rel=0.02)


def test_under_pp_torchtitan_keeps_each_stage_gathered_as_before():
    from stagewise.plan.cluster import TORCHTITAN

    kept_fw = replace(TORCHTITAN, name="torchtitan-kept", reshard_after_forward="never")
    block, kept = (cluster_search(_fsdp(fw, p=2), keep=1).ranking[0] for fw in (TORCHTITAN, kept_fw))
    assert not block.parallelism.reshard_after_forward
    assert (block.step_time, block.candidate.memory) == (kept.step_time, kept.candidate.memory)


def test_a_bad_reshard_policy_is_refused_with_the_rule():
    from stagewise.plan.cluster import TORCHTITAN

    with pytest.raises(ValueError, match="unknown rule 'sometimes'"):
        replace(TORCHTITAN, reshard_after_forward="sometimes")
