"""The process group's life (runtime/launching/groups.py): the launcher's rendezvous holds its port."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("torch")

from stagewise.runtime.launching.groups import HOST, Rendezvous, is_torchrun  # noqa: E402


def test_the_rendezvous_keeps_its_port_until_it_is_closed():
    meeting = Rendezvous(world=2, timeout_s=5)
    try:
        with socket.socket() as s, pytest.raises(OSError):  # nobody else can take it while the ranks join
            s.bind((HOST, meeting.port))
    finally:
        meeting.close()


def test_torchrun_is_recognised_by_its_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert not is_torchrun()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert is_torchrun()


TRAIN = ("train", "--schedule", "1f1b", "--layers", "2", "--d-model", "32", "--seq", "16", "--steps", "1", "-m", "2")


@pytest.mark.parametrize("env, argv, needle", [
    ({"RANK": "5", "WORLD_SIZE": "4"}, (), "RANK=5 with WORLD_SIZE=4: a rank is 0 .. WORLD_SIZE - 1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, (), "WORLD_SIZE=0: expected the number of ranks, >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "abc"}, (), "WORLD_SIZE='abc': expected a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "8"}, ("--dp", "3"), "--dp 3 = 3 does not divide the 8 ranks"),
    ({}, ("--dp", "1e9"), "argument --dp: expected a whole number; got '1e9'"),
    ({}, ("--dp", "1000000000"), "--dp 1000000000: over the limit"),
    ({}, ("--zero", "1", "--fsdp", "2", "--dp", "2"), "--zero 1 with --fsdp 2: FSDP already shards"),
    ({}, ("--ep", "2", "--tp", "2", "--moe-experts", "4"), "--ep 2 with --tp: expert parallel is not composed"),
])
def test_a_layout_or_torchrun_environment_that_cannot_run_exits_2_before_any_rank_starts(
        capsys, monkeypatch, env, argv, needle):
    """One line naming the variable or the degree and the rule, before any rendezvous (which would wait for
    ranks that never come)."""
    from cli_helpers import fails

    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert needle in fails(capsys, *TRAIN, *argv)
