"""Run the `stagewise` CLI in-process as a user would, for the CLI tests of every area."""

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
