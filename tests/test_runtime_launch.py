"""The launcher owns its ranks: however `stagewise train` (or torchrun) is ended, no process of the run survives.

A run's processes are found by a unique marker in their environment (every
process of the run inherits it: ranks, the forkserver, the resource tracker,
torchrun's workers), read from /proc. Each test starts a run of many steps,
waits for its first step, signals the launcher and checks that within 10 s no
process holding the marker is left.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import stagewise

from stagewise.runtime.launching.launch import Stopped, _stop_on_signals, parent_death_signal

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the run's processes from /proc")]

TRAIN = ["-m", "stagewise", "train", "--schedule", "1f1b", "-m", "2", "--layers", "2", "--d-model", "32", "--seq",
         "16", "--steps", "100000", "--threads", "1"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def marked(marker: str) -> list[int]:
    """The pids of every process whose environment holds ``marker``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


class Run:
    """A `stagewise train` of many steps with a marker in its environment; kills what is left when done."""

    def __init__(self, tmp_path, argv: list[str]):
        self.marker = f"STAGEWISE_TEST_RUN={uuid.uuid4().hex}"
        key, value = self.marker.split("=")
        self.err = tmp_path / "stderr.txt"
        self.proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=open(self.err, "w"),
                                     cwd=tmp_path, env={**os.environ, key: value, "OMP_NUM_THREADS": "1"})

    def first_step(self, within: float = 60.0) -> None:
        ready, _, _ = select.select([self.proc.stdout], [], [], within)
        line = self.proc.stdout.readline().decode() if ready else ""
        assert line.startswith("step 1/"), (line, self.err.read_text()[-2000:])

    def survivors(self, within: float = 10.0) -> list[int]:
        """The run's processes still alive ``within`` seconds from now (polled: [] as soon as none is left)."""
        deadline = time.monotonic() + within
        while (left := marked(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def cleanup(self) -> None:
        for pid in marked(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def run(tmp_path):
    runs = []

    def start(*argv: str) -> Run:
        runs.append(Run(tmp_path, list(argv)))
        return runs[-1]

    yield start
    for r in runs:
        r.cleanup()


def test_sigterm_stops_every_rank_then_exits_128_plus_the_signal(run):
    sig = signal.SIGTERM
    r = run(*TRAIN, "-p", "2")
    r.first_step()
    assert len(marked(r.marker)) >= 3  # the launcher, its forkserver, two ranks (and the resource tracker)
    r.proc.send_signal(sig)
    assert r.proc.wait(timeout=10) == 128 + sig
    assert r.survivors() == []
    assert r.err.read_text().strip().endswith(f"stopped by {signal.Signals(sig).name}; every rank stopped")


def test_sigkill_of_the_launcher_leaves_no_rank_alive(run):
    r = run(*TRAIN, "-p", "2")
    r.first_step()
    r.proc.kill()
    r.proc.wait(timeout=10)
    assert r.survivors() == []  # the ranks see their lifeline close; the forkserver and tracker follow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_under_torchrun_ending_torchrun_leaves_no_worker_alive(run, sig):
    r = run(*TORCHRUN, *TRAIN)
    r.first_step()
    r.proc.send_signal(sig)  # SIGTERM: torchrun forwards it; SIGKILL: its workers' parent-death signal
    r.proc.wait(timeout=30)
    assert r.survivors() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_while_ranks_run_sigterm_and_sighup_become_stopped_with_the_conventional_status(sig):
    """The handler ``spawn`` holds while ranks run (in-process: the same path as the SIGTERM run above)."""
    before = signal.getsignal(sig)
    with pytest.raises(Stopped) as info:
        with _stop_on_signals():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises at the next bytecode
    assert (info.value.code, info.value.name, isinstance(info.value, SystemExit)) == (128 + sig, sig.name, True)
    assert signal.getsignal(sig) is before  # restored once the ranks are stopped


def test_a_child_asking_for_the_parent_death_signal_dies_with_its_parent(tmp_path):
    """The kernel's guard on its own: a grandchild asks for SIGKILL on its parent's death; the parent is killed."""
    script = ("import os, sys, time\n"
              "from stagewise.runtime.launching.launch import parent_death_signal\n"
              "if os.fork() == 0:\n"
              "    assert parent_death_signal(9)\n"
              "    print(os.getpid(), flush=True)\n"
              "    time.sleep(60)\n"
              "    os._exit(0)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(stagewise.__file__).parents[1])})
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    parent.stdout.close()
    assert parent_death_signal(0)  # 0 clears it: this test process stays as it was


def test_no_process_of_a_run_outlives_the_command(tmp_path):
    """The forkserver of the ranks used to tear torch down for seconds after `stagewise train` (or `profile
    --hf`) had returned; it is ended at exit, so nothing of the run is left once the command is."""
    marker = f"STAGEWISE_TEST_RUN={uuid.uuid4().hex}"
    key, value = marker.split("=")
    argv = [a if a != "100000" else "1" for a in TRAIN]
    proc = subprocess.run([sys.executable, *argv, "-p", "2"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, env={**os.environ, key: value, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    deadline = time.monotonic() + 2.0  # multiprocessing's resource tracker (no torch) ends as its pipe closes
    while (left := [p for p in marked(marker) if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def test_a_late_rank_is_waited_for_at_startup_then_named():
    """Rank 1 builds its layers 3 s after rank 0 while the step timeout is 1 s: the first pipeline waits for it
    (ranks start slowly on a loaded machine); with a startup allowance of 1.5 s the second names it."""
    from api_helpers import late_rank
    from stagewise.runtime import RankFailure

    with pytest.raises(RankFailure) as info:
        stagewise.launch(late_rank, 2, 3.0, "1.5", timeout=1, threads=1)
    assert info.value.user and "\n" not in str(info.value)
    assert ("rank 0: rank 1 did not reach the pipeline's first exchange within 1.5 s (still starting or building "
            "its layers on a loaded machine, or stopped; STAGEWISE_STARTUP_S=S waits longer)") in str(info.value)
