"""Your own loop under torchrun survives what `stagewise train` survives: a worker killed with -9 (torchrun's
`--max-restarts` restarts it; the `Pipeline` meets on the agent's store under its own attempt's keys) and a
stop notice (SIGTERM: `stagewise.StopNotice` lets the loop save the step in flight and exit 143); each restart
continues the loss curve bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
pytest.importorskip("torch")

# a user's loop with its own checkpoints (DCP, a `done` marker written last), saving every 3 steps and on a
# notice. Attempt 0: rank 1 is killed with -9 in step 6; attempt 1 resumes step 3, and SIGTERM reaches rank 1
# alone in step 4; attempt 2 resumes the notice's checkpoint of step 4 and finishes.
OWN_LOOP = """
import json, os, signal
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import stagewise

attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])


def layers():
    torch.manual_seed(0)
    return [nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)]


pipe = stagewise.Pipeline("1f1b", layers(), F.mse_loss, microbatches=4)
opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
state = {"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)}
done = sorted(Path("ck").glob("step-*/done"))
start = int(done[-1].parent.name.split("-")[1]) if done else 0
if done:
    dcp.load(state, checkpoint_id=str(done[-1].parent))
    pipe.load_state_dict(state["model"]); pipe.load_optimizer_state_dict(opt, state["optim"])


def save(step):
    folder = f"ck/step-{step}"
    dcp.save({"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)}, checkpoint_id=folder)
    dist.barrier()
    if rank == 0:
        Path(folder, "done").touch()
    return folder


with stagewise.StopNotice(grace=60) as notice:
    for step in range(start, 6):
        if rank == 1 and (attempt, step) == (0, 5):
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1 and (attempt, step) == (1, 3):
            os.kill(os.getpid(), signal.SIGTERM)  # the notice: this step still runs to its end
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        loss = pipe.step(x, torch.sin(x[:, :4])).loss
        opt.step(); opt.zero_grad()
        if rank == 0:
            with open("losses.jsonl", "a") as f:
                f.write(json.dumps([attempt, step + 1, loss.hex()]) + "\\n")
        stop = notice.agreed()
        if stop or (step + 1) % 3 == 0:
            folder = save(step + 1)
        if stop:
            raise stagewise.Preempted(step + 1, folder)
"""


@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_own_loop_under_torchrun_restarts_after_kill_9_and_saves_on_sigterm_bit_for_bit(tmp_path):
    (tmp_path / "own.py").write_text(OWN_LOOP)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "own.py"],
                          capture_output=True, text=True, timeout=220, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Connection refused" not in proc.stderr  # the restarted Pipelines met on keys of their own
    assert "exitcode: -9" in proc.stderr and "exitcode: 143" in proc.stderr  # the kill, then the notice's exit
    rows = [json.loads(line) for line in (tmp_path / "losses.jsonl").read_text().splitlines()]
    seen = {(a, s): loss for a, s, loss in rows}
    assert [(a, s) for a, s, _ in rows] == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 4), (2, 5), (2, 6)]
    assert seen[1, 4] == seen[0, 4]  # resumed step 3's checkpoint after the kill: the same bits
    assert seen[2, 5] == seen[0, 5]  # resumed the notice's checkpoint of step 4: the same bits
    assert (tmp_path / "ck/step-4/done").exists()  # saved on the notice, not on the every-3 rule


def test_a_stop_notice_refuses_a_grace_that_is_no_number_of_seconds():
    import stagewise
    from stagewise import StagewiseError

    for grace in (0, -1.0, float("nan"), "60"):
        with pytest.raises(StagewiseError, match="`grace` must be a finite number > 0"):
            stagewise.StopNotice(grace=grace)
