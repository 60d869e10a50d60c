"""The schedule lowered for one rank (runtime/execution/program.py): the lowered program itself, with its channels."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from stagewise.actions import actions_of
from stagewise.comm_actions import CommAction
from stagewise.lowering.rules import stage_points
from stagewise.parallelism import Parallelism
from stagewise.runtime.execution.program import lower
from stagewise.runtime.messages.p2p import ACT, GRAD, Route, route_of, route_out
from stagewise.schedules import FAMILIES, generate


def positions(plan) -> list[tuple[int, object]]:
    """(index of the compute op it follows, -1 before the first; the CommAction) of each communication action."""
    out, k = [], -1
    for a in plan.program:
        if type(a) is CommAction:
            out.append((k, a))
        else:
            k += 1
    return out


def ops(plan) -> list:
    return [a for a in plan.program if type(a) is not CommAction]


def test_a_stage_reduction_starts_after_its_last_weight_gradient():
    sched = generate("zb-v", 2, 4)
    plan = lower(sched, 0, Parallelism(pp=2, dp=2))
    prog = sched.programs[0]
    assert ops(plan) == list(prog)
    assert sorted(plan.last_backward) == sorted(sched.stages_of_rank(0)) == list(plan.stages)
    reduced = {c.stage: k for k, c in positions(plan) if c.kind == "REDUCE_GRAD"}
    for s, k in plan.last_backward.items():
        assert reduced[s] == k and prog[k].kind == "W" and prog[k].stage == s
        later = [b for op in prog[k + 1:] for b in actions_of(op) if b.stage == s and b.kind in "BW"]
        assert not later  # nothing adds to the stage's gradients after its reduction starts
    assert min(plan.last_backward.values()) < len(prog) - 1  # one stage's reduction overlaps the rest


def test_first_forward_is_where_a_stage_starts_its_step():
    prog = lower(generate("interleaved-1f1b", 2, 4, 2), 1).schedule.programs[1]
    for s, k in stage_points(prog).first_forward.items():
        assert prog[k].kind == "F" and prog[k].stage == s
        assert all(a.stage != s for op in prog[:k] for a in actions_of(op))


def test_messages_of_a_1f1b_middle_rank():
    plan = lower(generate("1f1b", 3, 2), 1)
    text = [str(a) for a in plan.program]
    assert text[:3] == ["1RECV_F0", "1F0", "1SEND_F0"]
    assert route_of(plan.program[0]) == Route(ACT, 1, 0) and route_of(plan.program[2]) == Route(ACT, 2, 0)
    k = text.index("1B0")
    assert route_of(plan.program[k - 1]) == Route(GRAD, 1, 0) and route_of(plan.program[k + 1]) == Route(GRAD, 0, 0)


def test_an_fb_pair_moves_what_both_halves_move():
    """The sends after an F&B pair are its halves' (each half whose next stage is on another rank)."""
    sched = generate("dualpipe", 4, 8)
    place = sched.placement
    for r in range(4):
        plan = lower(sched, r)
        for k, a in enumerate(plan.program):
            if type(a) is CommAction or len(list(actions_of(a))) != 2:
                continue
            sends = []
            for c in plan.program[k + 1:]:
                if type(c) is not CommAction:
                    break
                if c.kind.startswith("SEND"):
                    sends.append((c.stage, c.mb))
            outs = [(h, route_out(h, sched.first_stages, sched.last_stages)) for h in actions_of(a)]
            crossing = [(h.stage, h.mb) for h, out in outs if out is not None and place[out.stage] != r]
            assert sends == crossing, (r, a)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(FAMILIES)), p=st.sampled_from([2, 4]), extra=st.integers(0, 4))
def test_every_route_is_received_once_and_sent_once(name, p, extra):
    """Over all ranks, what the plans send across ranks is exactly what they receive (the validator's
    dependencies, seen as messages): each cross-stage route once on each side."""
    m = 2 * p + 2 * extra  # >= 2p and even: every family's rule
    sched = generate(name, p, m)
    sent, got = [], []
    for r in range(p):
        for _, c in positions(lower(sched, r)):
            if c.kind.startswith("SEND"):
                sent.append(route_of(c))
            elif c.kind.startswith("RECV"):
                got.append(route_of(c))
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
        comms = positions(plan)
        starts = {c.stage: k + 1 for k, c in comms if c.kind == "UNSHARD"}  # before the op after k
        frees = [(c.stage, k) for k, c in comms if c.kind == "RESHARD"]
        reduced = {(c.stage, k) for k, c in comms if c.kind == "REDUCE_GRAD"}
        assert sorted(starts) == sorted(s for s, _ in frees) == list(plan.stages)
        first_forward = stage_points(sched.programs[r]).first_forward
        order = sorted(first_forward, key=first_forward.get)
        assert starts[order[0]] == 0
        for before, s in zip(order, order[1:]):
            assert starts[s] == first_forward[before] < first_forward[s]
        for s, k in frees:
            assert k == max(i for i, op in enumerate(ops(plan)) for a in actions_of(op) if a.stage == s)
            assert k == plan.last_backward[s] and (s, k) in reduced


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(FAMILIES)), st.integers(2, 4), st.integers(0, 4),
       st.sampled_from([dict(fsdp=2), dict(fsdp=2, dp=2), dict(dp=2), dict(dp=2, zero=True), dict(fsdp=2, ep=2),
                        dict(fsdp=2, reshard_after_forward=True)]),
       st.sampled_from(["stagewise", "deepspeed", "megatron"]))
def test_the_plan_is_the_lowered_program(name, p, extra, layout, framework):
    """One set of rules: the runtime walks the lowered program of each layout and framework's overlap rule
    (stagewise.lowering) as it is, action for action, ending with the step end."""
    from stagewise.lowering import lower as lower_comms
    from stagewise.lowering.options import FRAMEWORKS, LoweringOptions

    try:
        sched = generate(name, p, 2 * p + extra)
    except Exception:  # noqa: BLE001 - a family that refuses these p, m
        return
    par = Parallelism(pp=p, **layout)
    low = lower_comms(sched, par, LoweringOptions(overlap=FRAMEWORKS[framework]))
    for r in range(p):
        plan = lower(sched, r, par, FRAMEWORKS[framework])
        assert plan.program == low.programs[r], (name, r)
        reductions = [c for _, c in positions(plan) if c.kind == "REDUCE_GRAD"]
        assert len({c.stage for c in reductions}) == (len(plan.stages) if par.world > 1 else 0)
        assert str(plan.program[-1]) == f"{min(plan.stages)}STEP_END"


def test_deepspeeds_rule_reduces_every_stage_after_the_drain_and_stagewises_after_each_last_backward():
    sched = generate("interleaved-1f1b", 2, 4, 2)
    par = Parallelism(pp=2, dp=2)
    from stagewise.lowering.options import FRAMEWORKS

    own, drained = lower(sched, 0, par), lower(sched, 0, par, FRAMEWORKS["deepspeed"])
    at = {name: sorted({k for k, c in positions(plan) if c.kind == "REDUCE_GRAD"})
          for name, plan in (("own", own), ("drained", drained))}
    assert at["own"] == sorted(own.last_backward.values())
    assert at["drained"] == [len(ops(drained)) - 1]
    assert sorted(c.stage for k, c in positions(drained) if c.kind == "REDUCE_GRAD") == list(drained.stages)


def test_the_channels_are_the_programs_receives_in_order():
    """p2p posts each peer's messages in the order this rank's RECVs from it come (the sender's order)."""
    sched = generate("dualpipe", 4, 8)
    for r in range(4):
        plan = lower(sched, r)
        for peer, routes in plan.messages.inbound.items():
            assert list(routes) == [route_of(c) for _, c in positions(plan)
                                    if c.kind.startswith("RECV") and c.peer == peer]
