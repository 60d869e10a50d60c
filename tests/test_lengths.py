"""Costs per micro-batch (variable lengths): the factors, the engine that plays them, the order policies, the CLI."""

import json

import pytest
from hypothesis import assume, given, settings, strategies as st

from cli_helpers import fails, raises_said, run
from stagewise import lengths
from stagewise.costs import CostError, Costs
from stagewise.schedules import FAMILIES, generate
from stagewise.schedules.registry import ScheduleArgError
from stagewise.simulate import simulate
from stagewise.timeline import metrics


def _schedule(name, p, m):
    fam = FAMILIES[name]
    v = None if fam.chunks is None else fam.chunks[0]
    try:
        return generate(name, p, m, v)
    except ScheduleArgError:
        return None


cases = st.tuples(st.sampled_from(sorted(FAMILIES)), st.integers(2, 4), st.integers(1, 3))
#: factors a length distribution gives: 1/8 .. 8 (the issue's "lengths that differ by 8x"), and zero (empty)
factor = st.sampled_from([0.0, 0.125, 0.5, 1.0, 1.5, 3.0, 8.0]) | st.floats(0.1, 8.0)


@settings(max_examples=40)
@given(cases, st.data())
def test_any_family_and_factors_play_through(case, data):
    """The engine is never stuck for any factors; 1 everywhere is today's timeline exactly; all factors times c
    make a compute-only step c times as long (and its peak activations c times as large)."""
    name, p, k = case
    sched = _schedule(name, p, p * k)
    assume(sched is not None)
    u = sched.microbatches
    mt = data.draw(st.lists(factor, min_size=u, max_size=u))
    ma = data.draw(st.lists(factor, min_size=u, max_size=u))
    base = Costs(t_f=1.0, t_b=2.0, latency=0.25, bandwidth=4.0, boundary_bytes=1.0)
    plain = simulate(sched, base)
    ones = simulate(sched, Costs(t_f=1.0, t_b=2.0, latency=0.25, bandwidth=4.0, boundary_bytes=1.0,
                                 mb_time=[1.0] * u, mb_activation=[1.0] * u))
    assert (ones.starts, ones.ends) == (plain.starts, plain.ends)
    assert metrics(ones) == metrics(plain)
    varied = metrics(simulate(sched, Costs(mb_time=mt, mb_activation=ma)))  # never stuck: a play to the end
    assert varied.makespan >= 0
    c = data.draw(st.sampled_from([0.5, 2.0, 3.0]))
    one = metrics(simulate(sched, Costs(mb_time=mt, mb_activation=ma)))
    times_c = metrics(simulate(sched, Costs(mb_time=[x * c for x in mt], mb_activation=[x * c for x in ma])))
    assert times_c.makespan == pytest.approx(c * one.makespan, rel=1e-9, abs=1e-12)
    assert times_c.peak_activations == pytest.approx([c * x for x in one.peak_activations], rel=1e-9, abs=1e-12)


@settings(max_examples=15)
@given(cases, st.data())
def test_lowered_plays_of_any_family_and_factors(case, data):
    """The lowered play (fsdp: gathers, reductions, sends with bytes) is never stuck for any factors, and with
    factor 1 everywhere is today's exactly."""
    from stagewise.lowering import Communication, LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism

    name, p, k = case
    sched = _schedule(name, p, p * k)
    assume(sched is not None)
    u = sched.microbatches
    comm = Communication(parallelism=Parallelism(fsdp=2), options=LoweringOptions(
        sizes=Sizes(params=4.0, boundary=1.0), network=Network(intra_bandwidth=2.0)))
    base = dict(comm=comm, bandwidth=2.0, latency=0.1)
    plain = simulate(sched, Costs(**base))
    ones = simulate(sched, Costs(**base, mb_time=[1.0] * u, mb_activation=[1.0] * u))
    assert (ones.starts, ones.ends, ones.comm) == (plain.starts, plain.ends, plain.comm)
    mt = data.draw(st.lists(factor, min_size=u, max_size=u))
    assert metrics(simulate(sched, Costs(**base, mb_time=mt, mb_activation=mt))).makespan >= 0


@pytest.mark.parametrize("name", ["dualpipe", "zb-v"])
def test_a_pair_scales_each_half_by_its_own_micro_batch(name):
    """An F&B pair runs two micro-batches: its time is each half's own (here one long micro-batch among short)."""
    from stagewise.actions import Pair

    sched = generate(name, 4, 8, FAMILIES[name].chunks and FAMILIES[name].chunks[0])
    mt = [1.0] * sched.microbatches
    mt[3] = 4.0
    tl = simulate(sched, Costs(t_f=1.0, t_b=2.0, mb_time=mt))
    for prog, st_, en in zip(sched.programs, tl.starts, tl.ends):
        for op, s, e in zip(prog, st_, en):
            if type(op) is Pair:
                f, b = op
                want = 1.0 * mt[f.mb] + (2.0 if b.kind == "B" else 1.0) * mt[b.mb]
                assert e - s == pytest.approx(want)


def test_lowered_messages_and_memory_scale_with_tokens():
    """A lowered play (fsdp) with factor 1 is today's; its SENDs' bytes and its lowered memory scale with tokens."""
    from stagewise.lowering import Communication, LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.report import result

    sched = generate("1f1b", 2, 4)
    comm = Communication(parallelism=Parallelism(fsdp=2), options=LoweringOptions(
        sizes=Sizes(params=8.0, boundary=2.0), network=Network(intra_bandwidth=1.0)))
    base = Costs(comm=comm, activation_bytes=10.0, bandwidth=1.0)
    plain, ones = simulate(sched, base), simulate(sched, Costs(comm=comm, activation_bytes=10.0, bandwidth=1.0,
                                                              mb_time=[1.0] * 4, mb_activation=[1.0] * 4))
    assert (ones.starts, ones.ends) == (plain.starts, plain.ends)
    big = Costs(comm=comm, activation_bytes=10.0, bandwidth=1.0, mb_activation=[3.0] * 4)
    sends = lambda tl: [c.end - c.start for lane in tl.comm for c in lane if c.kind == "SEND_F"]  # noqa: E731
    assert sends(simulate(sched, big)) == pytest.approx([3 * x for x in sends(plain)])
    peak = lambda c: result(sched, c)["lowered_memory"]["parts"][0]["activations"]  # noqa: E731
    assert peak(big) == pytest.approx(3 * peak(base))


def test_factors_and_orders():
    f = lengths.factors([256, 1024, 4096], attention_share=0.5, reference=1024)
    assert f.time == pytest.approx((0.5 * 0.25 + 0.5 * 0.0625, 1.0, 0.5 * 4 + 0.5 * 16))
    assert f.tokens == pytest.approx((0.25, 1.0, 4.0))
    assert lengths.factors([5, 5]).time == (1.0, 1.0)  # reference: the mean
    xs = (3, 9, 1, 5, 7)
    assert lengths.ordered(xs, "longest-first") == (9, 7, 5, 3, 1)
    assert lengths.ordered(xs, "shortest-first") == (1, 3, 5, 7, 9)
    assert lengths.ordered(xs, "balanced") == (9, 1, 7, 3, 5)
    assert sorted(lengths.ordered(xs, "balanced")) == sorted(xs)
    # per pipeline unit: a micro-batch's tokens on each of its slices; its attention grows slice by slice (causal:
    # slice j attends to j + 1 slices of keys), the slices' times averaging to the micro-batch's
    c = lengths.apply(Costs(), [1, 3], microbatches=2, slices=2)
    assert c.mb_activation == (0.5, 0.5, 1.5, 1.5) and c.mb_time == c.mb_activation  # no attention share
    c = lengths.apply(Costs(), [2, 2], microbatches=2, slices=2, attention_share=0.5)
    assert c.mb_time == pytest.approx((0.75, 1.25, 0.75, 1.25))


def test_the_order_matters_and_the_simulator_says_which_wins():
    """Mixed lengths with a long one late: 1F1B as given waits on its long micro-batches in the steady state;
    sorted, its long ones come together at one end. Asserted on simulated times, as `simulate --order` says."""
    sched = generate("1f1b", 4, 8)
    lens = [512, 4096, 1024, 1024, 2048, 512, 8192, 1024]
    span = {o: metrics(simulate(sched, lengths.apply(Costs(), lens, microbatches=8, attention_share=0.3,
                                                    order=o))).makespan for o in lengths.ORDERS}
    assert span["longest-first"] < 0.9 * span["as-given"]
    assert span["shortest-first"] < span["balanced"] < span["as-given"]


def test_bad_factors_name_the_option(capsys, tmp_path):
    sched = generate("1f1b", 4, 8)
    with raises_said(CostError, r"--lengths has 3 values; the schedule has 8 micro-batches"):
        simulate(sched, Costs(mb_time=[1.0] * 3))
    with raises_said(CostError, r"--lengths must be finite numbers >= 0; got -1.0 \(micro-batch 1\)"):
        simulate(generate("1f1b", 2, 2), Costs(mb_activation=[1.0, -1.0]))
    with raises_said(CostError, r"--attention-share 1.5: must be a number >= 0 and < 1"):
        lengths.factors([1, 2], attention_share=1.5)
    with raises_said(CostError, r"--order 'random': choose one of as-given"):
        lengths.ordered([1], "random")
    f = tmp_path / "lengths.txt"
    f.write_text("512\n1024\n")
    err = fails(capsys, "simulate", "1f1b", "-p", "2", "-m", "4", "--lengths", str(f))
    assert "--lengths has 2 lengths; the step has 4 micro-batches (--microbatches)" in err
    f.write_text("512\nlong\n")
    err = fails(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--lengths", str(f))
    assert "line 2 is 'long'; every length must be a whole number >= 1" in err
    f.write_text("[512, 0]")
    assert "item 1 is 0" in fails(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--lengths", str(f))
    f.write_text("[" * 100_000)
    assert "not a JSON list of whole numbers this reader accepts" in fails(
        capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--lengths", str(f))
    f.write_text("# nothing\n\n")
    assert "no lengths" in fails(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--lengths", str(f))
    assert "--lengths" in fails(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--lengths", str(tmp_path))
    assert "give --lengths FILE" in fails(capsys, "simulate", "1f1b", "--order", "balanced")
    assert "give --lengths FILE" in fails(capsys, "simulate", "1f1b", "--attention-share", "0.2")


def test_cli_simulate_and_compare_orders(capsys, tmp_path):
    f = tmp_path / "lengths.json"
    f.write_text(json.dumps([512, 4096, 1024, 1024, 2048, 512, 8192, 1024]))
    rc, out, err = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--lengths", str(f),
                       "--attention-share", "0.3", "--json")
    assert rc == 0, err
    given_ = json.loads(out)
    assert given_["formula_bubble_fraction"] is None  # the papers' forms count like micro-batches
    rc, out, err = run(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--lengths", str(f),
                       "--attention-share", "0.3", "--order", "longest-first", "--json")
    assert json.loads(out)["makespan"] < given_["makespan"] and json.loads(out)["order"] == "longest-first"
    rc, out, err = run(capsys, "compare", "--schedules", "1f1b,zb-h1", "-p", "4", "-m", "8", "--lengths", str(f),
                       "--attention-share", "0.3", "--order", "all", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [(r["schedule"], r["order"]) for r in rows] == [(n, o) for n in ("1f1b", "zb-h1") for o in lengths.ORDERS]
    assert {r["makespan"] for r in rows if r["schedule"] == "1f1b" and r["order"] == "as-given"} == \
        {given_["makespan"]}
    rc, out, err = run(capsys, "compare", "--schedules", "1f1b", "-p", "4", "-m", "8", "--lengths", str(f),
                       "--order", "all")
    assert rc == 0 and "longest-first" in out and "order" in out.splitlines()[0], (out, err)


def test_explain_and_pictures_show_a_long_micro_batch(capsys, tmp_path):
    """explain names the long micro-batch that holds a stage; a picture's cells are as wide as their times."""
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(map(str, [512, 4096, 1024, 1024, 2048, 512, 8192, 1024])))
    rc, out, err = run(capsys, "explain", "1f1b", "-p", "4", "-m", "8", "--lengths", str(f), "--attention-share",
                       "0.3", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["idle_by_cause"]["long micro-batch"] > got["idle_by_cause"]["fill"]
    held = [g for g in got["gaps"] if g["cause"] == "long micro-batch"]
    assert any("micro-batch 6 takes x" in g["text"] and "a long micro-batch holds a stage up" in g["plain"]
               for g in held)
    rc, out, err = run(capsys, "draw", "1f1b", "-p", "4", "-m", "8", "--lengths", str(f), "-o",
                       str(tmp_path / "step.png"))
    assert rc == 0 and (tmp_path / "step.png").stat().st_size > 0, err
    import re

    from stagewise.render.svg import timeline_svg

    text = timeline_svg(simulate(generate("1f1b", 4, 8), lengths.apply(Costs(), lengths.read(f), microbatches=8)))
    assert "micro-batch times x" in text
    widths = {}  # the F cells of rank 0 by micro-batch, from their tooltips' times
    for mb, a, b in re.findall(r"0F(\d) stage 0 mb \d ([0-9.e-]+)\.\.([0-9.e-]+)", text):
        widths[int(mb)] = float(b) - float(a)
    assert widths[6] == pytest.approx(16 * widths[0], rel=1e-4) and widths[1] == pytest.approx(4 * widths[2], rel=1e-4)


def test_workshop_takes_lengths_an_attention_share_and_an_order():
    from stagewise.workshop import api

    s = api.parse_settings({"schedules": "1f1b", "per": "stage", "lengths": "512,4096,1024,1024,2048,512,8192,1024",
                            "attention_share": "0.3", "order": "longest-first"})
    assert s.to_query()["lengths"] == "512,4096,1024,1024,2048,512,8192,1024"
    (res,) = api.payload(s)["results"]
    cli = metrics(simulate(generate("1f1b", 4, 8), lengths.apply(
        Costs(), s.lengths, microbatches=8, attention_share=0.3, order="longest-first"))).makespan
    assert res["makespan"] == pytest.approx(cli)
    with pytest.raises(api.SettingError) as e:
        api.payload(api.parse_settings({"lengths": "512,1024"}))
    assert e.value.field == "lengths" and "--lengths has 2 lengths" in str(e.value)
    with pytest.raises(api.SettingError) as e:
        api.parse_settings({"order": "random"})
    assert e.value.field == "order"


def test_plan_a_length_distribution(capsys, tmp_path):
    """`plan --lengths`: each configuration's step is simulated over its own micro-batches of the distribution
    (the chosen layout's makespan is its schedule's over those micro-batches), with the long tail in its share."""
    from plan_fixtures import gpt_profile
    from stagewise.plan.search import Profile

    prof = tmp_path / "profile.json"
    gpt_profile().save(prof)
    f = tmp_path / "lengths.txt"
    dist = [256] * 12 + [512] * 6 + [1024, 4096]  # a long tail
    f.write_text("\n".join(map(str, dist)))
    base = ("plan", "--profile", str(prof), "-N", "2", "-G", "8", "--schedules", "1f1b,gpipe", "-o",
            str(tmp_path / "plan.csv"), "--json")
    rc, out, err = run(capsys, *base)
    assert rc == 0, err
    alike = json.loads(out)
    rc, out, err = run(capsys, *base, "--lengths", str(f), "--attention-share", "0.3", "--reference-length", "256")
    assert rc == 0, err
    got = json.loads(out)
    assert got["lengths"]["samples"] == 20 and got["lengths"]["reference_length"] == 256
    best = got["best"]
    # the winner's step, replayed: its schedule over its micro-batches of the distribution
    from stagewise.plan.search import Cluster
    from stagewise.plan.search.profile_costs import stage_costs
    from stagewise.plan.search.holding import holding

    d = lengths.Distribution(tuple(dist), 0.3, 256.0)
    c = best
    sched = generate(c["family"], c["p"], c["m"], c["v"] if FAMILIES[c["family"]].chunks else None)
    loaded = Profile.load(prof)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=loaded.link, inter=loaded.link, state_factor=4.0)
    costs = stage_costs(loaded, tuple(c["counts"]), holding(sched), c["micro_batch_size"], c["recompute"], cl,
                        c["p"], c["dp"])
    assert metrics(simulate(sched, d.apply(costs, c["m"], c["micro_batch_size"]))).makespan == \
        pytest.approx(best["makespan"])
    # longer samples than the profile's reference: every configuration's step is longer than with alike ones
    assert best["step_time"] > alike["best"]["step_time"]
    rc, out, err = run(capsys, *base[:-3], "-o", str(tmp_path / "plan.md"), "--lengths", str(f))
    assert rc == 0 and "- Lengths: each step over its micro-batches drawn from 20 sample lengths 256..4096" in \
        (tmp_path / "plan.md").read_text(), err
    drawn = d.microbatches(4, 5)
    assert sorted(x for g in drawn for x in g) == sorted(dist)  # 20 draws of 20: the distribution itself
    assert "--lengths plans a length distribution from a --profile" in fails(
        capsys, "plan", "--model", "x.json", "--lengths", str(f))
    assert "--auto runs or searches micro-batches alike" in fails(capsys, *base, "--lengths", str(f), "--auto")


def test_explain_reads_each_message_at_its_own_bytes():
    """A micro-batch's messages take its tokens' bytes: explain's arrivals are the engine's (none after the op
    that takes it starts, and the long micro-batch's do hold its receivers)."""
    from stagewise.explain import messages

    sched = generate("1f1b", 4, 8)
    ma = [1.0] * 8
    ma[3] = 6.0
    tl = simulate(sched, Costs(latency=0.1, bandwidth=1.0, boundary_bytes=1.0, mb_activation=ma))
    got = messages(tl)
    assert all(arrival <= tl.starts[b.rank][b.pos] + 1e-9 for _, b, _, arrival in got)
    held = [arrival for a, b, _, arrival in got if sched.programs[b.rank][b.pos].mb == 3
            and arrival == pytest.approx(tl.starts[b.rank][b.pos])]
    assert held and all(arrival - tl.ends[a.rank][a.pos] == pytest.approx(0.1 + 6.0) for a, b, _, arrival in got
                        if sched.programs[a.rank][a.pos].mb == 3)


def test_the_examples_in_the_docstrings_run():
    import doctest

    assert doctest.testmod(lengths).failed == 0
