"""DTensors without importing them (runtime/dtensor.py): a plain tensor is no DTensor and is its own shard."""

import pytest

torch = pytest.importorskip("torch")

from stagewise.runtime.dtensor import is_dtensor, local  # noqa: E402


def test_a_plain_tensor_is_its_own_local_shard():
    t = torch.ones(3)
    assert not is_dtensor(t) and local(t) is t
    assert not is_dtensor(None) and not is_dtensor([t])


def test_a_dtensor_is_seen_and_gives_its_shard():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401  (DTensor's module loaded)
    from torch.distributed.tensor import DTensor, Replicate

    if not dist.is_available():
        pytest.skip("torch.distributed is not built")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh("cpu", [0])
        d = DTensor.from_local(torch.arange(4.0), mesh, [Replicate()])
        assert is_dtensor(d) and not is_dtensor(d.to_local())
        assert torch.equal(local(d), torch.arange(4.0))
    finally:
        dist.destroy_process_group()
