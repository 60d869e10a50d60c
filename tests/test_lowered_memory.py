"""What a rank holds over its lowered program (lowering/rank_memory.py), the planner's sharded memory from it (the
configurations it lowers), and the CLI's report of it."""

import json

import pytest

from stagewise.cli import main
from stagewise.lowering import LoweringOptions, Sizes, lower
from stagewise.lowering.rank_memory import lowered_memory
from stagewise.parallelism import Parallelism
from stagewise.plan.cluster import Hardware, Job, TransformerSpec, cluster_search
from stagewise.plan.search import Space
from stagewise.schedules import FAMILIES, generate
from stagewise.timeline import peak_memory

LAYOUTS = [dict(), dict(fsdp=2), dict(dp=2, zero=1), dict(dp=2, fsdp=2), dict(ep=2),
           dict(fsdp=2, reshard_after_forward=True)]


def schedules():
    for name, fam in FAMILIES.items():
        for p, m, v in ((2, 4, 2), (4, 8, 2), (3, 5, 1)):
            try:
                yield generate(name, p, m, v) if fam.chunks is None or v in fam.chunks else generate(name, p, m)
            except Exception:  # noqa: BLE001 - a family that refuses these p, m, v
                continue


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_without_the_new_terms_it_is_peak_memory_for_every_family(layout):
    seen = set()
    for sched in schedules():
        seen.add(sched.name)
        low = lower(sched, Parallelism(pp=sched.ranks, **layout))  # no weight, gradient or boundary bytes
        for fi in (0.0, 0.4, -0.6):
            size = [1.0 + 0.25 * s for s in range(sched.stages)]
            got = [m.peak.total for m in lowered_memory(low, size, fi)]
            assert got == pytest.approx(peak_memory(sched, size, fi)), (sched.name, layout, fi)
    assert seen == set(FAMILIES)  # every family ran


def test_each_term_is_held_between_its_actions():
    sched = generate("interleaved-1f1b", 2, 2, 2)  # m = p: a chunk's first backward comes after the others drop
    par = Parallelism(pp=2, fsdp=2)
    low = lower(sched, par, LoweringOptions(sizes=Sizes(params=100.0, grads=200.0, boundary=1.0)))
    mem = lowered_memory(low, [10.0] * sched.stages)
    for r, m in enumerate(mem):
        prog = low.programs[r]
        assert m.peak.total < 10 * 4 + 2 * (100 + 200)  # less than every term at its largest at once
        assert m.curve[-1][1].total == 0  # everything freed by the end of the step
        for k, held in m.curve:
            assert held.gathered == 100 * sum(1 for a in prog[:k + 1] if str(a).endswith("UNSHARD")) - 100 * sum(
                1 for a in prog[:k + 1] if str(a).endswith("RESHARD"))
    raf = lower(sched, Parallelism(pp=2, fsdp=2, reshard_after_forward=True),
                LoweringOptions(sizes=Sizes(params=100.0)))
    assert all(m.peak.gathered == 100 for m in lowered_memory(raf, [1.0] * sched.stages))  # one stage at a time


def test_simulate_reports_the_lowered_memory(capsys):
    args = ["simulate", "interleaved-1f1b", "-p", "2", "-m", "2", "-v", "2", "--fsdp", "2", "--param-bytes", "100",
            "--grad-bytes", "200", "--activation-bytes", "10", "--boundary-bytes", "1"]
    assert main(args + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)["lowered_memory"]
    assert got["activations_in_bytes"] and len(got["peak"]) == 2
    assert got["peak"] == pytest.approx([sum(x.values()) for x in got["parts"]])
    sched = generate("interleaved-1f1b", 2, 2, 2)
    low = lower(sched, Parallelism(pp=2, fsdp=2), LoweringOptions(sizes=Sizes(params=100.0, grads=200.0,
                                                                               boundary=1.0)))
    assert got["peak"] == pytest.approx([m.peak.total for m in lowered_memory(low, [10.0] * 4)])
    assert main(args) == 0
    assert "lowered memory peak" in capsys.readouterr().out


def _job(family: str, v: int, mbs: int) -> Job:
    spec = TransformerSpec.load("llama3-8b")
    return Job(spec=spec, hardware=Hardware.load("h100"), gpus=16, global_batch_tokens=16 * spec.seq,
               tensor=(1,), pipeline=(4,), micro_batch_sizes=(mbs,), sharding=("fsdp",),
               space=Space(families=(family,), chunks=(v,)))


def test_the_planners_sharded_memory_is_the_lowered_programs():
    got = {}
    for family, v in (("1f1b", 1), ("interleaved-1f1b", 2)):
        best = cluster_search(_job(family, v, 1), keep=1).ranking[0]  # m = 16 sequences / fsdp 4 = p
        assert best.config.m == best.config.p == 4
        parts = best.memory_parts
        assert best.lowered
        assert parts.state + parts.gathered + parts.activations + parts.transient == \
            pytest.approx(max(best.candidate.memory))
        got[family] = parts
    # FSDP over 4: the sharded state is 8 / 4 bytes a bf16 weight byte, the gathered 1 + 2 while gathered.
    # 1F1B's first backward comes at its activation peak: everything gathered is held there. With two chunks
    # and m = p the later chunk's gradients appear after the first's activations have gone: less is held
    one, two = got["1f1b"], got["interleaved-1f1b"]
    assert one.gathered == pytest.approx(3 * one.state / 2)
    assert two.gathered < 3 * two.state / 2 * (1 - 1e-3)


def test_a_layer_by_layer_rhythm_holds_two_neighbouring_layers():
    """Reshard after forward with the layers known: the walk holds the two largest neighbouring layers' weights,
    not the stage's; gradients reduced bucket by bucket in the one backward that makes them are that share too,
    while a stage whose gradients accumulate over micro-batches holds all of them until its reduction."""
    from dataclasses import replace

    from stagewise.lowering import FRAMEWORKS

    sizes = Sizes(params=8.0, grads=16.0, layers=((1, 2, 5),))
    layer = replace(FRAMEWORKS["torchtitan"], fsdp_reduce="layer")
    raf = Parallelism(pp=1, fsdp=2, reshard_after_forward=True)
    one = lower(generate("1f1b", 1, 1), raf, LoweringOptions(overlap=layer, sizes=sizes, step_end=False))
    peak = lowered_memory(one, [3.0])[0].peak
    assert (peak.activations, peak.gathered, peak.grads) == (3.0, 8.0 * 7 / 8, 16.0 * 7 / 8)
    kept = lower(generate("1f1b", 1, 1), Parallelism(pp=1, fsdp=2), LoweringOptions(sizes=sizes, step_end=False))
    assert lowered_memory(kept, [3.0])[0].peak.gathered == 8.0
    two = lower(generate("1f1b", 1, 2), raf, LoweringOptions(overlap=layer, sizes=sizes, step_end=False))
    assert lowered_memory(two, [3.0])[0].peak.grads == 16.0  # B0's gradients wait for B1's reduction
