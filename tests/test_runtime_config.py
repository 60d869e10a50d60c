"""Every `stagewise train` option is checked before any rank starts: exit 2, one line naming the option, fast.

Each case runs the CLI in-process with the launcher's ``spawn`` and the
reference's run replaced by a tripwire, so a check that is missing (or comes
too late) fails the test instead of starting ranks.
"""

from __future__ import annotations

import os
import time

import pytest

import stagewise.runtime.launching.launch as launch
import stagewise.runtime.run.reference as reference
from cli_helpers import fails
from stagewise.runtime import RunConfig, RunError
from stagewise.runtime.run.models import GPTConfig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting ranks (or the in-process reference) fails the test."""
    def tripwire(*_, **__):
        raise AssertionError("ranks started: the option was not checked before the launch")

    monkeypatch.setattr(launch, "spawn", tripwire)  # every local launch goes through it
    monkeypatch.setattr(reference, "run_reference", tripwire)


CASES = [
    # zero or negative sizes never mean "default" (refused by the parser: cli.common.positive_int)
    (["-p", "0"], "argument -p/--ranks: must be >= 1; got 0"),
    (["-m", "0"], "argument -m/--microbatches: must be >= 1; got 0"),
    (["-v", "0"], "argument -v/--chunks: must be >= 1; got 0"),
    (["--dp", "0"], "argument --dp: must be >= 1; got 0"),
    (["--vocab", "0"], "argument --vocab: must be >= 1; got 0"),
    (["--batch", "0"], "argument --batch: must be >= 1; got 0"),
    (["--batch", "-8"], "argument --batch: must be >= 1; got -8"),
    (["--threads", "0"], "argument --threads: must be >= 1; got 0"),
    (["--heads", "0"], "argument --heads: must be >= 1; got 0"),
    (["--seed", "-1"], "--seed must be >= 0; got -1"),
    # documented limits, before anything is allocated
    (["--layers", "1000000"], "--layers 1000000: over the limit of 100,000 layers"),
    (["--batch", "1000000000"], "--batch 1000000000: over the limit of 1,048,576 sequences per step"),
    (["--batch", "65536", "--seq", "1024"], "= 67,108,864 tokens per step: over the limit of 16,777,216"),
    (["--seq", "100000"], "--seq 100000: the synthetic stream has 65,536 tokens, so at most 65,535"),
    (["--d-model", "100000"], "--d-model x 4 --d-model (one block's MLP weight) = 40000000000: over the limit of "
     "268,435,456 elements in one tensor"),
    (["--layers", "4000", "--d-model", "4096"], "parameters: over the limit of 2,147,483,648 model parameters"),
    (["-p", "100000"], "--ranks 100000: over the limit of 4,096 ranks"),
    (["-p", "300", "--layers", "400", "-m", "300", "--batch", "300"], "300 local ranks: over the limit of 256"),
    (["-m", "100000", "--batch", "100000"], "--microbatches 100000: over the limit of 65,536 micro-batches"),
    (["-v", "100"], "--chunks 100: over the limit of 64"),
    # numbers: finite and positive
    (["--lr", "nan"], "--lr must be a finite number > 0; got nan"),
    (["--lr", "inf"], "--lr must be a finite number > 0; got inf"),
    (["--lr", "0"], "--lr must be a finite number > 0; got 0.0"),
    (["--timeout", "nan"], "--timeout must be a finite number > 0; got nan"),
    (["--timeout", "1e400"], "--timeout must be a finite number > 0; got inf"),
    (["--timeout", "1e9"], "--timeout 1000000000.0: over the limit of 86,400 seconds"),
    (["--clip", "nan"], "--clip must be a finite number > 0; got nan"),
    (["--clip", "-1"], "--clip must be a finite number > 0; got -1.0"),
    # the optimizer must exist, step without a closure, and step this model's parameters
    (["--optimizer", "lbfgs"], "--optimizer lbfgs: LBFGS needs a closure"),
    (["--optimizer", "nope"], "--optimizer nope: not a torch.optim optimizer"),
]


@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_option_exits_2_naming_it_before_any_rank_starts(capsys, no_ranks, argv, needle):
    t = time.monotonic()
    err = fails(capsys, "train", "--schedule", "1f1b", *argv)
    assert needle in err, err
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("schedule", ["1f1b", "none"])
def test_an_optimizer_needing_a_closure_is_refused_for_the_reference_too(capsys, no_ranks, monkeypatch, schedule):
    monkeypatch.undo()  # the reference runs in-process: the check must come before its first step
    err = fails(capsys, "train", "--schedule", schedule, "-p", "2", "--optimizer", "lbfgs", "--layers", "2")
    assert "--optimizer lbfgs: LBFGS needs a closure" in err


@pytest.mark.slow
def test_an_optimizer_that_cannot_step_dense_parameters_fails_as_the_option_on_every_rank(capsys):
    """Its trial step runs where the optimizer is built (the first construction imports torch._dynamo, which
    the ranks have preloaded and the launcher does not need): one line naming the option, exit 2."""
    err = fails(capsys, "train", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "2", "--optimizer",
                "sparseadam")
    assert "every rank: --optimizer sparseadam: SparseAdam cannot step this model's dense weights" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_data_must_be_a_regular_readable_file(capsys, no_ranks, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block forever: it is refused from its stat alone
    for path in (tmp_path, fifo):
        assert f"--data {path}: not a regular file" in fails(capsys, "train", "--schedule", "1f1b", "--data",
                                                             str(path))
    small = tmp_path / "small.txt"
    small.write_text("abc")
    assert "3 bytes; needs at least --seq + 1 = 33" in fails(capsys, "train", "--schedule", "1f1b", "--data",
                                                             str(small))


def test_the_checks_hold_for_the_library_too():
    """RunConfig.check and GPTConfig.check are what the CLI relies on: a config built in code meets them too."""
    for cfg, needle in [(RunConfig(lr=float("nan")), "`lr`"), (RunConfig(threads=0), "`threads`"),
                        (RunConfig(model=GPTConfig(seq=70000)), "`seq` 70000"),
                        (RunConfig(timeout=float("inf")), "`timeout`"), (RunConfig(ranks="4"), "`ranks` must be a whole"),
                        (RunConfig(microbatches=True), "`microbatches` must be a whole")]:
        with pytest.raises(RunError, match=needle):
            cfg.check()


def test_the_parameter_count_is_the_built_models():
    cfg = GPTConfig(layers_n=3, d_model=64, heads=4, seq=20, vocab=100)
    built = {id(p): p.numel() for layer in cfg.layers().build_all() for p in layer.parameters()}  # the tied weight once
    assert cfg.parameters() == sum(built.values())


BIG = [["--layers", "1000000"], ["--batch", "1000000000"], ["--seq", "100000"], ["--d-model", "65536"],
       ["--ranks", "100000"], ["--vocab", "1000000000"], ["--microbatches", "1000000000", "--batch", "1000000000"]]
UNDER_A_CAP = """
import contextlib, io, json, sys
from stagewise.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["train", "--schedule", "1f1b", *argv])
    out.append([rc, err.getvalue()])
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="sets a memory limit on a child process")
def test_huge_sizes_are_refused_within_a_1_gib_address_space(tmp_path):
    """Each size is refused before anything of its size is allocated: under RLIMIT_AS of 1 GiB, in seconds."""
    import json
    import resource
    import subprocess
    import sys
    from pathlib import Path

    import stagewise

    cap = 1 << 30
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", UNDER_A_CAP, json.dumps(BIG)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(stagewise.__file__)
                                                                                            .parents[1])},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for argv, (rc, err) in zip(BIG, json.loads(proc.stdout)):
        assert rc == 2 and err.count("\n") == 1 and argv[0] in err, (argv, err)
        assert "limit of" in err or "so at most" in err, (argv, err)
    assert time.monotonic() - t < 60
