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


#: the small pp 2 x dp 2 run that the preemption and restart tests share (CLI words; `elastic_config` in the API's)
ELASTIC_RUN = ["--schedule", "1f1b", "-p", "2", "--dp", "2", "-m", "2", "--layers", "2", "--d-model", "32", "--seq",
               "16", "--no-memory"]


def elastic_config(**changes):
    """``ELASTIC_RUN`` as a RunConfig (the same model, data and batch as the CLI makes of it)."""
    import dataclasses

    from stagewise import Parallelism
    from stagewise.runtime.run.config import RunConfig
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
