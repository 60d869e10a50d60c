"""torchrun multi-node, on one machine: two "nodes" on loopback train together like one node, and fail together.

Each node is a ``python -m torch.distributed.run --nnodes 2 --nproc-per-node 1``
process with a c10d rendezvous on 127.0.0.1 (node 0 hosts the store). One
thread per rank in both runs, so the losses are bit for bit those of the local
launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from runtime_helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TRAIN = ["-m", "stagewise", "train", "--schedule", "1f1b", "-m", "4", "--layers", "2", "--d-model", "32", "--seq",
         "16", "--steps", "3", "--threads", "1"]


def two_nodes(tmp_path, *extra: str, env: dict | None = None) -> tuple[list[subprocess.CompletedProcess], float]:
    """Start node 0 and node 1 as two torchrun processes; wait for both."""
    port = free_port()
    procs = []
    t = time.monotonic()
    for node in (0, 1):
        # static rendezvous (node 0 hosts the store): c10d's keep-alive makes a node that finishes
        # after the host fail with RendezvousConnectionError on one machine, now and then
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "--local-addr", "127.0.0.1", *TRAIN, *extra]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=100)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done, time.monotonic() - t


def test_two_nodes_give_the_losses_of_one_node(tmp_path):
    local = subprocess.run([sys.executable, *TRAIN, "-p", "2", "--json"], capture_output=True, text=True, check=True,
                           cwd=tmp_path)
    nodes, _ = two_nodes(tmp_path, "--json")
    assert [n.returncode for n in nodes] == [0, 0], [n.stderr[-2000:] for n in nodes]
    printed = [n.stdout for n in nodes if n.stdout.strip()]
    assert len(printed) == 1  # global rank 0 alone prints, on whichever node the rendezvous put it
    res = json.loads(printed[0])
    assert (res["schedule"], res["ranks"]) == ("1f1b", 2)
    assert res["losses"] == json.loads(local.stdout)["losses"]


def test_a_rank_that_dies_on_one_node_ends_both_nodes(tmp_path):
    nodes, seconds = two_nodes(tmp_path, env={"STAGEWISE_FAULT": "exit:rank=1:action=1F2:step=2"})
    assert all(n.returncode != 0 for n in nodes), [n.returncode for n in nodes]
    assert seconds < 60
    err = "\n".join(n.stderr for n in nodes)
    assert "exitcode  : 3" in err  # torchrun's own report of the dead rank 1
    # its peer names the op it was at and the message from rank 1 it waited for, then prints its last events
    assert "stagewise train: error: rank 0 at 0B" in err and "(rank 1): " in err
    assert "flight recorder, rank 0 (failed): last 12 events" in err


# after train(), each rank writes the names of its threads that belong to gloo (Linux: /proc/self/task/*/comm)
GLOO_THREADS_LEFT = """
import os
from stagewise.runtime import RunConfig, train
from stagewise.runtime.run.models import GPTConfig

train(RunConfig(schedule="dualpipe", ranks=2, microbatches=4, batch=8, steps=2, threads=1,
                model=GPTConfig(layers_n=2, d_model=32, heads=4, seq=16, vocab=64)))
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
with open(f"rank-{os.environ['RANK']}.txt", "w") as f:
    f.write(" ".join(sorted(n for n in names if "gloo" in n)))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the rank's threads from /proc")
def test_a_rank_joins_its_gloo_threads_before_the_interpreter_exits(tmp_path):
    """A gloo worker still alive at interpreter exit may be freeing a finished collective's tensors, which takes
    the GIL: the rank then aborts after printing its result ("terminate called without an active exception"),
    now and then. Deterministic form: once train() returns, every group (default and dualpipe's tied-weight
    groups) is freed and its threads joined."""
    script = tmp_path / "probe.py"
    script.write_text(GLOO_THREADS_LEFT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(tmp_path / f"rank-{r}.txt").read_text() for r in (0, 1)] == ["", ""]  # no gloo thread left


LATE_AT_THE_RENDEZVOUS = """
import os, time
import torch.nn.functional as F
from torch import nn
import stagewise

if os.environ["RANK"] == "1":
    time.sleep(60)  # a rank still importing and building on a loaded machine (torchrun ends it)
stagewise.Pipeline("1f1b", [nn.Linear(4, 4), nn.Linear(4, 4)], F.mse_loss, microbatches=2, timeout=1)
"""


def test_a_rank_that_misses_the_rendezvous_is_named(tmp_path):
    """Under torchrun a rank later than the startup allowance failed with c10d's socket warnings and a
    DistStoreError traceback per rank, naming nothing; now the line names the missing rank and the cure."""
    script = tmp_path / "late.py"
    script.write_text(LATE_AT_THE_RENDEZVOUS)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "STAGEWISE_STARTUP_S": "2"})
    assert proc.returncode != 0
    assert ("RunError: rank 0: rank 1 did not reach the rendezvous at localhost:" in proc.stderr
            and "within 2 s (ranks still starting on a loaded machine, or stopped before it; STAGEWISE_STARTUP_S=S "
                "waits longer)" in proc.stderr), proc.stderr[-3000:]
