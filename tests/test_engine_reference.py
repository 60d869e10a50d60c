"""The engine against a reference player written here: 1,000+ random valid programs, compute-only and lowered
(every family, layouts with dp, fsdp, tp and ep, random overlap rules, sizes, networks and costs).

The reference is slow on purpose: it sweeps the ranks over and over, each running its next entry when what
that entry needs is there, with every rule of the engine's docstring written out plainly on named keys. The
engine runs a rank until it waits and wakes ranks up from a work list, on flat integer keys; both must give
every entry the same start, end and exposed time, and stop at the same places when a program deadlocks.
"""

import random

import pytest

from stagewise.actions import Action, Pair
from stagewise.costs import Costs
from stagewise.engine import Stuck, op_time, play
from stagewise.lowering import FRAMEWORKS, LoweringOptions, Network, Overlap, Sizes, lower
from stagewise.comm_actions import ALL_TO_ALL, RECV_B, RECVS, SEND_B, SENDS, UNSHARD, CommAction
from stagewise.lowering.play import a2a_costs, play_lowered
from stagewise.parallelism import Parallelism
from stagewise.schedule import make
from stagewise.schedules import FAMILIES, generate


def reference(schedule, sc, low=None, latency=0.0, bandwidth=None):
    """(starts, ends, exposed, waited) per rank: of every entry of the programs (``low``'s, else the
    schedule's) its times and exposed time, of each compute op held by a transfer that transfer's position;
    or the (rank, position) of each rank that never finishes."""
    programs = low.programs if low is not None else schedule.programs
    place, first, last = schedule.placement, schedule.first_stages, schedule.last_stages
    lowered_p2p = low is not None and low.options.p2p
    blocking = low is not None and low.options.overlap.blocking_p2p
    R = len(programs)
    starts = [[0.0] * len(p) for p in programs]
    ends = [[0.0] * len(p) for p in programs]
    exposed = [[0.0] * len(p) for p in programs]
    waited = [{} for _ in programs]
    pos, free, op_start, comm_end = [0] * R, [0.0] * R, [0.0] * R, [0.0] * R
    gathered = [{} for _ in range(R)]  # stage -> (end, position) of its latest gather
    got = [{} for _ in range(R)]  # (gradient?, stage, mb) -> (arrival, sent, receive position)
    last_op = [max((k for k, a in enumerate(p) if type(a) is not CommAction), default=-1) for p in programs]
    done = {}  # ("F" or "G", stage, mb) -> end: a forward, an input gradient (B or I)
    arrived = {}  # (gradient?, stage it goes into, mb) -> (arrival, sent)
    link_free, stream_free, posts, seq, colls = {}, {}, {}, {}, [[] for _ in range(R)]

    def needs(r, a):
        """[(ready, arrival of its message, receive position)] of plain action ``a``, or None: not there yet."""
        kind, s, mb = a
        inputs = []  # (result key, the stage it comes from, message key)
        if kind == "F" and s != first[s]:
            inputs.append((("F", s - 1, mb), s - 1, (False, s, mb)))
        if kind in "BI":
            inputs.append((("F", s, mb), s, None))
            if s != last[s]:
                inputs.append((("G", s + 1, mb), s + 1, (True, s, mb)))
        if kind == "W":
            inputs.append((("G", s, mb), s, None))
        out = []
        for key, src, message in inputs:
            if message is not None and lowered_p2p and place[src] != r:
                if message not in got[r]:
                    return None
                arrival, sent, where = got[r][message]
                out.append((sent, arrival, where))
            else:
                if key not in done:
                    return None
                link = 0.0 if place[src] == place[s] else sc.message[min(src, s)]
                out.append((done[key] + link, 0.0, -1))
        return out

    def compute(r, i, a):
        halves = tuple(a) if type(a) is Pair else (a,)
        ready, transfers = [free[r]], []  # transfers in the order the engine weighs them (first wins a tie)
        for h in halves:
            got_ = needs(r, h)
            if got_ is None:
                return False
            ready += [x for x, _, _ in got_]
            transfers += [(arr, where) for _, arr, where in got_ if where >= 0]
            if h.stage in gathered[r]:
                transfers.append(gathered[r][h.stage])
        base = max(ready)
        comm, via = 0.0, -1
        for arr, where in transfers:
            if arr > comm:
                comm, via = arr, where
        if comm > base:
            exposed[r][via] += comm - base
            waited[r][i] = via
        start = max(base, comm)
        end = start + op_time(a, sc)  # (the cost model's: durations are not what is checked here)
        starts[r][i], ends[r][i] = start, end
        free[r], op_start[r] = end, start
        for h in halves:
            if h.kind != "W":
                done[("F" if h.kind == "F" else "G", h.stage, h.mb)] = end
        return True

    def send(r, i, a):
        back = a.kind == SEND_B
        into = a.stage - 1 if back else a.stage + 1
        if bandwidth and a.nbytes > 0:
            busy, delay = a.nbytes / bandwidth, latency
        else:
            busy, delay = 0.0, sc.message[min(a.stage, into)]
        posted = op_start[r] if a.during else free[r]
        start = max(link_free.get((r, a.peer), 0.0), posted)
        link_free[(r, a.peer)] = start + busy
        starts[r][i], ends[r][i] = start, start + busy + delay
        if blocking:
            free[r] = max(free[r], ends[r][i])
        arrived[(back, into, a.mb)] = (ends[r][i], posted)
        return True

    def receive(r, i, a):
        key = (a.kind == RECV_B, a.stage, a.mb)
        if key not in arrived:
            return False
        arrival, sent = arrived[key]
        got[r][key] = (arrival, sent, i)
        starts[r][i], ends[r][i] = sent, arrival
        return True

    def collective(r, i, a):
        d, members, stream = low.duration(r, a), low.members(r, a), (r, a.stream)
        t = free[r]
        if a.during is True:
            posted = op_start[r]
        elif a.during is not False:
            posted = op_start[r] + a.during * (t - op_start[r])
        elif i > last_op[r] and comm_end[r] > t:
            posted = comm_end[r]
        else:
            posted = t
        start = max(stream_free.get(stream, 0.0), posted)
        if len(members) > 1:  # every member posts it first
            n = seq.get((r, a.group), 0)
            entered = posts.setdefault((a.group, members, n), {})
            entered.setdefault(r, start)
            if len(entered) < len(members):
                return False
            seq[(r, a.group)] = n + 1
            start = max(entered.values())
        end = start + d
        if a.during is True:
            end = max(end, t)
            start = end - d
        if d or a.during:
            stream_free[stream] = end
        starts[r][i], ends[r][i] = start, end
        if a.kind == UNSHARD and 0 <= a.stage < schedule.stages:
            gathered[r][a.stage] = (end, i)
        colls[r].append(i)
        if a.kind != ALL_TO_ALL:
            comm_end[r] = max(comm_end[r], end)
        return True

    moved = True
    while moved:
        moved = False
        for r in range(R):
            i = pos[r]
            if i == len(programs[r]):
                continue
            a = programs[r][i]
            if type(a) is not CommAction:
                ran = compute(r, i, a)
            elif a.kind in SENDS:
                ran = send(r, i, a)
            elif a.kind in RECVS:
                ran = receive(r, i, a)
            else:
                ran = collective(r, i, a)
            if ran:
                pos[r] += 1
                moved = True
    stuck = {(r, pos[r]) for r in range(R) if pos[r] < len(programs[r])}
    if stuck:
        return stuck
    # the step ends when every rank's compute and collectives are done: what runs past the last op is exposed
    finish = max((ends[r][k] for r, k in enumerate(last_op) if k >= 0), default=0.0) if low is not None else 0.0
    for r in range(R):
        edge = finish
        for k in sorted((k for k in colls[r] if ends[r][k] > finish), key=lambda k: ends[r][k]):
            exposed[r][k] += min(ends[r][k] - edge, ends[r][k] - starts[r][k])
            edge = ends[r][k]
    return starts, ends, exposed, waited


# ---- random valid programs ----------------------------------------------------------------------------

def random_schedule(rng: random.Random):
    """A family's schedule at random ranks, micro-batches and chunks (retried until the family accepts)."""
    while True:
        name = rng.choice(sorted(FAMILIES))
        p, m, v = rng.randint(1, 4), rng.randint(1, 8), rng.choice([None, 1, 2, 3])
        try:
            return generate(name, p, m, v) if v else generate(name, p, m)
        except Exception:  # noqa: BLE001 - a family that refuses these arguments
            continue


def shuffled(rng: random.Random, sched):
    """``sched`` with a few neighbouring ops swapped on random ranks: still every action once on its rank,
    often a deadlock."""
    programs = [list(p) for p in sched.programs]
    for _ in range(rng.randint(1, 3)):
        prog = rng.choice(programs)
        if len(prog) > 1:
            k = rng.randrange(len(prog) - 1)
            prog[k], prog[k + 1] = prog[k + 1], prog[k]
    return make(sched.name, programs, sched.placement, sched.microbatches, sched.lanes)


def per_stage(rng, stages, values):
    return rng.choice(values) if rng.random() < 0.5 else [rng.choice(values) for _ in range(stages)]


def random_costs(rng, sched, low=None) -> Costs:
    """Per-stage times at random; an all-to-all time without a lowering (a lowering's comes from its bytes:
    ``a2a_costs``), a pair's time by hand where no all-to-all derives it."""
    S = sched.stages
    pairs = any(type(op) is Pair for p in sched.programs for op in p)
    a2a = per_stage(rng, S, [0.0, 0.25, 1.0]) if low is None and rng.random() < 0.3 else 0.0
    by_hand = pairs and not a2a and (low is None or low.parallelism.ep == 1) and rng.random() < 0.5
    return Costs(t_f=per_stage(rng, S, [0.5, 1.0, 2.0]), t_b=per_stage(rng, S, [1.0, 2.0, 3.5]),
                 t_i=per_stage(rng, S, [0.5, 1.0]) if rng.random() < 0.3 else None,
                 t_fb=per_stage(rng, S, [1.5, 2.5]) if by_hand else None,
                 a2a=a2a, latency=rng.choice([0.0, 0.1, 0.5]), bandwidth=rng.choice([None, 1.0, 4.0]),
                 boundary_bytes=per_stage(rng, S, [0.0, 1.0, 2.0]),
                 recompute=rng.random() < 0.2)


def random_lowering(rng, sched):
    """A valid lowering of ``sched``: a random layout over dp, fsdp, tp and ep, overlap rule, sizes, network."""
    S = sched.stages
    while True:
        par = Parallelism(pp=sched.ranks, dp=rng.choice([1, 1, 2]), fsdp=rng.choice([1, 1, 2]),
                          tp=rng.choice([1, 2]), ep=rng.choice([1, 1, 2]))
        if par.dp > 1 and par.fsdp == 1 and rng.random() < 0.4:
            par = Parallelism(pp=par.pp, dp=par.dp, tp=par.tp, ep=par.ep, zero=1)
        if par.fsdp > 1 and rng.random() < 0.3:
            par = Parallelism(pp=par.pp, fsdp=par.fsdp, tp=par.tp, ep=par.ep, reshard_after_forward=True)
        try:
            par.check()
            break
        except Exception:  # noqa: BLE001 - a layout that does not hold together: draw again
            continue
    if rng.random() < 0.5:
        overlap = rng.choice(list(FRAMEWORKS.values()))
    else:
        overlap = Overlap(reduce=rng.choice(["layer", "stage", "drain", "each"]),
                          gather=rng.choice(["layer", "stage", "end"]),
                          fsdp_reduce=rng.choice(["layer", "stage", "drain", "each"]),
                          fsdp_gather=rng.choice(["layer", "stage"]), blocking_p2p=rng.random() < 0.3)
    sizes = Sizes(params=per_stage(rng, S, [0.0, 1.0, 8.0]), boundary=rng.choice([None, 1.0, 3.0]),
                  a2a=per_stage(rng, S, [0.0, 2.0]) if par.ep > 1 else 0.0, tie=rng.choice([0.0, 0.0, 2.0]),
                  layers=tuple(tuple(rng.choice([1.0, 2.0]) for _ in range(rng.randint(1, 3))) for _ in range(S))
                  if rng.random() < 0.4 else None)
    network = Network(gpus_per_node=rng.choice([1, 2, 8]), intra_bandwidth=rng.choice([None, 8.0]),
                      inter_bandwidth=rng.choice([None, 2.0]), intra_latency=rng.choice([0.0, 0.05]),
                      inter_latency=rng.choice([0.0, 0.2]))
    opts = LoweringOptions(overlap=overlap, sizes=sizes, network=network, step_end=rng.random() < 0.8,
                           p2p=rng.random() < 0.8)
    return lower(sched, par, opts)


def same(engine, expect):
    for got, want in zip(engine, expect):
        for g, w in zip(got, want):
            assert g == pytest.approx(w, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_engine_plays_random_compute_programs_as_the_reference(seed):
    """Compute only: family schedules, some with neighbouring ops swapped (deadlocks included)."""
    rng = random.Random(seed)
    for _ in range(150):
        sched = random_schedule(rng)
        if rng.random() < 0.4:
            sched = shuffled(rng, sched)
        sc = random_costs(rng, sched).resolve(sched.stages)
        expect = reference(sched, sc)
        try:
            starts, ends = play(sched, sc)
        except Stuck as stuck:
            assert {(b.rank, b.position) for b in stuck.blocked} == expect, sched
            continue
        assert not isinstance(expect, set), sched
        same((starts, ends), expect[:2])


@pytest.mark.parametrize("seed", range(4))
def test_engine_plays_random_lowered_programs_as_the_reference(seed):
    """Lowered: every family under random layouts, overlap rules, sizes, networks and link costs."""
    rng = random.Random(100 + seed)
    for _ in range(130):
        sched = random_schedule(rng)
        low = random_lowering(rng, sched)
        costs = a2a_costs(low, random_costs(rng, sched, low))
        sc = costs.resolve(sched.stages)
        expect = reference(sched, sc, low, costs.latency, costs.bandwidth)
        assert not isinstance(expect, set), (sched, low)
        played = play_lowered(low, sc, costs)
        same((played.starts, played.ends, played.exposed), expect[:3])
        assert played.waited == expect[3]


def test_the_reference_sees_a_deadlock():
    """The reference is no pushover: rank 0's gradient waits for a forward rank 1 runs after its own wait."""
    A = Action
    bad = make("t", [[A("F", 0, 0), A("B", 0, 0), A("F", 0, 1), A("B", 0, 1)],
                     [A("F", 1, 1), A("F", 1, 0), A("B", 1, 0), A("B", 1, 1)]], [0, 1], 2)
    assert reference(bad, Costs().resolve(2)) == {(0, 1), (1, 0)}
