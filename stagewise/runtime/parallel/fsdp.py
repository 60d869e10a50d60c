"""Sharded data parallel: torch's FSDP2 (``fully_shard``) on each stage, the schedule deciding when it gathers.

Each layer of a stage that holds parameters is its own FSDP unit, and the stage is the root over them (what
torchtitan does per model chunk). A rank runs several forwards and backwards of a stage per step, so FSDP's
own per-call rhythm (gather before each forward, reduce-scatter after each backward) is replaced by the
lowered program's actions, which the executor hands here one by one (execution/executor.py), the way torch's
``_PipelineScheduleRuntime`` does with its UNSHARD, RESHARD and REDUCE_GRAD actions:

- **gather** (``unshard`` at UNSHARD): the all-gather of a stage starts, asynchronously, when the rank begins
  the first forward of the stage before it in its program (the first stage's at the step's first op), so it is
  in flight one stage ahead; an op of a stage waits for its gather before its clock starts.
- the stage stays gathered while it has micro-batches left (``reshard_after_forward=False``, torchtitan's
  choice under pipeline parallel); ``reshard_after_forward=True`` frees each layer after each of its forwards
  and backwards, for an all-gather per layer per forward and backward (FSDP's own hooks, one layer at a
  time) and of the stage before each W. Either way the gradients stay whole until the stage's last backward.
- **reduce** and **free** (``reduce`` at REDUCE_GRAD, ``reshard`` at RESHARD): after the stage's last
  backward (its last W under split backward) its gradients are reduce-scattered (all-reduced over ``dp`` too
  with HSDP) and it is resharded, where the lowered program has its REDUCE_GRAD and RESHARD. Until then the
  backward only accumulates into the gathered gradients (``set_requires_gradient_sync(False)``). W adds
  its gradients to the gathered parameters' ``.grad`` like autograd would, so FSDP reduces them alike.

Gradients are summed, not averaged (``set_gradient_divide_factor(1)`` with sum-only collectives, which
gloo also runs): the pipeline's loss is already divided by the number of data shards.

A layer may hand a tensor on unchanged (a timestep, an encoder output): FSDP's pre-forward makes every input
of a unit a view (its post-backward hook's autograd function returns its inputs as views), so such a layer
returns a view, and torch warns that an in-place op on it "can cause backward to fail or produce wrong
gradients". Nothing here writes into a layer's output (the next layer reads it, the executor sends or
differentiates it) and the gradients are right, so that one warning is silenced where stages are sharded.

Each gather, reduction and reshard is written to the flight recorder as it is issued, under the lowering's
names (``1UNSHARD``, ``1REDUCE_GRAD``, ``1RESHARD``: stagewise/comm_actions.py).
"""

from __future__ import annotations

import time
import warnings

from ..resilience.flight import NO_FLIGHT


class Sharded:
    """This rank's stages under FSDP2 over ``mesh`` (1-D ``fsdp``, or 2-D ``(dp, fsdp)``: HSDP).
    Mutable: which stages are gathered, the gathers in flight."""

    def __init__(self, stages: dict, mesh, *, reshard_after_forward: bool = False, flight=NO_FLIGHT):
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self.stages, self.raf, self.flight = stages, reshard_after_forward, flight
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor",
                                category=UserWarning)  # a pass-through input (see above): no in-place op follows
        self.units: dict[int, list] = {}  # stage -> its FSDP modules (layers, then the stage itself)
        for s, st in stages.items():
            for layer in st.layers:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
            fully_shard(st, mesh=mesh, reshard_after_forward=reshard_after_forward)
            self.units[s] = [m for m in st.modules() if isinstance(m, FSDPModule)]
            for m in self.units[s]:
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        self.pending: dict[int, list] = {}  # stage -> unshard handles in flight
        self.gathered: set[int] = set()

    # ---- what the executor's handlers call

    def start_step(self) -> None:
        """Before a step: the backwards only accumulate; nothing is reduced until ``free``, nor resharded
        (with ``reshard_after_forward``: each layer after each of its forwards and backwards)."""
        for st in self.stages.values():
            st.set_requires_gradient_sync(False)
            st.set_reshard_after_backward(self.raf)
            st.set_is_last_backward(False)

    def unshard(self, s: int) -> None:
        """UNSHARD: start the stage's gather (asynchronously, once while it stays gathered). With
        ``reshard_after_forward`` FSDP gathers one layer at a time itself in F, B and I (see ``ready``)."""
        if not self.raf:
            self._gather(s)

    def ready(self, a) -> None:
        """Before action ``a``'s clock starts: wait for its stage's gather (a W under ``reshard_after_forward``
        gathers its stage first: its weight gradients belong to the gathered parameters)."""
        if self.raf and a.kind != "W":
            return
        if self.raf:
            self.gathered.discard(a.stage)
        self._gather(a.stage)
        self._wait(a.stage)

    def reduce(self, s: int) -> None:
        """REDUCE_GRAD: reduce-scatter the stage's gradients into its shards."""
        self.flight.comm(f"{s}REDUCE_GRAD")
        t0 = time.perf_counter()
        self._reduce(s)
        self.flight.done(f"{s}REDUCE_GRAD", time.perf_counter() - t0)

    def reshard(self, s: int, training: bool = True) -> None:
        """RESHARD: release the stage (evaluating, reshard it: no reduction did)."""
        if not training:
            for m in self.units[s]:
                m.reshard()
        self.flight.comm(f"{s}RESHARD")
        self.gathered.discard(s)

    def finish(self) -> None:
        """After the program: no gather is left in flight (a stage the program never ran)."""
        for s in list(self.pending):
            self._wait(s)

    # ---- internals

    def _wait(self, s: int) -> None:
        handles = self.pending.pop(s, None)
        if handles is not None:
            t0 = time.perf_counter()
            for handle in handles:
                handle.wait()
            self.flight.done(f"{s}UNSHARD", time.perf_counter() - t0)

    def _gather(self, s: int) -> None:
        if s not in self.gathered:
            self.flight.comm(f"{s}UNSHARD")
            self.pending[s] = [m.unshard(async_op=True) for m in self.units[s]]
            self.gathered.add(s)

    def _reduce(self, s: int) -> None:
        """torch.distributed.pipelining's REDUCE_GRAD (stage.py ``perform_reduce_grad``): every FSDP unit of the
        stage runs its post-backward with gradient sync on, then the root's end-of-backward callback."""
        from torch.distributed.fsdp import fully_shard

        st = self.stages[s]
        st.set_is_last_backward(True)
        st.set_reshard_after_backward(True)
        st.set_requires_gradient_sync(True)
        state = fully_shard.state(st)
        for unit in state._state_ctx.all_states:
            for group in unit._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()
