"""Pipeline parallel composed with FSDP2, ZeRO-1 and tensor parallel on one named mesh: equal to plain loops.

Four launches. The Pipeline API on 4 ranks: pp 2 x fsdp 2, pp 2 x tp 2 (one with the user's own DeviceMesh,
named in another order) and pp 2 x dp 2 with ZeRO-1, each with the own model and the tiny Llama (tp by its
base_model_tp_plan), over 1f1b, interleaved-1f1b, zb-v and dualpipe-v; the first also saved with the user's
own ``dcp.save``. The same on 8 ranks (pp 2 x fsdp 2 x tp 2; pp 2 x dp 2 x tp 2, with ZeRO-1 too; pp 1 x dp 2 x
fsdp 2 x tp 2, HSDP with TP). Config-driven runs (the built-in GPT and the
tiny Llama, as ``stagewise train`` runs them) save at pp 2 x fsdp 2 and pp 2 x tp 2, then resume at pp 4,
pp 1 x tp 2, pp 2 x fsdp 2 and unpipelined in this process; they also count every rank's state bytes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import api_helpers
from composed_helpers import Case, hf_reference, run_cases
from hf_helpers import save_tiny
from runtime_helpers import TINY, rel_err

import stagewise
from stagewise.runtime import RunConfig
from stagewise.runtime.run.train import train, train_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

FOUR = [
    Case("fsdp 1f1b", "1f1b", 4, options={"fsdp": 2}),
    Case("fsdp zb-v, resharded after each forward", "zb-v", 4, options={"fsdp": 2, "reshard_after_forward": True}),
    Case("tp interleaved (the user's mesh)", "interleaved-1f1b", 4, 2, mesh=(("tp", "pp"), (2, 2))),
    Case("tp dualpipe-v", "dualpipe-v", 4, options={"tp": 2}),
    Case("dp+zero 1f1b", "1f1b", 4, options={"dp": 2}, zero=True),
    Case("llama fsdp zb-v", "zb-v", 2, model="llama", options={"fsdp": 2}),
    Case("llama tp 1f1b (the user's mesh)", "1f1b", 4, model="llama", mesh=(("pp", "tp"), (2, 2))),
    Case("llama dp+zero interleaved", "interleaved-1f1b", 2, 2, model="llama", options={"dp": 2}, zero=True),
]
EIGHT = [
    Case("fsdp+tp 1f1b", "1f1b", 2, options={"fsdp": 2, "tp": 2}),
    Case("fsdp+tp dualpipe-v", "dualpipe-v", 4, options={"fsdp": 2, "tp": 2}),
    Case("llama fsdp+tp zb-v (the user's mesh)", "zb-v", 2, model="llama", mesh=(("fsdp", "pp", "tp"), (2, 2, 2))),
    Case("dp+tp 1f1b", "1f1b", 2, options={"dp": 2, "tp": 2}),
    Case("llama dp+tp+zero interleaved", "interleaved-1f1b", 2, 2, model="llama", options={"dp": 2, "tp": 2},
         zero=True),
    Case("dp+fsdp+tp (HSDP with TP) 1f1b", "1f1b", 2, options={"dp": 2, "fsdp": 2, "tp": 2}),
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def references(llama):
    return {"own": api_helpers.reference(), "llama": hf_reference(str(llama))}


@pytest.fixture(scope="module")
def four(llama, tmp_path_factory):
    dcp_dir = tmp_path_factory.mktemp("users-dcp") / "ck"
    return stagewise.launch(run_cases, 4, FOUR, str(llama), str(dcp_dir), timeout=120), dcp_dir


def check_equal(got: dict, cases: list[Case], references: dict) -> None:
    for case in cases:
        losses, state = got[case.label]
        want_losses, want_state = references[case.model]
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5, err_msg=case.label)
        assert set(state) >= set(want_state) - {"lm_head.weight"}, case.label
        for name, want in want_state.items():
            if name in state:
                assert rel_err(state[name], want) <= 1e-5, (case.label, name, rel_err(state[name], want))


def test_every_mesh_on_4_ranks_equals_the_plain_loop(four, references):
    got, _ = four
    assert list(got) == [c.label for c in FOUR]
    check_equal(got, FOUR, references)


def test_the_users_own_dcp_save_loads_into_the_plain_model_with_torchs_own_calls(four):
    """pp 2 x fsdp 2 saved with ``dcp.save({"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)})``:
    torch's get_state_dict/set_state_dict on the plain model read it (names, DTensor shards, flattened AdamW
    state), and the next step's loss equals the uninterrupted loop's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    _, folder = four
    plain, uninterrupted = nn.Sequential(*api_helpers.layers()), nn.Sequential(*api_helpers.layers())
    opts = [torch.optim.AdamW(m.parameters(), lr=api_helpers.LR) for m in (plain, uninterrupted)]
    for k in range(api_helpers.STEPS):
        loss = api_helpers.loss_fn(uninterrupted(api_helpers.batch(k)[0]), api_helpers.batch(k)[1])
        loss.backward()
        opts[1].step()
        opts[1].zero_grad()
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(plain, opts[0], options=options)
    state = {"model": model_sd, "optim": {k: v for k, v in optim_sd.items() if k.startswith("state.")}}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    set_state_dict(plain, opts[0], model_state_dict=model_sd, optim_state_dict={**optim_sd, **state["optim"]},
                   options=options)
    for (name, p), q in zip(plain.named_parameters(), uninterrupted.parameters()):
        assert rel_err(p.detach(), q.detach()) <= 1e-5, name
        assert rel_err(opts[0].state[p]["exp_avg"], opts[1].state[q]["exp_avg"]) <= 1e-4, name
    x, y = api_helpers.batch(api_helpers.STEPS)
    a, b = (api_helpers.loss_fn(m(x), y).item() for m in (plain, uninterrupted))
    assert abs(a - b) <= 1e-5 * b


def test_fsdp_x_tp_dp_x_tp_and_hsdp_x_tp_on_8_ranks_equal_the_plain_loop(llama, references):
    got = stagewise.launch(run_cases, 8, EIGHT, str(llama), timeout=180)
    check_equal(got, EIGHT, references)


# ---- config-driven runs: checkpoints that reshard, and the bytes each rank holds

BASE = RunConfig(schedule="1f1b", ranks=2, fsdp=2, microbatches=2, batch=8, steps=3, model=TINY, timeout=60,
                 collect=("params",))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text("A pipeline keeps every rank busy when the schedule is good. " * 30)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory, llama, text):
    """One launch of 4 ranks: the GPT at pp 2 x fsdp 2 uninterrupted and saving after step 2; at pp 2 x dp 2 with
    ZeRO-1 (one step); the tiny Llama at pp 2 x tp 2 uninterrupted and saving after step 2."""
    from stagewise.hf.hf_run import HFRun

    root = tmp_path_factory.mktemp("composed")
    hf = dataclasses.replace(BASE, model=HFRun(source=str(llama), data=str(text), seq=16), fsdp=1, tp=2,
                             collect=())
    cfgs = [BASE, dataclasses.replace(BASE, steps=2, save=str(root / "gpt")),
            dataclasses.replace(BASE, fsdp=1, dp=2, zero=1, steps=1, microbatches=4, collect=()),
            hf, dataclasses.replace(hf, steps=2, save=str(root / "llama"))]
    full, part, zero, hf_full, hf_part = train_many(cfgs)
    assert part.losses == full.losses[:2] and hf_part.losses == hf_full.losses[:2]
    return {"full": full, "zero": zero, "hf": hf_full, "gpt": root / "gpt", "llama": root / "llama", "hf_cfg": hf}


def test_a_checkpoint_saved_at_pp_2_x_fsdp_2_resumes_at_pp_4_at_pp_1_x_tp_2_and_unpipelined(saved):
    full, root = saved["full"], str(saved["gpt"])
    pp4 = dataclasses.replace(BASE, resume=root, ranks=4, fsdp=1, microbatches=4, collect=())
    hf = dataclasses.replace(saved["hf_cfg"], resume=str(saved["llama"]), tp=1, fsdp=2)  # pp 2 x tp 2 -> x fsdp 2
    (pp4, hf) = train_many([pp4, hf])
    tp2 = train(dataclasses.replace(BASE, resume=root, ranks=1, fsdp=1, tp=2, collect=()))
    alone = train(dataclasses.replace(BASE, schedule=None, ranks=1, fsdp=1, resume=root, collect=()))
    for res in (pp4, tp2, alone):
        assert res.checkpoint["resumed_step"] == 2 and len(res.losses) == 1
        assert abs(res.losses[0] - full.losses[2]) <= 1e-5 * full.losses[2], (res.schedule, res.ranks, res.tp)
    assert (tp2.ranks, tp2.tp, alone.schedule) == (1, 2, "none")
    assert abs(hf.losses[0] - saved["hf"].losses[2]) <= 1e-5 * saved["hf"].losses[2]
    assert hf.fsdp == 2 and hf.checkpoint["rng_restored"] is False


def _stage_bytes(p: int) -> list[tuple[int, float]]:
    """Per stage of the GPT cut evenly into ``p`` stages (the tied head its own copy): its parameter bytes, and
    what FSDP's uneven split of two ranks can move (half a row of each tensor)."""
    from stagewise.runtime.stages.stage import partition

    built = [TINY.layer(i) for i in range(TINY.num_layers)]
    out = []
    for rg in partition(TINY.num_layers, p):
        params = [q for i in rg for q in built[i].parameters()]
        out.append((sum(q.numel() * q.element_size() for q in params),
                    sum(q.numel() // q.shape[0] * q.element_size() for q in params) / 2))
    return out


def test_each_rank_holds_its_share_of_parameters_gradients_and_optimizer_state(saved):
    """pp 2 x fsdp 2: each rank half its stage (within FSDP's uneven rows), the pair exactly the stage; the
    prediction next to it is the same rule. ZeRO-1: whole parameters and gradients, the AdamW moments split
    over the dp pair."""
    stage = [b for b, _ in _stage_bytes(2)]
    fsdp = saved["full"].memory
    for r, (held, predicted) in enumerate(zip(fsdp.state_bytes, fsdp.predicted_state_bytes)):
        s = r % 2  # the default grid: fsdp outermost, then pp (ranks 0, 1 are one pipeline)
        assert abs(held["parameters"] - stage[s] / 2) <= _stage_bytes(2)[s][1], (r, held)
        assert held["gradients"] == held["parameters"] and held["optimizer"] == 2 * held["parameters"]
        assert predicted == {"parameters": stage[s] / 2, "gradients": stage[s] / 2, "optimizer": stage[s]}
    for s in range(2):
        assert fsdp.state_bytes[s]["parameters"] + fsdp.state_bytes[s + 2]["parameters"] == stage[s]
    zero = saved["zero"].memory
    for s in range(2):
        pair = [zero.state_bytes[s], zero.state_bytes[s + 2]]
        assert all(h["parameters"] == h["gradients"] == stage[s] for h in pair)
        assert sum(h["optimizer"] for h in pair) == 2 * stage[s] and min(h["optimizer"] for h in pair) > 0
        assert zero.predicted_state_bytes[s]["optimizer"] == stage[s]  # 2 x stage / dp 2
