"""Pipeline's device, autocast and recompute arguments refused in its own words, before any rank starts."""

import pytest
import torch

import stagewise
from stagewise.runtime.arguments import check_autocast, check_device
from stagewise.runtime.config import RunError


def _pipeline(**kw):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    return stagewise.Pipeline("1f1b", model, torch.nn.functional.mse_loss, **kw)


@pytest.mark.parametrize("kw, words", [
    (dict(device="bogus"), "`device` 'bogus': not a device torch knows"),
    (dict(device=3.5), "`device` must be a torch.device or its name"),
    (dict(device="cuda:9"), "`device` 'cuda:9': this machine has"),
    (dict(autocast=1), "`autocast` must be None or one of torch.bfloat16, torch.float16; got int 1"),
    (dict(autocast=torch.int8), "`autocast` must be None or one of"),
    (dict(recompute="x"), "`recompute` must be True, False or a list of stage numbers such as [0, 2]; got 'x'"),
    (dict(recompute=[0, "1"]), "`recompute` must be True, False or a list of stage numbers"),
])
def test_bad_arguments_are_refused_before_any_process_group(kw, words):
    with pytest.raises(RunError) as e:  # no process group exists: the argument is named first
        _pipeline(**kw)
    assert words in str(e.value)
    assert isinstance(e.value, stagewise.StagewiseError)


def test_good_arguments_pass():
    for device in (None, "cpu", torch.device("cpu")):
        check_device(device)
    for dtype in (None, torch.bfloat16, torch.float16):
        check_autocast(dtype)
