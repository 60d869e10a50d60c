"""Run the `stagewise` CLI in-process as a user would, for the CLI tests of every area."""

from contextlib import contextmanager

import pytest

from stagewise.cli import main


def run(capsys, *argv: str):
    """(exit code, stdout, stderr) of `stagewise ARGV`; argparse's SystemExit becomes the code."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's own errors and --help
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def fails(capsys, *argv: str) -> str:
    """stderr of a command that must fail as bad input: exit 2, one line, no traceback."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (argv, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@contextmanager
def raises_said(exc, pattern: str):
    """``pytest.raises(exc)`` whose message, said in the CLI's words (flags.py), matches ``pattern``: a
    library error names `microbatches`, the CLI -m; one expectation checks both the rule and the wording."""
    import re

    from stagewise.flags import say

    with pytest.raises(exc) as info:
        yield info
    text = say(str(info.value))
    assert re.search(pattern, text), f"{pattern!r} not in {text!r}"
