"""The flight recorder (runtime/resilience/flight.py): each rank's last events, readable after it died."""

from __future__ import annotations

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


def test_dump_lists_the_failed_rank_first():
    a, b = flight.Recorder(), flight.Recorder()
    for rec, op in ((a, "0F0"), (b, "1F0")):
        rec.step(0)
        rec.start(parse(op))
    text = flight.dump({0: a.entries(), 1: b.entries()}, failed=(1,))
    assert text.splitlines()[0] == "flight recorder, rank 1 (failed): last 2 events"
    assert "flight recorder, rank 0: last 2 events" in text
