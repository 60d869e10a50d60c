"""Chrome/Perfetto trace: one complete event per action at its simulated time, flows along the lanes."""

import json

import pytest
from hypothesis import given, strategies as st
from render_helpers import families, measured, sim

from stagewise.render.trace import chrome_trace, scale_of, sends, write_trace


def events(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


@pytest.mark.parametrize("name", families(4, 8))
def test_one_complete_event_per_action_with_simulated_start_and_duration(name):
    tl = sim(name, 4, 8, t_f=1.0, t_b=2.5)
    trace = chrome_trace(tl)
    k = scale_of(tl.unit)
    expected = {}
    for r in range(tl.ranks):
        for op, start, end in tl.rows(r):
            for a in ([op.forward, op.backward] if op.kind == "F&B" else [op]):
                expected[str(a)] = (r, start * k, (end - start) * k)
    xs = events(trace, "X")
    assert len(xs) == len(expected) == sum(1 for _ in tl.schedule.actions())
    for e in xs:
        r, ts, dur = expected[e["name"]]
        assert (e["tid"], e["cat"]) == (r, e["name"].rstrip("0123456789")[-1])
        assert e["ts"] == pytest.approx(ts) and e["dur"] == pytest.approx(dur)


@given(p=st.integers(1, 6), m=st.integers(1, 10))
def test_1f1b_sends_one_activation_and_one_gradient_per_boundary_and_microbatch(p, m):
    tl = sim("1f1b", p, m, latency=0.25)
    trace = chrome_trace(tl)
    starts, finishes = events(trace, "s"), events(trace, "f")
    assert len(starts) == len(finishes) == 2 * (p - 1) * m
    xs = {(e["tid"], e["ts"]): e for e in events(trace, "X")}
    by_id = {e["id"]: e for e in finishes}
    for s in starts:
        f = by_id[s["id"]]
        sender, receiver = xs[s["tid"], s["ts"]], xs[f["tid"], f["ts"]]
        assert abs(sender["tid"] - receiver["tid"]) == 1
        assert receiver["ts"] >= sender["ts"] + sender["dur"] + 0.25 * 1000 - 1e-6  # latency respected


@pytest.mark.parametrize("name", families(4, 8))
def test_sends_follow_lanes_and_cross_ranks(name):
    tl = sim(name, 4, 8)
    sched = tl.schedule
    pairs = sends(tl)
    for a, b in pairs:
        sa, sb = a.action.stage, b.action.stage
        assert sched.lane_of_stage(sa) == sched.lane_of_stage(sb) and abs(sa - sb) == 1
        assert a.rank != b.rank
        assert (a.action.kind == "F") == (b.action.kind == "F") == (sb == sa + 1)
    # every cross-rank boundary of every lane carries one activation and one gradient per micro-batch
    expected = sum(2 * len(lane.mbs) for lane in sched.lanes for s in range(lane.stage_lo, lane.stage_hi - 1)
                   if sched.placement[s] != sched.placement[s + 1])
    assert len(pairs) == expected


def test_measured_trace_is_in_microseconds_from_the_first_start(tmp_path):
    tl = measured(sim("1f1b", 2, 2), offset=5000.0, seconds_per_unit=0.002)
    path = write_trace(tl, tmp_path / "t.json")
    trace = json.loads(path.read_text())
    xs = events(trace, "X")
    assert min(e["ts"] for e in xs) == 0
    assert sorted(e["dur"] for e in xs) == pytest.approx([2000] * 4 + [4000] * 4)
    assert trace["otherData"]["unit"] == "s" and trace["otherData"]["trace_us_per_unit"] == 1e6
    names = {e["args"]["name"] for e in events(trace, "M") if e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1"}


def test_memory_counters_reach_the_peak():
    tl = sim("gpipe", 3, 5)
    counters = events(chrome_trace(tl), "C")
    for r in range(3):
        levels = [e["args"]["chunks"] for e in counters if e["name"] == f"live activations rank {r}"]
        assert max(levels) == 5 and levels[-1] == 0


def test_all_to_all_gets_its_own_track_per_rank_with_what_was_exposed():
    from stagewise.timeline import metrics

    tl = sim("dualpipe-v", 4, 8, a2a=0.5)
    trace = chrome_trace(tl)
    k = scale_of(tl.unit)
    comm = [e for e in events(trace, "X") if e["cat"] == "a2a"]
    assert len(comm) == sum(len(lane) for lane in tl.comm)
    assert {e["tid"] for e in comm} == {4, 5, 6, 7}
    names = {e["tid"]: e["args"]["name"] for e in events(trace, "M") if e["name"] == "thread_name"}
    assert names[5] == "rank 1 all-to-all"
    mt = metrics(tl)
    assert sum(e["args"]["exposed"] for e in comm) / k == pytest.approx(sum(mt.exposed_a2a), rel=1e-3)
    assert sum(e["dur"] for e in comm) / k == pytest.approx(sum(mt.a2a), rel=1e-3)
