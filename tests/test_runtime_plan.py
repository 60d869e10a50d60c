"""The schedule lowered for one rank (runtime/execution/plan.py): messages and stage points, derived once."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from stagewise.actions import actions_of
from stagewise.parallelism import Parallelism
from stagewise.runtime.execution.plan import lower
from stagewise.runtime.messages.p2p import ACT, GRAD, Route
from stagewise.schedules import FAMILIES, generate


def test_a_stage_reduction_starts_after_its_last_weight_gradient():
    sched = generate("zb-v", 2, 4)
    plan = lower(sched, 0)
    prog = sched.programs[0]
    assert sorted(plan.last_backward) == sorted(sched.stages_of_rank(0)) == list(plan.stages)
    for s, k in plan.last_backward.items():
        assert s in plan.steps[k].done and prog[k].kind == "W" and prog[k].stage == s
        later = [b for op in prog[k + 1:] for b in actions_of(op) if b.stage == s and b.kind in "BW"]
        assert not later  # nothing adds to the stage's gradients after its reduction starts
    assert min(plan.last_backward.values()) < len(prog) - 1  # one stage's reduction overlaps the rest


def test_first_forward_is_where_a_stage_starts_its_step():
    plan = lower(generate("interleaved-1f1b", 2, 4, 2), 1)
    for s, k in plan.first_forward.items():
        assert plan.steps[k].op.kind == "F" and plan.steps[k].op.stage == s
        assert all(a.stage != s for step in plan.steps[:k] for a in step.actions)


def test_messages_of_a_1f1b_middle_rank():
    plan = lower(generate("1f1b", 3, 2), 1)
    f0 = plan.steps[0]
    assert str(f0.op) == "1F0" and f0.recv == (Route(ACT, 1, 0),) and f0.send == (Route(ACT, 2, 0),)
    b0 = next(s for s in plan.steps if str(s.op) == "1B0")
    assert b0.recv == (Route(GRAD, 1, 0),) and b0.send == (Route(GRAD, 0, 0),)


def test_an_fb_pair_moves_what_both_halves_move():
    sched = generate("dualpipe", 4, 8)
    for r in range(4):
        for step in lower(sched, r).steps:
            assert len(step.actions) == len(step.recv) == len(step.send) == len(list(actions_of(step.op)))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(FAMILIES)), p=st.sampled_from([2, 4]), extra=st.integers(0, 4))
def test_every_route_is_received_once_and_sent_once(name, p, extra):
    """Over all ranks, what the plans send across ranks is exactly what they receive (the validator's
    dependencies, seen as messages): each cross-stage route once on each side."""
    m = 2 * p + 2 * extra  # >= 2p and even: every family's rule
    sched = generate(name, p, m)
    sent, got = [], []
    for r in range(p):
        for step in lower(sched, r).steps:
            sent += [x for x in step.send if x is not None]
            got += [x for x in step.recv if x is not None]
    assert sorted(sent) == sorted(got) and len(set(sent)) == len(sent)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(FAMILIES)), p=st.sampled_from([2, 4]))
def test_a_sharded_stage_is_gathered_one_stage_ahead_and_freed_after_its_last_action(name, p):
    """FSDP's points: every stage's gather starts at most at its first forward, at the first forward of the
    stage before it in the program (the first one's at op 0), and it is freed exactly once, after its last op
    (its last B or W: where its gradients are complete)."""
    sched = generate(name, p, 2 * p)
    for r in range(p):
        plan = lower(sched, r, Parallelism(pp=p, fsdp=2))
        starts = {s: k for k, step in enumerate(plan.steps) for s in step.gather}
        frees = [(s, k) for k, step in enumerate(plan.steps) for s in step.free]
        assert sorted(starts) == sorted(s for s, _ in frees) == list(plan.stages)
        order = sorted(plan.first_forward, key=plan.first_forward.get)
        assert starts[order[0]] == 0
        for before, s in zip(order, order[1:]):
            assert starts[s] == plan.first_forward[before] < plan.first_forward[s]
        for s, k in frees:
            assert k == max(i for i, step in enumerate(plan.steps) for a in step.actions if a.stage == s)
            assert k == plan.last_backward[s] and s in plan.steps[k].done and s in plan.steps[k].reduce


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(FAMILIES)), st.integers(2, 4), st.integers(0, 4),
       st.sampled_from([dict(fsdp=2), dict(fsdp=2, dp=2), dict(dp=2), dict(dp=2, zero=True), dict(fsdp=2, ep=2),
                        dict(fsdp=2, reshard_after_forward=True)]),
       st.sampled_from(["stagewise", "deepspeed", "megatron"]))
def test_the_plan_gathers_reduces_and_frees_where_the_lowering_puts_them(name, p, extra, layout, framework):
    """One set of rules: each op's gathers, reductions and frees are the lowered program's first UNSHARD over
    fsdp (before it), REDUCE_GRAD and last RESHARD (after it), under each layout and framework's overlap rule
    (stagewise.lowering; a drained reduction is the last op's)."""
    from stagewise.lowering import lower as lower_comms
    from stagewise.lowering.comms import CommAction
    from stagewise.lowering.options import FRAMEWORKS, LoweringOptions

    try:
        sched = generate(name, p, 2 * p + extra)
    except Exception:  # noqa: BLE001 - a family that refuses these p, m
        return
    par = Parallelism(pp=p, **layout)
    low = lower_comms(sched, par, LoweringOptions(overlap=FRAMEWORKS[framework]))
    for r in range(p):
        plan, k, before = lower(sched, r, par, FRAMEWORKS[framework]), -1, []
        marks: dict[int, dict[str, list[int]]] = {}
        gathered, freed = set(), {}
        for a in low.programs[r]:
            if type(a) is not CommAction:
                k += 1
                marks[k] = {"gather": before, "reduce": [], "free": []}
                before = []
            elif a.kind == "UNSHARD" and a.group == "fsdp" and k + 1 < len(plan.steps):
                if a.stage not in gathered:
                    before.append(a.stage)
                gathered.add(a.stage)
            elif a.kind == "REDUCE_GRAD":
                marks[k]["reduce"].append(a.stage)
            elif a.kind == "RESHARD":
                freed[a.stage] = k
        for s, k in freed.items():
            marks[k]["free"].append(s)
        assert sum(len(m["reduce"]) for m in marks.values()) == (len(plan.stages) if par.world > 1 else 0)
        for k, step in enumerate(plan.steps):
            assert (sorted(marks[k]["gather"]), marks[k]["reduce"], sorted(marks[k]["free"])) == \
                (list(step.gather), list(step.reduce), list(step.free)), (name, r, k)
            assert all(type(c) is CommAction for c in step.comms)
        assert list(plan.tail)[-1:] == [f"{min(plan.stages)}STEP_END"]


def test_deepspeeds_rule_reduces_every_stage_after_the_drain_and_stagewises_after_each_last_backward():
    sched = generate("interleaved-1f1b", 2, 4, 2)
    par = Parallelism(pp=2, dp=2)
    from stagewise.lowering.options import FRAMEWORKS

    own, drained = lower(sched, 0, par), lower(sched, 0, par, FRAMEWORKS["deepspeed"])
    assert [k for k, st in enumerate(own.steps) if st.reduce] == sorted(own.last_backward.values())
    assert [k for k, st in enumerate(drained.steps) if st.reduce] == [len(drained.steps) - 1]
    assert sorted(drained.steps[-1].reduce) == list(drained.stages)
