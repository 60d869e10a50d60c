"""The data-parallel reduction overlapped with the backward, on timelines small enough to check by hand."""

import pytest

from stagewise.costs import Costs
from stagewise.plan.cluster import exposed_gather, exposed_reduction, reduce_scatter_time
from stagewise.plan.search import Link
from stagewise.schedules import generate
from stagewise.simulate import simulate

ONE = Link(latency=0.0, bandwidth=1.0)  # dp = 2: a layer of 1 byte takes 1 time unit (fp32 doubles, ring halves)


def test_reduce_scatter_is_a_ring():
    assert reduce_scatter_time(8.0, 4, Link(latency=0.5, bandwidth=2.0)) == pytest.approx(3 * 0.5 + 3 / 4 * 4.0)
    assert reduce_scatter_time(8.0, 1, ONE) == 0.0


def test_layers_reduce_as_the_last_backward_passes_them():
    # 1F1B, p = 1, m = 2: F 0-1, F 1-2, B 2-4, B 4-6; four layers ready at 4.5, 5, 5.5, 6, one unit each
    tl = simulate(generate("1f1b", 1, 2, 1), Costs(t_f=1, t_b=2))
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE) == pytest.approx(8.5 - 6)
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE, all_reduce=True) == pytest.approx(12.5 - 6)
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 1, ONE) == 0.0


def test_block_by_block_every_op_gathers_and_each_wait_delays_the_ops_after_it():
    # 1F1B, p = 1, m = 2, one layer gathered in 1.5: F0 0-1, F1 1-2, B0 2-4, B1 4-6 as simulated. Gathering once,
    # F0 waits 1.5. Block by block each op gathers again, one op ahead: F0 waits 1.5 (runs 1.5-2.5), F1's
    # gather ends at 3 (runs 3-4), B0's at 4.5 (runs 4.5-6.5), B1's at 6 (no wait): the step ends 2.5 later
    tl = simulate(generate("1f1b", 1, 2, 1), Costs(t_f=1, t_b=2))
    cost = lambda nbytes: 1.5 * nbytes  # noqa: E731
    assert exposed_gather(tl, [[1.0]], (0,), "stage", cost) == pytest.approx(1.5)
    assert exposed_gather(tl, [[1.0]], (0,), "stage", cost, per_block=True) == pytest.approx(2.5)


def test_breadth_first_hides_more():
    # looped BFS, p = 1, v = 2: stage 1's backwards end at 4, so its layers reduce while stage 0's run
    tl = simulate(generate("looped-bfs", 1, 2, 2), Costs(t_f=0.5, t_b=1))
    assert max(tl.ends[0]) == pytest.approx(6)
    assert exposed_reduction(tl, [[1.0] * 2, [1.0] * 2], (0, 1), 2, ONE) == pytest.approx(7.5 - 6)


@pytest.mark.parametrize("name,p,v", [("1f1b", 3, 1), ("interleaved-1f1b", 2, 2), ("zb-v", 3, 2), ("dualpipe", 4, 2),
                                      ("looped-bfs", 2, 2), ("zb-h1", 3, 1)])
@pytest.mark.parametrize("rule", ["layer", "stage", "drain", "each"])
def test_the_reductions_read_each_stages_last_backward_as_a_scan_of_every_op_finds_it(name, p, v, rule):
    """exposed_reduction stops at each rank's last backwards (under "each" it reads every backward); the oracle
    reads the whole program."""
    from stagewise.actions import Pair

    sched = generate(name, p, 2 * p, v)
    tl = simulate(sched, Costs(t_f=1.0, t_b=2.0, t_w=0.7, t_i=1.3))
    layers = [[0.3 + 0.1 * s, 0.5] for s in range(sched.stages)]
    stage_piece = tuple(range(sched.stages))
    got = exposed_reduction(tl, layers, stage_piece, 2, ONE, rule=rule)
    end, latest = max(en[-1] for en in tl.ends if en), 0.0
    for r, prog in enumerate(sched.programs):
        last, every = {}, []
        for op, s0, s1 in zip(prog, tl.starts[r], tl.ends[r]):
            back = op.backward if type(op) is Pair else op
            if back.kind in ("B", "W"):
                last[back.stage] = (s0, s1)
                every.append((back.stage, (s0, s1)))
        units = []
        for s, (a, e) in every if rule == "each" else last.items():
            if rule in ("layer", "each"):
                units += [(a + (e - a) * (k + 1) / 2, b) for k, b in enumerate(reversed(layers[s]))]
            else:
                units.append((e if rule == "stage" else tl.ends[r][-1], sum(layers[s])))
        busy = 0.0
        for ready, nbytes in sorted(units):
            busy = max(busy, ready) + reduce_scatter_time(2 * nbytes, 2, ONE)
        latest = max(latest, busy)
    assert got == max(latest, end) - end


@pytest.mark.parametrize("name,p,v", [("1f1b", 3, 1), ("interleaved-1f1b", 2, 2), ("zb-v", 3, 2), ("zb-h1", 3, 1),
                                      ("looped-bfs", 2, 2)])
@pytest.mark.parametrize("rule,mode", [("stage", "zero1"), ("stage", "ddp"), ("drain", "zero1"), ("drain", "ddp"),
                                       ("layer", "zero1"), ("layer", "ddp"), ("each", "zero1"), ("each", "ddp")])
def test_the_planners_reduction_rules_are_the_lowerings_played(name, p, v, rule, mode):
    """The planner's exposed reduction (in buckets as the stage's last backward passes its layers, after that
    backward, or after the drain) is what playing the lowered program's REDUCE_GRADs on the same timeline leaves
    past the compute: one rule, two readings."""
    from stagewise.lowering import lower
    from stagewise.comm_actions import REDUCE_GRAD
    from stagewise.lowering.options import LoweringOptions, Network, Overlap, Sizes
    from stagewise.lowering.play import simulate_lowered
    from stagewise.parallelism import Parallelism

    sched = generate(name, p, 2 * p, v)
    costs = Costs(t_f=1.0, t_b=2.0, t_w=0.7, t_i=1.3)
    tl = simulate(sched, costs)
    layers = [[0.3 + 0.1 * s, 0.5] for s in range(sched.stages)]  # one piece per stage
    link = Link(latency=0.05, bandwidth=2.0)
    planned = exposed_reduction(tl, layers, tuple(range(sched.stages)), 4, link, rule=rule,
                                all_reduce=mode == "ddp")
    grads = [2 * sum(piece) for piece in layers]  # fp32 gradients of the bf16 bytes, as the planner reduces
    low = lower(sched, Parallelism(pp=p, dp=4, zero=mode == "zero1"),
                LoweringOptions(overlap=Overlap(reduce=rule), step_end=False,
                                sizes=Sizes(params=grads, grads=grads, layers=tuple(layers)),
                                network=Network(gpus_per_node=1 << 20, intra_bandwidth=link.bandwidth,
                                                intra_latency=link.latency)))
    played = simulate_lowered(low, costs)
    assert played.starts == tl.starts and played.ends == tl.ends  # the compute is the engine's
    ends = played.meta["played"].ends
    last = max(ends[r][k] for r, prog in enumerate(low.programs) for k, a in enumerate(prog)
               if getattr(a, "kind", None) == REDUCE_GRAD)
    compute = max(en[-1] for en in tl.ends if en)
    assert planned == pytest.approx(max(last, compute) - compute, rel=1e-12, abs=1e-12)
