"""stagewise.limits: documented limits raised by environment variables; guarded file reads."""

import os

import pytest

from stagewise import limits
from stagewise.limits import LimitError
from stagewise.schedules import generate


def test_a_limit_names_the_option_the_limit_and_the_variable(monkeypatch):
    with pytest.raises(LimitError, match=r"^--ranks 5000: over the limit of 4,096 ranks; set STAGEWISE_MAX_RANKS=N"):
        limits.RANKS.check(5000, "--ranks")
    monkeypatch.setenv("STAGEWISE_MAX_RANKS", "8000")
    limits.RANKS.check(5000, "--ranks")  # raised: fine now
    monkeypatch.setenv("STAGEWISE_MAX_RANKS", "-3")
    with pytest.raises(LimitError, match="STAGEWISE_MAX_RANKS='-3': expected a whole number >= 1"):
        limits.RANKS.check(1, "--ranks")
    for raw in ("²", "1e3", "٣"):  # digits to str.isdigit, not to int(): refused alike, never a ValueError
        monkeypatch.setenv("STAGEWISE_MAX_RANKS", raw)
        with pytest.raises(LimitError, match="expected a whole number >= 1"):
            limits.RANKS.check(1, "--ranks")


def test_generate_checks_the_actions_before_generating(monkeypatch):
    monkeypatch.setenv("STAGEWISE_MAX_ACTIONS", "1000")
    generate("zb-v", 4, 40)  # 4 x 2 x 40 x 3 = 960 actions at most
    with pytest.raises(LimitError, match=r"-p 4 -m 48 -v 2 \(zb-v\) make up to 1152 actions: over the limit of 1,000"):
        generate("zb-v", 4, 48)


def test_the_table_lists_every_limit():
    text = limits.table()
    assert all(lim.env in text for lim in limits.ALL.values())


def test_read_text_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(LimitError, match="--csv .*fifo: not a regular file \\(a FIFO\\)"):
        limits.read_text(tmp_path / "fifo", "--csv")  # would block forever if opened for reading plainly
    with pytest.raises(LimitError, match="--csv /dev/zero: not a regular file \\(a device\\)"):
        limits.read_text("/dev/zero", "--csv")
    with pytest.raises(LimitError, match="--csv .*: not a regular file \\(a folder\\)"):
        limits.read_text(tmp_path, "--csv")
    with pytest.raises(LimitError, match="--csv .*nope: cannot read: No such file"):
        limits.read_text(tmp_path / "nope", "--csv")


def test_read_text_caps_the_size_and_names_bad_bytes(tmp_path, monkeypatch):
    f = tmp_path / "f.csv"
    f.write_bytes(b"0F0,0B0\n")
    assert limits.read_text(f, "--csv") == "0F0,0B0\n"
    monkeypatch.setenv("STAGEWISE_MAX_FILE_BYTES", "4")
    with pytest.raises(LimitError, match="more than 4 bytes: over the limit .* STAGEWISE_MAX_FILE_BYTES"):
        limits.read_text(f, "--csv")
    monkeypatch.delenv("STAGEWISE_MAX_FILE_BYTES")
    f.write_bytes(b"0F0,\xff\n")
    with pytest.raises(LimitError, match="not UTF-8 text \\(byte 4 is 0xff\\)"):
        limits.read_text(f, "--csv")


def test_the_docs_table_is_the_modules_limits():
    """Every limit of docs/limits.md's table comes from limits.py, with its default, and every limit is in it."""
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "docs" / "limits.md").read_text()
    assert limits.markdown() in readme
    rows = [ln for ln in readme.splitlines() if ln.startswith("| `STAGEWISE_MAX_")]
    assert [r.split("`")[1] for r in rows] == [lim.env for lim in limits.ALL.values()]
