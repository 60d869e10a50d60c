"""The lowering: communication as actions (stagewise/lowering), checked through its public functions."""

import pytest
from hypothesis import given, settings, strategies as st

from stagewise.costs import Costs
from stagewise.lowering import FRAMEWORKS, LoweringOptions, Network, Sizes, lower
from stagewise.lowering.check import check
from stagewise.comm_actions import CommAction, parse_comm
from stagewise.lowering.play import simulate_lowered
from stagewise.parallelism import Parallelism
from stagewise.schedule import make
from stagewise.schedules import FAMILIES, generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import ScheduleError

LAYOUTS = [dict(), dict(fsdp=2), dict(dp=2), dict(dp=2, zero=1), dict(dp=2, fsdp=2), dict(ep=2),
           dict(fsdp=2, reshard_after_forward=True)]


def families(p, m):
    for name, fam in FAMILIES.items():
        try:
            yield generate(name, p, m)
        except Exception:  # noqa: BLE001 - a family that refuses these p, m
            continue


def test_lower_1f1b_fsdp_is_torchs_shape():
    low = lower(generate("1f1b", 2, 2), Parallelism(pp=2, fsdp=2))
    assert low.text(0) == "0UNSHARD 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD 0RESHARD 0STEP_END"
    assert low.text(1) == "1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD 1RESHARD 1STEP_END"


def test_receives_follow_the_senders_order():
    """Interleaved: rank 1 takes its messages from rank 0 in rank 0's send order, even where it uses them later."""
    low = check(lower(generate("interleaved-1f1b", 2, 4, 2), Parallelism(pp=2)))
    sent = [a.key for a in low.programs[0] if type(a) is CommAction and a.kind.startswith("SEND")]
    got = [a.key for a in low.programs[1] if type(a) is CommAction and a.kind.startswith("RECV")]
    assert sent == got


def test_overlap_rules_place_the_reduction():
    s = generate("1f1b", 2, 4)
    par = Parallelism(pp=2, dp=2, zero=1)
    ds = lower(s, par, LoweringOptions(overlap=FRAMEWORKS["deepspeed"])).text(0).split()
    mg = lower(s, par, LoweringOptions(overlap=FRAMEWORKS["megatron"])).programs[0]
    assert ds[-4:] == ["0REDUCE_GRAD", "0UNSHARD", "0STEP_END"][-3:] or ds[-3:] == ["0REDUCE_GRAD", "0UNSHARD",
                                                                                      "0STEP_END"]
    assert [a for a in mg if type(a) is CommAction and a.kind == "REDUCE_GRAD"][0].during
    assert str(mg[0]) == "0UNSHARD"  # megatron: the updated weights gathered ahead of the first forward


def test_ties_and_experts():
    low = lower(generate("1f1b", 4, 4), Parallelism(pp=4, ep=2), LoweringOptions(sizes=Sizes(tie=8, a2a=2)))
    kinds = [a.kind for a in low.programs[0] if type(a) is CommAction]
    assert "TIE_GRAD" in kinds and kinds.count("ALL_TO_ALL") == 8
    assert [a.kind for a in low.programs[1] if type(a) is CommAction].count("TIE_GRAD") == 0


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 4), st.integers(0, 6), st.sampled_from(range(len(LAYOUTS))),
       st.floats(0, 2, allow_nan=False))
def test_free_communication_changes_nothing(p, extra, layout, latency):
    """Every family, every layout: with every collective free the lowered play has engine.play's times."""
    m = p + extra
    for sched in families(p, m):
        low = check(lower(sched, Parallelism(pp=p, **LAYOUTS[layout]), LoweringOptions(sizes=Sizes(tie=1.0))))
        costs = Costs(latency=latency)
        a, b = simulate(sched, costs), simulate_lowered(low, costs)
        assert (a.starts, a.ends) == (b.starts, b.ends), sched.name
        assert metrics(a).makespan == metrics(b).makespan


def test_collectives_cost_and_are_exposed_or_hidden():
    s = generate("1f1b", 4, 8)
    net = Network(intra_bandwidth=4.0, inter_bandwidth=1.0, gpus_per_node=8)
    par = Parallelism(pp=4, fsdp=2)
    end = lambda rule: metrics(simulate_lowered(lower(s, par, LoweringOptions(  # noqa: E731
        overlap=rule, sizes=Sizes(params=8.0), network=net, step_end=False))))
    m = end(FRAMEWORKS["torchtitan"])
    assert m.makespan > metrics(simulate(s)).makespan
    rs = m.comm["REDUCE_GRAD"]
    assert list(rs["time"]) == [pytest.approx(1 / 2 * 8 / 4)] * 4  # a ring reduce-scatter of 8 bytes over 2 at 4 B/t
    assert sum(rs["exposed"]) < sum(rs["time"])  # the early ranks' reductions hide behind the drain
    drain = end(FRAMEWORKS["deepspeed"])
    assert drain.makespan >= m.makespan


def test_contended_links_queue_sends():
    s = generate("gpipe", 2, 4)
    free = metrics(simulate(s, Costs(latency=0.0)))
    low = lower(s, Parallelism(pp=2), LoweringOptions(sizes=Sizes(boundary=4.0)))
    slow = metrics(simulate_lowered(low, Costs(bandwidth=2.0)))  # 2 t_f per message, back to back
    assert slow.makespan > free.makespan
    assert slow.comm["RECV_F"]["exposed"][1] > 0


def _swap_recvs(low, rank):
    prog = list(low.programs[rank])
    ks = [k for k, a in enumerate(prog) if type(a) is CommAction and a.kind == "RECV_F"]
    prog[ks[0]], prog[ks[1]] = prog[ks[1]], prog[ks[0]]
    from dataclasses import replace

    return replace(low, programs=tuple(tuple(p) if r != rank else tuple(prog) for r, p in enumerate(low.programs)))


def test_validator_names_a_receive_out_of_order():
    low = _swap_recvs(lower(generate("gpipe", 2, 2), Parallelism(pp=2)), 1)
    with pytest.raises(ScheduleError, match="deadlock: receive order: rank 1 position 0 .1RECV_F1. is receive 0"):
        check(low)


def test_validator_names_a_use_before_gather_and_a_cycle():
    from dataclasses import replace

    low = lower(generate("1f1b", 2, 2), Parallelism(pp=2, fsdp=2))
    no_gather = replace(low, programs=(low.programs[0][1:], low.programs[1]))
    with pytest.raises(ScheduleError, match=r"rank 0 position 0 \(0F0\): uses stage 0 while it is not gathered"):
        check(no_gather)
    # two ranks whose first ops wait for each other: a cycle of receives
    cyc = make("bad", [["0F0", "0B0"], ["1F0", "1B0"]], [0, 1], 1)
    from stagewise.actions import parse

    cyc = make("bad", [[parse("0B0"), parse("0F0")], [parse("1F0"), parse("1B0")]], [0, 1], 1)
    with pytest.raises(ScheduleError, match="deadlock"):
        check(lower(cyc, Parallelism(pp=2)))


def test_collective_order_mismatch_is_a_deadlock():
    from dataclasses import replace

    low = lower(generate("1f1b", 2, 2), Parallelism(pp=2, dp=2), LoweringOptions(sizes=Sizes(tie=4)))
    prog = list(low.programs[1])
    prog[-1], prog[-2] = prog[-2], prog[-1]  # rank 1: step end before the tie
    bad = replace(low, programs=(low.programs[0], tuple(prog)))
    with pytest.raises(ScheduleError, match=r"deadlock: wait cycle: rank 0 position 9 \(0TIE_GRAD\) waits for rank 1; "
                       r"rank 1 position 9 \(1STEP_END\) waits for rank 0; back to rank 0"):
        check(bad)


def test_comm_text_round_trips():
    for text in ("1SEND_F0", "2RECV_B13", "0UNSHARD", "3REDUCE_GRAD", "0RESHARD", "4ALL_TO_ALL2", "0TIE_GRAD"):
        assert str(parse_comm(text)) == text
    assert parse_comm("1SEND_F") is None and parse_comm("0UNSHARD3") is None


# ---- torch's compute+comms CSV


def test_compute_comms_csv_round_trips_and_plays():
    from stagewise.lowering.torch_comms import dumps, loads

    par = Parallelism(pp=2, fsdp=2)
    for name, v in (("1f1b", None), ("interleaved-1f1b", 2), ("zb-v", None)):
        low = lower(generate(name, 2, 4, v), par)
        text = dumps(low)
        back = check(loads(text, parallelism=par))
        assert dumps(back) == text
        assert simulate_lowered(back).starts == simulate(low.schedule).starts


def test_compute_comms_csv_refuses_bad_cells():
    from stagewise.lowering.torch_comms import loads

    with pytest.raises(ScheduleError, match=r"row 1 \(rank 0\) column 2: not an action: '0SEND_X0'"):
        loads("0F0,0SEND_X0\n1F0\n")
    with pytest.raises(ScheduleError, match="no stage 2 to exchange with"):
        loads("0F0,0B0\n1F0,1SEND_F0,1B0\n")


def _torch_lowered(sched):
    """torch's own passes (_add_unshard_reshard, _add_reduce_grad, _add_send_recv) on stagewise's programs."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    from stagewise import torch_csv

    rows = torch_csv.dumps(sched).strip().split("\n")
    acts = {r: [S._Action.from_str(x) for x in row.split(",") if x] for r, row in enumerate(rows)}
    acts = {r: S._add_reduce_grad(S._add_unshard_reshard(a), sched.microbatches) for r, a in acts.items()}
    return S, S._add_send_recv(acts, stage_to_rank=lambda s: sched.placement[s], num_stages=sched.stages)


@pytest.mark.parametrize("name,v", [("1f1b", None), ("interleaved-1f1b", 2), ("gpipe", None)])
def test_torch_lowered_schedules_play_in_stagewise(name, v):
    """torch's lowering, read as stagewise's: valid, and with free transfers the compute times are unchanged."""
    from stagewise.lowering.torch_comms import dumps, loads

    sched = generate(name, 4, 8, v)
    S, lowered = _torch_lowered(sched)
    text = "".join(",".join(str(a) for a in lowered[r]) + "\n" for r in sorted(lowered))
    low = check(loads(text, parallelism=Parallelism(pp=4, fsdp=2)))
    assert dumps(low) == text
    assert simulate_lowered(low).starts == simulate(sched).starts


@pytest.mark.parametrize("name,v", [("1f1b", None), ("interleaved-1f1b", 2), ("zb-h1", None)])
def test_stagewise_lowering_passes_torchs_dry_run(name, v):
    """stagewise's lowered programs, read by torch's parser, pass torch's own comms simulator (no hang)."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    from stagewise.lowering.torch_comms import dumps

    sched = generate(name, 4, 8, v)
    rows = dumps(lower(sched, Parallelism(pp=4))).strip().split("\n")
    acts = {r: [S._Action.from_str(x) for x in row.split(",")] for r, row in enumerate(rows)}
    S._simulate_comms_compute(acts, lambda s: sched.placement[s], sched.stages)


def test_what_torchs_dry_run_takes_is_what_docs_schedules_says():
    """docs/schedules.md, exactly (torch 2.13): `_simulate_comms_compute` takes compute and sends/receives, so
    every family but the DualPipes (OVERLAP_F_B) passes at pp alone; it refuses UNSHARD and REDUCE_GRAD, of
    stagewise's lowering and of torch's own alike, and the DualPipes' OVERLAP_F_B. torch's runtime loads them
    all (test_torchs_runtime_loads_a_compute_comms_csv_as_written)."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    from stagewise.lowering.torch_comms import dumps

    def dry_run(acts, sched):
        S._simulate_comms_compute(acts, lambda s: sched.placement[s], sched.stages)

    def ours(name, par, v=None):
        sched = generate(name, 4, 8, v)
        rows = dumps(lower(sched, par)).strip().split("\n")
        return {r: [S._Action.from_str(x) for x in row.split(",")] for r, row in enumerate(rows)}, sched

    for name, v in (("gpipe", None), ("1f1b", None), ("interleaved-1f1b", 2), ("zb-h1", None), ("zb-v", None)):
        dry_run(*ours(name, Parallelism(pp=4), v))
    for name, par, refused in (("1f1b", Parallelism(pp=4, fsdp=2), "UNSHARD"),
                               ("1f1b", Parallelism(pp=4, dp=2), "REDUCE_GRAD"),
                               ("dualpipe-v", Parallelism(pp=4), "OVERLAP_F_B")):
        with pytest.raises(ValueError, match=f"Unsupported action type .*{refused}"):
            dry_run(*ours(name, par))
    sched = generate("1f1b", 4, 8)
    with pytest.raises(ValueError, match="Unsupported action type .*UNSHARD"):
        dry_run(_torch_lowered(sched)[1], sched)


# ---- explain names the transfer a gap waits on


def _lowered_timeline(name="1f1b", p=2, m=4, **par):
    from stagewise.lowering import Communication

    comm = Communication(parallelism=Parallelism(**par), options=LoweringOptions(
        sizes=Sizes(params=8.0), network=Network(intra_bandwidth=1.0)))
    return simulate(generate(name, p, m), Costs(comm=comm))


def test_explain_names_the_gather_and_the_reduction():
    import re

    from stagewise import causes
    from stagewise.explain import explain, idle_by_cause

    tl = _lowered_timeline(fsdp=2)
    gaps = explain(tl)
    first = gaps[0]
    assert first.cause == "collective" and first.before == (0, 0)
    assert first.text == ("rank 0 idle 0..4 (4): 0F0 waits for the all-gather of stage 0 over fsdp on rank 0, in "
                          "flight from 0 to 4: collective")
    last = [g for g in gaps if g.rank == 1][-1]
    assert last.cause == "collective" and last.before is None and "step-end all-reduce" in last.text
    assert abs(sum(idle_by_cause(gaps).values()) - sum(metrics(tl).idle)) < 1e-9
    for g in gaps:
        assert not re.search(r"\d+[FBIW]\d+", causes.plain(g, tl))


def test_explain_cli_prints_the_collective(capsys):
    from cli_helpers import run

    rc, out, _ = run(capsys, "explain", "1f1b", "-p", "2", "-m", "4", "--fsdp", "2", "--param-bytes", "8",
                     "--intra-bandwidth", "1", "--json")
    import json

    gaps = json.loads(out)["gaps"]
    assert rc == 0 and gaps[0]["cause"] == "collective" and gaps[0]["comm"] == {
        "action": "0UNSHARD", "rank": 0, "start": 0.0, "end": 4.0}
    assert gaps[0]["label"] == "a collective in flight"


def test_hsdp_reduces_over_fsdp_then_dp_and_nodes_set_the_link():
    s = generate("1f1b", 2, 4)
    net = Network(intra_bandwidth=4.0, inter_bandwidth=1.0, gpus_per_node=4)
    low = lower(s, Parallelism(pp=2, dp=2, fsdp=2), LoweringOptions(sizes=Sizes(params=8.0), network=net))
    (rg,) = [a for a in low.programs[0] if type(a) is CommAction and a.kind == "REDUCE_GRAD"]
    assert rg.group == "hsdp" and rg.op == "reduce-scatter+all-reduce"
    # fsdp pairs ranks 0 and 2 (one node of 4), dp pairs 0 and 4 (two nodes): 1/2 x 8 / 4, then 2 x 1/2 x 4 / 1
    assert low.duration(0, rg) == pytest.approx(1.0 + 4.0)


def test_expert_bytes_give_the_all_to_all_time_the_cost_model_takes():
    """ep with dispatch bytes: each F and B pays the all-to-all Network prices, exactly as --a2a would."""
    s = generate("dualpipe-v", 4, 8)
    low = lower(s, Parallelism(pp=4, ep=4), LoweringOptions(sizes=Sizes(a2a=2.0), network=Network(inter_bandwidth=4.0)))
    assert not low.inside(low.global_ranks(0, "ep"))  # ranks 0, 4, 8, 12: two nodes of 8
    assert sum(type(a) is CommAction and a.kind == "ALL_TO_ALL" for a in low.programs[0]) == 2 * 2 * 8
    by_bytes = simulate_lowered(low)
    by_time = simulate(s, Costs(a2a=1.0))  # dispatch + combine: 2 x 2 bytes at 4 per t_f
    assert by_bytes.starts == by_time.starts and metrics(by_bytes).a2a == metrics(by_time).a2a


@pytest.mark.parametrize("name,v", [("1f1b", None), ("interleaved-1f1b", 2)])
def test_torchs_runtime_loads_a_compute_comms_csv_as_written(tmp_path, name, v):
    """_PipelineScheduleRuntime._load_csv(FILE, "compute_comms") reads `export --comms`'s file action for action."""
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    from stagewise.lowering.torch_comms import dump

    sched = generate(name, 2, 4, v)
    path = tmp_path / "c.csv"
    dump(lower(sched, Parallelism(pp=2, fsdp=2)), path)
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, 2, None, sched.stages
    runtime = _PipelineScheduleRuntime([stage] * sched.chunks, 4)
    runtime._load_csv(str(path), format="compute_comms")
    rows = path.read_text().strip().split("\n")
    assert [",".join(map(str, runtime.pipeline_order_with_comms[r])) for r in range(2)] == rows


def test_the_planners_framework_rules_are_the_lowerings():
    """plan/cluster/overlap_rules.py costs a cluster plan under the rules the lowering places transfers by."""
    from stagewise.plan.cluster.overlap_rules import FRAMEWORKS as PLANNED

    for name, rule in FRAMEWORKS.items():
        assert PLANNED[name].overlap == rule, name


def test_deepspeeds_blocking_sends_hold_the_sender():
    s = generate("1f1b", 4, 8)
    costs = Costs(latency=0.5)
    plain = lower(s, Parallelism(pp=4))
    blocking = lower(s, Parallelism(pp=4), LoweringOptions(overlap=FRAMEWORKS["deepspeed"]))
    a, b = simulate_lowered(plain, costs), simulate_lowered(blocking, costs)
    assert a.starts == simulate(s, costs).starts
    assert metrics(b).makespan > metrics(a).makespan
    assert simulate_lowered(blocking).starts == simulate(s).starts  # free links: nothing to wait for


_NET = Network(intra_bandwidth=4.0, inter_bandwidth=1.0, intra_latency=0.05, inter_latency=0.2, gpus_per_node=4)


@pytest.mark.parametrize("name,v,par,framework,sizes,costs,pinned", [
    ("1f1b", None, dict(dp=2, fsdp=2), "megatron", dict(params=8.0, tie=2.0), Costs(latency=0.1),
     (69.0, 3763.2, 113.9, 37)),
    ("interleaved-1f1b", 2, dict(dp=2), "megatron", dict(params=4.0, boundary=1.0, tie=1.0),
     Costs(bandwidth=2.0, latency=0.1), (84.95, 10733.8, 89.9, 40)),
    ("zb-v", None, dict(fsdp=2, reshard_after_forward=True), "torchtitan", dict(params=[2.0, 4.0] * 4),
     Costs(latency=0.3), (158.7, 52440.0, 383.3, 192)),
    ("dualpipe", None, dict(ep=2, dp=2), "deepspeed", dict(params=2.0, a2a=1.0), Costs(latency=0.2),
     (89.5, 7443.6, 119.2, 10)),
])
def test_costed_lowered_plays_keep_their_times(name, v, par, framework, sizes, costs, pinned):
    """Every transfer costed (HSDP with layer-bucketed reductions and a tie, contended links, per-layer
    FSDP gathers, all-to-alls with DeepSpeed's blocking sends): the step's end, the sum of every action's
    start, the exposed time and how many ops waited on a transfer, as the object-based player had them."""
    from stagewise.lowering.play import a2a_costs, play_lowered

    low = lower(generate(name, 4, 8, v), Parallelism(pp=4, **par),
                LoweringOptions(overlap=FRAMEWORKS[framework], sizes=Sizes(**sizes), network=_NET))
    c = a2a_costs(low, costs)
    played = play_lowered(low, c.resolve(low.schedule.stages), c)
    got = (max(map(max, played.ends)), sum(map(sum, played.starts)), sum(map(sum, played.exposed)),
           sum(map(len, played.waited)))
    assert got == pytest.approx(pinned, rel=1e-12)


def test_layer_buckets_gather_one_ahead_and_reduce_as_the_backward_produces_them():
    """Megatron-LM's rules with the layers known: ZeRO-1's updated weights gathered layer by layer (the first
    ahead of the stage's first forward, each next one while the layer before it computes), gradients reduced
    layer by layer from the last, each as the last backward produces it; with one layer, the stage at once."""
    s = generate("1f1b", 2, 4)
    par = Parallelism(pp=2, dp=2, zero=1)
    opts = LoweringOptions(overlap=FRAMEWORKS["megatron"], step_end=False,
                           sizes=Sizes(params=4.0, grads=8.0, layers=((1, 3), (2, 1, 1))),
                           network=Network(intra_bandwidth=1.0))
    low = check(lower(s, par, opts))
    comms = [a for a in low.programs[0] if type(a) is CommAction]
    gathers = [(a.nbytes, a.during) for a in comms if a.kind == "UNSHARD"]
    assert gathers == [(1.0, False), (3.0, 0.0)]  # the first layer's share ahead, the second's from the op's start
    reduces = [(a.nbytes, a.during) for a in comms if a.kind == "REDUCE_GRAD"]
    assert reduces == [(6.0, 0.5), (2.0, 1.0)]  # the backward produces the last layer's first
    assert [str(a) for a in low.programs[0][:4]] == ["0UNSHARD", "0F0", "0SEND_F0", "0UNSHARD"]
    one = lower(s, par, replace_sizes(opts, layers=None))
    assert [a.during for a in one.programs[0] if type(a) is CommAction and a.kind == "REDUCE_GRAD"] == [True]
    # played: the layer-wise gather exposes only the first layer's share before the first forward
    bucketed, whole = simulate(s, Costs(t_f=1, t_b=2, comm=_comm(par, opts))), \
        simulate(s, Costs(t_f=1, t_b=2, comm=_comm(par, replace_sizes(opts, layers=None))))
    assert bucketed.starts[0][0] == pytest.approx(1 / 2)  # 1 byte all-gathered over 2 ranks at 1 byte per unit
    assert whole.starts[0][0] == pytest.approx(4 / 2)


def replace_sizes(opts, **kw):
    from dataclasses import replace

    return replace(opts, sizes=replace(opts.sizes, **kw))


def _comm(par, opts):
    from stagewise.lowering import Communication

    return Communication(parallelism=par, options=opts)


def test_the_device_order_puts_a_group_inside_a_node_or_across():
    from stagewise.lowering.options import PIPELINE_OUTERMOST

    par = Parallelism(pp=2, dp=4, tp=2)
    mesh = lower(generate("1f1b", 2, 2), par, LoweringOptions(network=Network(gpus_per_node=8)))
    assert mesh.global_ranks(1, "dp") == [2, 6, 10, 14] and not mesh.inside(mesh.global_ranks(1, "dp"))
    megatron = lower(generate("1f1b", 2, 2), par,
                     LoweringOptions(network=Network(gpus_per_node=8, order=PIPELINE_OUTERMOST)))
    assert megatron.global_ranks(1, "dp") == [8, 10, 12, 14] and megatron.inside(megatron.global_ranks(1, "dp"))


@pytest.mark.parametrize("kw,words", [
    (dict(layers=((1,),)), "`layers` has 1 per-stage entries; the schedule has 2 stages"),
    (dict(layers=((1,), ())), "`layers` of stage 1 must be finite byte counts >= 0 with a positive sum"),
    (dict(layers=((1,), (0, float("nan")))), "`layers` of stage 1"),
])
def test_bad_layers_are_refused_with_the_rule(kw, words):
    from stagewise.costs import CostError

    with pytest.raises(CostError, match=words.replace("(", r"\(").replace(")", r"\)")):
        lower(generate("1f1b", 2, 2), Parallelism(pp=2, dp=2), LoweringOptions(sizes=Sizes(**kw)))


def test_a_bad_device_order_is_refused():
    from stagewise.costs import CostError

    with pytest.raises(CostError, match="`order` .* must name each of dp, fsdp, ep, pp, tp once"):
        Network(order=("dp", "pp"))


@pytest.mark.parametrize("layout", [dict(dp=2), dict(dp=2, zero=1), dict(fsdp=2), dict(dp=2, fsdp=2), dict(ep=2)])
@pytest.mark.parametrize("rule", ["megatron", "torchtitan", "stagewise"])
def test_messages_as_link_times_play_the_same_step_as_lowered_sends(layout, rule):
    """``p2p=False`` (the planner's: boundaries carry no bytes) plays each message as the cost model's link
    time, as engine.play does, instead of a SEND and a RECV: the step's span is the same for every family."""
    from stagewise.lowering.play import step_span

    for sched in families(3, 6):
        S = sched.stages
        sizes = Sizes(params=[1.0 + s % 3 for s in range(S)], grads=[2.0 + s % 2 for s in range(S)],
                      layers=tuple((1.0, 0.5 + s % 2) for s in range(S)))
        net = Network(gpus_per_node=2, intra_bandwidth=3.0, inter_bandwidth=1.0, intra_latency=0.01,
                      inter_latency=0.05)
        costs = Costs(t_f=[1.0 + 0.1 * s for s in range(S)], t_b=2.0, latency=0.3)
        opts = LoweringOptions(overlap=FRAMEWORKS[rule], sizes=sizes, network=net, moe=False)
        lowered, linked = (step_span(lower(sched, Parallelism(pp=3, **layout), replace_options(opts, p2p=p2p)),
                                     costs) for p2p in (True, False))
        assert linked[0] == pytest.approx(lowered[0], rel=1e-12)
        assert not any(kind.startswith(("SEND", "RECV")) for kind in linked[1])


def replace_options(opts, **kw):
    from dataclasses import replace

    return replace(opts, **kw)


def test_reshard_after_forward_gathers_each_op_layer_by_layer():
    """FSDP2's per-block rhythm with the layers known: each op gathers its stage again, the first layer it runs
    (a forward's first, a backward's last) ahead of it and each next one while the one before it computes;
    played, only the first layer's share waits before each op, where the whole stage's did at once."""
    s = generate("1f1b", 1, 1)
    opts = LoweringOptions(overlap=FRAMEWORKS["torchtitan"], step_end=False,
                           sizes=Sizes(params=8.0, layers=((1, 2, 5),)), network=Network(intra_bandwidth=1.0))
    par = Parallelism(pp=1, fsdp=2, reshard_after_forward=True)
    low = check(lower(s, par, opts))
    gathers = [(a.nbytes, a.during) for a in low.programs[0] if type(a) is CommAction and a.kind == "UNSHARD"]
    assert gathers == [(1.0, False), (2.0, 0.0), (5.0, 1 / 3), (5.0, False), (2.0, 0.0), (1.0, 1 / 3)]
    assert low.text(0) == "0UNSHARD 0F0 0UNSHARD 0UNSHARD 0RESHARD 0UNSHARD 0B0 0UNSHARD 0UNSHARD 0REDUCE_GRAD 0RESHARD"
    costs = Costs(t_f=10.0, t_b=20.0)
    layered = simulate_lowered(low, costs)
    whole = simulate_lowered(lower(s, par, replace_sizes(opts, layers=None)), costs)
    assert layered.starts[0][0] == pytest.approx(1 / 2)  # F0 waits for the first layer's 1 byte over 2 ranks
    assert whole.starts[0][0] == pytest.approx(8 / 2)
    # the forward's other layers came while it computed; B0 waits only for the last layer's 5 bytes, gathered again
    assert layered.starts[0][1] == pytest.approx(1 / 2 + 10 + 5 / 2)


def test_each_backward_reduces_what_it_made_under_the_each_rule():
    """FSDP with gradient sync on between micro-batches (torchtitan's accumulation without PP): every B reduces
    its layers as it leaves them, so the step reduce-scatters the stage m times and holds a window of its
    gradients, where the "layer" rule reduces once, during the last B, after the gradients accumulated whole."""
    from dataclasses import replace

    from stagewise.lowering import Overlap
    from stagewise.lowering.rank_memory import lowered_memory

    s = generate("1f1b", 1, 3)
    par = Parallelism(pp=1, fsdp=2, reshard_after_forward=True)
    opts = LoweringOptions(overlap=Overlap(fsdp_reduce="each", fsdp_gather="layer"), step_end=False,
                           sizes=Sizes(params=4.0, grads=8.0, layers=((1, 2, 1),)))
    each = check(lower(s, par, opts))
    last = check(lower(s, par, replace(opts, overlap=Overlap(fsdp_reduce="layer", fsdp_gather="layer"))))
    reduced = [[a.nbytes for a in low.programs[0] if type(a) is CommAction and a.kind == "REDUCE_GRAD"]
               for low in (each, last)]
    assert reduced == [[2.0, 4.0, 2.0] * 3, [2.0, 4.0, 2.0]]  # from the last layer, as each B leaves it
    text = each.text(0).split()
    assert [text.index(w) for w in ("0B0", "0B1", "0B2")] == sorted(text.index(w) for w in ("0B0", "0B1", "0B2"))
    # after a backward, the stream's collectives in the order the op reaches them: a layer's reduce-scatter as
    # the backward leaves it, then the prefetch released with it (FSDP's post- then pre-backward hooks)
    prog = each.programs[0]
    b0 = next(k for k, a in enumerate(prog) if str(a) == "0B0")
    fsdp = [(a.kind, a.during) for a in prog[b0 + 1:] if type(a) is CommAction and a.kind != "RESHARD"][:5]
    assert fsdp == [("UNSHARD", 0.0), ("REDUCE_GRAD", 1 / 3), ("UNSHARD", 1 / 3), ("REDUCE_GRAD", 2 / 3),
                    ("REDUCE_GRAD", 1.0)]
    held = [lowered_memory(low, [1.0])[0].peak.grads for low in (each, last)]
    assert held == [pytest.approx(8.0 * 3 / 4), pytest.approx(8.0)]  # two neighbouring layers' share, or all
    with pytest.raises(Exception, match="fsdp_reduce"):
        Overlap(fsdp_reduce="sometimes")
