"""The MoE block (stages/moe.py): routing, capacity, padding, the balance loss, and the pair it carries.

In one process: the block against a per-token loop written from the rules in its docstring, each row of a
batch on its own against the whole batch (what makes micro-batches and data shards change nothing), padding
against no padding, the balance loss against a hand computation, and the options' messages.
"""

from __future__ import annotations

import math

import pytest
import torch

from stagewise.runtime.config import RunError
from stagewise.runtime.stages import moe as moe_mod
from stagewise.runtime.stages.moe import MoE
from stagewise.schedules.registry import whole_names

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()


def _block(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(experts=4, top_k=2, hidden=12)
    args.update(kw)
    return MoE(8, args.pop("experts"), args.pop("top_k"), args.pop("hidden"), **args)


def naive(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """The block's output token by token: first choices before second choices, earlier tokens first."""
    probs = torch.softmax(m.router(x), -1)
    w, c = probs.topk(m.top_k, -1)
    if m.top_k > 1:
        w = w / w.sum(-1, keepdim=True)
    rows, T, _ = x.shape
    out = torch.zeros_like(x)
    for b in range(rows):
        used = [0] * m.num_experts
        for k in range(m.top_k):
            for t in range(T):
                e = int(c[b, t, k])
                if used[e] < m.slots(T):
                    used[e] += 1
                    out[b, t] += w[b, t, k] * m.experts[str(e)](x[b, t])
    return out + (m.shared(x) if m.shared is not None else 0)


@pytest.mark.parametrize("kw", [{}, {"capacity": 1.0}, {"capacity": 0.5, "shared": 1}, {"top_k": 1},
                                {"capacity": 0.75, "pad": True, "shared": 2}])
def test_the_block_equals_the_per_token_rules(kw):
    m = _block(**kw)
    x = torch.randn(3, 6, 8)
    y, _ = m(x)
    torch.testing.assert_close(y, naive(m, x), rtol=1e-5, atol=1e-6)


def test_capacity_drops_tokens_and_the_kept_ones_are_the_first_choices():
    m = _block(capacity=0.5)  # C = ceil(0.5 * 6 * 2 / 4) = 2 of a row's 12 assignments per expert
    assert m.slots(6) == 2
    x = torch.randn(2, 6, 8)
    dropless = _block(capacity=None)
    assert not torch.allclose(m(x)[0], dropless(x)[0])  # something was dropped
    torch.testing.assert_close(m(x)[0], naive(m, x), rtol=1e-5, atol=1e-6)


def test_each_row_alone_equals_the_whole_batch():
    """Routing, capacity and the balance loss are per row: micro-batches and data shards change nothing."""
    for kw in ({}, {"capacity": 0.5}, {"capacity": 1.0, "pad": True, "shared": 1}):
        m = _block(**kw)
        x = torch.randn(4, 5, 8)
        y, aux = m(x)
        parts = [m(x[b:b + 1]) for b in range(4)]
        torch.testing.assert_close(torch.cat([p[0] for p in parts]), y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.stack([p[1] for p in parts]).mean(), aux)


def test_padding_to_capacity_changes_no_output_and_no_gradient():
    a, b = _block(capacity=1.0), _block(capacity=1.0, pad=True)
    x = torch.randn(3, 6, 8)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, aa = a(xa)
    yb, ab = b(xb)
    torch.testing.assert_close(ya, yb)
    (ya.square().sum() + aa).backward()
    (yb.square().sum() + ab).backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_the_balance_loss_by_hand():
    m = _block(aux=0.1)
    with torch.no_grad():
        m.router.weight.zero_()  # uniform probabilities: sum_e f_e P_e = 1 whatever the ties pick
    x = torch.randn(2, 5, 8)
    assert m(x)[1].item() == pytest.approx(0.1)
    m = _block(experts=2, top_k=1, aux=1.0)
    x = torch.randn(1, 4, 8)
    probs = torch.softmax(m.router(x), -1)[0]  # (4, 2)
    counts = torch.bincount(probs.argmax(-1), minlength=2).float()
    f = counts * 2 / 4
    want = float((f * probs.mean(0)).sum().detach())
    assert m(x)[1].item() == pytest.approx(want, rel=1e-6)


def test_the_balance_loss_trains_the_router_and_no_expert():
    m = _block(aux=1.0)
    _, aux = m(torch.randn(2, 5, 8))
    aux.backward()
    assert m.router.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in m.experts.parameters())


def test_an_unused_expert_gets_a_zero_gradient_and_every_name_is_kept():
    m = _block(experts=6, top_k=1)
    y, aux = m(torch.randn(1, 2, 8))  # 2 tokens reach at most 2 of the 6 experts
    (y.sum() + aux).backward()
    names = {n for n, _ in m.named_parameters()}
    assert {"router.weight", "experts.5.fc.weight", "experts.5.out.bias"} <= names
    unused = [e for e in range(6) if m.experts[str(e)].fc.weight.grad is None or
              not m.experts[str(e)].fc.weight.grad.any()]
    assert len(unused) >= 4


def test_the_pair_carries_the_aux_loss_and_with_aux_adds_it():
    h = torch.ones(2, 3)
    assert moe_mod.unpack(h) == (h, None) and moe_mod.pack(h, None) is h
    pair = moe_mod.pack(h, torch.tensor(0.5))
    assert moe_mod.unpack(pair)[1].item() == 0.5
    loss = moe_mod.with_aux(lambda out, y: (out - y).square().mean())
    assert loss(pair, h).item() == 0.5 and loss(h, h).item() == 0.0


def test_a_layers_own_pair_is_never_taken_for_the_aux_loss():
    """A (hidden, mask) boundary is the common case: unpack gives it back whole; pack keeps it beside the aux."""
    h, keep = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    assert moe_mod.unpack((h, keep)) == ((h, keep), None)
    (got_h, got_keep), aux = moe_mod.unpack(moe_mod.pack((h, keep), torch.tensor(0.25)))
    assert got_h is h and got_keep is keep and aux.item() == 0.25


@pytest.mark.parametrize("kw, needle", [
    ({"top_k": 5}, "`top_k` 5: a token goes to at most `experts` (4) experts"),
    ({"capacity": 0}, "`capacity` must be a finite number > 0"),
    ({"capacity": math.inf}, "`capacity` must be a finite number > 0"),
    ({"pad": True}, "`pad` pads every expert's buffer to its capacity: give `capacity` too"),
    ({"aux": -1}, "`aux` must be a finite number >= 0"),
    ({"experts": 0}, "`experts` must be >= 1"),
    ({"shared": 1.5}, "`shared` must be a whole number"),
    ({"experts": 10**12}, "`experts` 1000000000000 x `d_model` 8 (the router): over the limit of"),
    ({"hidden": 10**6, "shared": 10**3}, "`shared` 1000 x `hidden` 1000000 x `d_model` 8 (the shared experts): over"),
])
def test_bad_options_name_the_argument(kw, needle):
    from stagewise.errors import StagewiseError

    with pytest.raises(StagewiseError) as e:  # a size over its limit is a LimitError, before any allocation
        _block(**kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("call, needle", [
    (lambda: MoE(None, 4, 2, 12), "`d_model` must be a whole number; got None"),
    (lambda: MoE("8", 4, 2, 12), "`d_model` must be a whole number; got '8'"),
    (lambda: MoE(8, 4, 2, 12, aux=None), "`aux` must be a finite number >= 0; got None"),
    (lambda: MoE(8, 4, 2, 12, aux="0.1"), "`aux` must be a finite number >= 0; got '0.1'"),
    (lambda: MoE(8, 4, 2, 12, capacity=1.0, pad="yes"), "`pad` must be True or False; got 'yes'"),
    (lambda: moe_mod.with_aux(None), "stagewise.moe.with_aux: `loss_fn` must be a function (output, target) -> loss"),
    (lambda: moe_mod.with_aux("cross_entropy"), "`loss_fn` must be a function (output, target) -> loss, such as "
                                                "torch.nn.functional.cross_entropy; got str"),
    (lambda: moe_mod.pack(torch.zeros(2), "0.1"), "stagewise.moe.pack: `aux` must be the running aux loss as a "
                                                  "tensor, or None; got str"),
])
def test_every_argument_of_the_moe_api_is_checked_as_the_librarys_error(call, needle):
    """Issue 44: `with_aux(None)` (or a string) and its kin were a bare TypeError, late, from torch or a call."""
    import stagewise

    with pytest.raises(stagewise.StagewiseError) as e:
        call()
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_width_and_the_input_are_checked_before_any_division():
    with pytest.raises(RunError, match="`d_model` must be >= 1; got 0"):
        MoE(0, 4, 2, 12)
    m = _block()
    for shape in ((2, 0, 8), (0, 3, 8), (2, 3, 7), (2, 3)):
        with pytest.raises(RunError, match=r"MoE input must be floating hidden states \(rows, tokens, d_model=8\) "
                           rf"with rows and tokens >= 1; got shape \({', '.join(map(str, shape))},?\)"):
            m(torch.zeros(shape))


def test_a_capacity_beyond_every_token_is_dropless_not_an_overflow():
    x = torch.randn(2, 6, 8)
    huge, dropless = _block(capacity=1e300), _block(capacity=None)
    assert huge.slots(6) == 6  # an expert never gets more than a row's tokens
    for a, b in zip(huge(x), dropless(x)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(_block(capacity=1e300, pad=True)(x)[0], dropless(x)[0])


# ---- an own model with stagewise.MoE, pipelined under every family at p=2 (one launch)

@pytest.fixture(scope="module")
def every_family():
    from runtime_helpers import pipelined_own_moe

    import stagewise

    cases = [(name, name, {"microbatches": 4, "chunks": 2 if name in ("interleaved-1f1b", "looped-bfs") else None})
             for name in FAMILIES_RUN]
    return stagewise.launch(pipelined_own_moe, 2, cases, 8, 3, capacity=1.0, shared=1, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_own_moe_model_under_every_family_equals_the_unpipelined_model(every_family):
    from runtime_helpers import own_moe_reference, rel_err

    loss, grads = own_moe_reference(8, 3, capacity=1.0, shared=1)
    assert set(every_family) == set(FAMILIES_RUN)
    worst = 0.0
    for case, (got, per_rank, _) in every_family.items():
        assert got == pytest.approx(loss, rel=1e-5), case
        seen = set()
        for ranks_grads in per_rank:
            for name, g in ranks_grads.items():
                seen.add(name)
                worst = max(worst, rel_err(g, grads[name]))
                assert rel_err(g, grads[name]) <= 1e-5, (case, name)
        assert seen == set(grads), (case, set(grads) - seen)
    assert worst > 0  # different summation orders really were compared
