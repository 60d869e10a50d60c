"""Measured activation memory: what the meter counts, and how the simulator predicts it per rank.

The counter (one storage once, weights never, freed when autograd or the
executor lets go), the simulator's peak when I holds more than F left
(``free_at_i < 0``), one rank's executor in this process against the
prediction, and one launch of p=4, m=8 where the measured peaks rank 1f1b,
gpipe, zb-h2 and zb-v like the simulator does, each within 15%.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import TINY
from scale_helpers import SMALL, run_local
from torch import nn

from stagewise.costs import CostError, Costs
from stagewise.runtime import RunConfig
from stagewise.runtime.execution.activation_memory import SavedBytes, predicted_peaks
from stagewise.runtime.run.train import train_many
from stagewise.schedules import generate
from stagewise.schedules.registry import whole_names
from stagewise.schedules.registry import ScheduleArgError
from stagewise.simulate import simulate
from stagewise.timeline import metrics

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()


def test_a_storage_counts_once_weights_never_and_until_the_last_holder_lets_go():
    count = SavedBytes()
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with count.hooks(lin):
        y = lin(x)  # saves x (its storage) and a view of the weight (not counted)
    assert count.live == 4 * 8 * 4
    tokens = count.hold([x, x[1:], y])  # x's storage is already counted; y's is new
    assert count.live == 2 * 4 * 8 * 4
    y.sum().backward()  # autograd drops what it saved: x stays, held by a token
    assert count.live == 2 * 4 * 8 * 4
    del tokens
    assert count.live == 0 and count.peak == 2 * 4 * 8 * 4


def _schedules():
    out = []
    for name in FAMILIES_RUN:
        for p in (1, 2, 3):
            try:
                out.append(generate(name, p, 4))
            except ScheduleArgError:
                pass
    return out


SCHEDULES = _schedules()


@given(k=st.integers(0, len(SCHEDULES) - 1), free_at_i=st.floats(-1.0, 1.0),
       sizes=st.lists(st.floats(0.5, 4.0), min_size=8, max_size=8))
def test_the_simulated_peak_is_the_top_of_the_memory_curve_whatever_i_frees_or_adds(k, free_at_i, sizes):
    sched = SCHEDULES[k]
    tl = simulate(sched, Costs(activation_bytes=sizes[:sched.stages], free_at_i=free_at_i))
    peaks = metrics(tl).peak_activation_bytes
    for r in range(sched.ranks):
        top = max(level for _, level in tl.memory_curve(r, unit_bytes=True))
        assert peaks[r] == pytest.approx(top, abs=1e-9)


def test_free_at_i_above_one_is_refused():
    with pytest.raises(CostError, match="--free-at-i must be <= 1; got 1.5"):
        Costs(free_at_i=1.5).resolve(2)


@pytest.mark.parametrize("name, v, exact", [("gpipe", None, True), ("1f1b", None, True),
                                            ("interleaved-1f1b", 2, True), ("zb-h1", None, True),
                                            ("zb-v", None, False)])
def test_one_rank_in_process_peaks_as_predicted(name, v, exact):
    sched = generate(name, 1, 4, v)
    _, meter, _ = run_local(sched, SMALL)
    predicted = predicted_peaks(sched, meter.added)[0]
    # exact where one stage sets the growth at I; zb-v's two stages share one free_at_i
    assert meter.peak == pytest.approx(predicted, rel=1e-9 if exact else 0.05)


@pytest.fixture(scope="module")
def four_schedules():
    base = RunConfig(ranks=4, microbatches=8, batch=16, steps=1, model=TINY, timeout=60)
    return train_many([dataclasses.replace(base, schedule=name) for name in ("1f1b", "gpipe", "zb-h2", "zb-v")])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_measured_peaks_rank_the_schedules_like_the_simulator(four_schedules):
    def order(key):
        return [r.schedule for r in sorted(four_schedules, key=lambda r: max(getattr(r.memory, key)))]

    assert order("peak_activation_bytes") == order("predicted_peak_activation_bytes")
    assert len({max(r.memory.peak_activation_bytes) for r in four_schedules}) == 4  # a real order, no ties
    for res in four_schedules:
        mem = res.memory
        for r, (m, p) in enumerate(zip(mem.peak_activation_bytes, mem.predicted_peak_activation_bytes)):
            assert m == pytest.approx(p, rel=0.15), (res.schedule, r)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_split_backward_the_prediction_is_exact_and_i_grows_what_zero_bubble_holds(four_schedules):
    by = {r.schedule: r for r in four_schedules}
    for name in ("1f1b", "gpipe"):
        mem = by[name].memory
        assert mem.peak_activation_bytes == pytest.approx(mem.predicted_peak_activation_bytes, rel=1e-9)
    for name in ("zb-h2", "zb-v"):  # W's gradients outweigh the output I lets go, on every stage
        added = by[name].memory.stage_activation_bytes
        assert all(added["I"][s] > 0 for s in added["F"]), name


def test_no_memory_counts_nothing_and_reports_no_bytes(capsys):
    import json

    from cli_helpers import run

    rc, out, _ = run(capsys, "train", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "2", "--d-model", "16",
                     "--seq", "8", "--steps", "1", "--no-memory", "--json")
    res = json.loads(out)
    assert rc == 0 and "peak_activation_bytes" not in res and res["losses"]
