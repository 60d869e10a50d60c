"""A user's loops for pipeline parallel composed with FSDP2, ZeRO-1 and tensor parallel, and the plain loops they
must equal.

In a module (not a test file) so spawned ranks can import the functions they run. The own model is
api_helpers' (an embedding, six Linear+Tanh layers of varied widths, the tied head); its tensor-parallel plan
splits the Linear layers in column/row pairs, so a boundary after a column-split layer carries each tp rank's
own columns to the same tp rank of the next stage. The Hugging Face model is a tiny Llama (4 heads, 2 kv
heads) split by its own ``base_model_tp_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import stagewise
from api_helpers import LR, STEPS, batch, layers, loss_fn

#: the own model's plan: Linear layers 1..6 split column-wise, then row-wise (sizes 12, 20, 6, 16, 10, 8 divide 2)
OWN_TP_PLAN = {"1.0": "colwise", "2.0": "rowwise", "3.0": "colwise", "4.0": "rowwise", "5.0": "colwise",
               "6.0": "rowwise"}
HF_ROWS, HF_SEQ, HF_LR = 8, 16, 0.5  #: the HF loop: SGD (AdamW turns near-zero gradients' rounding into +-lr)


@dataclass(frozen=True)
class Case:
    """One run of a user's loop: a schedule on a grid, the own model or the tiny Llama."""

    label: str
    schedule: str
    microbatches: int
    chunks: int | None = None
    model: str = "own"  #: "own" or "llama"
    options: dict = field(default_factory=dict)  #: Pipeline's dp / fsdp / tp / reshard_after_forward
    mesh: tuple | None = None  #: (dimension names, shape): the user makes the DeviceMesh and passes it instead
    zero: bool = False  #: ZeRO-1: a ZeroRedundancyOptimizer over the pipeline's dp group


def hf_batch(k: int) -> torch.Tensor:
    return torch.randint(0, 256, (HF_ROWS, HF_SEQ), generator=torch.Generator().manual_seed(50 + k))


def hf_reference(folder: str) -> tuple[list[float], dict]:
    """transformers' own model in a plain SGD loop: the losses and the final state_dict."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).train()
    opt = torch.optim.SGD(model.parameters(), lr=HF_LR)
    losses = []
    for k in range(STEPS):
        ids = hf_batch(k)
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def run_cases(cases: list[Case], hf_folder: str | None = None, dcp_dir: str | None = None) -> dict:
    """Rank function: each case through stagewise.Pipeline; rank 0 returns {label: (losses, full state_dict)}.
    ``dcp_dir``: the first case also saves ``{"model": pipe.state_dict(), "optim": ...}`` there with the user's
    own ``dcp.save`` (DCP's conventions), for the test to read into the plain model."""
    out = {}
    for n, case in enumerate(cases):
        pipe, opt, step = _build(case, hf_folder)
        losses = [step(k) for k in range(STEPS)]
        if dcp_dir is not None and n == 0:
            import torch.distributed.checkpoint as dcp

            dcp.save({"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)}, checkpoint_id=dcp_dir)
        out[case.label] = (losses, pipe.full_state_dict())
    return out


def _build(case: Case, hf_folder: str | None):
    options = dict(case.options)
    if case.mesh is not None:
        from torch.distributed.device_mesh import init_device_mesh

        names, shape = case.mesh
        options["mesh"] = init_device_mesh("cpu", shape, mesh_dim_names=names)
    if case.model == "llama":
        from stagewise.hf import load
        from stagewise.hf.pipelined import pipeline

        pipe = pipeline(load(hf_folder), case.schedule, microbatches=case.microbatches, chunks=case.chunks,
                        **options)
        opt = _optimizer(pipe, case, torch.optim.SGD, HF_LR)
        return pipe, opt, lambda k: _step(pipe, opt, hf_batch(k), hf_batch(k))
    if options.get("tp", 1) > 1 or "tp" in (case.mesh or ((),))[0]:
        options["tp_plan"] = OWN_TP_PLAN
    pipe = stagewise.Pipeline(case.schedule, layers(), loss_fn, microbatches=case.microbatches, chunks=case.chunks,
                              **options)
    opt = _optimizer(pipe, case, torch.optim.AdamW, LR)
    return pipe, opt, lambda k: _step(pipe, opt, *batch(k))


def _optimizer(pipe, case: Case, cls, lr: float):
    if not case.zero:
        return cls(pipe.parameters(), lr=lr)
    opt = pipe.zero_optimizer(cls, lr=lr)  # torch's ZeroRedundancyOptimizer over pipe.group("dp")
    assert pipe.dp is None or all(g is pipe.group("dp") for g in pipe.dp.groups.values())  # one dp group
    return opt


def _step(pipe, opt, x, y) -> float:
    loss = pipe.step(x, y).loss
    opt.step()
    opt.zero_grad()
    return loss


def grid_facts() -> dict:
    """Rank function (4 ranks): what the Grid hands out. pp 2 x dp 2 from degrees, then from the user's own
    DeviceMesh named (pp, dp); one step each. Rank 0 returns the facts and the losses."""
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    pipe = stagewise.Pipeline("1f1b", layers(), loss_fn, microbatches=2, dp=2)
    dp = pipe.group("dp")
    out["degrees"] = {"parallelism": pipe.parallelism.describe(), "mesh": pipe.mesh,
                      "dp reduction's group": all(g is dp for g in pipe.dp.groups.values()),
                      "made once": pipe.group("dp") is dp and pipe.grid.group(("dp", "tp")) is dp,
                      "dp ranks": pipe.topo.group_of("dp"), "loss": pipe.step(*batch(0)).loss}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pipe = stagewise.Pipeline("1f1b", layers(), loss_fn, microbatches=2, mesh=mesh)
    out["mesh"] = {"parallelism": pipe.parallelism.describe(), "mesh is the user's": pipe.mesh is mesh,
                   "dp group is the mesh's": pipe.group("dp") is mesh.get_group("dp"),
                   "dp reduction's group": all(g is mesh.get_group("dp") for g in pipe.dp.groups.values()),
                   "dp ranks": pipe.topo.group_of("dp"), "loss": pipe.step(*batch(0)).loss}
    return out


def executed_actions(cases: list[Case]) -> dict:
    """Rank function: one step of each case; rank 0 returns {label: (schedule, parallelism, [(pipeline rank,
    the actions the executor ran, as text) per rank])}."""
    import torch.distributed as dist

    out = {}
    for case in cases:
        pipe, _, step = _build(case, None)
        step(0)
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, (pipe.topo.pipe, [str(a) for a in pipe.last_outcome.executed]))
        out[case.label] = (pipe.schedule, pipe.parallelism, every)
    return out
