"""The planner's inputs as a hostile user gives them: model and hardware files, profiles, sizes and options.

Every case exits 2 with one line naming the option, file or field and the rule, under the
2 GiB memory cap of ``capped_cli`` and within seconds (a generous bound that catches a
hang, not a speed test); the planning cases that must run (a huge batch on a small model)
end with exit 0 in bounded time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capped_cli import assert_refused, run_capped

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "data/profiles/gpt-l32-d256-cpu.json"
CLUSTER = ["plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "2M",
           "--schedules", "1f1b", "-o", "{tmp}/p.csv"]


def _with(flag: str, value: str) -> list[str]:
    args = list(CLUSTER)
    args[args.index(flag) + 1] = value
    return args


#: (case id, argv, words the one line must contain)
CASES = [
    ("model-mlp-list", _with("--model", "{tmp}/mlp.json"), ["--model", "mlp must be one of gelu, swiglu"]),
    ("model-layers-1e9", _with("--model", "{tmp}/layers.json"), ["layers 1000000000", "STAGEWISE_MAX_LAYERS"]),
    ("model-nested", _with("--model", "{tmp}/nested.json"), ["--model", "nested too deeply"]),
    ("model-not-utf8", _with("--model", "{tmp}/latin1.json"), ["--model", "not UTF-8"]),
    ("model-digits", _with("--model", "{tmp}/digits.json"), ["--model", "digits"]),
    ("model-fifo", _with("--model", "{tmp}/fifo"), ["--model", "FIFO"]),
    ("model-hidden-huge", _with("--model", "{tmp}/hidden.json"), ["hidden must be <= 1.04858e+06"]),
    ("hardware-sources-text", _with("--hardware", "{tmp}/sources.json"), ["sources must be an object of texts"]),
    ("hardware-gpus-per-node", _with("--hardware", "{tmp}/node.json"), ["gpus_per_node", "STAGEWISE_MAX_GPUS"]),
    ("hardware-peak-tiny", _with("--hardware", "{tmp}/peak.json"), ["--hardware", "peak_flops must be >= 1e+09"]),
    ("hardware-reserve-all", _with("--hardware", "{tmp}/reserve.json"), ["reserve", "leaves nothing"]),
    # issue 44: a field the file does not have (a typo, or one it cannot set) is refused, not silently unused
    ("hardware-unknown-field", _with("--hardware", "{tmp}/unknown.json"),
     ["--hardware", "unknown field 'expert_efficiency'; the fields are format, version, name"]),
    ("hardware-reserve-typo", _with("--hardware", "{tmp}/reserve_typo.json"),
     ["reserve: unknown field 'fragmentaton'; the fields are context, communication, fragmentation"]),
    ("gpus-18-digits", _with("--gpus", "999999999999999989"), ["--gpus 999999999999999989", "STAGEWISE_MAX_GPUS"]),
    ("gpus-2-to-40", _with("--gpus", str(2**40)), ["--gpus 1099511627776", "STAGEWISE_MAX_GPUS"]),
    ("tokens-400-digits", _with("--global-batch-tokens", "9" * 400), ["--global-batch-tokens", "24 characters"]),
    ("tokens-fraction", _with("--global-batch-tokens", "1.3K"), ["--global-batch-tokens", "whole number"]),
    ("reserve-percent", [*CLUSTER, "--memory-reserve", "150%"], ["--memory-reserve '150%'", "from 0 to below 100"]),
    ("reserve-size", [*CLUSTER, "--memory-reserve", "lots"], ["--memory-reserve 'lots'"]),
    ("reserve-all", [*CLUSTER, "--memory-reserve", "80GiB"], ["--memory-reserve 80GiB", "leaves nothing"]),
    ("schedules-empty", [*CLUSTER, "--schedules", ""], ["--schedules ''", "leave the option out for every family"]),
    ("schedules-comma", [*CLUSTER, "--schedules", "1f1b,"], ["--schedules '1f1b,'"]),
    ("compare-schedules-empty", ["compare", "--schedules", ""], ["--schedules ''"]),
    ("framework-unknown", [*CLUSTER, "--framework", "colossal"], ["--framework", "invalid choice"]),
    ("output-missing-folder", _with("-o", "{tmp}/nowhere/p.md"), ["-o", "nowhere", "does not exist"]),
    ("output-suffix", _with("-o", "{tmp}/p.png"), ["-o", "unknown suffix '.png'"]),
    ("profile-huge-times", ["plan", "--profile", "{tmp}/huge.json", "-N", "2", "-G", "16"],
     ["--profile", "t_f must be finite numbers from 0 to 1e+06 seconds"]),
    ("profile-size-twice", ["plan", "--profile", "{tmp}/twice.json", "-N", "2", "-G", "16"],
     ["micro_batch_sizes lists 1 more than once"]),
    ("profile-overhead-huge", ["plan", "--profile", "{tmp}/overhead.json", "-N", "2", "-G", "16"],
     ["meta.step_overhead", "fixed_s must be at most"]),
    ("local-reserve-no-memory", ["plan", "--profile", PROFILE, "-N", "2", "-G", "16", "--memory-reserve", "1GiB"],
     ["--memory-reserve needs --memory"]),
    ("auto-free-at-i", ["auto", "--free-at-i", "-1"], ["--free-at-i", "fraction from 0 to 1"]),
    ("auto-layers-per-stage-inf", ["auto", "--layers-per-stage", "inf", "--hidden-size", "64", "--heads", "4",
                                   "--seq-length", "16"], ["--layers-per-stage", "finite"]),
    ("auto-hidden-400-digits", ["auto", "--hidden-size", "9" * 400, "--heads", "4", "--seq-length", "16"],
     ["--hidden-size", "18 digits"]),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    import os

    d = tmp_path_factory.mktemp("planfiles")
    model = json.loads((ROOT / "stagewise/plan/cluster/data/models/llama3-8b.json").read_text())
    hw = json.loads((ROOT / "stagewise/plan/cluster/data/hardware/h100.json").read_text())
    (d / "mlp.json").write_text(json.dumps({**model, "mlp": []}))
    (d / "layers.json").write_text(json.dumps({**model, "layers": 1e9}))
    (d / "hidden.json").write_text(json.dumps({**model, "hidden": 2**30, "heads": 2**10, "kv_heads": 2**10}))
    (d / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "latin1.json").write_bytes(b'{"format": "stagewise-model", "name": "caf\xe9"}')
    (d / "digits.json").write_text('{"format": "stagewise-model", "version": 1, "layers": ' + "9" * 5000 + "}")
    os.mkfifo(d / "fifo")
    (d / "sources.json").write_text(json.dumps({**hw, "sources": "abc"}))
    (d / "node.json").write_text(json.dumps({**hw, "gpus_per_node": 1e12}))
    (d / "peak.json").write_text(json.dumps({**hw, "peak_flops": 1e-300}))
    (d / "reserve.json").write_text(json.dumps({**hw, "reserve": {"context": 2**30, "fragmentation": 0.5,
                                                                  "communication": hw["memory"] / 2}}))
    (d / "unknown.json").write_text(json.dumps({**hw, "expert_efficiency": float("nan")}))
    (d / "reserve_typo.json").write_text(json.dumps({**hw, "reserve": {"fragmentaton": 0.9}}))
    prof = json.loads((ROOT / PROFILE).read_text())
    huge = json.loads(json.dumps(prof))
    for layer in huge["layers"]:
        layer["t_f"] = [1e300] * len(layer["t_f"])
    (d / "huge.json").write_text(json.dumps(huge))
    (d / "twice.json").write_text(json.dumps({**prof, "micro_batch_sizes": [1, 1, 4, 8, 16]}))
    (d / "overhead.json").write_text(json.dumps({**prof, "meta": {"step_overhead": {"fixed_s": 1e300}}}))
    return d


@pytest.fixture(scope="module")
def results(tmp):
    batch = [{"argv": [a.replace("{tmp}", str(tmp)) for a in argv]} for _, argv, _ in CASES]
    batch.append({"argv": ["plan", "--model", "gpt-1.7b", "--hardware", "a100", "--gpus", "8",
                           "--global-batch-tokens", "16M", "-o", f"{tmp}/big.csv", "--top", "3"]})
    got = run_capped(batch, timeout=600)
    return dict(zip([c[0] for c in CASES] + ["16M-tokens-small-model"], got))


@pytest.mark.parametrize("name,argv,words", CASES, ids=[c[0] for c in CASES])
def test_bad_planner_input_is_one_line_and_exit_2(results, name, argv, words):
    assert_refused(results[name], words)


def test_a_huge_batch_on_a_small_model_is_planned_in_bounded_time(results):
    """16M tokens of a 1.7B model on 8 GPUs: thousands of micro-batches per replica, costed from short steps."""
    r = results["16M-tokens-small-model"]
    assert r["rc"] == 0, r["err"][-2000:]
    assert "8192 sequences of 2048" in r["out"] and r["seconds"] < 60  # used to take over 30 s


def test_plan_says_where_the_default_output_went(tmp_path, monkeypatch, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_helpers import run

    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "plan", "--profile", str(ROOT / PROFILE), "-N", "2", "-G", "16", "--recompute", "off")
    assert rc == 0, err
    assert "wrote plan.csv" in out and "the default -o, in the current folder" in out
    assert (tmp_path / "plan.csv").is_file()


def _numeric_fields(d: dict, path: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict) and k != "sources":
            yield from _numeric_fields(v, (*path, k))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "version":
            yield (*path, k)


def test_every_numeric_field_of_a_model_or_hardware_file_is_finite_and_in_range(tmp_path, capsys):
    """Issue 44, the class (a hardware file's `efficiency: NaN` planned): every number of a shipped hardware file
    and of model files with MoE, MLA, MTP and sliding windows, set to NaN, infinity, -1 or 1e300, is refused by
    `plan` in one line naming the file and the field."""
    import copy
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_helpers import fails

    seen = 0
    for kind, name, flag in (("hardware", "h100", "--hardware"), ("models", "deepseek-v3", "--model"),
                             ("models", "gpt-oss-20b", "--model")):
        base = json.loads((ROOT / f"stagewise/plan/cluster/data/{kind}/{name}.json").read_text())
        for path in _numeric_fields(base):
            for bad in (float("nan"), float("inf"), -1, 1e300):
                data = copy.deepcopy(base)
                node = data
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = bad
                f = tmp_path / f"{name}.json"
                f.write_text(json.dumps(data))
                err = fails(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in _with(flag, str(f))])
                assert f"{flag} {f}" in err and path[-1] in err, (path, bad, err)
                seen += 1
    assert seen > 150
