"""Memory actions (OFFLOAD, RELOAD, RECOMPUTE): the validator, the engine's host stream, the lowering, placement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.actions import parse
from stagewise.costs import Costs
from stagewise.lowering import lower
from stagewise.lowering.check import check
from stagewise.memory_actions import MemoryActionError, place, policy_of
from stagewise.parallelism import Parallelism
from stagewise.schedule import make
from stagewise.schedules import generate
from stagewise.simulate import run, simulate
from stagewise.validate import ScheduleError, validate


def hand(*programs: str, placement=(0, 1), m: int = 2):
    return make("hand", tuple(tuple(parse(x) for x in p.split()) for p in programs), placement, m)


GOOD = ("0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1RECOMPUTE0 1B0 1F1 1B1")


def test_a_program_with_memory_actions_in_order_is_valid_and_lowers_them_through():
    sched = validate(hand(*GOOD))
    for par in (Parallelism(pp=2), Parallelism(pp=2, fsdp=2, reshard_after_forward=True), Parallelism(pp=2, fsdp=2)):
        low = check(lower(sched, par))
        for r in range(2):  # each rank's lowered program holds its memory actions, in their order
            mine = [str(a) for a in low.programs[r] if str(a) in " ".join(GOOD).split() and not str(a)[1] in "FB"]
            assert mine == [x for x in GOOD[r].split() if x[1] not in "FB"]
    raf = lower(sched, Parallelism(pp=2, fsdp=2, reshard_after_forward=True)).text(1)
    assert "1UNSHARD 1RECOMPUTE0 1RESHARD" in raf  # a recompute is a forward: its weights gathered
    assert "0RESHARD 0OFFLOAD0 0UNSHARD" in lower(sched, Parallelism(pp=2, fsdp=2, reshard_after_forward=True)).text(0)


@pytest.mark.parametrize("programs, words", [
    (("0F0 0OFFLOAD0 0F1 0B0 0RELOAD0 0B1", "1F0 1B0 1F1 1B1"),
     "deadlock: wait cycle: rank 0 position 3 (0B0) waits for 0RELOAD0 at rank 0 position 4"),
    (("0F0 0F1 0B0 0B1", "1RECOMPUTE0 1F0 1B0 1F1 1B1"),
     "deadlock: wait cycle: rank 1 position 0 (1RECOMPUTE0) waits for 1F0 at rank 1 position 1"),
    (("0F0 0F1 0B0 0B1", "1F0 1B0 1RECOMPUTE0 1F1 1B1"), "(1B0) waits for 1RECOMPUTE0 at rank 1 position 2"),
    (("0RELOAD0 0F0 0OFFLOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), "(0RELOAD0) waits for 0OFFLOAD0 at rank 0"),
    (("0F0 0OFFLOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), "no 0RELOAD0 on rank 0"),
    (("0F0 0RELOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), "no 0OFFLOAD0 on rank 0"),
    (("0F0 0OFFLOAD0 0RECOMPUTE0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1B1"), "not both"),
    (("0F0 0OFFLOAD0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1B1"), "duplicate action 0OFFLOAD0"),
    (("0F0 1OFFLOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), "stage 1 belongs to rank 1, not rank 0"),
])
def test_the_validator_names_a_memory_action_out_of_order(programs, words):
    with pytest.raises(ScheduleError) as e:
        validate(hand(*programs))
    assert words in str(e.value)
    if "deadlock" in words:
        assert "back to rank" in str(e.value)


def test_a_hand_computed_timeline_host_stream_and_recompute():
    """Rank 0 offloads 0F0 over a link of 0.5 chunk per t_f (2 t_f a transfer): the offload runs 1-3 beside
    0F1, the reload 3-5 after it (FIFO); 0B0 waits for the gradient (5) and the reload (5). Rank 1 recomputes
    1F0 (2-3) and its backward does not replay it (3-5)."""
    tl = simulate(hand(*GOOD), Costs(host_bandwidth=0.5))
    rows = [[(str(op), s, e) for op, s, e in tl.rows(r)] for r in range(2)]
    assert rows[0] == [("0F0", 0, 1), ("0OFFLOAD0", 1, 3), ("0F1", 1, 2), ("0RELOAD0", 3, 5), ("0B0", 5, 7),
                       ("0B1", 8, 10)]
    assert rows[1] == [("1F0", 1, 2), ("1RECOMPUTE0", 2, 3), ("1B0", 3, 5), ("1F1", 5, 6), ("1B1", 6, 8)]
    slow = simulate(hand(*GOOD), Costs(host_bandwidth=0.25))  # 4 t_f a transfer: 0B0 waits for its reload
    assert [(str(op), s, e) for op, s, e in slow.rows(0)][3:5] == [("0RELOAD0", 5, 9), ("0B0", 9, 11)]


def test_place_offload_and_recompute_from_a_policy():
    s = place(generate("1f1b", 2, 2), ("offload", "recompute"))
    assert " ".join(map(str, s.programs[0])) == "0F0 0OFFLOAD0 0RELOAD0 0F1 0OFFLOAD1 0RELOAD1 0B0 0B1"
    assert " ".join(map(str, s.programs[1])) == "1F0 1RECOMPUTE0 1B0 1F1 1RECOMPUTE1 1B1"
    validate(s)
    assert place(generate("1f1b", 2, 2), ("keep", "keep")) == generate("1f1b", 2, 2)
    with pytest.raises(MemoryActionError, match="has 1 entries; the schedule has 2 stages"):
        place(generate("1f1b", 2, 2), ("keep",))
    with pytest.raises(MemoryActionError, match="one of keep, offload, recompute"):
        place(generate("1f1b", 2, 2), ("keep", "drop"))
    assert policy_of(3, offload="all") == ("offload",) * 3


FAMILIES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(FAMILIES), st.integers(2, 4), st.data(), st.sampled_from([None, 0.5, 2.0]),
       st.sampled_from(["backward", "bubble"]), st.sampled_from([0.0, 0.5]), st.booleans())
def test_any_policy_on_any_family_plays_through_and_holds_no_more_than_keeping(fam, p, data, host, at, free_at_i,
                                                                              lowered):
    """Placed from any per-stage policy, a schedule is valid, never stuck, its memory never negative, and each
    rank's peak is at most what keeping everything holds (in chunk-units and in bytes); with a free host link and
    no recompute the step is keeping's exactly."""
    from stagewise.lowering import Communication

    p += p % 2 if fam.startswith("dualpipe") else 0
    sched = generate(fam, p, 2 * p, 2 if fam in ("interleaved-1f1b",) else None)
    policy = tuple(data.draw(st.lists(st.sampled_from(["keep", "offload", "recompute"]), min_size=sched.stages,
                                      max_size=sched.stages)))
    costs = Costs(host_bandwidth=host, free_at_i=free_at_i, activation_bytes=[3.0 * (s + 1) for s in range(sched.stages)],
                  comm=Communication() if lowered else None)
    placed = validate(place(sched, policy, recompute_at=at, costs=costs))
    tl, me = run(placed, costs)
    _, base = run(sched, costs)
    for r in range(sched.ranks):
        for unit_bytes in (False, True):
            assert min(level for _, level in tl.memory_curve(r, unit_bytes)) >= -1e-9
    assert all(a <= b + 1e-9 for a, b in zip(me.peak_activations, base.peak_activations))
    assert all(a <= b + 1e-9 for a, b in zip(me.peak_activation_bytes, base.peak_activation_bytes))
    if host is None and "recompute" not in policy:
        assert me.makespan == base.makespan
    assert me.makespan >= base.makespan - 1e-9 or at == "bubble"


def test_explain_says_a_backward_waited_for_its_reload_and_what_recompute_costs():
    from stagewise.causes import plain
    from stagewise.explain import explain, memory_summary

    sched = place(generate("1f1b", 3, 4), ("offload", "keep", "recompute"))
    tl = simulate(sched, Costs(host_bandwidth=0.4))
    gaps = [g for g in explain(tl) if g.rank == 0 and g.before is not None and g.waits_for is not None]
    first = gaps[0]
    assert first.text == ("rank 0 idle 3..8.5 (5.5): 0B0 waits for 0RELOAD0 (reload from rank 0): link: its "
                          "activations came back from host memory over the host link: 0RELOAD0 ran from 6 to 8.5 "
                          "(behind the link's earlier transfers)")
    assert "activations to come back from host memory" in plain(first, tl)
    assert all(str(sched.programs[0][g.before.pos])[1] == "B" for g in gaps)  # no gap before a host transfer
    assert memory_summary(tl) == ("memory actions: 4 recomputes take 4 of compute over all ranks (the forwards "
                                  "redone); 4 offloads and 4 reloads take 20 of the host link; backwards waited 5 "
                                  "for their reloads")


def test_the_cli_places_memory_actions_and_refuses_bad_ones(capsys):
    from stagewise.cli import main

    assert main(["simulate", "1f1b", "-p", "3", "-m", "4", "--offload", "0", "--recompute", "2",
                 "--host-bandwidth", "0.4", "--draw"]) == 0
    out = capsys.readouterr().out
    assert "R0" in out and "offload/reload" in out and "RELOAD" in out
    for argv, words in ((["--recompute", "0", "--offload", "0"], "--offload and --recompute both name stage 0"),
                        (["--recompute", "5"], "--recompute 5: stage 5 is outside the schedule's stages 0..2"),
                        (["--recompute-at", "bubble"], "--recompute-at places the recomputes of --recompute"),
                        (["--offload", "all", "--host-bandwidth", "0"], "--host-bandwidth must be > 0")):
        assert main(["simulate", "1f1b", "-p", "3", "-m", "4", *argv]) == 2
        assert words in capsys.readouterr().err


def test_lowered_rank_memory_counts_memory_actions_in_program_order():
    """A lowered run's memory walk: an offload frees where it stands, a reload brings the activation back, a
    recomputed forward keeps ``kept`` of it and its recompute the rest; never above keeping everything."""
    from stagewise.lowering.rank_memory import lowered_memory

    sched = generate("1f1b", 2, 4)
    placed = place(sched, ("offload", "recompute"))
    keep = lowered_memory(lower(sched), [2.0, 2.0])
    got = lowered_memory(lower(placed), [2.0, 2.0], kept=[0.5, 0.5])
    assert [m.peak.activations for m in keep] == [4.0, 2.0]
    assert [m.peak.activations for m in got] == [4.0, 2.0]  # 0RELOAD0 comes back right after 0OFFLOAD0 (lead 1)
    levels = [h.activations for _, h in got[1].curve]
    assert levels[1:4] == [0.5, 2.0, 0.0]  # after 1RECV_F0: 1F0 keeps 0.5, 1RECOMPUTE0 brings back 1.5, 1B0 frees it all
