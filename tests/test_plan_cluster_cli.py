"""`stagewise plan --model --hardware --gpus --global-batch-tokens` as a user meets it, and its torch-free core."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stagewise import torch_csv

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ("plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "2M",
        "--schedules", "1f1b,interleaved-1f1b", "--chunks", "2")


def test_plan_a_cluster_prints_table_frameworks_and_csv(tmp_path, capsys):
    csv = tmp_path / "plan.csv"
    rc, out, err = run(capsys, *BASE, "-o", str(csv), "--top", "3")
    assert rc == 0, err
    assert "llama3-8b on 64 x h100" in out and "256 sequences of 8192" in out
    assert "MFU" in out and "mem/GPU" in out and "bubble" in out and "free" in out
    lines = {ln.split(":")[0]: ln for ln in out.splitlines() if ln.split(":")[0] in
             ("Megatron-LM", "torchtitan", "DeepSpeed", "stagewise")}
    assert set(lines) == {"Megatron-LM", "torchtitan", "DeepSpeed", "stagewise"}  # each framework's best, run
    assert "--tensor-model-parallel-size" in lines["Megatron-LM"] and "(#" in lines["Megatron-LM"]
    assert "--parallelism.tensor-parallel-degree" in lines["torchtitan"]
    assert '"train_batch_size":256' in lines["DeepSpeed"] and "PipelineModule(layers, topology=" in lines["DeepSpeed"]
    assert "torchrun --nnodes=8 --nproc-per-node=8 -m stagewise train" in lines["stagewise"]
    _train_takes(lines["stagewise"])
    assert str(csv) in out and ("ranks first:" in out or "is recommended:" in out)
    sched = torch_csv.load(csv)
    assert sched.ranks >= 1


def test_plan_a_cluster_json(tmp_path, capsys):
    rc, out, _ = run(capsys, *BASE, "-o", str(tmp_path / "p.csv"), "--json", "--top", "2")
    data = json.loads(out)
    assert rc == 0 and data["inputs"]["global_batch"] == 256 and len(data["ranking"]) == 2
    best = data["best"]
    assert best["t"] * best["p"] * best["dp"] == 64 and best["m"] * best["micro_batch_size"] * best["dp"] == 256
    assert data["ranking"][0]["step_time"] <= data["ranking"][1]["step_time"]
    assert set(data["frameworks"]) == {"megatron", "torchtitan", "deepspeed", "stagewise"}
    assert all(f["command"] for f in data["frameworks"].values())
    assert data["format"] == "stagewise-plan" and data["stagewise"] and data["inputs"]["gpus"] == 64


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_bad_inputs_are_one_line_exit_2(tmp_path, capsys):
    args = dict(zip(BASE[1::2], BASE[2::2]))

    def bad(**change):
        merged = {**args, **change}
        return fails(capsys, "plan", *[x for kv in merged.items() for x in kv])

    model = json.loads((ROOT / "stagewise/plan/cluster/data/models/llama3-8b.json").read_text())
    assert "--model" in bad(**{"--model": "nope.json"})
    assert "heads (33)" in bad(**{"--model": write(tmp_path, "m.json", {**model, "heads": 33})})
    assert "peak_flops must be > 0" in bad(**{"--hardware": write(tmp_path, "h.json", {
        **json.loads((ROOT / "stagewise/plan/cluster/data/hardware/h100.json").read_text()), "peak_flops": 0})})
    assert "no such file and not a shipped name" in bad(**{"--hardware": "h900"})
    assert "must be a multiple of the model's sequence length 8192" in bad(**{"--global-batch-tokens": "1000"})
    assert "--global-batch-tokens 'lots'" in bad(**{"--global-batch-tokens": "lots"})
    assert "no t x p x dp = --gpus 37" in bad(**{"--gpus": "37"})
    assert "no configuration" in bad(**{"--gpus": "4096", "--global-batch-tokens": "64K"})
    assert "needs --gpus" in fails(capsys, "plan", "--model", "llama3-8b", "--hardware", "h100",
                                   "--global-batch-tokens", "2M")
    assert "--verify belongs to planning from a measured profile" in fails(capsys, *BASE, "--verify")
    assert "--memory belongs to planning from a measured profile" in fails(capsys, *BASE, "--memory", "40GiB")
    assert "plan needs --profile" in fails(capsys, "plan")
    assert "--recompute selective needs --model" in fails(capsys, "plan", "--profile", "x.json",
                                                         "--recompute", "selective")
    for given, flag in (("-p", "--ranks"), ("--pipeline", "--ranks"), ("--tp", "--tp"), ("--expert", "--ep"),
                        ("--etp", "--etp")):  # the degrees to try are the cluster planner's, said as --help lists them
        assert f"{flag} belongs to planning with --model" in fails(capsys, "plan", "--profile", "x.json", "-N", "4",
                                                                   "-G", "8", given, "2")


def test_plan_a_cluster_with_selective_recomputation(tmp_path, capsys):
    rc, out, err = run(capsys, "plan", "--model", "gpt-1.7b", "--hardware", "a100", "--gpus", "8",
                       "--global-batch-tokens", "128K", "--schedules", "1f1b", "--recompute", "selective",
                       "--tensor", "1", "--pipeline", "2", "-o", str(tmp_path / "p.csv"), "--top", "2")
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln.split()[:1] and ln.split()[0].rstrip("=").isdigit() and "1f1b" in ln]
    assert rows and all(" sel " in ln for ln in rows)
    assert "--recompute-granularity selective" in out


def test_planning_core_imports_neither_torch_nor_the_runtime(tmp_path):
    """Searching and costing run with torch made unimportable; the runtime is never loaded."""
    code = f"""
import sys
sys.modules['torch'] = None  # any 'import torch' now raises ImportError
from stagewise.cli import main
rc = main(['plan', '--model', 'llama3-8b', '--hardware', 'h100', '--gpus', '16', '--global-batch-tokens', '1M',
           '--schedules', '1f1b', '-o', {str(tmp_path / 'p.csv')!r}, '--json'])
assert rc == 0, rc
import stagewise.plan.search.search, stagewise.plan.search.partition, stagewise.plan.auto.auto, stagewise.plan.search.profile
bad = sorted(m for m, mod in sys.modules.items() if mod is not None
             and (m.startswith('stagewise.runtime') or m.split('.')[0] == 'torch'))
assert not bad, bad
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]


ONE = ("plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch-tokens", "256K", "--schedules", "1f1b",
       "--tensor", "8", "--micro-batch-sizes", "1", "--recompute", "off", "--framework", "megatron")


def test_the_reserve_is_kept_free_and_a_plan_that_fits_only_without_it_is_refused(tmp_path, capsys):
    rc, out, err = run(capsys, *ONE, "--hardware", "h100", "--json", "-o", str(tmp_path / "p.csv"))
    assert rc == 0, err
    plan = json.loads(out)
    reserve = plan["assumptions"]["memory_reserve"]
    assert reserve["context"] > 0 and reserve["communication"] > 0 and 0 < reserve["fragmentation"] < 1
    assert all(r["headroom"] >= 0 and max(r["peak_memory"]) + r["headroom"] == pytest.approx(reserve["usable"])
               for r in plan["ranking"])
    need = max(plan["ranking"][0]["peak_memory"])
    hw = json.loads((ROOT / "stagewise/plan/cluster/data/hardware/h100.json").read_text())
    tight = write(tmp_path, "tight.json", {**hw, "memory": need * 1.02})  # fits the GPU, not GPU less reserve
    err = fails(capsys, *ONE, "--hardware", tight, "-o", str(tmp_path / "p.csv"))
    assert "--memory-reserve: none of the" in err and "fits only without the reserve" in err
    assert "--memory-reserve 0 to plan without it" in err
    rc, out, err = run(capsys, *ONE, "--hardware", tight, "--memory-reserve", "0", "-o", str(tmp_path / "p.csv"))
    assert rc == 0 and "0 B reserved" in out, err
    rc, out, err = run(capsys, *ONE, "--hardware", "h100", "--memory-reserve", "10%", "--json", "-o",
                       str(tmp_path / "p.csv"))
    assert json.loads(out)["assumptions"]["memory_reserve"]["fragmentation"] == pytest.approx(0.1)


def test_a_written_plan_records_inputs_assumptions_and_version(tmp_path, capsys):
    import stagewise

    md, js = tmp_path / "plan.md", tmp_path / "plan.json"
    rc, out, err = run(capsys, *BASE, "-o", str(md), "--top", "2")
    assert rc == 0, err
    text = md.read_text()
    assert f"stagewise {stagewise.__version__}" in text and "## Inputs" in text and "## Assumptions" in text
    assert "## Commands" in text and "Megatron-LM" in text and "Memory:" in text and "Error band:" in text
    assert (tmp_path / "plan.csv").is_file() and "wrote " + str(md) in out
    rc, out, err = run(capsys, *BASE, "-o", str(js), "--top", "2")
    plan = json.loads(js.read_text())
    assert plan["stagewise"] == stagewise.__version__ and plan["command"][:2] == ["stagewise", "plan"]
    assert plan["inputs"]["model"]["name"] == "llama3-8b" and plan["inputs"]["hardware"]["sources"]["peak_flops"]
    assert set(plan["assumptions"]["frameworks"]) == {"megatron", "torchtitan", "deepspeed", "stagewise"}
    assert plan["csv"] == str(tmp_path / "plan.csv")


def test_megatron_gets_its_own_best_layout_and_any_split(tmp_path, capsys):
    """The winner may be a family Megatron-LM cannot run: its line is then its own best layout, with the
    layout flag where the split is neither even nor uneven at the ends only."""
    rc, out, err = run(capsys, "plan", "--model", "llama3-70b", "--hardware", "h100", "--gpus", "256",
                       "--global-batch-tokens", "2M", "--tensor", "8", "--pipeline", "4", "--schedules",
                       "zb-v,interleaved-1f1b", "--chunks", "4", "--json", "-o", str(tmp_path / "p.csv"))
    plan = json.loads(out)
    mega = plan["frameworks"]["megatron"]
    assert mega["command"] and mega["layout"]["family"] == "interleaved-1f1b" and mega["rank"] >= 1
    from stagewise.plan.cluster.frameworks import megatron_layout

    assert megatron_layout([2, 3, 0, 1]) == "Et*2|t*3||tL"


def _train_takes(line: str) -> None:
    """The printed stagewise line is a command `stagewise train` accepts: every flag exists, with its value."""
    import shlex

    from stagewise.cli import build_parser

    words = shlex.split(line[line.index("torchrun"):], comments=True)
    argv = words[words.index("train"):]
    argv = [w for w in argv if not w.startswith("#")]
    args = build_parser().parse_args(argv)
    assert args.hf == "MODEL_FOLDER" and args.ranks >= 1 and args.split


def test_the_stagewise_line_of_a_sharded_plan_names_the_runtimes_flags(tmp_path, capsys):
    """FSDP and ZeRO-1 plans print --fsdp or --zero 1, in what train parses (issue 19's runtime runs them)."""
    for sharding, flag in (("fsdp", "--fsdp"), ("zero1", "--zero")):
        rc, out, err = run(capsys, *BASE, "--sharding", sharding, "-o", str(tmp_path / f"{sharding}.csv"))
        assert rc == 0, err
        line = next(ln for ln in out.splitlines() if ln.startswith("stagewise:"))
        if "--dp 1 " not in line or sharding == "fsdp":
            assert flag in line, line
        _train_takes(line)


def test_failure_rate_costs_a_cluster_plan_and_its_stagewise_run_saves_at_the_interval(tmp_path, capsys):
    """`plan --model --failure-rate`: the checkpoint is the model's bf16 weights, fp32 master weights and Adam's
    moments (14 bytes per parameter), written by every GPU of a sharded layout; the MTBF is over --gpus; the
    stagewise command saves every Daly interval in its own row's steps."""
    from stagewise.plan.cluster import TransformerSpec
    from stagewise.plan.failures import daly

    rc, out, err = run(capsys, *BASE, "--sharding", "fsdp", "--failure-rate", "0.02", "--write-bandwidth", "500MB/s",
                       "--restart-time", "90", "-o", str(tmp_path / "p.csv"), "--json")
    assert rc == 0, err
    data = json.loads(out)
    f = data["failures"]
    assert f["checkpoint_bytes"] == TransformerSpec.load("llama3-8b").params() * 14
    assert f["write_s"] == f["checkpoint_bytes"] / (64 * 500e6) and f["mtbf_s"] == 86400 / (0.02 * 64)
    assert f["interval_s"] == f["daly_s"] == daly(f["write_s"], f["mtbf_s"])
    assert f["lost_per_failure_s"] == (f["interval_s"] + f["write_s"]) / 2 + 90
    mine = data["frameworks"]["stagewise"]
    steps = max(1, round(f["interval_s"] / mine["layout"]["step_time"]))
    assert f"--save ckpt --save-every {steps} --save-on-signal --max-restarts 3" in mine["command"]
    _train_takes(mine["command"])
    rc, out, err = run(capsys, *BASE, "--failure-rate", "0.02", "-o", str(tmp_path / "q.csv"))
    assert rc == 0 and "under faults: a checkpoint of" in out and "(Daly; Young" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("stagewise:"))
    assert "--save-on-signal" in line
    _train_takes(line)
    assert "--checkpoint-interval needs --failure-rate" in fails(capsys, *BASE, "--checkpoint-interval", "60", "-o",
                                                                  str(tmp_path / "r.csv"))


EVEN = ("plan", "--model", "gpt-oss-120b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "2M",
        "--tensor", "1", "--expert", "8", "--expert-tensor", "1", "--framework", "megatron", "--json")


def test_split_even_is_the_frameworks_default_split_and_skips_what_it_cannot_divide(tmp_path, capsys):
    """--split even: the 36 blocks of GPT-OSS go 9 to a stage over p=4, the embedding with the first and the head
    with the last, as Megatron-LM runs with no layout flags (its command then carries none); the balanced
    default moves blocks off the head's stage and is faster; a p x v that does not divide the blocks is skipped."""
    plans = {}
    for split in ("balanced", "even"):
        rc, out, err = run(capsys, *EVEN, "--pipeline", "4", "--schedules", "1f1b", "--split", split,
                           "-o", str(tmp_path / f"{split}.csv"))
        assert rc == 0, err
        plans[split] = json.loads(out)
    even, balanced = plans["even"]["best"], plans["balanced"]["best"]
    assert even["counts"] == [10, 9, 9, 10] and even["layout"] == "E+m*9 | m*9 | m*9 | m*9+H"
    assert balanced["counts"] != even["counts"] and balanced["step_time"] < even["step_time"]
    command = plans["even"]["frameworks"]["megatron"]["command"]
    assert "--pipeline-model-parallel-size 4" in command and "pipeline-num-layers" not in command
    assert "layout" not in command
    # p=8: no 8 x v divides 36 blocks
    assert "--split even: p x v does not divide the blocks" in fails(
        capsys, *EVEN, "--pipeline", "8", "--schedules", "1f1b,interleaved-1f1b", "--split", "even",
        "-o", str(tmp_path / "p8.csv"))
    rc, out, err = run(capsys, *EVEN, "--pipeline", "4", "--schedules", "interleaved-1f1b", "--chunks", "3",
                       "--split", "even", "-o", str(tmp_path / "v3.csv"))
    assert rc == 0, err
    assert json.loads(out)["best"]["counts"] == [4] + [3] * 10 + [4]  # 12 stages of 3 blocks


def test_split_bad_values_and_conflicts_exit_2(tmp_path, capsys):
    assert "invalid choice: 'lumpy'" in fails(capsys, *BASE, "--split", "lumpy")
    assert "--ranks 3: no pipeline degree divides --gpus 64" in fails(capsys, *BASE, "--pipeline", "3")
    assert "--layout fixes the split" in fails(capsys, "plan", "--profile", "x.json", "-N", "4", "-G", "8",
                                                "--layout", "E+t | t+H", "--split", "even")


def test_a_torchtitan_plan_without_pp_reshards_after_forward_and_holds_two_blocks(tmp_path, capsys):
    """torchtitan's FSDP runs block by block without PP (its 'default' reshard-after-forward policy): the plan's
    layout says so and its gathered memory is a sliver of stagewise's, which keeps the stage gathered; under PP
    torchtitan keeps it gathered too."""
    base = ("plan", "--model", "llama3-8b", "--hardware", "h200", "--gpus", "8", "--global-batch-tokens", "128K",
            "--tensor", "1", "--schedules", "1f1b", "--sharding", "fsdp", "--recompute", "full", "--json",
            "-o", str(tmp_path / "p.csv"))
    plans = {}
    for fw, p in (("torchtitan", "1"), ("stagewise", "1"), ("torchtitan", "2")):
        rc, out, err = run(capsys, *base, "--framework", fw, "--pipeline", p)
        assert rc == 0, err
        plan = json.loads(out)
        assert plan["assumptions"]["frameworks"][fw]["reshard_after_forward"] == (
            "default" if fw == "torchtitan" else "never")
        plans[fw, p] = plan["ranking"][0]
    titan, mine = plans["torchtitan", "1"], plans["stagewise", "1"]
    assert titan["parallelism"]["reshard_after_forward"] is True
    assert mine["parallelism"]["reshard_after_forward"] is False
    assert plans["torchtitan", "2"]["parallelism"]["reshard_after_forward"] is False
    assert 0 < titan["memory_parts"]["gathered"] < mine["memory_parts"]["gathered"] / 8
