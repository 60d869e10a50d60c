"""Each printed line is what its framework builds as planned: Megatron-LM (its argument names at a pinned
commit and its layer-count rules), torchtitan (its own ConfigManager and ParallelDims, where installed),
DeepSpeed (its own config and topology, where installed) and stagewise (train's own parser)."""

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from framework_helpers import (megatron_args, megatron_builds, megatron_model_validate, megatron_validate,  # noqa: E402
                               planned, rows)

from stagewise import Parallelism  # noqa: E402
from stagewise.plan.cluster.frameworks import (block_counts, deepspeed_config, megatron_model,  # noqa: E402
                                               megatron_options, megatron_split, refusal, stagewise_train_argv,
                                               torchtitan_options, torchtitan_parts)
from stagewise.plan.cluster.transformer import from_json  # noqa: E402


def _placed(built: list[list[int]], p: int) -> list[int]:
    """Megatron-LM's (rank, virtual stage) counts in model order: stage s on rank s mod p, chunk s // p."""
    v = len(built[0])
    return [built[s % p][s // p] for s in range(p * v)]


def test_megatron_builds_every_layer_of_every_plan():
    seen = 0
    for job, c in rows("megatron"):
        cmd, note = megatron_options(c, job)
        assert cmd, note
        a = megatron_args(cmd)
        megatron_validate(a)
        megatron_model_validate(a, job.spec)
        built = megatron_builds(a)
        assert sum(map(sum, built)) == job.spec.layers
        p = c.config.p
        assert int(a["pipeline-model-parallel-size"]) == c.parallelism.pp
        assert int(a["tensor-model-parallel-size"]) == c.parallelism.tp
        want = block_counts(c.candidate.counts)
        assert _placed(built, p) == want if p > 1 else sum(map(sum, built)) == sum(want)
        seen += 1
    assert seen >= 8


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), v=st.sampled_from([1, 2, 4]), base=st.integers(1, 6),
       ends=st.tuples(st.integers(-1, 2), st.integers(-1, 2)), bump=st.integers(0, 3))
def test_megatron_split_builds_the_planned_blocks(p, v, base, ends, bump):
    """Any split (even, lighter ends, one odd stage): Megatron-LM builds exactly its blocks per stage."""
    blocks = [base] * (p * v)
    blocks[0], blocks[-1] = max(0, base + ends[0]), max(0, base + ends[1])
    blocks[bump % len(blocks)] += bump // 2
    counts = tuple([blocks[0] + 1, *blocks[1:-1], blocks[-1] + 1])
    flags = ["--num-layers", str(sum(blocks)), "--pipeline-model-parallel-size", str(p), *megatron_split(counts, p, v)]
    a = megatron_args(shlex.join(flags))
    megatron_validate(a)
    assert _placed(megatron_builds(a), p) == blocks


SHIPPED = sorted(p.stem for p in (Path(__file__).parents[1] / "stagewise/plan/cluster/data/models").glob("*.json"))


@pytest.mark.parametrize("name", SHIPPED)
def test_megatron_lines_carry_every_shipped_models_shape(name):
    """Issue 44: Megatron-LM's validate_args requires the model's shape, and without it builds another model."""
    from stagewise.plan.cluster import TransformerSpec

    spec = TransformerSpec.load(name)
    megatron_model_validate(megatron_args(shlex.join([*megatron_model(spec), "--pipeline-model-parallel-size", "1"])),
                            spec)


@st.composite
def _model_files(draw):
    """A user's model file: dense or MoE (dense first blocks, every k-th, dense indices, shared experts, a
    capacity), grouped-query or latent attention (with or without a query rank), a head size of its own, sliding
    windows per block, MTP modules, tied embeddings, dropout."""
    layers, heads = draw(st.integers(1, 40)), draw(st.sampled_from([4, 8, 16]))
    d = {"name": "mine", "layers": layers, "hidden": heads * draw(st.sampled_from([16, 24, 64])), "heads": heads,
         "kv_heads": heads // draw(st.sampled_from([1, 2, 4])), "ffn": draw(st.integers(64, 4096)),
         "vocab": draw(st.integers(256, 200_000)), "seq": draw(st.sampled_from([512, 4096])),
         "mlp": draw(st.sampled_from(["gelu", "swiglu"])), "tied_embeddings": draw(st.booleans()),
         "dropout": draw(st.booleans()), "mtp_layers": draw(st.integers(0, 2))}
    if draw(st.booleans()):
        d["head_dim"] = draw(st.sampled_from([32, 128]))
    if draw(st.booleans()):
        first = draw(st.integers(0, layers - 1))  # the first MoE block, kept MoE
        d["moe"] = {"experts": draw(st.integers(2, 64)), "top_k": 2, "expert_ffn": draw(st.integers(16, 2048)),
                    "shared_experts": draw(st.integers(0, 2)), "dense_layers": first, "every": draw(st.integers(1, 3)),
                    "dense": sorted(draw(st.sets(st.integers(0, layers - 1), max_size=3)) - {first})}
        if draw(st.booleans()):
            d["moe"] |= {"capacity_factor": 1.25, "pad": draw(st.booleans())}
    if draw(st.booleans()):
        d["mla"] = {"q_lora_rank": draw(st.sampled_from([None, 64])), "kv_lora_rank": 32, "qk_rope_head_dim": 16,
                    "qk_nope_head_dim": 32, "v_head_dim": 32}
        d["kv_heads"] = heads
    elif draw(st.booleans()):
        d["sliding_window"] = draw(st.integers(2, 512))
        d["layer_types"] = draw(st.lists(st.sampled_from(["full_attention", "sliding_attention"]), min_size=layers,
                                         max_size=layers))
    return from_json({"format": "stagewise-model", "version": 1, **d}, "mine.json")


@settings(max_examples=80, deadline=None)
@given(spec=_model_files())
def test_megatron_lines_carry_any_model_files_shape(spec):
    """Any model file a user writes: its line has what validate_args requires, and Megatron-LM builds that model."""
    megatron_model_validate(megatron_args(shlex.join([*megatron_model(spec), "--pipeline-model-parallel-size", "1"])),
                            spec)


def test_a_moe_model_files_megatron_line_from_the_cli_runs_in_megatron(tmp_path):
    """Issue 44 as reported: `plan --model` of a Qwen3-30B-A3B-like model file, its Megatron-LM line checked as
    Megatron-LM parses and validates it (layout rules and model rules)."""
    from stagewise.cli import main
    from stagewise.plan.cluster import TransformerSpec

    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "qwen3-30b-a3b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens",
                 "1M", "--framework", "megatron", "--tensor", "2", "--pipeline", "2", "--json", "-o", str(out)]) == 0
    mega = json.loads(out.read_text())["frameworks"]["megatron"]
    a = megatron_args(mega["command"])
    megatron_validate(a)
    megatron_model_validate(a, TransformerSpec.load("qwen3-30b-a3b"))
    assert a["num-experts"] == "128" and a["moe-ffn-hidden-size"] == "768" and a["num-query-groups"] == "4"
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in mega["note"] and "--mock-data" in mega["note"]


def test_llama3_8b_on_64_gpus_is_never_interleaved_on_one_stage(capsys):
    """The plan of issue 31: interleaved on one pipeline stage is gradient accumulation; no framework gets it."""
    job, res = planned(1)
    assert all(not (c.config.p == 1 and c.config.v > 1) for c in res.ranking)
    assert refusal("megatron", Parallelism(pp=1, dp=64), v=4).startswith("v=4 on one pipeline stage")


def test_megatron_names_a_layout_it_cannot_run():
    job, res = planned(0)
    c = next(c for c in res.ranking if c.config.family not in ("1f1b", "interleaved-1f1b"))
    cmd, note = megatron_options(c, job)
    assert cmd is None and "Megatron-LM runs 1F1B and interleaved 1F1B" in note


def test_torchtitan_lines_carry_the_planned_stages_and_its_own_words():
    for job, c in rows("torchtitan"):
        cmd, note = torchtitan_options(c, job, "plan.csv")
        words = shlex.split(cmd)
        g = c.config
        assert "--parallelism.pipeline_parallel_split_points" not in cmd and "activation_checkpoint.mode" not in cmd
        assert words[-1] in ("activation-checkpoint:none", "activation-checkpoint:full")
        if g.p > 1:
            k = words.index("--parallelism.module-fqns-per-model-part")
            parts = words[k + 1:k + 1 + g.p * g.v]
            assert parts == torchtitan_parts(c.candidate.counts) and "--training.disable-cuda-graphs" in words
            names = [n for part in parts for n in part.split(",")]
            assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(job.spec.layers)), "norm", "lm_head"]


def _titan():
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install torchtitan==0.3.0)")
    try:
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as e:  # its own dependencies (tyro, triton, ...) missing
        pytest.skip(f"torchtitan does not import here: {e}")
    return ConfigManager, ParallelDims


def test_torchtitans_own_parser_accepts_its_lines_with_the_planned_split(tmp_path, monkeypatch):
    ConfigManager, ParallelDims = _titan()
    import torchtitan.components.quantization.float8 as float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)  # the H100s planned for (SM90), not this CPU
    csv = tmp_path / "plan.csv"
    csv.write_text("")
    seen, layouts = 0, set()
    for job, c in rows("torchtitan"):
        key = (job.spec.name, c.config.family)
        if key in layouts:  # one parse per layout kind: each loads torchtitan's model config
            continue
        layouts.add(key)
        cmd, note = torchtitan_options(c, job, str(csv) if c.config.family not in ("1f1b",) else None)
        if cmd is None or ("llama3_405b" in cmd and importlib.util.find_spec("torchao") is None):
            continue  # torchtitan's 405B config converts to float8 through torchao
        cfg = ConfigManager().parse_args(shlex.split(cmd))
        par, g, pa = c.parallelism, c.config, cfg.parallelism
        dims = ParallelDims.from_config(pa, world_size=job.gpus)  # its own degree rules
        assert (dims.pp, dims.tp, dims.dp_replicate, dims.dp_shard, dims.ep) == (par.pp, par.tp, par.dp,
                                                                               par.fsdp * par.ep, par.ep)
        assert cfg.training.local_batch_size == g.m * g.mbs and pa.pipeline_parallel_microbatch_size == g.mbs
        assert cfg.training.global_batch_size == job.global_batch
        if g.p > 1:
            assert len(pa.module_fqns_per_model_part) == g.p * g.v  # the planned stages, not its default
            assert [len([n for n in part if n.startswith("layers.")]) for part in pa.module_fqns_per_model_part] \
                == block_counts(c.candidate.counts)
            assert cfg.training.disable_cuda_graphs
        seen += 1
    assert seen >= 4


def test_deepspeed_config_and_topology_hold_together():
    for job, c in rows("deepspeed"):
        text = deepspeed_config(c, job)
        config = json.loads(text[:text.index(" PipelineModule")])
        par = c.parallelism
        dp = par.data_shards
        assert f"PipeModelDataParallelTopology(num_pp={par.pp}, num_mp={par.tp}, num_dp={dp})" in text
        assert par.pp * par.tp * dp == job.gpus
        assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * \
            config["gradient_accumulation_steps"] * dp == job.global_batch


def test_deepspeeds_own_config_and_topology_accept_its_output(monkeypatch):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    if not dist.is_initialized():
        dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    seen = 0
    for job, c in rows("deepspeed"):
        text = deepspeed_config(c, job)
        config = json.loads(text[:text.index(" PipelineModule")])
        par = c.parallelism
        topo = PipeModelDataParallelTopology(num_pp=par.pp, num_mp=par.tp, num_dp=par.data_shards)
        assert topo.world_size() == job.gpus

        class Grid:  # PipelineParallelGrid's answer for this topology (the real one needs every rank)
            def get_data_parallel_world_size(self):
                return topo.get_dim("data")

        ds = DeepSpeedConfig(config, mpu=Grid())  # its batch assertion runs in the constructor
        assert ds.train_batch_size == job.global_batch and ds.zero_optimization_stage == par.zero
        seen += 1
    assert seen >= 2


# ---- stagewise: the printed line parses into the candidate's Parallelism and RunConfig


def _run_config(argv: list[str]):
    pytest.importorskip("transformers")
    from stagewise.cli import build_parser
    from stagewise.cli import train, train_moe, train_safety, train_scale

    args = build_parser().parse_args(["train", *argv])
    return train_scale.apply(train_moe.apply(train_safety.apply(train.config_from(args), args), args), args)


def _check_stagewise(job, c, csv):
    cfg = _run_config(stagewise_train_argv(c, job, csv))
    par, g = c.parallelism, c.config
    got = getattr(cfg, "parallelism", None) or Parallelism(pp=cfg.ranks, dp=cfg.dp, fsdp=cfg.fsdp, tp=cfg.tp,
                                                           ep=cfg.ep, zero=cfg.zero,
                                                           reshard_after_forward=cfg.reshard_after_forward)
    assert got == par, (got, par)
    assert cfg.microbatches == g.m and cfg.batch == g.m * g.mbs * par.data_shards
    assert cfg.model.dtype == "bfloat16" and cfg.model.seq == job.spec.seq
    assert cfg.recompute is (c.recompute == "stage")
    assert (cfg.csv, cfg.schedule, cfg.chunks) == ((csv, None, None) if csv else (None, g.family, g.v))
    assert str(cfg.split).replace(" ", "").count("t") >= 1
    pieces = [x.strip() for x in cfg.split.split("|")]
    assert len(pieces) == len(c.candidate.counts)


def test_the_stagewise_line_parses_into_the_candidates_parallelism():
    seen = 0
    for job, c in rows("stagewise"):
        _check_stagewise(job, c, None)
        _check_stagewise(job, c, "plan.csv")
        seen += 1
    assert seen >= 8


_GRID_FRAMEWORKS = (None, "megatron", "torchtitan", "deepspeed", "stagewise")


@pytest.mark.parametrize("model", ["llama3-8b", "mixtral-8x7b"])
def test_every_recompute_sharding_and_framework_plans_or_says_truly_why_not(capsys, model):
    """Issue 45: each of recompute x sharding x framework plans when a framework asked for runs the pair (a
    mixture of experts: no HSDP, no whole-stage replay), else refuses in one line naming what was asked and never
    blaming memory (the weights fit here)."""
    from cli_helpers import run

    from stagewise.plan.cluster.overlap_rules import FRAMEWORKS

    moe = model != "llama3-8b"
    for rc in ("off", "selective", "full"):
        for sh in ("ddp", "zero1", "fsdp", "hsdp"):
            for name in _GRID_FRAMEWORKS:
                fws = [FRAMEWORKS[name]] if name else list(FRAMEWORKS.values())
                runs = any(rc in fw.recompute and sh in fw.sharding and not (moe and sh == "hsdp")
                           and not (moe and rc == "full" and fw.stage_recompute) for fw in fws)
                argv = ["plan", "--model", model, "--hardware", "h100", "--gpus", "64" if moe else "32", "--tensor", "8",
                        "--pipeline", "4" if moe else "1", "--global-batch-tokens", "1M", "--recompute", rc,
                        "--sharding", sh, "--top", "1", "--schedules", "1f1b"]
                code, out, err = run(capsys, *argv, *(["--framework", name] if name else []))
                assert code == (0 if runs else 2), (rc, sh, name, err)
                if not runs:
                    assert err.count("\n") == 1 and "Traceback" not in err, err
                    assert f"--sharding {sh}" in err and ("--recompute" in err or "runs it" in err), err
                    assert "weights" not in err and "memory" not in err, err


def test_deepseek_v3_on_dualpipe_says_which_recomputation_no_framework_runs(capsys):
    """Issue 45: DeepSeek-V3's layout on 2,048 H800s asked of the shipped frameworks: only stagewise runs DualPipe
    and it replays no expert-parallel stage, so nothing recomputed fits; the refusal says so, and the least it
    reports is the least-memory split of the fastest (DualPipe's heavy pieces where fewer micro-batches are in
    flight), not an arbitrary tie."""
    from cli_helpers import fails

    err = fails(capsys, "plan", "--model", "deepseek-v3", "--hardware", "h800", "--gpus", "2048",
                "--global-batch-tokens", "60M", "--tensor", "1", "--pipeline", "16", "--schedules", "dualpipe",
                "--chunks", "2", "--expert", "64", "--micro-batch-sizes", "1", "--sharding", "zero1")
    assert "recomputation full was not searched" in err and "stagewise recomputes off" in err, err
    need = float(err.split("the least any needs is ")[1].split(" GiB")[0])
    assert need < 150, err  # 212 GiB when load ties went by index
