"""`stagewise plan` as a user meets it after issue 31 and 26: one recommendation under ties (its rule in --help),
the printed stagewise line is the plan, and options that mean nothing or name the wrong culprit are refused."""

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402

from stagewise.plan.search.bands import RULE, recommend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ("plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "2M")
#: catches a hang only (the suite never asserts on speed)
HANG_S = 60


def test_the_rule_is_in_plan_help(capsys):
    rc, out, _ = run(capsys, "plan", "--help")
    out = " ".join(out.split())
    assert " ".join(RULE.split()) in out


def test_405b_gets_one_recommendation_that_says_its_headroom(tmp_path, capsys):
    rc, out, err = run(capsys, "plan", "--model", "llama3-405b", "--hardware", "h100", "--gpus", "16384",
                       "--global-batch-tokens", "16M", "--json", "-o", str(tmp_path / "p.csv"))
    assert rc == 0, err
    plan = json.loads(out)
    rec = plan["recommendation"]
    assert rec["rule"] == RULE and rec["tied"] > 1 and 1 <= rec["rank"] <= rec["tied"]
    assert plan["best"] == plan["ranking"][rec["rank"] - 1]
    assert "cannot be ranked" not in plan["why"] and "0.0% faster" not in plan["why"]
    assert "is recommended" in plan["why"] and "beside it the best" in plan["why"]
    if rec["headroom"] < rec["reserve"]:
        assert rec["tight"] and "less than the reserve itself" in plan["why"]


def test_recommend_prefers_headroom_within_the_resolution_then_fewer_ranks():
    from types import SimpleNamespace as R

    a = R(step_time=1.0, band=0.1, headroom=1e8, config=R(p=8, m=16))
    b = R(step_time=1.004, band=0.1, headroom=1e8, config=R(p=4, m=16))
    c = R(step_time=1.2, band=0.1, headroom=9e10, config=R(p=2, m=8))  # tied, but its upper end is 20% worse
    got = recommend([a, b, c], reserve=2e9)
    assert got.row is b and got.decided_by == "fewer pipeline ranks" and got.tied == 3
    assert got.tight and got.roomy is c
    lone = recommend([a, R(step_time=2.0, band=0.1, headroom=0, config=R(p=1, m=1))], reserve=0)
    assert lone.row is a and lone.tied == 1 and lone.decided_by == "fastest" and not lone.tight


def test_the_stagewise_line_says_dtype_microbatches_and_the_degrees(tmp_path, capsys):
    rc, out, err = run(capsys, *BASE, "--framework", "stagewise", "-o", str(tmp_path / "p.csv"))
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("stagewise:"))
    assert "--dtype bfloat16" in line and " -m " in line and " -p " in line and "--batch 256" in line


def test_a_moe_plan_for_stagewise_offers_expert_parallel_and_prints_it(tmp_path, capsys):
    """train --hf shards an HF mixture of experts' experts over --ep: the planner offers ep for stagewise, and
    the printed line carries it."""
    moe = json.loads((ROOT / "stagewise/plan/cluster/data/models/deepseek-v3.json").read_text())
    tiny = {**moe, "name": "tiny-moe", "layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn": 2048,
            "vocab": 32000, "seq": 512, "moe": {"experts": 16, "top_k": 2, "expert_ffn": 512}}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny))
    rc, out, err = run(capsys, "plan", "--model", str(path), "--hardware", "h100", "--gpus", "32",
                       "--global-batch-tokens", "64K", "--framework", "stagewise", "--schedules", "1f1b",
                       "-o", str(tmp_path / "p.csv"), "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert not any("Hugging Face" in k for k in plan["not_offered"])  # only what the runtime does not compose
    best = plan["best"]
    command = plan["frameworks"]["stagewise"]["command"]
    assert best["ep"] > 1 and f"--ep {best['ep']}" in command


def test_a_moe_file_with_a_huge_expert_count_is_refused_at_once(tmp_path, capsys):
    moe = json.loads((ROOT / "stagewise/plan/cluster/data/models/deepseek-v3.json").read_text())
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({**moe, "name": "huge", "moe": {**moe["moe"], "experts": 10**12}}))
    t0 = time.monotonic()
    err = fails(capsys, "plan", "--model", str(path), "--hardware", "h100", "--gpus", "64", "--global-batch-tokens",
                "1M", "-o", str(tmp_path / "p.csv"))
    assert time.monotonic() - t0 < HANG_S
    assert "experts 1000000000000: over the limit of 65,536 routed experts per MoE block" in err
    assert "STAGEWISE_MAX_EXPERTS" in err


@pytest.mark.parametrize("option, words", [
    ("--expert", "--ep '': expected whole numbers"),
    ("--sharding", "--sharding '': each must be one of"),
    ("-o", "-o '': give a file name"),
    ("--tensor", "--tp '': expected whole numbers"),
    ("--chunks", "--chunks '': expected whole numbers"),
])
def test_an_empty_option_is_refused_not_read_as_its_default(option, words, capsys):
    assert words in fails(capsys, *BASE, option, "")


def test_the_real_culprit_is_named_not_memory(tmp_path, capsys):
    out = str(tmp_path / "p.csv")
    err = fails(capsys, *BASE, "--framework", "deepspeed", "--schedules", "dualpipe", "-o", out)
    assert "--schedules dualpipe: no framework asked for runs it (DeepSpeed runs 1f1b)" in err
    assert "GiB" not in err
    err = fails(capsys, *BASE, "--sharding", "hsdp", "--hsdp-shard", "3", "-o", out)
    assert "--hsdp-shard 3: an HSDP shard group must divide the data-parallel ranks" in err and "GiB" not in err
