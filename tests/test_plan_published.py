"""The published rows the analytic planner is calibrated against (benchmarks/bench_published.py): every
configuration of Megatron-LM SC21 Table 1, Llama 3 Table 4 and Megatron-Core's weak scaling (few micro-batches
per replica) predicted within 15%, one row per GPU type calibrated, the shipped error bands made of the rest."""

import importlib.util
from pathlib import Path

import pytest

from stagewise.plan.hardware import Hardware

_spec = importlib.util.spec_from_file_location(
    "bench_published", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_published.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def predicted():
    """row -> (per-GPU figure, best candidate), each row planned once."""
    return {row: bench.predict(row, Hardware.load(row.hardware)) for row in bench.ROWS}


def test_one_calibration_row_per_gpu_type():
    cal = [r.hardware for r in bench.ROWS if r.calibration]
    assert sorted(cal) == sorted(set(cal)) == ["a100", "h100"]
    assert sum(r.few for r in bench.ROWS) >= 5  # the few-micro-batch rows: 4 sequences per pipeline rank
    assert all(r.cluster for r in bench.ROWS)


@pytest.mark.parametrize("row", bench.ROWS, ids=lambda r: f"{r.model}-{r.gpus}")
def test_published_throughput_within_15_percent(predicted, row):
    got, best = predicted[row]
    assert best.t == row.t and best.config.p == row.p and best.config.dp * row.t * row.p == row.gpus
    assert best.framework == row.framework.name and row.framework.runs(best.config.family)
    assert got == pytest.approx(row.published, rel=0.15)
    if row.calibration:  # the shipped efficiency reproduces its calibration row
        assert got == pytest.approx(row.published, rel=0.01)


def test_the_shipped_bands_are_the_published_rows_largest_errors(predicted):
    errs = {row: got / row.published - 1 for row, (got, _) in predicted.items()}
    for gpu, band in bench.bands(errs).items():
        assert Hardware.load(gpu).band == pytest.approx(band, abs=0.001)  # --calibrate prints them
    big = [r for r in bench.ROWS if not r.few]
    assert len(big) == 12 and sum(bench.covered(errs, r) for r in big) >= 11  # each band made without its row


def test_layouts_print_each_layouts_best(capsys):
    row = bench.ROWS[0]  # gpt-1.7b on 32 A100s
    bench.layouts(row, Hardware.load(row.hardware), top=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all("TFLOP/s per GPU" in ln and "bubble" in ln for ln in lines)
    steps = [float(ln.split("step")[1].split()[0]) for ln in lines]
    assert steps == sorted(steps) and len({tuple(ln.split()[1:3]) for ln in lines}) == 3  # distinct t x p
