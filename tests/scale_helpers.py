"""Helpers for the data-parallel, recomputation and memory tests.

A module (not a test file) so spawned ranks can unpickle the model config.
``run_local`` runs one rank's executor in this process, for schedules with
p = 1 (several stages on one rank hand tensors over in memory): no process
group, so these tests cost milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from stagewise.runtime.execution.activation_memory import ActivationMeter
from stagewise.runtime.execution.program import lower
from stagewise.runtime.messages.p2p import P2P
from stagewise.runtime.execution.executor import Executor, RankContext
from stagewise.runtime.run.models import GPTConfig
from stagewise.runtime.execution.recompute import Recompute
from stagewise.runtime.stages.stage import build_stages, stage_map
from stagewise.runtime.execution.timing import WallClock


@dataclass(frozen=True, kw_only=True)
class DropoutGPT(GPTConfig):
    """The GPT with dropout after every block: recomputation must replay the same masks."""

    dropout: float = 0.3

    def layer(self, i: int):
        out = super().layer(i)
        return nn.Sequential(out, nn.Dropout(self.dropout)) if 0 < i < self.num_layers - 1 else out


SMALL = GPTConfig(layers_n=2, d_model=32, heads=4, seq=16, vocab=64)  # 4 layers


def run_local(schedule, model, recompute=frozenset(), batch: int = 8, meter: bool = True):
    """One step of ``schedule`` (p = 1) on ``model``: ({stage.param: grad}, meter, loss)."""
    assert schedule.ranks == 1
    layers = model.layers().build_all()
    torch.manual_seed(0)  # dropout draws from here: every run starts from the same state
    lay = stage_map(schedule, layers)
    stages = build_stages(schedule, lay, layers, 0, torch.device("cpu"))
    m = ActivationMeter(stages) if meter else None
    plan = lower(schedule, 0)
    ctx = RankContext(plan=plan, stages=stages, p2p=P2P(plan.messages, 0, torch.device("cpu"), 10),
                      loss=model.loss, clock=WallClock(), recompute=Recompute(frozenset(recompute),
                                                                               torch.device("cpu")), meter=m)
    inputs, targets = model.batch(0, batch)
    k = schedule.microbatches
    done = Executor(ctx).step([c.clone() for c in inputs.chunk(k)], [c.clone() for c in targets.chunk(k)])
    grads = {f"{s}.{n}": p.grad.clone() for s, st in stages.items() for n, p in st.named_parameters()}
    return grads, m, done.loss
