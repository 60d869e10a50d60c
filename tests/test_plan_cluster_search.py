"""Cluster-scale search: the batch in tokens, ZeRO-1, the overlapped data-parallel reduction, exact pruning."""

import time
from dataclasses import replace

import pytest

from stagewise.plan.cluster import Job, cluster_search, state_factor
from stagewise.plan.errors import PlanError
from stagewise.plan.cluster.frameworks import block_counts, megatron_options, torchtitan_options
from stagewise.plan.cluster import Hardware, Reserve
from stagewise.plan.search import Space
from stagewise.plan.cluster import TransformerSpec

H100 = Hardware.load("h100")
SMALL = Space(families=("1f1b", "interleaved-1f1b", "zb-h1"), chunks=(2,))


def job(model="llama3-8b", gpus=64, tokens=2**21, **kw):
    return Job(spec=TransformerSpec.load(model), hardware=H100, gpus=gpus, global_batch_tokens=tokens, **kw)


def test_batch_is_tied_to_m_mbs_and_dp():
    res = cluster_search(job(space=SMALL), keep=5)
    assert res.ranking and res.simulated + res.pruned + res.too_big == res.configurations
    for c in res.ranking:
        g = c.config
        assert g.m * g.mbs * g.dp == 256 and c.parallelism.tp * g.p * g.dp == 64
        assert max(c.candidate.memory) <= H100.memory
        assert 0 < c.mfu < 1


def test_pruning_keeps_the_exact_top():
    pruned = cluster_search(job(space=SMALL), keep=3)
    full = cluster_search(job(space=SMALL), keep=10**6)
    assert pruned.simulated < full.simulated
    assert [c.step_time for c in pruned.ranking[:3]] == [c.step_time for c in full.ranking[:3]]


def test_zero1_shards_the_optimizer_state():
    assert state_factor(1, True) == state_factor(8, False) == 9
    assert state_factor(64, True) == pytest.approx(3 + 6 / 64)
    z = cluster_search(job(space=SMALL, tensor=(8,), pipeline=(2,)), keep=1).ranking[0]
    r = cluster_search(job(space=SMALL, tensor=(8,), pipeline=(2,), zero=False), keep=1).ranking[0]
    assert max(z.candidate.memory) < max(r.candidate.memory)


def test_llama3_405b_first_and_last_stages_get_fewer_blocks():
    res = cluster_search(Job(spec=TransformerSpec.load("llama3-405b"), hardware=H100, gpus=16384,
                             global_batch_tokens=16 * 2**20, tensor=(8,), pipeline=(16,),
                             recompute=("full",), space=Space(families=("1f1b",))), keep=1)
    best = res.ranking[0]
    blocks = block_counts(best.candidate.counts)
    assert blocks == [7] + [8] * 14 + [7]  # Llama 3's own split (Sec. 3.3.2)
    mega, _ = megatron_options(best, Job(spec=TransformerSpec.load("llama3-405b"), hardware=H100, gpus=16384,
                                         global_batch_tokens=16 * 2**20))
    assert "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7" in mega
    assert "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16" in mega
    titan, _ = torchtitan_options(replace(best, recompute="off"), job(), "plan.csv")
    assert "tok_embeddings," + ",".join(f"layers.{i}" for i in range(7)) + " layers.7," in titan
    assert "--parallelism.pipeline-parallel-schedule-csv plan.csv" in titan


def test_llama3_405b_on_16384_gpus_is_searched_fast():
    t0 = time.perf_counter()
    res = cluster_search(Job(spec=TransformerSpec.load("llama3-405b"), hardware=H100, gpus=16384,
                             global_batch_tokens=16 * 2**20))
    elapsed = time.perf_counter() - t0
    assert elapsed < 120  # catches a hang only: the speed is benchmarks/bench_cluster_plan.py's (README)
    assert res.configurations > 500 and res.ranking[0].parallelism.tp == 8
    layouts = list(dict.fromkeys((c.parallelism.tp, c.config.p) for c in res.ranking))
    assert (8, 16) in layouts[:5]  # Llama 3's t x p among the top five layouts
    blocks = block_counts(res.ranking[0].candidate.counts)
    assert blocks[0] < max(blocks) and blocks[-1] < max(blocks)


def _least_memory(spec, mode, **kw):
    res = cluster_search(Job(spec=spec, recompute=(mode,), **kw), keep=10**6)
    return min(max(c.candidate.memory) for c in res.ranking)


def test_search_takes_the_least_recomputation_that_fits():
    """Megatron 2021's GPT (scores kept): off where it fits, else selective, else full."""
    spec, a100 = TransformerSpec.load("gpt-1.7b"), Hardware.load("a100")
    kw = dict(hardware=a100, gpus=8, global_batch_tokens=64 * spec.seq, tensor=(1,), pipeline=(2,),
              space=Space(families=("1f1b",)), micro_batch_sizes=(1,), reserve=Reserve())
    need = {m: _least_memory(spec, m, **kw) for m in ("off", "selective", "full")}
    assert need["full"] < need["selective"] < need["off"]
    chosen = []  # less memory, more recomputation: off, then selective, then full
    for k in range(13):
        memory = need["off"] * 1.01 * (need["full"] / need["off"]) ** (k / 12)
        res = cluster_search(Job(spec=spec, **{**kw, "hardware": replace(a100, memory=memory)}), keep=1)
        if res.ranking:
            assert max(res.ranking[0].candidate.memory) <= memory
            chosen.append(res.ranking[0].recompute)
    assert list(dict.fromkeys(chosen)) == ["off", "selective", "full"]
    sel = cluster_search(Job(spec=spec, recompute=("selective",), **kw), keep=1).ranking[0]
    off = cluster_search(Job(spec=spec, recompute=("off",), **kw), keep=1).ranking[0]
    full = cluster_search(Job(spec=spec, recompute=("full",), **kw), keep=1).ranking[0]
    assert off.step_time < sel.step_time < full.step_time
    assert "--recompute-granularity selective" in megatron_options(sel, Job(spec=spec, **kw))[0]
    titan, why = torchtitan_options(sel, Job(spec=spec, **kw), None)
    assert titan is None and "torchtitan's selective activation checkpointing is per operator" in why


def test_flash_attention_models_skip_selective():
    from stagewise.plan.cluster import searchers

    def modes(j):
        return {s.recompute for s in searchers(j, {})}

    # selective = off with flash attention; "stage": the stagewise runtime replays a whole stage for "full"
    assert modes(job(tensor=(8,), pipeline=(2,))) == {"off", "full", "stage"}
    assert modes(job(tensor=(8,), pipeline=(2,), recompute=("selective",))) == {"selective"}
    assert modes(job(model="gpt-1.7b", tensor=(8,), pipeline=(2,), tokens=2**20)) == {"off", "selective", "full",
                                                                                     "stage"}


def test_recompute_choices_are_checked():
    with pytest.raises(PlanError, match="--recompute some: each must be one of off, selective, full"):
        cluster_search(job(recompute=("some",)))
    with pytest.raises(PlanError, match="Job.space.recompute is not read at cluster scale"):
        cluster_search(job(space=Space(recompute=(True,))))


@pytest.mark.parametrize("kw, words", [
    (dict(tokens=2**21 + 1), "--global-batch-tokens 2097153 must be a multiple of the model's sequence length 8192"),
    (dict(gpus=64, tensor=(16,)), "--gpus 64 with `tensor` 16: no tensor-parallel degree divides both the GPU"),
    (dict(gpus=37), "no t x p x dp = --gpus 37 with dp x micro-batch size (1/2/4) dividing 256"),
    (dict(gpus=4096, tokens=8192 * 8), "no configuration: --global-batch-tokens 65536 is 8 sequences of 8192"),
])
def test_impossible_jobs_name_value_and_rule(kw, words):
    with pytest.raises(PlanError) as e:
        cluster_search(job(space=SMALL, **kw))
    assert words in str(e.value)


def test_nothing_fits_reports_the_least_memory():
    small = Job(spec=TransformerSpec.load("llama3-8b"), hardware=replace(H100, memory=19e9), gpus=8,
                global_batch_tokens=2**18, tensor=(8,), recompute=("off",), space=Space(families=("1f1b",)),
                reserve=Reserve())
    res = cluster_search(small)
    assert not res.ranking and res.too_big == res.configurations and max(res.least_memory.memory) > 19e9
    with pytest.raises(PlanError, match="--gpus 8: llama3-8b's weights, fp32 gradients and optimizer state need "
                                        "at least 16.8 GiB per GPU split over all 8 GPUs, more than the 954 MiB"):
        cluster_search(replace(small, hardware=replace(H100, memory=1e9)))


def test_pipeline_messages_cross_nodes_where_stages_do():
    from stagewise.plan.cluster import searchers

    found = {(s.parallelism.tp, s.parallelism.pp): s.cluster for s in searchers(job(gpus=64), {})}
    t8 = found[(8, 2)]  # a t=8 group fills a node: every pipeline boundary crosses nodes
    assert t8.per_node == 1 and t8.link(2, 4, 0, 1) is H100.inter
    t1 = found[(1, 8)]  # eight t=1 ranks of one pipeline share a node
    assert t1.per_node == 8 and t1.link(8, 8, 0, 7) is H100.intra


def test_schedules_megatron_cannot_run_go_to_torchtitan_only():
    res = cluster_search(job(space=Space(families=("zb-v",)), tensor=(8,), pipeline=(2,)), keep=1)
    best = res.ranking[0]
    mega, note = megatron_options(best, job())
    assert mega is None and "not zb-v" in note
    assert "--parallelism.pipeline-parallel-schedule-csv x.csv" in torchtitan_options(best, job(), "x.csv")[0]


@pytest.mark.parametrize("family, v", [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2), ("dualpipe", 2),
                                       ("gpipe", 1), ("looped-bfs", 2)])
def test_pipeline_bound_never_exceeds_the_simulation(family, v):
    from stagewise.costs import Costs
    from stagewise.plan.cluster import pipeline_bound
    from stagewise.schedules import FAMILIES, generate
    from stagewise.simulate import simulate

    sched = generate(family, 4, 8, v)
    costs = Costs(t_f=[1.0 + 0.1 * s for s in range(sched.stages)], t_b=[2.0] * sched.stages, latency=0.3,
                  bandwidth=1.0, boundary_bytes=0.2)
    tl = simulate(sched, costs)
    bound = pipeline_bound(sched, costs.resolve(sched.stages), FAMILIES[family].split_backward)
    span = max(max(e) for e in tl.ends) - min(min(s) for s in tl.starts)
    assert 0 < bound <= span + 1e-9
    if family == "1f1b":  # fill + steady work + drain: exact for 1F1B on even costs without links
        even = Costs(t_f=1.0, t_b=2.0)
        assert pipeline_bound(sched, even.resolve(4), False) == pytest.approx(3 * 1 + 8 * 3 + 3 * 2)


def test_the_schedule_free_bound_prunes_without_changing_the_top():
    lazy = cluster_search(job(space=SMALL), keep=5)
    built = cluster_search(job(space=SMALL), keep=5, floors=False)
    assert lazy.unbuilt > 0 and built.unbuilt == 0
    assert [c.step_time for c in lazy.ranking[:5]] == [c.step_time for c in built.ranking[:5]]
    assert lazy.simulated + lazy.pruned + lazy.too_big == lazy.configurations


def test_each_frameworks_best_is_exact():
    from stagewise.plan.cluster import FRAMEWORKS

    res = cluster_search(job(space=SMALL, tensor=(8,)), keep=2)
    assert set(res.best) == set(FRAMEWORKS)
    for name, fw in FRAMEWORKS.items():
        alone = cluster_search(job(space=SMALL, tensor=(8,), frameworks=(fw,)), keep=1).ranking[0]
        assert res.best[name].step_time == pytest.approx(alone.step_time) and alone.framework == name


def test_v_half_and_v_min_never_beat_zb_v():
    """Why the search skips them where ZB-V fits with its fastest split (``TRADES_BUBBLE_FOR_MEMORY``):
    the same stages and work, a bubble traded for memory, on uneven costs and links."""
    import random

    from stagewise.costs import Costs
    from stagewise.plan.search import timing
    from stagewise.schedules import generate
    from stagewise.simulate import simulate

    rnd = random.Random(3)
    for _ in range(12):
        p = rnd.choice([2, 4, 6, 8])
        m = rnd.choice([p, 2 * p, 3 * p + 1])
        f = [rnd.uniform(0.5, 1.5) for _ in range(2 * p)]
        costs = Costs(t_f=f, t_b=[x * rnd.uniform(1.6, 2.4) for x in f], latency=rnd.uniform(0, 0.2),
                      bandwidth=1.0, boundary_bytes=rnd.uniform(0, 0.3))
        zbv = timing(simulate(generate("zb-v", p, m, 2), costs, check=False))[0]
        for fam in ("v-half", "v-min"):
            assert timing(simulate(generate(fam, p, m, 2), costs, check=False))[0] >= zbv * (1 - 1e-9)
