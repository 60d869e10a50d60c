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
