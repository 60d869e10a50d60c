"""The memory model: what each action allocates and frees, a GPT layer's M_B and M_W, caps per rank."""

from __future__ import annotations

import json

import pytest

from cli_helpers import fails, run
from stagewise.costs import CostError, Costs, MemoryCap, transformer_activation, with_transformer_memory
from stagewise.schedules import generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics


def test_m_b_and_m_w_are_the_zero_bubble_papers_per_layer_bytes():
    h, a, s, b = 4096, 32, 2048, 2
    act = transformer_activation(h, a, s, b, layers=3)
    assert act.m_b == (34 * s * b * h + 5 * a * s * s * b) * 3
    assert act.m_w == 32 * s * b * h * 3
    assert act.free_at_i == pytest.approx((2 * h + 5 * a * s) / (34 * h + 5 * a * s))


def test_f_allocates_m_b_i_frees_all_but_m_w_and_w_the_rest():
    act = transformer_activation(1024, 16, 512)
    sc = with_transformer_memory(Costs(), act).resolve(2)
    assert sc.allocated("F", 1, unit_bytes=True) == act.m_b
    assert sc.allocated("I", 1, unit_bytes=True) == pytest.approx(-(act.m_b - act.m_w))
    assert sc.allocated("W", 1, unit_bytes=True) == pytest.approx(-act.m_w)
    assert sc.allocated("B", 0) == -1.0


def test_the_peak_in_bytes_counts_what_w_still_holds():
    # 1F1B-like ZB-H1 on 2 ranks, m=2: rank 0 holds F0 F1 and, after I0, M_W of mb 0 until W0
    act = transformer_activation(64, 4, 32)
    costs = with_transformer_memory(Costs(), act)
    mt = metrics(simulate(generate("zb-h1", 2, 2), costs))
    assert mt.peak_activation_bytes[0] == pytest.approx(2 * act.m_b)
    assert mt.peak_activation_bytes[1] == pytest.approx(act.m_b + act.m_w)  # F1 runs before W0


@pytest.mark.parametrize("cap, words", [
    (MemoryCap(values=(0,)), "--cap must be > 0 and finite (no order runs a forward without memory); got 0 for "
                             "rank 0"),
    (MemoryCap(values=(float("inf"),)), "got inf for rank 0"),
    (MemoryCap(values=(2, -1, 2, 2)), "got -1 for rank 1"),
    (MemoryCap(values=(2, 2)), "--cap has 2 values; give one, or one per rank (4)"),
    (MemoryCap(values=(1e9,), unit="bytes"), "--cap-bytes needs the activation sizes in bytes"),
])
def test_bad_caps_are_named(cap, words):
    with pytest.raises(CostError, match=words.replace("(", r"\(").replace(")", r"\)")):
        simulate(generate("1f1b", 4, 8), Costs(cap=cap))


def test_simulate_reports_peak_against_the_cap(capsys):
    rc, out, _ = run(capsys, "simulate", "zb-h1", "-p", "4", "-m", "8", "--cap", "3", "--json")
    res = json.loads(out)
    assert rc == 0 and res["memory_cap"] == [3] * 4 and res["cap_unit"] == "chunks"
    assert res["within_cap"] is False and res["peak_activations"] == [4, 4, 4, 4]  # W frees: ZB-H1 holds p
    assert res["memory_model"]["chunks"]["F"] == [1.0] * 4
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--cap", "3")
    assert "1f1b: peak chunk-units per rank 4 3 2 1; cap 3 3 3 3: over the cap on rank 0" in out


def test_compare_in_bytes_from_the_model_shape(capsys):
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", "zb-v,v-half,v-min",
                     "--hidden-size", "1024", "--heads", "16", "--seq-length", "1024", "--cap-bytes", "8e8",
                     "--json")
    res = {r["schedule"]: r for r in json.loads(out)}
    act = transformer_activation(1024, 16, 1024)
    assert res["v-min"]["memory_model"]["free_at_i"] == pytest.approx(act.free_at_i)
    assert max(res["v-min"]["peak_activation_bytes"]) < max(res["v-half"]["peak_activation_bytes"]) < \
        max(res["zb-v"]["peak_activation_bytes"])
    assert [res[n]["within_cap"] for n in ("zb-v", "v-half", "v-min")] == [False, True, True]


def test_the_picture_says_the_cap(capsys):
    rc, out, _ = run(capsys, "draw", "v-min", "-p", "4", "-m", "8", "--cap", "4", "--width", "100")
    assert rc == 0 and "cap 4 chunk-units: within" in out


@pytest.mark.parametrize("argv, words", [
    (["--cap", "0"], "--cap must be > 0"),
    (["--cap", "nan"], "--cap must be > 0 and finite"),
    (["--cap", "two"], "--cap two: expected a number"),
    (["--cap", "2", "--cap-bytes", "9"], "give either --cap (chunk-units) or --cap-bytes, not both"),
    (["--hidden-size", "1024"], "--hidden-size needs --hidden-size, --heads and --seq-length together"),
    (["--hidden-size", "0", "--heads", "2", "--seq-length", "8"], "--hidden-size must be a whole number >= 1"),
])
def test_bad_memory_options_exit_2_naming_the_option(capsys, argv, words):
    assert words in fails(capsys, "simulate", "1f1b", *argv)


def test_the_workshop_reports_the_cap():
    from stagewise.workshop import api

    res = {r["schedule"]: r for r in api.payload(api.parse_settings({"schedules": "v-min,zb-v", "cap": "3"}))["results"]}
    assert res["v-min"]["within_cap"] is True and res["zb-v"]["within_cap"] is False
    with pytest.raises(api.SettingError) as e:
        api.payload(api.parse_settings({"cap": "-1"}))
    assert e.value.field == "cap"
