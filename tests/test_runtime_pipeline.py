"""stagewise.Pipeline in a user's own loop equals the same model trained by a plain torch loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stagewise
from api_helpers import STEPS, layers, reference, train_cases

pytestmark = [pytest.mark.timeout(300)]

P2 = [("gpipe", 4, None), ("1f1b", 4, None), ("interleaved-1f1b", 4, 2), ("looped-bfs", 4, 2), ("zb-h1", 4, None),
      ("zb-h2", 4, None), ("zb-v", 4, None), ("dualpipe", 4, None), ("dualpipe-v", 4, None)]
P4 = [("1f1b", 4, None), ("zb-v", 8, None), ("dualpipe", 8, None)]


def assert_same(got: tuple, want: tuple, case) -> None:
    losses, state = got
    assert len(losses) == len(want[0])
    for a, b in zip(losses, want[0]):
        assert abs(a - b) <= 1e-5 * abs(b), (case, losses, want[0])
    assert state.keys() == want[1].keys(), case
    for k, v in want[1].items():
        assert torch.allclose(state[k], v, rtol=1e-5, atol=1e-7), (case, k)


def test_every_family_at_two_ranks_equals_a_plain_torch_loop():
    want = reference()
    got = stagewise.launch(train_cases, 2, P2, threads=1)
    for case in P2:
        assert_same(got[case], want, case)


@pytest.mark.slow
def test_1f1b_zbv_and_dualpipe_at_four_ranks_equal_a_plain_torch_loop():
    want = reference()
    got = stagewise.launch(train_cases, 4, P4, threads=1)
    for case in P4:
        assert_same(got[case], want, case)


def test_gradient_accumulation_and_global_norm_clipping_equal_torch():
    want = reference(accumulate=2, clip=0.5)
    got = stagewise.launch(train_cases, 2, [("1f1b", 4, None), ("zb-v", 2, None)], 2, 0.5, threads=1)
    for case, res in got.items():
        assert_same(res, want, case)


def test_data_parallel_replicas_equal_torch():
    want = reference()
    got = stagewise.launch(train_cases, 4, [("1f1b", 2, None), ("dualpipe", 4, None)], 1, None, 2, threads=1)
    for case, res in got.items():
        assert_same(res, want, case)


def test_the_gathered_state_dict_loads_into_the_unpipelined_model_and_gives_its_outputs():
    losses, state = stagewise.launch(train_cases, 2, [("zb-v", 4, None)], threads=1)[("zb-v", 4, None)]
    model = nn.Sequential(*layers())
    model.load_state_dict(state, strict=True)
    _, want = reference()
    trained = nn.Sequential(*layers())
    trained.load_state_dict(want)
    x = torch.randint(0, 16, (3, 5))
    torch.testing.assert_close(model(x), trained(x), rtol=1e-5, atol=1e-6)
    assert len(losses) == STEPS
