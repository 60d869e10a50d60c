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


WALKED = [("1f1b", 4, None), ("interleaved-1f1b", 4, 2), ("zb-v", 4, None), ("dualpipe-v", 4, None)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks, options", [(4, {"fsdp": 2}), (8, {"dp": 2, "tp": 2})])
def test_every_rank_executes_its_lowered_program_action_by_action(ranks, options):
    """pp 2 x fsdp 2 and pp 2 x dp 2 x tp 2 under four families: the actions each rank's executor ran (compute,
    SEND, RECV, UNSHARD, REDUCE_GRAD, RESHARD, the tied weight's TIE_GRAD, the step end) are its program as the
    core lowering writes it (stagewise.lowering, stagewise's overlap rule, the model's tie of its first and last
    stage, the headers of each boundary's first message), in order."""
    import stagewise
    from composed_helpers import Case, executed_actions
    from stagewise.lowering import lower
    from stagewise.lowering.options import FRAMEWORKS, LoweringOptions, Sizes

    cases = [Case(f"{name} {options}", name, m, v, options=dict(options)) for name, m, v in WALKED]
    got = stagewise.launch(executed_actions, ranks, cases, timeout=120, threads=1)
    for case in cases:
        sched, par, every = got[case.label]
        low = lower(sched, par, LoweringOptions(overlap=FRAMEWORKS["stagewise"], sizes=Sizes(tie=1.0),
                                                headers="first"))
        kinds = set()
        for pipe_rank, executed in every:
            want = [str(a) for a in low.programs[pipe_rank]]
            assert executed == want, (case.label, pipe_rank)
            kinds |= {a.kind for a in low.programs[pipe_rank] if hasattr(a, "peer")}
        assert {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD", "STEP_END"} <= kinds, case.label
        assert ("UNSHARD" in kinds and "RESHARD" in kinds) == ("fsdp" in options), case.label
        assert ("TIE_GRAD" in kinds) == (case.schedule in ("1f1b", "interleaved-1f1b")), case.label  # V: rank 0
