"""Bad input, as a hostile user would type it, outside `train`: every case exits 2 with one line.

The cases run in one child process under a 2 GiB address-space cap
(``capped_cli``), so a size that used to allocate without bound fails the
test with a MemoryError traceback instead of taking the machine down; each
case must also end within seconds. Categories follow issue 10: sizes over a
limit, files that are not what they claim, costs that are not finite,
options that make no sense.
"""

from __future__ import annotations

import json
import os

import pytest

from capped_cli import assert_refused, run_capped

PROFILE = "data/profiles/gpt-l32-d256-cpu.json"
PLAN = ["plan", "--profile", PROFILE, "-N", "2", "-G", "8", "-o", "{tmp}/plan.csv"]

#: (category, case id, argv, extra environment, words the one line must contain)
CASES = [
    # sizes over a documented limit, refused before anything is allocated
    ("limit", "simulate-m", ["simulate", "1f1b", "-m", "1000000000"], {},
     ["--microbatches 1000000000", "STAGEWISE_MAX_MICROBATCHES"]),
    ("limit", "simulate-p", ["simulate", "1f1b", "-p", "1000000000"], {},
     ["--ranks 1000000000", "STAGEWISE_MAX_RANKS"]),
    ("limit", "simulate-v", ["simulate", "interleaved-1f1b", "-v", "1000000"], {}, ["--chunks 1000000"]),
    ("limit", "simulate-actions", ["simulate", "zb-v", "-p", "1024", "-m", "4096"], {},
     ["-p 1024 -m 4096 -v 2 (zb-v)", "STAGEWISE_MAX_ACTIONS"]),
    ("limit", "compare-total", ["compare", "-p", "64", "-m", "1024"], {"STAGEWISE_MAX_COMPARE_ACTIONS": "500000"},
     ["-p 64 -m 1024: the first", "STAGEWISE_MAX_COMPARE_ACTIONS"]),
    ("limit", "compare-p", ["compare", "-p", "100000"], {}, ["--ranks 100000"]),
    ("limit", "report-p-m", ["report", "-p", "1000", "-m", "2000", "-o", "{tmp}"], {}, ["STAGEWISE_MAX_ACTIONS"]),
    ("limit", "draw-actions", ["draw", "gpipe", "-p", "64", "-m", "60000", "-o", "{tmp}/d.svg"], {},
     ["STAGEWISE_MAX_ACTIONS"]),
    ("limit", "export-actions", ["export", "interleaved-1f1b", "-p", "64", "-m", "4096", "-v", "64", "--csv",
                                 "{tmp}/e.csv"], {}, ["STAGEWISE_MAX_ACTIONS"]),
    ("limit", "validate-actions", ["validate", "zb-h2", "-p", "2000", "-m", "2000"], {}, ["STAGEWISE_MAX_ACTIONS"]),
    ("limit", "auto-m", ["auto", "-m", "1000000000"], {}, ["--microbatches 1000000000"]),
    ("limit", "auto-actions", ["auto", "-p", "64", "-m", "1000"], {}, ["STAGEWISE_MAX_AUTO_ACTIONS"]),
    ("limit", "plan-layout", [*PLAN, "--layout", "E+t*1000000000 | t*2+H"], {}, ["--layout", "t*1000000000"]),
    ("limit", "plan-layout-digits", [*PLAN, "--layout", "E+t*" + "9" * 5000 + " | H"], {}, ["--layout"]),
    ("limit", "plan-devices", ["plan", "--profile", PROFILE, "-N", "1000000000", "-G", "8"], {}, ["--devices"]),
    ("limit", "plan-search", ["plan", "--profile", PROFILE, "-N", "64", "-G", "65536"], {},
     ["-N 64 -G 65536: the schedules to search", "STAGEWISE_MAX_PLAN_ACTIONS"]),
    ("limit", "plan-global-batch", ["plan", "--profile", PROFILE, "-N", "2", "-G", "100000000000000000"], {},
     ["-G 100000000000000000", "STAGEWISE_MAX_PLAN_ACTIONS"]),
    ("limit", "csv-13-bytes", ["simulate", "--csv", "{tmp}/huge_index.csv"], {},
     ["huge_index.csv", "STAGEWISE_MAX_ACTIONS"]),
    ("limit", "csv-commas", ["simulate", "--csv", "{tmp}/commas.csv"], {"STAGEWISE_MAX_ACTIONS": "1000"},
     ["commas.csv", "8001 cells", "STAGEWISE_MAX_ACTIONS"]),
    ("limit", "csv-many-ranks", ["validate", "--csv", "{tmp}/rows.csv"], {"STAGEWISE_MAX_RANKS": "8"},
     ["rows (ranks)", "STAGEWISE_MAX_RANKS"]),
    ("limit", "csv-file-size", ["validate", "--csv", "{tmp}/1f1b.csv"], {"STAGEWISE_MAX_FILE_BYTES": "16"},
     ["--csv", "STAGEWISE_MAX_FILE_BYTES"]),
    ("limit", "env-lowered", ["simulate", "1f1b", "-p", "9"], {"STAGEWISE_MAX_RANKS": "8"},
     ["--ranks 9", "of 8 ranks"]),
    ("limit", "env-not-a-number", ["simulate", "1f1b"], {"STAGEWISE_MAX_RANKS": "lots"},
     ["STAGEWISE_MAX_RANKS='lots'"]),
    ("limit", "profile-layers", ["profile", "--layers", "1000000"], {}, ["--layers 1000000", "STAGEWISE_MAX_LAYERS"]),
    ("limit", "profile-seq", ["profile", "--seq", "100000"], {}, ["--seq", "STAGEWISE_MAX_ELEMENTS"]),
    ("limit", "profile-batch", ["profile", "--micro-batch-sizes", "1,1000000000"], {}, ["STAGEWISE_MAX_ELEMENTS"]),
    ("limit", "profile-params", ["profile", "--layers", "20000", "--d-model", "1024"], {},
     ["STAGEWISE_MAX_PARAMETERS"]),
    ("limit", "profile-repeats", ["profile", "--repeats", "1000000000"], {}, ["--repeats"]),
    ("limit", "draw-width", ["draw", "1f1b", "--width", "100000000"], {}, ["--width"]),
    # files that are not what they claim
    ("file", "csv-dev-zero", ["simulate", "--csv", "/dev/zero"], {}, ["--csv /dev/zero", "not a regular file"]),
    ("file", "csv-fifo", ["simulate", "--csv", "{tmp}/fifo"], {}, ["fifo", "FIFO"]),
    ("file", "csv-folder", ["validate", "--csv", "{tmp}"], {}, ["--csv", "(a folder)"]),
    ("file", "csv-not-utf8", ["simulate", "--csv", "{tmp}/latin1.csv"], {}, ["latin1.csv", "not UTF-8"]),
    ("file", "csv-huge-cell", ["simulate", "--csv", "{tmp}/cell.csv"], {}, ["row 1", "field larger than field limit"]),
    ("file", "csv-5000-digits", ["simulate", "--csv", "{tmp}/digits.csv"], {}, ["row 1 (rank 0) column 1"]),
    ("file", "csv-nul", ["validate", "--csv", "{tmp}/nul.csv"], {}, ["row 1"]),
    ("file", "profile-not-utf8", [*PLAN[:2], "{tmp}/latin1.json", *PLAN[3:]], {}, ["--profile", "not UTF-8"]),
    ("file", "profile-5000-digits", [*PLAN[:2], "{tmp}/digits.json", *PLAN[3:]], {}, ["--profile", "digits"]),
    ("file", "profile-nested", [*PLAN[:2], "{tmp}/nested.json", *PLAN[3:]], {}, ["--profile", "nested too deeply"]),
    ("file", "profile-wrong-shape", [*PLAN[:2], "{tmp}/shape.json", *PLAN[3:]], {}, ["--profile", "shape.json"]),
    ("file", "profile-list", [*PLAN[:2], "{tmp}/list.json", *PLAN[3:]], {}, ["not a stagewise profile"]),
    ("file", "profile-infinite", [*PLAN[:2], "{tmp}/inf.json", *PLAN[3:]], {}, ["t_f must be finite numbers"]),
    ("file", "profile-fifo", [*PLAN[:2], "{tmp}/fifo", *PLAN[3:]], {}, ["--profile", "FIFO"]),
    # costs and latencies must be finite: refused naming the option
    ("finite", "tf-inf", ["simulate", "1f1b", "--tf", "inf", "--json"], {}, ["--tf", "finite"]),
    ("finite", "tf-1e400", ["simulate", "1f1b", "--tf", "1e400", "--json"], {}, ["--tf", "finite"]),
    ("finite", "tf-overflow", ["simulate", "1f1b", "--tf", "1e308", "--json"], {}, ["--tf", "overflow"]),
    ("finite", "tb-list-nan", ["compare", "-p", "2", "--tb", "2,nan"], {}, ["--tb", "finite"]),
    ("finite", "latency-inf", ["simulate", "1f1b", "--latency", "inf"], {}, ["--latency", "finite"]),
    ("finite", "latency-nan", ["simulate", "1f1b", "--latency", "nan"], {}, ["--latency", "finite"]),
    ("finite", "bandwidth-nan", ["simulate", "1f1b", "--bandwidth", "nan"], {}, ["--bandwidth"]),
    ("finite", "draw-tf-inf", ["draw", "1f1b", "--tf", "inf", "-o", "{tmp}/x.svg"], {}, ["--tf"]),
    ("finite", "auto-tw-inf", ["auto", "--tw", "inf"], {}, ["--tw"]),
    ("finite", "intra-latency-nan", [*PLAN, "--intra-latency", "nan"], {}, ["--intra-latency"]),
    ("finite", "inter-latency-inf", [*PLAN, "--inter-latency", "inf"], {}, ["--inter-latency"]),
    ("finite", "state-factor-nan", [*PLAN, "--state-factor", "nan"], {}, ["--state-factor"]),
    ("finite", "memory-inf", [*PLAN, "--memory", "1e400GiB"], {}, ["--memory"]),
    # nonsense that used to be accepted or to end in a traceback
    ("nonsense", "compare-p-0", ["compare", "-p", "0"], {}, ["--ranks", ">= 1"]),
    ("nonsense", "report-m-0", ["report", "-m", "0", "-o", "{tmp}"], {}, ["--microbatches", ">= 1"]),
    ("nonsense", "profile-repeats-0", ["profile", "--repeats", "0"], {}, ["--repeats", ">= 1"]),
    ("nonsense", "plan-rounds-0", [*PLAN, "--verify", "1", "--rounds", "0"], {}, ["--rounds", ">= 1"]),
    ("nonsense", "plan-top-0", [*PLAN, "--top", "0"], {}, ["--top", ">= 1"]),
    ("nonsense", "auto-time-limit", ["auto", "--optimum", "--time-limit", "-1"], {}, ["--time-limit", "> 0"]),
    ("nonsense", "auto-time-limit-nan", ["auto", "--optimum", "--time-limit", "nan"], {}, ["--time-limit"]),
    ("nonsense", "m-5000-digits", ["simulate", "1f1b", "-m", "9" * 5000], {}, ["--microbatches"]),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    """The bad files the cases read."""
    d = tmp_path_factory.mktemp("bad")
    (d / "huge_index.csv").write_text("1000000000F0")  # 13 bytes that used to exhaust memory
    (d / "commas.csv").write_text("0F0" + "," * 8000)
    (d / "rows.csv").write_text("".join(f"{r}F0\n" for r in range(9)))
    (d / "1f1b.csv").write_text("0F0,0F1,0B0,0B1\n\n\n")  # 18 bytes
    (d / "latin1.csv").write_bytes("0F0,0B0 caf\xe9\n".encode("latin-1"))
    (d / "cell.csv").write_text('"' + "x" * 200_000 + '"\n')
    (d / "digits.csv").write_text("0F" + "9" * 5000 + "\n")
    (d / "nul.csv").write_bytes(b"0F0,\x00\n")
    os.mkfifo(d / "fifo")
    good = json.loads(open(PROFILE).read())
    (d / "latin1.json").write_bytes(b'{"format": "stagewise-profile", "model": "caf\xe9"}')
    (d / "digits.json").write_text('{"format": "stagewise-profile", "version": ' + "9" * 5000 + "}")
    (d / "nested.json").write_text("[" * 100_000)
    (d / "shape.json").write_text(json.dumps({**good, "tied": 5, "meta": [1, 2]}))
    (d / "list.json").write_text("[1, 2]")
    inf = json.loads(json.dumps(good))
    inf["layers"][0]["t_f"][0] = 1.0
    (d / "inf.json").write_text(json.dumps(inf).replace('"t_f": [1.0', '"t_f": [1e400', 1))
    return d


@pytest.fixture(scope="module")
def results(tmp):
    batch = [{"argv": [a.replace("{tmp}", str(tmp)) for a in argv], "env": env} for _, _, argv, env, _ in CASES]
    return dict(zip((c[1] for c in CASES), run_capped(batch)))


@pytest.mark.parametrize("category,name,argv,env,words", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input_is_one_line_and_exit_2(results, category, name, argv, env, words):
    assert_refused(results[name], words)


def test_every_category_of_the_issue_is_covered():
    assert {c[0] for c in CASES} == {"limit", "file", "finite", "nonsense"}
    assert len({c[1] for c in CASES}) == len(CASES)


def test_a_raised_limit_is_honoured(tmp):
    """The limit named in the message is the one that moves it: raise it and the same input runs."""
    argv = ["simulate", "1f1b", "-p", "2", "-m", "70000", "--json"]
    low, raised = run_capped([{"argv": argv, "env": {}},
                              {"argv": argv, "env": {"STAGEWISE_MAX_MICROBATCHES": "70000"}}])
    assert low["rc"] == 2 and "STAGEWISE_MAX_MICROBATCHES" in low["err"]
    assert raised["rc"] == 0 and json.loads(raised["out"])["microbatches"] == 70000


def _integer_options():
    """(subcommand, option) of every option of every subcommand that takes a whole number."""
    import argparse

    from stagewise.cli import build_parser
    from stagewise.option_values import positive_int, whole_int

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, sub in subs.choices.items():
        for action in sub._actions:
            if action.option_strings and (action.type is int or action.type in (positive_int, whole_int)
                                          or getattr(action.type, "__name__", "") == "_count"):
                out.append((name, max(action.option_strings, key=len), action.type, action.choices))
    return out


def test_every_integer_option_names_itself_for_a_31_digit_value(capsys):
    """Issue 44, the class of a 31-digit `--moe-shared` whose message named the parameter count instead: every
    whole-number option of every command refuses it in one line that names the option; none is a bare `int`
    unless its choices bound it (or, --seed, its own check names it)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_helpers import fails

    options = _integer_options()
    # --seed stays int: its own check says torch's range, naming it, for any length (test_hf_cli)
    bare = [o[:2] for o in options if o[2] is int and o[3] is None and o[1] != "--seed"]
    assert len(options) > 40 and not bare, bare
    for sub, flag, *_ in (o for o in options if o[1] != "--seed"):
        err = fails(capsys, sub, flag, "1234567890123456789012345678901")
        assert flag in err, (sub, flag, err)
    err = fails(capsys, "train", "--schedule", "1f1b", "--moe-experts", "4", "--moe-shared", "999999999999999999")
    assert "--moe-experts 4 + --moe-shared 999999999999999999 expert MLPs a block" in err, err
