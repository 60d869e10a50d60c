"""Every schedule family, run for real on gloo ranks, equals the unpipelined reference.

One launch per number of ranks runs every family (plus a schedule written by
torch and read from its CSV), so process start-up is paid twice in all. After
step 1 the loss and every parameter's gradient (each copy of a tied or
duplicated one) must equal the reference's to a norm-wise relative 1e-5, in
fp32; the losses of 3 steps must agree; copies must stay bitwise equal; and under
SGD with clipping the weights after 3 steps equal the reference's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stagewise.runtime import RunConfig
from stagewise.runtime.run.train import train, train_many
from stagewise.schedules import generate
from stagewise.schedules.registry import whole_names
from stagewise.schedules.registry import ScheduleArgError
from runtime_helpers import TINY, rel_err, torch_schedule_csv

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

M, BATCH, STEPS = 8, 8, 3
BASE = RunConfig(schedule=None, ranks=1, microbatches=M, batch=BATCH, steps=STEPS, model=TINY,
                 collect=("grads", "params"), timeout=60)


def families(p: int) -> list[str]:
    out = []
    for name in FAMILIES_RUN:
        try:
            generate(name, p, M)
        except ScheduleArgError:
            continue
        out.append(name)
    return out


@pytest.fixture(scope="module")
def reference():
    return train(BASE)


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("csv") / "torch_zbv_p4_m8.csv"
    path.write_text(torch_schedule_csv("ScheduleZBVZeroBubble", 4, M, 2))
    return path


@pytest.fixture(scope="module")
def runs(csv_file):
    """{(label, p): result} for every family at p=2 and p=4 and torch's ZBV from CSV; two launches."""
    out = {}
    for p in (2, 4):
        cfgs = [dataclasses.replace(BASE, schedule=name, ranks=p) for name in families(p)]
        if p == 4:
            cfgs.append(dataclasses.replace(BASE, schedule=None, csv=str(csv_file), ranks=4))
        for cfg, res in zip(cfgs, train_many(cfgs)):
            out[(cfg.schedule or "torch-csv", p)] = res
    return out


def test_every_family_ran_at_both_sizes(runs):
    assert {name for name, p in runs if p == 2} == set(FAMILIES_RUN)
    assert {name for name, p in runs if p == 4} == set(FAMILIES_RUN) | {"torch-csv"}
    assert runs[("torch-csv", 4)].schedule == "torch_zbv_p4_m8" and runs[("torch-csv", 4)].ranks == 4


def test_losses_of_every_step_equal_the_reference(runs, reference):
    for key, res in runs.items():
        np.testing.assert_allclose(res.losses, reference.losses, rtol=1e-5, err_msg=str(key))
    assert reference.losses[-1] < reference.losses[0]  # it learns


def test_every_gradient_after_step_one_equals_the_reference(runs, reference):
    ref = reference.grads
    worst = 0.0
    for key, res in runs.items():
        assert set(res.grads) == set(ref), key
        for name, copies in res.grads.items():
            for g in copies:
                err = rel_err(g, ref[name][0])
                worst = max(worst, err)
                assert err <= 1e-5, (key, name, err)
    assert worst > 0  # a real comparison of different summation orders, not one array with itself


def test_tied_and_duplicated_copies_stay_equal_after_every_step(runs):
    # (AdamW divides by the gradient's running RMS, so last-bit gradient differences from another summation
    # order move near-zero weights visibly: values are compared with the reference under SGD, below)
    for key, res in runs.items():
        for name, copies in res.params.items():
            for c in copies[1:]:
                assert np.array_equal(c, copies[0]), (key, name)
    tied = runs[("dualpipe", 4)].params["0.tok.weight"]
    assert len(tied) == 4  # embedding and head, in both DualPipe lanes


def test_measured_timelines_come_back_for_every_step(runs):
    for key, res in runs.items():
        assert len(res.timelines) == STEPS and res.timelines[0].source == "measured", key
        assert 0.0 <= res.measured_bubble_fraction < 1.0 and 0.0 <= res.predicted_bubble_fraction < 1.0


def test_sgd_with_global_norm_clipping_and_an_explicit_split_equal_the_reference():
    base = dataclasses.replace(BASE, optimizer="sgd", lr=0.5, clip=0.05, collect=("params",))
    ref = train(base)
    cfgs = [dataclasses.replace(base, schedule=name, ranks=2, split=(3, 5)) for name in ("1f1b", "zb-h1")]
    cfgs.append(dataclasses.replace(base, schedule="dualpipe", ranks=2, split=(5, 3)))
    for cfg, res in zip(cfgs, train_many(cfgs)):
        np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5, err_msg=cfg.schedule)
        for name, copies in res.params.items():
            assert max(rel_err(c, ref.params[name][0]) for c in copies) <= 1e-5, (cfg.schedule, name)
