"""The flight recorder (runtime/resilience/flight.py): each rank's last events, readable after it died."""

from __future__ import annotations

import pytest

from stagewise.actions import parse
from stagewise.runtime.resilience import flight


def test_a_recorder_keeps_the_last_events_in_a_file_another_process_can_read(tmp_path):
    path = flight.rank_file(tmp_path, 3)
    rec = flight.Recorder(capacity=4, path=path)
    rec.step(0)
    for op in ("0F0", "0F1", "0B0"):
        rec.start(parse(op))
        rec.end(parse(op))
    rec.start(parse("0B1"))
    entries = flight.read(path)
    assert len(entries) == 4 and entries[-1].text == "0B1" and entries[-1].kind == flight.START  # the ring wrapped
    assert flight.where(entries) == "at 0B1 (step 1)"  # the op it was in when it stopped


def test_where_names_a_wait_and_a_phase():
    rec = flight.Recorder()
    rec.step(1)
    rec.start(parse("1F0"))
    rec.event(flight.WAIT, "activation mb 0, stage 0->1 (rank 0)")
    assert flight.where(rec.entries()) == "at 1F0 (step 2), waiting for the activation mb 0, stage 0->1 (rank 0)"
    rec.end(parse("1F0"))
    rec.event(flight.SYNC, "gradients and loss")
    assert flight.where(rec.entries()) == "in the step-end collectives of step 2"
    assert flight.where([]) == "" and flight.read("/no/such/file") == []


def test_collectives_are_kept_under_their_lowered_names_and_paired_issued_to_done():
    rec = flight.Recorder()
    rec.step(0)
    rec.reset_comms()
    rec.start(parse("1F0"))
    rec.comm("1UNSHARD")
    rec.done("1UNSHARD", 0.0)
    rec.end(parse("1F0"))
    rec.event(flight.SYNC, "gradients and loss")
    rec.comm("1REDUCE_GRAD")
    rec.comm("1STEP_END")  # never done: not on the measured lane
    rec.done("1REDUCE_GRAD", 1e-9)
    assert [e.text for e in rec.entries() if e.kind == flight.COMM] == ["1UNSHARD", "1REDUCE_GRAD", "1STEP_END"]
    assert flight.where(rec.entries()) == "in the step-end collectives of step 1"  # a collective keeps the phase
    got = flight.intervals(rec.comms, rec.comms[0][0])
    assert [(op, text) for op, text, *_ in got] == [(0, "1UNSHARD"), (0, "1REDUCE_GRAD")]
    assert all(0 <= start <= end and 0 <= exposed <= end - start for *_, start, end, exposed in got)


def test_dump_lists_the_failed_rank_first():
    a, b = flight.Recorder(), flight.Recorder()
    for rec, op in ((a, "0F0"), (b, "1F0")):
        rec.step(0)
        rec.start(parse(op))
    text = flight.dump({0: a.entries(), 1: b.entries()}, failed=(1,))
    assert text.splitlines()[0] == "flight recorder, rank 1 (failed): last 2 events"
    assert "flight recorder, rank 0: last 2 events" in text


# one launch of 4 ranks: pp 2 x dp 2 over every family, pp 2 x fsdp 2 and pp 2 x ep 2 over four
FAMILIES = [("1f1b", 4, None), ("interleaved-1f1b", 4, 2), ("zb-v", 4, None), ("dualpipe-v", 4, None)]
MORE = [("gpipe", 4, None), ("zb-h1", 4, None), ("zb-h2", 4, None), ("looped-bfs", 4, 2), ("v-half", 4, None),
        ("v-min", 4, None), ("dualpipe", 4, None)]
CASES = [({"dp": 2}, *f) for f in FAMILIES + MORE] + [(layout, *f) for layout in ({"fsdp": 2}, {"ep": 2})
                                                      for f in FAMILIES]


@pytest.fixture(scope="module")
def flown():
    """One launch of 4 ranks over CASES (runtime_helpers.flight_collectives), shared by the tests below."""
    pytest.importorskip("torch")
    import stagewise
    from runtime_helpers import flight_collectives

    return stagewise.launch(flight_collectives, 4, CASES, threads=1, timeout=120)


def test_each_rank_issues_its_collectives_where_and_in_the_order_its_lowered_program_has_them(flown):
    """The flight recorder against the lowering (stagewise.lowering): every rank's gathers, reductions,
    reshards, all-to-alls, tied-weight sum and step end, each after the op the lowered program puts it after
    and in that order (the executor walks the program); the measured timeline carries them on each rank's
    communication lane at the op the simulated lowered timeline puts them at."""
    from stagewise.lowering import lower
    from stagewise.comm_actions import P2P, CommAction
    from stagewise.lowering.options import LoweringOptions, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.render.svg import timeline_svg
    from stagewise.runtime.stages.stage import stage_ranges
    from stagewise.schedules import generate

    got = flown
    kinds = set()
    for layout, name, m, v in CASES:
        sched = generate(name, 2, m, v)
        if "ep" in layout:  # the own MoE model: embedding, 3 MoE blocks, head; no tied weight
            a2a = [float(any(1 <= i <= 3 for i in r)) for r in stage_ranges(sched, 5)]
            sizes = Sizes(a2a=a2a)
        else:  # api_helpers' model ties its embedding and head
            sizes = Sizes(tie=1.0)
        low = lower(sched, Parallelism(pp=2, **layout), LoweringOptions(sizes=sizes))
        ranks, lanes, measured = got[(tuple(layout.items()), name, m, v)]
        for g, (pipe, seen) in enumerate(ranks):
            want, k = [], -1
            for a in low.programs[pipe]:
                if type(a) is not CommAction:
                    k += 1
                elif a.kind not in P2P:  # issued where the walk reaches it: after op k (-1: before the first)
                    want.append((k, str(a)))
            assert seen == want, (layout, name, g)
            kinds |= {a.kind for a in low.programs[pipe] if type(a) is CommAction}
            if g == pipe:  # replica 0: the measured timeline's lane holds what completes (not a reshard, not
                # the all-to-alls inside the ops), issued to done, each at the op the simulated lane puts it at
                # (lowering.play.lanes: the last op before it, the first op when none)
                lane = [c for c in lanes[pipe] if not any(k in c[1] for k in P2P)]  # sends: the test below
                assert [(k, t) for k, t, *_ in lane] == [(max(k, 0), t) for k, t in want
                                                         if "RESHARD" not in t and "ALL_TO_ALL" not in t]
                assert all(0 <= start <= end and 0 <= exposed <= end - start + 1e-9
                           for *_, start, end, exposed in lane), lane
        drawn = timeline_svg(measured)  # the same lanes and words as a simulated lowered timeline's
        over = {"dp": "over dp", "fsdp": "over fsdp", "ep": "over ep"}[next(iter(layout))]
        assert f"the {'reduce-scatter' if 'fsdp' in layout else 'all-reduce'} of stage 0 {over}" in drawn, name
    assert kinds >= {"UNSHARD", "RESHARD", "REDUCE_GRAD", "ALL_TO_ALL", "TIE_GRAD", "STEP_END"}


def test_a_measured_and_a_simulated_timeline_of_one_run_line_up_action_for_action(flown):
    """The measured timeline of each pp 2 x dp 2 and pp 2 x fsdp 2 run (split backward, interleaved, V and
    DualPipe-V among them) and the simulator's timeline of the same lowered program (``simulate`` with the
    layout's ``Communication``, every transfer given a duration) name the same actions on every rank in the
    same order: the same compute ops, and on the communication lane every send, receive, gather, reduction,
    tied-weight sum and step end, each at the same op (a reshard takes no time in either)."""
    from stagewise.costs import Costs
    from stagewise.lowering.communication import Communication
    from stagewise.lowering.options import LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.simulate import simulate

    lined = 0
    for layout, name, m, v in CASES:
        if "ep" in layout:  # the all-to-alls run inside the ops: the lanes of test_all_to_all
            continue
        _, _, measured = flown[(tuple(layout.items()), name, m, v)]
        options = LoweringOptions(sizes=Sizes(params=1.0, tie=1.0),
                                  network=Network(intra_bandwidth=100.0, intra_latency=0.01))
        sim = simulate(measured.schedule, Costs(latency=0.01, comm=Communication(parallelism=Parallelism(**layout),
                                                                                 options=options)))
        assert sim.schedule.programs == measured.schedule.programs
        for r, program in enumerate(sim.meta["lowered"].programs):
            assert len(measured.starts[r]) == len(sim.starts[r]) == len(sim.schedule.programs[r])
            at = {id(a): k for k, a in enumerate(program)}  # the simulated lane is in time order
            simulated = [(c.op, str(c.action)) for c in sorted(sim.comm[r], key=lambda c: at[id(c.action)])]
            got = [(c.op, str(c.action)) for c in measured.comm[r]]
            assert got == simulated, (layout, name, r)
            assert simulated and all(
                0 <= c.start <= c.end and 0 <= c.exposed <= c.end - c.start + 1e-9 for c in measured.comm[r])
            lined += 1
    assert lined == 2 * (len(FAMILIES + MORE) + len(FAMILIES))
