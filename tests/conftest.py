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
