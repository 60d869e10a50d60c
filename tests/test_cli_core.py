"""The core CLI contract: JSON results, and bad input -> exit 2 with one line naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli_helpers import fails, run
from stagewise.schedules import names






# --- results ------------------------------------------------------------------------------------

def test_simulate_json_has_the_contract_fields(capsys):
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--json")
    res = json.loads(out)
    assert rc == 0
    assert (res["schedule"], res["ranks"], res["microbatches"], res["chunks"]) == ("1f1b", 4, 8, 1)
    assert res["bubble_fraction"] == pytest.approx(3 / 11) == res["formula_bubble_fraction"]
    assert res["makespan"] == 33 and res["peak_activations"] == [4, 3, 2, 1]
    assert res["busy"] == [24] * 4 and res["idle"] == [9] * 4


def test_simulate_takes_costs_per_action(capsys):
    rc, out, _ = run(capsys, "simulate", "zb-h1", "-p", "4", "-m", "8", "--tf", "1", "--ti", "1", "--tw", "1", "--json")
    res = json.loads(out)
    assert rc == 0 and res["idle"] == [3] * 4  # (p-1)(F+B-2W)
    assert res["formula_bubble_fraction"] == pytest.approx(res["bubble_fraction"])


def test_compare_lists_every_family_at_p4_m8(capsys):
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--json")
    results = json.loads(out)
    assert rc == 0 and [r["schedule"] for r in results] == names()
    by_name = {r["schedule"]: r for r in results}
    assert by_name["dualpipe"]["parameter_copies"] == [2.0] * 4
    assert by_name["dualpipe-v"]["chunks"] == 2 and by_name["dualpipe-v"]["parameter_copies"] == [1.0] * 4
    assert by_name["zb-h2"]["formula_bubble_fraction"] is None


def test_compare_a_chosen_list(capsys):
    rc, out, _ = run(capsys, "compare", "-p", "2", "-m", "4", "--schedules", "gpipe,zb-v", "--json")
    assert rc == 0 and [r["schedule"] for r in json.loads(out)] == ["gpipe", "zb-v"]


@pytest.mark.parametrize("name", ["interleaved-1f1b", "dualpipe"])
def test_export_then_simulate_the_csv_gives_the_same_result(capsys, tmp_path, name):
    path = tmp_path / "s.csv"
    assert run(capsys, "export", name, "-p", "4", "-m", "8", "--csv", str(path))[0] == 0
    direct = json.loads(run(capsys, "simulate", name, "-p", "4", "-m", "8", "--json")[1])
    read = json.loads(run(capsys, "simulate", "--csv", str(path), "--json")[1])
    for key in ("makespan", "bubble_fraction", "busy", "idle", "peak_activations", "ranks", "microbatches"):
        assert read[key] == direct[key], key


def test_validate_and_list(capsys):
    rc, out, _ = run(capsys, "validate", "zb-v", "-p", "4", "-m", "8")
    assert rc == 0 and out.startswith("valid: zb-v, 4 ranks, 8 stages, 8 micro-batches")
    rc, out, _ = run(capsys, "list")
    assert rc == 0 and [line.split()[0] for line in out.splitlines()] == names()


@pytest.mark.parametrize("command", ["list", "simulate", "compare", "export", "validate", "demo"])
def test_help(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0 and out.startswith("usage: stagewise " + command)


def test_command_entry_exits_with_mains_status(monkeypatch):
    """The console script and `python -m stagewise` run ``cli.run``: main's status becomes the exit code (a user
    error's 2 included), with the collector's objects frozen so that shutdown does not rescan them."""
    import gc
    import subprocess
    import sys

    from stagewise import cli

    monkeypatch.setattr(cli, "main", lambda: 3)
    try:
        with pytest.raises(SystemExit) as info:
            cli.run()
        assert info.value.code == 3 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    done = subprocess.run([sys.executable, "-m", "stagewise", "simulate", "dualpipe", "-p", "3", "-m", "6"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("stagewise simulate: error:"), done.stderr
    done = subprocess.run([sys.executable, "-m", "stagewise", "simulate", "zb-v", "-p", "2", "-m", "4", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["ranks"] == 2


def test_help_fills_the_terminal_width(capsys, monkeypatch):
    """Help and usage are laid out to the terminal's width (COLUMNS), though building a parser never reads it."""
    from stagewise.cli import build_parser

    lines = {}
    for columns in (50, 200):
        monkeypatch.setenv("COLUMNS", str(columns))
        rc, out, _ = run(capsys, "simulate", "--help")
        usage = build_parser(["core"])._subparsers._group_actions[0].choices["simulate"].format_usage()
        assert rc == 0 and usage.startswith("usage: stagewise simulate")
        lines[columns] = (out.count("\n"), usage.count("\n"))
    assert lines[50][0] > lines[200][0] and lines[50][1] > lines[200][1]


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["simulate", "1f1b", "-p", "0"], "--ranks: must be >= 1; got 0"),
    (["simulate", "1f1b", "-m", "-3"], "--microbatches: must be >= 1; got -3"),
    (["simulate", "1f1b", "-m", "0", "--json"], "--microbatches: must be >= 1; got 0"),
    (["export", "gpipe", "-p", "-2", "--csv", "x.csv"], "--ranks: must be >= 1; got -2"),
    (["simulate", "zb-v", "-v", "3"], "zb-v needs --chunks 2; got 3"),
    (["simulate", "interleaved-1f1b", "-v", "0"], "--chunks: must be >= 1; got 0"),
    (["simulate", "dualpipe", "-p", "5", "-m", "10"], "dualpipe needs an even --ranks; got 5"),
    (["simulate", "dualpipe-v", "-p", "4", "-m", "6"], "dualpipe-v needs --microbatches >= 2 * --ranks (8); got 6"),
    (["simulate", "pipedream"], "unknown schedule 'pipedream'; choose one of: gpipe"),
    (["compare", "--schedules", "1f1b,nope"], "--schedules: unknown schedule 'nope'"),
    (["simulate", "1f1b", "--tf", "-1"], "--tf must be a finite number >= 0; got -1.0"),
    (["simulate", "1f1b", "--tb", "0,1"], "--tb has 2 per-stage values; the schedule has 4 stages"),
    (["simulate", "1f1b", "--tf", "abc"], "argument --tf: expected a number"),
    (["simulate", "1f1b", "-p", "2.5"], "argument -p/--ranks: expected a whole number; got '2.5'"),
    (["simulate"], "a schedule NAME or --csv FILE is required"),
    (["validate", "--csv", "/nonexistent/s.csv"], "--csv /nonexistent/s.csv: cannot read"),
    (["export", "1f1b", "--csv", "/nonexistent/dir/s.csv"], "--csv /nonexistent/dir/s.csv: cannot write"),
])
def test_bad_options(capsys, argv, words):
    assert words in fails(capsys, *argv)


@pytest.mark.parametrize("text, words", [
    ("0F0junk,0B0\n", "row 1 (rank 0) column 1: not an action: '0F0junk'"),
    ("0F0,3X1\n", "row 1 (rank 0) column 2: not an action: '3X1'"),
    ("0F0,0F0,0B0\n1F0,1B0\n", "rank 0 position 1 (0F0): duplicate action 0F0"),
    ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", "rank 1: missing the backward of stage 1 micro-batch 1"),
    ("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", "deadlock: wait cycle: rank 0 position 1 (0B0) waits for 1B0"),
    ("0F0,0B0\n0F1\n", "stage 0 is on two ranks"),
])
@pytest.mark.parametrize("command", ["simulate", "validate", "draw", "explain"])
def test_bad_csv(capsys, tmp_path, command, text, words):
    """A read schedule is validated as it is read, once, for every command that takes --csv."""
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert words in fails(capsys, command, "--csv", str(path))


def test_a_real_process_exits_2_with_one_line_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "stagewise", "simulate", "dualpipe", "-p", "5", "-m", "10", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "stagewise simulate: error: dualpipe needs an even --ranks; got 5\n"


def test_version_and_every_subcommand_has_a_description(capsys):
    import stagewise
    from stagewise.cli import build_parser

    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"stagewise {stagewise.__version__}"
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert parser.description and len(parser.description) > 40, name  # more than the one-line help
    rc, out, _ = run(capsys, "--help")
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("train", "profile"))]
    assert lines and all("--hf" in ln for ln in lines), lines  # not only for the built-in GPT


@pytest.mark.parametrize("argv, words", [
    (["profile", "--micro-batch-sizes", "100000", "--no-link"], "--micro-batch-sizes 100000:"),
    (["profile", "--micro-batch-sizes", "2,2", "--no-link"], "--micro-batch-sizes names 2 twice"),
])
def test_profile_sizes_are_refused_naming_the_option(capsys, argv, words):
    from cli_helpers import fails

    assert words in fails(capsys, *argv)


def test_each_command_builds_only_its_own_module_and_the_table_matches_the_parsers():
    """COMMANDS is what each module's register adds; a command line builds only its module's parser, so
    `stagewise simulate` does not import the planner (its start-up), while --help still lists every command."""
    import argparse
    import importlib

    from stagewise import cli

    for name in cli.MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"stagewise.cli.{name}").register(sub)
        assert tuple(sub.choices) == cli.COMMANDS[name], name
    assert cli._modules_for(["simulate", "1f1b"]) == ["core"]
    assert cli._modules_for(["--help"]) == cli.MODULES and cli._modules_for(["simulat"]) == cli.MODULES
    code = ("import sys, io, contextlib; from stagewise.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['simulate', 'zb-v', '-p', '4', '-m', '8'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('stagewise.plan', 'torch', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_simulate_without_communication_options_imports_no_lowering():
    """The start-up of `stagewise simulate` stays with the core: the lowering (and torch's CSV reader) load only
    for the options that need them; the parser's --framework names are the lowering's. Nor does it load the
    layout parser (``stagewise.Split``), shutil (argparse's terminal width, with bz2, lzma and zlib), which only
    printing help needs, or typing (the core's named tuples are collections')."""
    import subprocess
    import sys

    from stagewise.cli.comm import FrameworkNames
    from stagewise.lowering import FRAMEWORKS

    assert tuple(FrameworkNames()) == tuple(FRAMEWORKS) and "megatron" in FrameworkNames()
    code = ("import sys; sys.argv = ['stagewise', 'simulate', '1f1b', '-p', '2', '-m', '2']\n"
            "from stagewise.cli import main\nmain()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('stagewise.lowering', 'stagewise.torch_csv', "
            "'torch', 'matplotlib', 'stagewise.plan', 'stagewise.runtime', 'stagewise.split', 'stagewise.render', "
            "'shutil', 'lzma', 'bz2', 'json', 'typing'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines()[-1] == "[]", out


def test_every_layout_option_is_generated_from_a_parallelism_field():
    """A degree has one flag and one help wherever a command takes it (cli/flags.add_layout_options, from
    ``Parallelism``'s fields; pp is -p/--ranks in every command); the planner's earlier --tensor, --pipeline,
    --expert and --expert-tensor still parse, as aliases of --tp, --ranks, --ep and --etp."""
    from dataclasses import fields

    from stagewise.cli import build_parser
    from stagewise.parallelism import Parallelism

    helps = {f.metadata["flag"]: f.metadata["help"] for f in fields(Parallelism)}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    seen = set()
    for name, parser in sub.choices.items():
        for action in parser._actions:
            for flag in set(action.option_strings) & set(helps):
                assert action.help.startswith(helps[flag]), (name, flag, action.help)
                assert flag != "--ranks" or action.option_strings[0] == "-p", (name, action.option_strings)
                seen.add(flag)
    assert seen == set(helps)
    plan = sub.choices["plan"]
    new = plan.parse_args(["--model", "llama3-8b", "--tp", "2,4", "--ranks", "2", "--ep", "4", "--etp", "1"])
    old = plan.parse_args(["--model", "llama3-8b", "--tensor", "2,4", "--pipeline", "2", "--expert", "4",
                           "--expert-tensor", "1"])
    assert vars(new) == vars(old) and (new.tensor, new.pipeline, new.expert, new.expert_tensor) == ("2,4", "2", "4", "1")
