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
    grid = StageGrid(devices=p * dp, per_node=8 // t, memory=None, intra=intra, inter=inter, pipeline=p, t=t,
                     node=8, placement=placement)
    net = network(grid)
    assert net.order == (PIPELINE_OUTERMOST if placement == "within" else DIMS) and net.gpus_per_node == 8
    par = Parallelism(pp=p, dp=dp, tp=t)
    low = Lowered(schedule=generate("1f1b", p, p), parallelism=par, programs=(), options=LoweringOptions(network=net))
    inside = all(low.inside(low.global_ranks(r, "dp")) for r in range(p))
    assert inside == (grid.data_parallel_link(p, dp) is intra)
    if 8 % (t * dp) == 0 and placement == "within":  # a pool that tiles a node
        assert inside
    assert sorted(g for r in range(p) for d in low.global_ranks(r, "dp") for g in range(d, d + t)) == \
        list(range(p * dp * t))  # every GPU once
