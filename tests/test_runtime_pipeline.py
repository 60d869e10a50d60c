"""stagewise.Pipeline in a user's own loop equals the same model trained by a plain torch loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stagewise
from stagewise.schedules.registry import whole_names
from api_helpers import (STEPS, Net, batch, features, layers, loss_fn, reference, strict_factory_bytes, train_cases,
                         tree_reference, tree_train)

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()

pytestmark = [pytest.mark.timeout(300)]

P2 = [(name, 4, None) for name in FAMILIES_RUN]  # every family the registry has, at its default v
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


def test_a_tie_declared_by_name_in_a_factory_is_one_parameter():
    from api_helpers import train_tied_by_name

    want = reference()
    cases = [("1f1b", 4, None), ("zb-v", 4, None), ("dualpipe", 4, None)]
    got = stagewise.launch(train_tied_by_name, 2, cases, threads=1)
    for case in cases:
        assert_same(got[case], want, case)


def test_gradient_accumulation_and_global_norm_clipping_equal_torch():
    want = reference(accumulate=2, clip=0.5)
    got = stagewise.launch(train_cases, 2, [("1f1b", 4, None), ("zb-v", 2, None)], 2, 0.5, threads=1)
    for case, res in got.items():
        assert_same(res, want, case)


def test_recomputation_with_static_shapes_equals_torch():
    want = reference()
    cases = [("1f1b", 4, None), ("zb-v", 4, None)]
    got = stagewise.launch(train_cases, 2, cases, 1, None, 1, threads=1, recompute=True, static_shapes=True)
    for case in cases:
        assert_same(got[case], want, case)


def test_data_parallel_replicas_equal_torch():
    want = reference()
    got = stagewise.launch(train_cases, 4, [("1f1b", 2, None), ("dualpipe", 4, None)], 1, None, 2, threads=1)
    for case, res in got.items():
        assert_same(res, want, case)


@pytest.mark.parametrize("names", [("dp", "pp"), ("pp", "dp")])
def test_a_device_mesh_read_by_its_names_equals_torch(names):
    """(pp, dp) is not read as (dp, pp): the pipeline runs along the dimension named pp (issue 17)."""
    from api_helpers import train_on_mesh

    want = reference()
    got = stagewise.launch(train_on_mesh, 4, [("zb-v", 4, None)], names, threads=1)
    assert_same(got[("zb-v", 4, None)], want, "mesh")


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


def test_a_factory_is_asked_only_for_the_ranks_own_layers_and_each_rank_holds_only_their_bytes():
    from api_helpers import MINE, factory_layer

    got = stagewise.launch(strict_factory_bytes, 2, threads=1)
    for rank, (held, asked) in enumerate(got):
        assert asked == sorted(MINE[rank])
        want = sum(p.numel() * p.element_size() for i in MINE[rank] for p in factory_layer(i).parameters())
        assert held == want


@pytest.mark.parametrize("name, m", [("1f1b", 4), ("zb-v", 4)])
def test_dict_and_dataclass_boundaries_with_integer_leaves_and_changing_lengths_equal_torch(name, m):
    want = tree_reference()
    got = stagewise.launch(tree_train, 2, name, m, threads=1)
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-5 * abs(b), (got, want)


def test_eval_autocast_and_a_meta_module_with_split_points_equal_torch():
    torch.manual_seed(3)
    real = Net()
    state = {k: v.clone() for k, v in real.state_dict().items()}
    ranks = stagewise.launch(features, 2, state, threads=1)
    x, y = batch(0)
    model = nn.Sequential(*layers())
    with torch.no_grad():
        want = loss_fn(model(x), y).item()
        assert ranks[0]["eval_loss"] == pytest.approx(want, rel=1e-5)
        outs, mbs = ranks[1]["eval_outputs"]  # rank 1 holds the last stage
        assert mbs == (0, 1, 2, 3) and ranks[0]["eval_outputs"] == (None, ())
        torch.testing.assert_close(outs, model(x), rtol=1e-5, atol=1e-6)
    assert all(r["grads_after_eval"] == [] for r in ranks)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = loss_fn(model(x), y).item()
    assert ranks[0]["bf16_loss"] == pytest.approx(bf16, rel=2e-2) and ranks[0]["bf16_loss"] != want
    # the module form: each rank materialized only its layers (embed, blocks.0-1 | blocks.2-3, norm, head)
    assert [r["meta_devices"] for r in ranks] == [["cpu"], ["cpu"]]
    assert ranks[0]["meta_names"] == sorted(k for k in state if k.startswith(("embed.", "blocks.0.", "blocks.1.")))
    assert ranks[1]["meta_names"] == sorted(k for k in state if k.startswith(("blocks.2.", "blocks.3.", "norm.",
                                                                               "head.")))
    real_opt = torch.optim.SGD(real.parameters(), lr=0.1)
    for k in range(STEPS):
        loss = loss_fn(real(batch(k)[0]), batch(k)[1])
        loss.backward()
        real_opt.step()
        real_opt.zero_grad()
        assert ranks[0]["meta_losses"][k] == pytest.approx(loss.item(), rel=1e-5)
    for k, v in real.state_dict().items():
        torch.testing.assert_close(ranks[0]["meta_state"][k], v, rtol=1e-5, atol=1e-6)


def test_the_cli_runtime_takes_a_schedule_value_with_no_csv_in_between():
    from stagewise.runtime import RunConfig
    from stagewise.runtime.run.train import train_many
    from stagewise.runtime.run.models import GPTConfig

    model = GPTConfig(layers_n=2, d_model=16, heads=2, seq=8, vocab=32)
    base = RunConfig(schedule="zb-v", ranks=2, microbatches=4, batch=4, steps=2, model=model, threads=1)
    by_value = RunConfig(schedule=stagewise.generate("zb-v", 2, 4), ranks=2, microbatches=4, batch=4, steps=2,
                         model=model, threads=1)
    named, valued = train_many([base, by_value])
    assert valued.schedule == "zb-v" and valued.losses == named.losses
