"""Long sequences at cluster scale: sequence slices (Seq1F1B) and activation offload (PipeOffload) as options
`stagewise plan --slices --offload` searches, through the CLI, and the holding rules they rest on."""

import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402
from framework_helpers import megatron_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "stagewise" / "plan" / "cluster" / "data" / "models"


def _long_model(tmp_path) -> str:
    """Llama 3 70B at a 128K-token sequence (Llama 3.1's context), as a model file."""
    spec = json.loads((MODELS / "llama3-70b.json").read_text())
    spec.update(name="llama3-70b-128k", seq=131072)
    path = tmp_path / "llama3-70b-128k.json"
    path.write_text(json.dumps(spec))
    return str(path)


def _args(tmp_path, *more):
    return ("plan", "--model", _long_model(tmp_path), "--hardware", "h100", "--gpus", "128", "--global-batch-tokens",
            "2M", "--tp", "8", "-p", "16", "--micro-batch-sizes", "1", "--recompute", "off",
            "-o", str(tmp_path / "plan.csv"), *more)


def test_a_128k_sequence_fits_only_with_slices_or_offload(tmp_path, capsys):
    # whole micro-batches: 1F1B-like schedules hold p micro-batches of L/p blocks on rank 0 (~360 GB here)
    err = fails(capsys, *_args(tmp_path, "--slices", "1", "--offload", "none"))
    assert "none of the" in err and "configurations fits" in err and "--slices 2,4,8 (Seq1F1B) or --offload all" in err
    rc, out, err = run(capsys, *_args(tmp_path, "--slices", "1,2,4,8", "--offload", "none,all", "--json"))
    assert rc == 0, err
    plan = json.loads(out)
    best = plan["best"]
    assert best["slices"] > 1 or best["offload"] == "all"
    assert all(r["slices"] > 1 or r["offload"] == "all" for r in plan["ranking"])
    assert all(r["framework"] == "stagewise" for r in plan["ranking"])  # the one that runs them as planned
    assert plan["search"]["seconds"] < 10  # generous: it plans in well under a second
    sliced = [r for r in plan["ranking"] if r["slices"] == 8 and r["offload"] == "none"]
    assert sliced and sliced[0]["m"] == 8 * 16  # units: 16 micro-batches of 8 slices on the one pipeline
    assert abs(sliced[0]["throughput"] * sliced[0]["step_time"] - 16) < 1e-9  # sequences, not units


def test_the_printed_offload_flags_are_megatron_lms_and_others_say_none(tmp_path, capsys):
    rc, out, err = run(capsys, *_args(tmp_path, "--offload", "all"))
    assert rc == 0, err
    lines = out.splitlines()
    at = lines.index("offload (the recommended row's), framework by framework:")
    said = {ln.split(":")[0].strip(): ln for ln in lines[at + 1:at + 5]}
    megatron = said["Megatron-LM"].split(":", 1)[1].split("#")[0]
    flags = [w for w in shlex.split(megatron) if w.startswith("--")]
    assert flags == ["--fine-grained-activation-offloading", "--offload-modules"]
    assert set(flags) <= megatron_names()  # Megatron-LM's own parser at the fixture's commit knows them
    assert "none (torchtitan has no activation offload" in said["torchtitan"]
    assert "none (DeepSpeed" in said["DeepSpeed"]
    assert "--offload all" in said["stagewise"]  # train places OFFLOAD and RELOAD (stagewise.memory_actions)
    line = next(ln for ln in lines if ln.startswith("stagewise:"))
    assert "--offload all" in line
    _train_parses(line)


def _train_parses(line: str):
    """The printed stagewise line is what `stagewise train` parses, every flag with its value."""
    from stagewise.cli import build_parser

    words = shlex.split(line[line.index("torchrun"):], comments=True)
    return build_parser().parse_args(words[words.index("train"):])


def test_the_stagewise_line_of_a_sliced_plan_runs_seq1f1b_over_its_slices(tmp_path, capsys):
    rc, out, err = run(capsys, *_args(tmp_path, "--slices", "1,2,4,8"))
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("stagewise:"))
    args = _train_parses(line)
    assert (args.schedule, args.slices, args.microbatches, args.batch) == ("seq1f1b", 8, 16, 16)  # micro-batches


def test_offloaded_activations_fit_the_nodes_host_memory(tmp_path, capsys):
    rc, out, err = run(capsys, *_args(tmp_path, "--offload", "all", "--json", "--top", "20"))
    assert rc == 0, err
    rows = [r for r in json.loads(out)["ranking"] if r["offload"] == "all"]
    assert rows and all(0 < r["offloaded_bytes"] * 8 <= 2 * 2**40 for r in rows)  # DGX H100: 2 TB a node
    small = json.loads((ROOT / "stagewise/plan/cluster/data/hardware/h100.json").read_text())
    small.update(name="h100-small-host", host_memory=min(r["offloaded_bytes"] for r in rows) * 8 - 1)
    path = tmp_path / "h100-small-host.json"
    path.write_text(json.dumps(small))
    args = list(_args(tmp_path, "--offload", "all", "--json", "--top", "20"))
    args[args.index("h100")] = str(path)
    rc, out, err = run(capsys, *args)
    assert rc == 0, err
    assert all(r["offloaded_bytes"] * 8 <= small["host_memory"] for r in json.loads(out)["ranking"])


def test_bad_long_sequence_options_are_one_line(tmp_path, capsys):
    assert "--offload some: each must be one of none, all" in fails(capsys, *_args(tmp_path, "--offload", "some"))
    assert "--slices" in fails(capsys, *_args(tmp_path, "--slices", "0"))
    err = fails(capsys, "plan", "--model", "llama3-8b", "--hardware", "b200", "--gpus", "8",
                "--global-batch-tokens", "1M", "--offload", "all")
    assert "--offload all: --hardware b200 gives no host_bandwidth" in err
    err = fails(capsys, "plan", "--profile", "p.json", "-N", "4", "-G", "8", "--slices", "2")
    assert "--slices belongs to planning with --model" in err


def test_seq1f1b_and_offload_holdings():
    from stagewise.plan.cluster.long_sequence import offloaded_holding, offloading_ranks, sliced_holding
    from stagewise.plan.search import holding
    from stagewise.schedules import generate

    p, m, k = 4, 8, 4
    h = holding(generate("1f1b", p, m * k))
    live = [max(sum(v) for v in vecs) for vecs in sliced_holding(h, k, m * k).live]
    assert live == [p - r + k - 1 for r in range(p)]  # Seq1F1B: rank 0 holds (p + k - 1) / k micro-batches
    assert offloading_ranks(h) == (True, True, False, False)  # 1F1B's last two ranks hold two or fewer
    assert [max(sum(v) for v in vecs) for vecs in offloaded_holding(h).live] == [2, 2, 2, 1]
