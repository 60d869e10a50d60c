"""Data x pipeline parallelism: dp=2 replicas of p=2 on gloo equal the unpipelined run on the whole batch.

One launch of 4 ranks runs 1f1b (the tied embedding and head on two ranks),
zb-v (split backward, the tie on one rank, two stages per rank so a stage's
reduction starts before the rank's program ends), DualPipe (every layer in
two copies, one per lane), interleaved 1F1B with
recomputation, and 1f1b under SGD with global-norm clipping (the norm sums
over one pipeline, not over the replicas). The rank mapping, the batch
shares, the launcher's rank count and the options' checks are tested without
processes.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cli_helpers import raises_said
import torch
from runtime_helpers import TINY, rel_err

from stagewise.cli import main
from stagewise.runtime import RunConfig, RunError
from stagewise.runtime.parallel.mesh import Topology
from stagewise.runtime.run.train import train, train_many
from stagewise.runtime.run.worker import preflight
from stagewise.schedules import generate

M, BATCH = 4, 16
BASE = RunConfig(schedule=None, ranks=1, microbatches=M, batch=BATCH, steps=3, model=TINY,
                 collect=("grads", "params"), timeout=60)
SGD = {"optimizer": "sgd", "lr": 0.5, "clip": 0.05}


@pytest.fixture(scope="module")
def runs():
    """{label: (result, reference)}: five configs of p=2 x dp=2 in one launch, two references."""
    refs = {"adamw": train(BASE), "sgd": train(dataclasses.replace(BASE, **SGD))}
    cases = {
        "1f1b": dataclasses.replace(BASE, schedule="1f1b"),
        "zb-v": dataclasses.replace(BASE, schedule="zb-v"),
        "dualpipe": dataclasses.replace(BASE, schedule="dualpipe"),
        "interleaved+recompute": dataclasses.replace(BASE, schedule="interleaved-1f1b", recompute=True),
        "1f1b+sgd+clip": dataclasses.replace(BASE, schedule="1f1b", **SGD),
    }
    cfgs = [dataclasses.replace(c, ranks=2, dp=2) for c in cases.values()]
    results = train_many(cfgs)
    return {label: (res, refs["sgd" if "sgd" in label else "adamw"]) for label, res in zip(cases, results)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_losses_and_every_gradient_copy_equal_the_whole_batch_reference(runs):
    worst = 0.0
    for label, (res, ref) in runs.items():
        assert (res.ranks, res.dp) == (2, 2), label
        np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5, err_msg=label)
        assert set(res.grads) == set(ref.grads), label
        for name, copies in res.grads.items():
            for g in copies:
                err = rel_err(g, ref.grads[name][0])
                worst = max(worst, err)
                assert err <= 1e-5, (label, name, err)
    assert worst > 0  # different summation orders really were compared
    assert len(runs["1f1b"][0].grads["0.tok.weight"]) == 4  # embedding and head, in both replicas
    assert len(runs["dualpipe"][0].grads["0.tok.weight"]) == 8  # ... in both lanes too


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_copy_stays_bitwise_equal_across_ties_and_replicas(runs):
    for label, (res, _) in runs.items():
        for name, copies in res.params.items():
            assert len(copies) >= 2, (label, name)  # at least one copy per replica
            for c in copies[1:]:
                assert np.array_equal(c, copies[0]), (label, name)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_weights_under_sgd_and_clipping_equal_the_reference(runs):
    res, ref = runs["1f1b+sgd+clip"]
    for name, copies in res.params.items():
        assert max(rel_err(c, ref.params[name][0]) for c in copies) <= 1e-5, name


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_memory_is_reported_for_every_rank_of_every_replica(runs):
    res, _ = runs["1f1b"]
    meas, pred = res.memory.peak_activation_bytes, res.memory.predicted_peak_activation_bytes
    assert len(meas) == len(pred) == 4 and meas[:2] == meas[2:]  # the replicas hold the same
    assert meas == pytest.approx(pred, rel=1e-9)
    assert len(res.timelines) == 3 and res.timelines[0].ranks == 2  # replica 0's timeline


def test_rank_mapping_and_batch_shares():
    batch = torch.arange(16).reshape(8, 2)
    seen = []
    for rank in range(6):
        t = Topology.of_sizes(world=6, rank=rank, dp=2)
        assert (t.replica, t.pipe, t.pipe_ranks[0]) == (rank // 3, rank % 3, 3 * (rank // 3))
        assert t.global_rank(t.pipe, t.replica) == rank and t.data_index == t.replica
        if t.pipe == 0:
            seen.append(batch.chunk(t.data_shards)[t.data_index])
    assert torch.equal(torch.cat(seen), batch)  # the replicas' shares are the whole batch, in order
    assert Topology.of_sizes(world=2, rank=1).data_shards == 1


def test_the_launch_needs_p_times_dp_ranks():
    cfg = dataclasses.replace(BASE, schedule="1f1b", ranks=2, dp=2)
    assert preflight(cfg).ranks == 2
    assert preflight(cfg, 4, "WORLD_SIZE=4").ranks == 2
    with raises_said(RunError, r"--dp 2 does not divide the 3 ranks launched \(WORLD_SIZE=3\)"):
        preflight(cfg, 3, "WORLD_SIZE=3")
    with raises_said(RunError, r"needs 2 ranks .*; 3 were launched per replica \(--dp 2\) \(WORLD_SIZE=6\)"):
        preflight(cfg, 6, "WORLD_SIZE=6")
    with raises_said(RunError, "--batch 12 does not split into --dp 2 replicas of --microbatches 4"):
        dataclasses.replace(cfg, batch=12).check()
    with raises_said(RunError, "--dp 2 needs a --schedule run on ranks"):
        dataclasses.replace(BASE, dp=2).check()


def test_cli_dp_options(capsys, monkeypatch):
    from stagewise.cli import build_parser
    from stagewise.cli.train import config_from
    from stagewise.cli.train_scale import apply

    def cfg(*argv):
        args = build_parser().parse_args(["train", *argv])
        return apply(config_from(args), args)

    c = cfg("--schedule", "1f1b", "-p", "2", "--dp", "2", "-m", "8")
    assert (c.ranks, c.dp, c.batch) == (2, 2, 16)  # the default batch covers whole micro-batches per replica
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert cfg("--schedule", "1f1b", "--dp", "2").ranks == 4  # under torchrun: -p is WORLD_SIZE / dp
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["train", "--schedule", "none", "--dp", "2"]) == 2
    assert "--dp 2 needs a --schedule run on ranks" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_dp_2_p_2_launches_4_ranks_and_reports_them(capsys):
    rc = main(["train", "--schedule", "1f1b", "-p", "2", "--dp", "2", "-m", "2", "--layers", "2", "--d-model", "32",
               "--seq", "16", "--steps", "1", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and (res["ranks"], res["dp"]) == (2, 2)
    assert len(res["peak_activation_bytes"]) == len(res["predicted_peak_activation_bytes"]) == 4


def test_the_planners_verify_and_train_command_run_dp_and_recompute(tmp_path):
    from plan_fixtures import gpt_profile

    from stagewise.plan.search import Cluster
    from stagewise.plan.search import train_command
    from stagewise.plan.search import Link
    from stagewise.plan.search import Searcher, Space, search
    from stagewise.profiling.verify import _run_config

    prof = dataclasses.replace(gpt_profile(blocks=6), meta={"gpt": dataclasses.asdict(TINY), "threads": 1})
    link = Link(latency=1e-4, bandwidth=1e9)
    cl = Cluster(devices=4, per_node=4, memory=None, intra=link, inter=link)
    cands = search(Searcher(profile=prof, cluster=cl, global_batch=16, space=Space(families=("1f1b",),
                                                                                    recompute=(True,))))
    c = next(c for c in cands if c.config.dp == 2)
    cfg = _run_config(c, TINY, prof, 3)
    assert (cfg.ranks, cfg.dp, cfg.recompute, cfg.batch) == (2, 2, True, 16)
    cfg.check()
    assert preflight(cfg, 4).ranks == 2
    line = train_command(c, prof, None, 16)
    assert "--dp 2 --recompute" in line and "--batch 16" in line and "#" not in line  # no caveat left
