"""The messages of the lowered programs: every cross-rank message once, in the sender's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stagewise.actions import actions_of
from stagewise.runtime.execution.program import lower
from stagewise.runtime.messages.p2p import ACT, GRAD, Route
from stagewise.schedules import FAMILIES, generate
from stagewise.schedules.registry import ScheduleArgError


@st.composite
def schedules(draw):
    """Any family at p in 1..4 and m in 1..12 (1f1b where the family refuses the arguments)."""
    name = draw(st.sampled_from(sorted(FAMILIES)))
    p = draw(st.sampled_from([1, 2, 3, 4]))
    m = draw(st.integers(1, 12))
    try:
        return generate(name, p, m)
    except ScheduleArgError:
        return generate("1f1b", p, m)


def expected_routes(sched) -> set[Route]:
    out = set()
    for lane in sched.lanes:
        for s in range(lane.stage_lo, lane.stage_hi - 1):
            if sched.placement[s] != sched.placement[s + 1]:
                for mb in lane.mbs:
                    out |= {Route(ACT, s + 1, mb), Route(GRAD, s, mb)}
    return out


def channels(sched) -> dict:
    """(sender, receiver) -> the routes the receiver's lowered program takes from it, in order."""
    return {(src, dst): routes for dst in range(sched.ranks)
            for src, routes in lower(sched, dst).messages.inbound.items()}


@given(schedules())
def test_every_cross_rank_message_is_planned_once_on_the_right_channel(sched):
    seen = [(src, dst, r) for (src, dst), routes in channels(sched).items() for r in routes]
    assert len(seen) == len({r for _, _, r in seen})
    assert {r for _, _, r in seen} == expected_routes(sched)
    for src, dst, r in seen:
        assert (src, dst) == (sched.placement[r.source], sched.placement[r.stage]) and src != dst


@given(schedules())
def test_channels_follow_the_senders_program_order(sched):
    for (src, dst), routes in channels(sched).items():
        produced = []
        for op in sched.programs[src]:
            for kind, s, mb in actions_of(op):
                if kind == "F":
                    produced.append(Route(ACT, s + 1, mb))
                elif kind in ("B", "I"):
                    produced.append(Route(GRAD, s - 1, mb))
        positions = [produced.index(r) for r in routes]
        assert positions == sorted(positions)


@given(schedules())
def test_gloo_tags_are_unique_per_stage_microbatch_and_direction(sched):
    plan = lower(sched, 0).messages
    routes = [r for rs in channels(sched).values() for r in rs]
    tags = [plan.tag(r, h) for r in routes for h in (False, True)]
    assert len(tags) == len(set(tags)) and min(tags, default=0) >= 0


def test_dualpipe_lanes_send_in_opposite_directions():
    sched = generate("dualpipe", 4, 8)
    order = channels(sched)
    # lane 0 (stages 0..3 on ranks 0..3) and lane 1 (stages 4..7 on ranks 3..0) both use the 0<->1 link
    down = {r.stage for r in order[(0, 1)] if r.direction == ACT}
    up = {r.stage for r in order[(1, 0)] if r.direction == ACT}
    assert down == {1} and up == {7}


def test_a_shape_learned_in_an_earlier_step_is_named_with_its_step():
    """static_shapes: step 2's micro-batch 0 differs from what step 1 taught; the message says which step,
    not "micro-batch 0 ... but micro-batch 0 had"."""
    import pytest
    import torch

    from stagewise.runtime.messages.p2p import ACT, P2P, Route, ShapeError
    from stagewise.schedules import generate

    p2p = P2P(lower(generate("1f1b", 2, 4), 1).messages, 1, torch.device("cpu"), 5.0, static=True)
    p2p._check(Route(ACT, 1, 0), None, (((1, 16, 32), torch.float32, True),), "receives")
    p2p.steps = 1  # the next step
    with pytest.raises(ShapeError, match=r"stage 1 micro-batch 0: receives activation \(stage 0 -> 1\) of shape "
                                         r"\(1, 15, 32\) float32 with gradient, but micro-batch 0 of step 1 had "
                                         r"\(1, 16, 32\) float32 with gradient; with static_shapes every step must "
                                         r"have the shapes of the first"):
        p2p._check(Route(ACT, 1, 0), None, (((1, 15, 32), torch.float32, True),), "receives")


def test_each_rank_sends_and_posts_its_receives_in_the_lowered_programs_order():
    """The flight recorder against the lowering (stagewise.lowering): every rank's sends in its lowered order,
    and its receives from each peer in that peer's send order (what the lowered RECVs say)."""
    import stagewise
    from api_helpers import flight_messages
    from stagewise.lowering import lower
    from stagewise.comm_actions import SEND_F, CommAction
    from stagewise.schedules import generate

    cases = [("1f1b", 4, None), ("interleaved-1f1b", 4, 2), ("zb-v", 4, None), ("dualpipe-v", 4, None)]
    got = stagewise.launch(flight_messages, 2, cases, threads=1)

    def text(a: CommAction, src: int, dst: int, sender: bool) -> str:
        what, into = ("activation", a.stage + 1) if a.kind == SEND_F else ("gradient", a.stage - 1)
        return f"{what} mb {a.mb}, stage {a.stage}->{into} (rank {dst if sender else src})"

    for name, m, v in cases:
        low = lower(generate(name, 2, m, v))
        for r, (sends, posts) in enumerate(got[(name, m, v)]):
            mine = [a for a in low.programs[r] if type(a) is CommAction and a.kind.startswith("SEND")]
            assert sends == [text(a, r, a.peer, True) for a in mine], (name, r)
            for peer in range(2):
                theirs = [text(a, peer, r, False) for a in low.programs[peer]
                          if type(a) is CommAction and a.kind.startswith("SEND") and a.peer == r]
                assert [p for p in posts if p.endswith(f"(rank {peer})")] == theirs, (name, r, peer)


class _Runs:
    """Would run a command if its header were unpickled freely."""

    def __reduce__(self):
        import os

        return (os.system, ("echo this must not run",))


def test_a_header_is_read_admitting_only_dtypes_and_tree_node_classes():
    """A received header names no callable but torch dtypes, tree node classes and plain constructors: a header
    that names another (os.system) is refused on reading, and a sender is told before it sends one."""
    import collections
    import pickle

    import pytest

    torch = pytest.importorskip("torch")
    from stagewise.runtime.messages import p2p
    from stagewise.runtime.stages import pytree

    tree = collections.OrderedDict(h=torch.ones(2), mask=torch.zeros(2, dtype=torch.bool), n=3, s="a", z=1 + 2j)
    leaves, spec = pytree.flatten(tree)
    metas = tuple(p2p._meta(x) for x in leaves)
    header, _ = p2p._encode(spec, metas, [x for x in leaves if isinstance(x, torch.Tensor)], Route(ACT, 1, 0))
    assert p2p._decode(header)[:2] == (spec, metas)
    with pytest.raises(pickle.UnpicklingError, match="names posix.system|names nt.system"):
        p2p._Header.loads(pickle.dumps((None, ((p2p._CONST, _Runs()),), None)))
    with pytest.raises(p2p.ShapeError, match="the activation of micro-batch 0 from stage 0 to stage 1: .*system"):
        p2p._encode(None, ((p2p._CONST, _Runs()),), [], Route(ACT, 1, 0))
