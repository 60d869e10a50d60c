"""The unpipelined reference (runtime/run/reference.py): the oracle every schedule is compared with."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from runtime_helpers import TINY  # noqa: E402

from stagewise.runtime import RunConfig  # noqa: E402
from stagewise.runtime.run.reference import run_reference  # noqa: E402


def test_the_reference_is_a_plain_loop_over_the_same_layers_with_the_tie_shared():
    res = run_reference(RunConfig(schedule=None, ranks=1, steps=2, batch=4, model=TINY, lr=1e-3))
    layers = TINY.layers().build_all()
    assert layers[-1].weight is layers[0].tok.weight  # one Parameter used twice, as a plain model has it
    model = nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for k, got in enumerate(res.losses):
        x, y = TINY.batch(k, 4)
        loss = TINY.loss(model(x), y)
        assert got == pytest.approx(loss.item(), rel=1e-6)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert (res.schedule, res.ranks) == ("none", 1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_reference_saves_a_checkpoint_that_a_pipeline_and_the_reference_resume(tmp_path):
    """Issue 44: the reference keeps checkpoints as a pipeline does (any layout resumes them, the losses go on as
    the uninterrupted run's), with the same manifest and the same refusals."""
    import dataclasses
    import json

    from stagewise.runtime import RunError
    from stagewise.runtime.resilience import checkpoint_files as files
    from stagewise.runtime.run.train import train

    base = RunConfig(schedule=None, ranks=1, steps=4, batch=4, model=TINY, lr=1e-3, collect=("params",))
    full = run_reference(base)
    part = run_reference(dataclasses.replace(base, steps=2, save=str(tmp_path / "s"), save_every=1))
    assert part.losses == full.losses[:2]
    assert part.checkpoint["saved"] == [str(tmp_path / "s" / f"step-0000000{k}") for k in (1, 2)]
    manifest = json.loads((tmp_path / "s" / "step-00000002" / files.MANIFEST).read_text())
    assert (manifest["world"], manifest["layout"]["schedule"], manifest["step"]) == (1, "none", 2)
    alone = run_reference(dataclasses.replace(base, resume=str(tmp_path / "s")))
    assert alone.losses == full.losses[2:]
    piped = train(dataclasses.replace(base, schedule="1f1b", ranks=2, microbatches=2, resume=str(tmp_path / "s"),
                                      timeout=60))
    assert piped.losses == pytest.approx(full.losses[2:], rel=1e-5)
    with pytest.raises(RunError, match="another run"):  # a second run into the same folder, as a pipeline's
        run_reference(dataclasses.replace(base, steps=2, save=str(tmp_path / "s")))
    with pytest.raises(RunError, match="`save_on_signal` needs a `schedule` run on ranks"):
        run_reference(dataclasses.replace(base, save=str(tmp_path / "t"), save_on_signal=5.0))
