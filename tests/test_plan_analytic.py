"""The analytic profile: Korthikanti et al.'s activation bytes, FLOP-derived times, tensor-parallel terms."""

import pytest

from stagewise.plan.cluster import TensorParallel, analytic_profile, block_activation_bytes, boundary_bytes, score_bytes, tp_allreduce_time
from stagewise.plan.cluster import Hardware
from stagewise.plan.cluster import TransformerSpec

GPT = TransformerSpec.load("gpt-145b")  # gelu, dropout, materialised attention: the paper's setting


@pytest.mark.parametrize("b", [1, 2])
def test_korthikanti_activation_bytes(b):
    s, h, a = GPT.seq, GPT.hidden, GPT.heads
    sbh = s * b * h
    # Korthikanti et al. 2022, Sec. 4.1-4.2: t = 1; tensor parallel; tensor + sequence parallel
    assert block_activation_bytes(GPT, b, TensorParallel(t=1)) == 34 * sbh + 5 * a * s * s * b
    no_sp = TensorParallel(t=8, sequence_parallel=False)
    assert block_activation_bytes(GPT, b, no_sp) == pytest.approx(sbh * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    assert block_activation_bytes(GPT, b, TensorParallel(t=8)) == pytest.approx(sbh / 8 * (34 + 5 * a * s / h))


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_table2_recomputation(t):
    """Korthikanti et al. 2022, Table 2: per-layer activation bytes by technique."""
    s, h, a, b = GPT.seq, GPT.hidden, GPT.heads, 1
    sbh = s * b * h
    tp, sp = TensorParallel(t=t, sequence_parallel=False), TensorParallel(t=t)
    assert block_activation_bytes(GPT, b, tp) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert block_activation_bytes(GPT, b, sp) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert block_activation_bytes(GPT, b, tp, "selective") == pytest.approx(sbh * (10 + 24 / t))
    assert block_activation_bytes(GPT, b, sp, "selective") == pytest.approx(sbh * 34 / t)
    assert block_activation_bytes(GPT, b, tp, "full") == 2 * sbh
    assert block_activation_bytes(GPT, b, sp, "full") == 2 * sbh / t  # the input is scattered along s
    assert block_activation_bytes(GPT, 1, TensorParallel(t=1), "selective") == 34 * sbh
    assert score_bytes(GPT, 2) == 5 * a * s * s * 2


def test_selective_recomputes_the_attention_core_in_the_backward():
    hw = Hardware.load("a100")
    tp = TensorParallel(t=8, sequence_parallel=False)
    off, sel, full = (analytic_profile(GPT, hw, tp, (1,), recompute=x).layers[1] for x in ("off", "selective", "full"))
    assert off.activation_bytes[0] == block_activation_bytes(GPT, 1, tp)
    assert sel.activation_bytes[0] == block_activation_bytes(GPT, 1, tp, "selective")
    assert sel.t_f[0] == off.t_f[0] and sel.t_w[0] == off.t_w[0]  # the forward and W do not change
    core = GPT.attention_flops(GPT.seq) / 8 / hw.rate + score_bytes(GPT, 1) / 8 / hw.memory_bandwidth
    assert sel.t_i[0] - off.t_i[0] == pytest.approx(core)  # Q K^T, softmax, dropout, x V once more
    assert core < 0.1 * off.t_b[0]  # Korthikanti et al.: a few percent of the step for most of the memory
    # full: every block its own checkpoint, keeping its input and replaying its forward in I
    assert full.activation_bytes[0] == block_activation_bytes(GPT, 1, tp, "full") == 2 * GPT.seq * GPT.hidden
    assert full.t_i[0] == pytest.approx(off.t_i[0] + off.t_f[0]) and full.t_f[0] == off.t_f[0]
    with pytest.raises(ValueError, match="recompute must be one of off, selective, full; got 'some'"):
        analytic_profile(GPT, hw, tp, (1,), recompute="some")
    # flash attention keeps no scores: selective is the plain profile
    llama = TransformerSpec.load("llama3-8b")
    a, b = (analytic_profile(llama, hw, TensorParallel(t=2), (1,), recompute=x).layers[1] for x in ("off", "selective"))
    assert (a.activation_bytes, a.t_i, a.t_f) == (b.activation_bytes, b.t_i, b.t_f)


def test_flash_attention_backward_recomputes_qk():
    hw = Hardware.load("h100")
    llama = TransformerSpec.load("llama3-8b")
    blk = analytic_profile(llama, hw, TensorParallel(t=1), (1,)).layers[1]
    mm = llama.block_matmul_flops(llama.seq) / hw.rate
    att = 0.5 * llama.attention_flops(llama.seq) / hw.rate  # causal
    act = block_activation_bytes(llama, 1, TensorParallel(t=1)) / hw.memory_bandwidth
    assert blk.t_f[0] == pytest.approx(mm + att + act)
    assert blk.t_i[0] == pytest.approx(mm + 2.5 * att + 2 * act)  # 5 products in the backward, 2 in the forward


def test_flash_attention_and_swiglu_change_the_terms():
    llama = TransformerSpec.load("llama3-8b")
    s, h, f, kv = llama.seq, llama.hidden, llama.ffn, llama.kv_dim
    # no dropout, no s^2 scores; Q, K, V (GQA), output projection input, three SwiGLU tensors, norms, inputs
    want = 4 * s * h + 2 * s * h + 2 * s * h + 2 * s * h + 4 * s * kv + 2 * s * h + 6 * s * f
    assert block_activation_bytes(llama, 1, TensorParallel(t=1)) == want


def test_block_times_follow_flops_and_split_backward():
    hw = Hardware.load("h100")
    prof = analytic_profile(GPT, hw, TensorParallel(t=1), (1, 2))
    blk = prof.layers[1]
    assert prof.symbols == ("E",) + ("t",) * GPT.layers + ("H",)
    mm = GPT.block_matmul_flops(GPT.seq) / hw.rate
    assert blk.t_w[0] == pytest.approx(mm)  # W: the weight-side multiplies only
    assert blk.t_b[0] == pytest.approx(blk.t_i[0] + blk.t_w[0])
    assert 2 * blk.t_f[0] * (1 - 1e-12) <= blk.t_b[0] < 2.2 * blk.t_f[0]  # backward ~ 2 x forward (exactly at t=1)
    assert blk.t_f[1] == pytest.approx(2 * blk.t_f[0], rel=1e-9)  # twice the sequences, twice the time
    assert blk.param_bytes == 2 * GPT.block_params()
    assert prof.tied and prof.tied[0][0] == (0, GPT.layers + 1)  # GPT ties its embedding and head


def test_tensor_parallel_divides_work_and_adds_collectives():
    hw = Hardware.load("a100")
    one = analytic_profile(GPT, hw, TensorParallel(t=1, sequence_parallel=False), (1,)).layers[1]
    eight = analytic_profile(GPT, hw, TensorParallel(t=8, sequence_parallel=False), (1,)).layers[1]
    assert eight.t_w[0] == pytest.approx(one.t_w[0] / 8)
    assert eight.param_bytes == pytest.approx(one.param_bytes / 8)
    nbytes = 2 * GPT.seq * GPT.hidden
    comm = 2 * tp_allreduce_time(nbytes, 8, hw.intra)
    assert comm == pytest.approx(2 * (2 * 7 * hw.intra.latency + 2 * 7 / 8 * nbytes / hw.intra.bandwidth))
    act = block_activation_bytes(GPT, 1, TensorParallel(t=8, sequence_parallel=False))
    mm_att = eight.t_f[0] - act / hw.memory_bandwidth - comm
    assert mm_att == pytest.approx((one.t_f[0] - block_activation_bytes(GPT, 1, TensorParallel(t=1))
                                    / hw.memory_bandwidth) / 8)
    assert eight.output_bytes[0] == boundary_bytes(GPT, 1, TensorParallel(t=8)) == nbytes / 8
    assert tp_allreduce_time(nbytes, 1, hw.intra) == 0.0


def test_head_costs_a_vocabulary_matmul():
    llama = TransformerSpec.load("llama3-405b")
    hw = Hardware.load("h100")
    prof = analytic_profile(llama, hw, TensorParallel(t=8), (1,))
    head, blk = prof.layers[-1], prof.layers[1]
    assert head.t_w[0] == pytest.approx(2 * llama.seq * llama.hidden * llama.vocab / 8 / hw.rate)
    assert 0.4 < head.t_f[0] / blk.t_f[0] < 0.8  # about 0.6 of a block: the last stage takes a block fewer
    assert not prof.tied
