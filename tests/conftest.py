import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


import pytest  # noqa: E402


@pytest.fixture
def one_rank_group(tmp_path):
    """A process group of this one process (gloo), for the runtime pieces that make groups; closed after."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from stagewise.runtime.launching.groups import close_groups, init_group

    init_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield torch.device("cpu")
    close_groups()


#: the small pp 2 x dp 2 layout that the preemption and restart tests share, for any model (CLI words)
ELASTIC_LAYOUT = ["--schedule", "1f1b", "-p", "2", "--dp", "2", "-m", "2", "--seq", "16", "--no-memory"]
#: ``ELASTIC_LAYOUT`` with the built-in GPT (`elastic_config` in the API's)
ELASTIC_RUN = [*ELASTIC_LAYOUT, "--layers", "2", "--d-model", "32"]
#: a restart on fewer ranks: with ``STAGEWISE_FAULT=LOSE_RANK_3`` rank 3 dies at step 3 and its slot stays gone
SHRINK = ["--save", "ck", "--save-every", "2", "--max-restarts", "1", "--elastic", "2:4", "--json"]
LOSE_RANK_3 = "lose:rank=3:action=1F0:step=3"


def shrunk(out: str, err: str) -> dict:
    """The JSON result of an ``ELASTIC_LAYOUT`` run with ``SHRINK`` that lost rank 3's slot, checked to have
    restarted once from the step-2 checkpoint, re-planned pp 2 x dp 2 -> pp 2 with m 4 (the global batch kept)."""
    import json

    res = json.loads(out)
    [r] = res["restarts"]
    assert "restart 1: rank 3 at 1F0 (step 3): exited with code 4" in err and "slot of rank 3 gone" in err
    assert (r["failed_after_step"], r["resumed_step"], r["lost_steps"], r["slots_lost"]) == (2, 2, 0, [3])
    assert r["old_layout"]["text"] == "pp 2 x dp 2, m 2" and r["new_layout"]["text"] == "pp 2, m 4"
    assert (res["ranks"], res["dp"], res["microbatches"]) == (2, 1, 4)  # m x dp = 4: the global batch of 8 kept
    assert all(r[k] >= 0 for k in ("detection_s", "restart_s", "replan_s", "load_s", "reshard_s", "downtime_s"))
    return res


def elastic_config(**changes):
    """``ELASTIC_RUN`` as a RunConfig (the same model, data and batch as the CLI makes of it)."""
    import dataclasses

    from stagewise import Parallelism
    from stagewise.runtime.config import RunConfig
    from stagewise.runtime.run.models import GPTConfig

    cfg = RunConfig(schedule="1f1b", parallelism=Parallelism(pp=2, dp=2), microbatches=2, batch=8,
                    model=GPTConfig(layers_n=2),
                    measure_memory=False, steps=7)
    return dataclasses.replace(cfg, **changes)


@pytest.fixture(scope="session")
def uninterrupted_elastic_run():
    """``ELASTIC_RUN`` for 7 steps, uninterrupted: what a preempted or restarted run must reproduce."""
    pytest.importorskip("torch")
    from stagewise.runtime import train

    return train(elastic_config())
