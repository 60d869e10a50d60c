"""Packed documents through a pipeline: pp2 runs of two families (one launch) equal the unpipelined run over the
same documents, loss and every gradient to 1e-5, and report the tokens, the padding and tokens/s."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stagewise.runtime import RunConfig
from stagewise.runtime.run.train import train, train_many
from runtime_helpers import TINY, rel_err

pytestmark = [pytest.mark.timeout(240)]

PACKED = dataclasses.replace(TINY, layers_n=2, pack=True)
BASE = RunConfig(schedule=None, ranks=1, microbatches=4, batch=8, steps=2, model=PACKED, collect=("grads",),
                 timeout=60, measure_memory=False)
FAMILIES = ("1f1b", "zb-h1")


@pytest.fixture(scope="module")
def runs():
    ref = train(BASE)
    cfgs = [dataclasses.replace(BASE, schedule=name, ranks=2) for name in FAMILIES]
    return ref, dict(zip(FAMILIES, train_many(cfgs)))


def test_packed_pipelined_runs_equal_the_unpipelined_run(runs):
    ref, out = runs
    for name, res in out.items():
        np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5, err_msg=name)
        assert set(res.grads) == set(ref.grads)
        for param, copies in res.grads.items():
            assert max(rel_err(g, ref.grads[param][0]) for g in copies) <= 1e-5, (name, param)


def test_the_result_reports_real_tokens_padding_and_rate(runs):
    ref, out = runs
    for res in (ref, *out.values()):
        js = res.to_json()
        assert js["tokens"] == sum(res.tokens) and res.tokens == ref.tokens  # the same documents
        assert 0 < js["padding_fraction"] < 1 and js["tokens"] == round(
            sum(res.token_places) * (1 - js["padding_fraction"]))
        assert js["tokens_per_s"] > 0 and sum(res.token_places) == BASE.steps * BASE.batch * PACKED.seq
