"""Each framework's overlap rules (plan/overlap.py) move the exposed data-parallel traffic the way its docs say."""

import json
from dataclasses import replace
import sys
from pathlib import Path

import pytest

from stagewise.costs import CostError, Costs
from stagewise.lowering import FRAMEWORKS as OVERLAPS, Overlap
from stagewise.plan.cluster import exposed_gather, exposed_reduction, reduction_cost, state_factor
from stagewise.plan.cluster import FRAMEWORKS, Framework, framework
from stagewise.plan.errors import PlanError
from stagewise.plan.search import Link
from stagewise.schedules import generate
from stagewise.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402

ONE = Link(latency=0.0, bandwidth=1.0)  # dp = 2: a layer of 1 byte takes 1 time unit (fp32 doubles, ring halves)


def test_the_rules_are_each_frameworks_documented_ones():
    assert FRAMEWORKS["megatron"].overlap.reduce == "layer" and FRAMEWORKS["megatron"].overlap.gather == "layer"
    assert FRAMEWORKS["deepspeed"].overlap.reduce == "drain" and FRAMEWORKS["deepspeed"].overlap.blocking_p2p
    assert FRAMEWORKS["torchtitan"].overlap.fsdp_reduce == "stage" and FRAMEWORKS["torchtitan"].default_sharding == ("fsdp",)
    assert FRAMEWORKS["megatron"].families == ("1f1b", "interleaved-1f1b")
    assert FRAMEWORKS["deepspeed"].families == ("1f1b",) and "dualpipe" not in FRAMEWORKS["torchtitan"].families
    with pytest.raises(PlanError, match="--framework 'colossal': choose one of megatron, torchtitan"):
        framework("colossal")
    with pytest.raises(CostError, match="`reduce` 'later' is not one of"):
        Framework(name="x", title="X", families=None, sharding=("ddp",), default_sharding=("ddp",),
                  overlap=Overlap(reduce="later", gather="end"))
    with pytest.raises(ValueError, match="unknown rule 'zero3'"):
        Framework(name="x", title="X", families=None, sharding=("zero3",), default_sharding=("ddp",), overlap=Overlap())
    for fw in FRAMEWORKS.values():  # the planner's rules are the lowering's, written once
        assert fw.overlap is OVERLAPS[fw.name]


def test_megatrons_sends_block_without_a_virtual_pipeline_only(capsys):
    """Megatron-LM's non-interleaved 1F1B exchanges synchronously (batch_isend_irecv, waited, then
    torch.cuda.synchronize); its interleaved schedule overlaps P2P. The plan costs a v = 1 row with blocking
    sends: its step is at least the overlapped one's, all else equal."""
    import doctest

    from stagewise.plan.cluster import overlap_rules

    assert doctest.testmod(overlap_rules).failed == 0
    meg, st = FRAMEWORKS["megatron"], FRAMEWORKS["stagewise"]
    assert meg.blocks_p2p(1) and not meg.blocks_p2p(4) and not st.blocks_p2p(1)
    from stagewise.plan.cluster import Hardware, Job, TransformerSpec, cluster_search
    from stagewise.plan.search import Space

    def step(fw):
        job = Job(spec=TransformerSpec.load("llama3-8b"), hardware=Hardware.load("h100"), gpus=32,
                  global_batch_tokens=2**20, tensor=(8,), pipeline=(4,), micro_batch_sizes=(1,), recompute=("off",),
                  space=Space(families=("1f1b",), chunks=None), frameworks=(fw,), sharding=("zero1",))
        return cluster_search(job, keep=1).ranking[0]
    blocked = step(meg)
    free = step(replace(meg, blocking_one_chunk=False))
    assert blocked.config == free.config and blocked.step_time > free.step_time


def test_a_stages_reduction_waits_for_its_last_backward_and_drain_for_the_rank():
    # 1F1B, p = 1, m = 2: F 0-1, F 1-2, B 2-4, B 4-6; four layers of one byte, one unit each to reduce
    tl = simulate(generate("1f1b", 1, 2, 1), Costs(t_f=1, t_b=2))
    layer = exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE, rule="layer")  # ready at 4.5, 5, 5.5, 6
    stage = exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE, rule="stage")  # all four at 6
    assert layer == pytest.approx(8.5 - 6) and stage == pytest.approx(10 - 6)
    # two stages on one rank (looped BFS, v = 2): stage 1's backwards end at 4, so it reduces while stage 0's
    # run; after the drain nothing overlaps
    tl = simulate(generate("looped-bfs", 1, 2, 2), Costs(t_f=0.5, t_b=1))
    by_stage = exposed_reduction(tl, [[1.0] * 2, [1.0] * 2], (0, 1), 2, ONE, rule="stage")
    drained = exposed_reduction(tl, [[1.0] * 2, [1.0] * 2], (0, 1), 2, ONE, rule="drain")
    assert by_stage == pytest.approx(8 - 6) and drained == pytest.approx(10 - 6)


def test_gathers_ahead_of_the_first_forward_hide_behind_the_compute_before_them():
    tl = simulate(generate("looped-bfs", 1, 2, 2), Costs(t_f=0.5, t_b=1))  # stage 0's F at 0, stage 1's at 1
    unit = lambda nbytes: nbytes  # noqa: E731 - one second per byte
    # per stage: stage 0's 2 bytes are late by 2 s; stage 1's start at 2 (one ahead) and end at 4, due at 1
    assert exposed_gather(tl, [[1.0] * 2, [1.0] * 2], (0, 1), "stage", unit) == pytest.approx(3)
    # per layer: due at 0, 0.25 (half-way through stage 0's first forward), 1 and 1.25; done at 1, 2, 3, 4
    assert exposed_gather(tl, [[1.0] * 2, [1.0] * 2], (0, 1), "layer", unit) == pytest.approx(4 - 1.25)
    assert exposed_gather(tl, [[0.1] * 2, [0.1] * 2], (0, 1), "layer", unit) == pytest.approx(0.1)


def test_sharding_memory_and_collectives():
    assert state_factor(8, sharding="ddp") == 9 and state_factor(8, sharding="zero1") == pytest.approx(3.75)
    assert state_factor(8, sharding="fsdp") == pytest.approx(4) and state_factor(8, sharding="hsdp", shard=2) == 7
    link = Link(latency=0.0, bandwidth=1.0)
    assert reduction_cost("ddp", 4, None, link, link)(8.0) == pytest.approx(2 * 6)
    assert reduction_cost("fsdp", 4, None, link, link)(8.0) == pytest.approx(6)
    # HSDP 4 = 2 groups of 2: reduce-scatter in a group (4), then all-reduce the half across the groups (4)
    assert reduction_cost("hsdp", 4, 2, link, link)(8.0) == pytest.approx(4 + 4)


BASE = ("plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "1M",
        "--tensor", "8", "--pipeline", "2", "--schedules", "1f1b", "--micro-batch-sizes", "1", "--recompute", "off",
        "--json", "--top", "1")


def _best(capsys, tmp_path, *extra):
    rc, out, err = run(capsys, *BASE, *extra, "-o", str(tmp_path / "p.csv"))
    assert rc == 0, err
    return json.loads(out)["best"]


def test_framework_moves_the_exposed_reduction_its_way(tmp_path, capsys):
    """One layout (1F1B, t = 8, p = 2, dp = 4, ZeRO-1): Megatron-LM reduces in buckets during the backward,
    torchtitan and stagewise a stage at its last backward, DeepSpeed after the pipeline has drained."""
    got = {fw: _best(capsys, tmp_path, "--framework", fw, "--sharding", "zero1")
           for fw in ("megatron", "stagewise", "deepspeed")}
    titan = _best(capsys, tmp_path, "--framework", "torchtitan", "--sharding", "fsdp")
    assert {g["framework"] for g in got.values()} == {"megatron", "stagewise", "deepspeed"}
    assert got["megatron"]["exposed_dp"] < got["stagewise"]["exposed_dp"] <= got["deepspeed"]["exposed_dp"]
    assert got["megatron"]["exposed_dp"] < titan["exposed_dp"]
    # Megatron-LM gathers the updated weights behind the next forwards; stagewise's ZeRO-1 after the optimizer
    assert got["megatron"]["exposed_gather"] < got["stagewise"]["exposed_gather"]
    # DeepSpeed's blocking P2P puts the link on the sender's timeline: a longer pipeline
    assert got["deepspeed"]["makespan"] > got["stagewise"]["makespan"]
    assert got["megatron"]["step_time"] < got["deepspeed"]["step_time"]


def test_torchtitan_plans_fsdp_and_hsdp(tmp_path, capsys):
    fsdp = _best(capsys, tmp_path, "--framework", "torchtitan")
    hsdp = _best(capsys, tmp_path, "--framework", "torchtitan", "--sharding", "hsdp", "--hsdp-shard", "2")
    assert fsdp["sharding"] == "fsdp" and hsdp["sharding"] == "hsdp" and hsdp["shard"] == 2
    assert max(hsdp["peak_memory"]) > max(fsdp["peak_memory"])  # sharded over 2, not 4


def test_a_sharding_no_framework_runs_is_refused(capsys):
    err = fails(capsys, *BASE, "--framework", "megatron", "--sharding", "fsdp")
    assert "--sharding fsdp: no framework asked for runs it (megatron: zero1, ddp)" in err
    assert "each must be one of ddp, zero1, fsdp, hsdp" in fails(capsys, *BASE, "--sharding", "zero3")
