"""Expert parallel (parallel/ep.py): the built-in GPT's MoE blocks with their experts sharded over an ep group.

One launch of 4 ranks runs pp 2 x ep 2 under 1f1b, dualpipe and dualpipe-v (dropless; with capacity, and
padded to it), zb-h1 with recomputation (the all-to-alls replayed in I, none in W), pp 1 x dp 2 x ep 2
(experts summed over dp, dense weights over dp x ep), and SGD with global-norm clipping over the shards: step 1's loss and every gradient equal the unpipelined, unsharded
model on the whole batch (relative 1e-5), each expert exists on exactly one rank of its pipeline, and the
weights after the steps equal the reference's. The rest is checked without ranks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stagewise.runtime import RunConfig
from stagewise.runtime.parallel.mesh import Topology
from stagewise.runtime.config import RunError
from stagewise.runtime.run.models import GPTConfig
from stagewise.runtime.run.train import train, train_many
from runtime_helpers import rel_err

MOE = GPTConfig(layers_n=2, d_model=16, heads=2, seq=8, vocab=32, moe_experts=4, moe_top_k=2, moe_shared=1)
BASE = RunConfig(schedule=None, ranks=1, microbatches=4, batch=16, steps=2, model=MOE, collect=("grads", "params"),
                 timeout=60, optimizer="sgd", lr=0.5)
CAPPED = dataclasses.replace(MOE, moe_capacity=0.5)
PADDED = dataclasses.replace(MOE, moe_capacity=0.5, moe_pad=True)
CASES = [  # (label, config)
    ("1f1b", dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=2)),
    ("dualpipe", dataclasses.replace(BASE, schedule="dualpipe", ranks=2, ep=2)),
    ("dualpipe-v", dataclasses.replace(BASE, schedule="dualpipe-v", ranks=2, ep=2)),
    ("dualpipe-v capped", dataclasses.replace(BASE, schedule="dualpipe-v", ranks=2, ep=2, model=CAPPED)),
    ("1f1b padded clipped", dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=2, model=PADDED, clip=0.05)),
    ("dp 2 x ep 2", dataclasses.replace(BASE, schedule="1f1b", ranks=1, dp=2, ep=2)),
    ("zb-h1 recomputed", dataclasses.replace(BASE, schedule="zb-h1", ranks=2, ep=2, recompute=True)),
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def runs():
    return dict(zip((label for label, _ in CASES), train_many([c for _, c in CASES])))


@pytest.fixture(scope="module")
def references():
    out = {}
    for label, cfg in CASES:
        key = (cfg.model, cfg.clip)
        if key not in out:
            out[key] = train(dataclasses.replace(BASE, model=cfg.model, clip=cfg.clip))
    return {label: out[(cfg.model, cfg.clip)] for label, cfg in CASES}


def test_pp_x_ep_and_dp_x_ep_equal_the_unpipelined_unsharded_model(runs, references):
    worst = 0.0
    for label, res in runs.items():
        ref = references[label]
        np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5, err_msg=label)
        assert set(res.grads) == set(ref.grads), (label, set(ref.grads) ^ set(res.grads))
        for name, copies in res.grads.items():
            for g in copies:
                err = rel_err(g, ref.grads[name][0])
                worst = max(worst, err)
                assert err <= 1e-5, (label, name, err)
        for name, copies in res.params.items():  # SGD (and clipping over the shards) step for step
            assert max(rel_err(c, ref.params[name][0]) for c in copies) <= 1e-5, (label, name)
    assert worst > 0


def test_each_expert_lives_on_one_rank_of_its_pipeline_and_dense_weights_on_every_rank(runs):
    res = runs["dualpipe"]  # 4 ranks; DualPipe holds each stage twice: an expert on 2 ranks, a dense weight on 4
    experts = {n: len(c) for n, c in res.grads.items() if ".experts." in n}
    dense = {n: len(c) for n, c in res.grads.items() if ".experts." not in n and ".moe." in n}
    assert len(experts) == 2 * 4 * 4  # 2 blocks x 4 experts x (fc, out) x (weight, bias)
    assert set(experts.values()) == {2} and set(dense.values()) == {4}
    res = runs["1f1b"]
    assert {len(c) for n, c in res.grads.items() if ".experts." in n} == {1}


def test_topology_groups_over_two_dimensions():
    t = Topology.of_sizes(world=8, rank=5, dp=2, ep=2)  # order dp, ep, pp: rank 5 = dp 1, ep 0, pp 1
    assert t.coords == {"dp": 1, "ep": 0, "pp": 1}
    assert t.group_of("ep") == (5, 7) and t.group_of(("dp", "ep")) == (1, 3, 5, 7)
    assert t.groups(("dp", "ep")) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert t.data_shards == 4 and t.pipe_ranks == (4, 5)


@pytest.mark.parametrize("cfg, needle", [
    (dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=3), "`ep` 3 must divide `moe_experts` 4"),
    (dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=2, model=GPTConfig()),
     "`ep` 2 shards the experts of MoE blocks; the model has none"),
    (dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=2, save="ck"), "`save` with `ep` 2"),
    (dataclasses.replace(BASE, ep=2), "`ep` 2 needs a `schedule` run on ranks"),
    (dataclasses.replace(BASE, schedule="1f1b", ranks=2, ep=2, batch=12), "`batch` 12 does not split"),
])
def test_bad_expert_parallel_options_are_refused_before_any_rank_starts(cfg, needle):
    with pytest.raises(RunError) as e:
        cfg.check()
    assert needle in str(e.value)
