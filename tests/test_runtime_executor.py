"""The executor (runtime/execution/executor.py): a rank's lowered program, op by op, with real tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scale_helpers import SMALL, run_local  # noqa: E402

from stagewise.actions import parse  # noqa: E402
from stagewise.schedule import Schedule  # noqa: E402
from stagewise.schedules import generate  # noqa: E402


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_every_kind_of_backward_gives_the_same_gradients_on_one_rank(name):
    """B, or I then W: one generic walk over the ops, the same gradients as GPipe's."""
    full, _, loss_b = run_local(generate("gpipe", 1, 4), SMALL)
    got, _, loss = run_local(generate(name, 1, 4), SMALL)
    assert loss == pytest.approx(loss_b, rel=1e-6) and full.keys() == got.keys()
    for key in full:
        assert torch.allclose(full[key], got[key], rtol=1e-5, atol=1e-7), key


def test_a_program_that_leaves_a_backward_out_is_named():
    sched = generate("gpipe", 1, 2)
    short = Schedule(name="short", programs=(sched.programs[0][:-1],), placement=sched.placement,
                     microbatches=sched.microbatches, lanes=sched.lanes)  # the last B is missing
    with pytest.raises(RuntimeError, match=r"rank 0: \(stage, mb\) \(0, 1\) never finished its backward"):
        run_local(short, SMALL, meter=False)
    assert str(sched.programs[0][-1]) == str(parse("0B1"))
