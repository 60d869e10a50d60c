"""The workshop's JSON API: the CLI's code and messages, each error tagged with its control."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise import limits, torch_csv
from stagewise.actions import Pair
from stagewise.costs import Costs
from stagewise.report import result
from stagewise.schedules import generate
from stagewise.simulate import simulate
from stagewise.workshop import api
from stagewise.workshop.downloads import download


def run(**settings):
    return api.payload(api.parse_settings(settings))


def error(**settings) -> api.SettingError:
    with pytest.raises(api.SettingError) as e:
        run(**settings)
    return e.value


def test_bubble_matches_the_literature_for_1f1b():
    # REFERENCES.md: (p-1)/(m+p-1) -> 27.3% at p=4, m=8 and 65.2% at p=16, m=8
    small, big = run(p="4", m="8")["results"][0], run(p=16, m=8)["results"][0]
    assert round(small["bubble_fraction"], 3) == 0.273 == round(small["formula_bubble_fraction"], 3)
    assert round(big["bubble_fraction"], 3) == 0.652 == round(big["formula_bubble_fraction"], 3)


def test_per_stage_costs_are_the_cli_lists_and_a_wrong_length_names_its_control(capsys):
    from stagewise.cli import main

    got = run(p=4, m=8, tf="1,1,1,2", tb=[2, 2, 2, 4])["results"][0]
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--tf", "1,1,1,2", "--tb", "2,2,2,4", "--json"]) == 0
    assert got["makespan"] == 57 == __import__("json").loads(capsys.readouterr().out)["makespan"]
    assert api.parse_settings({"tf": "1, 1,1,2", "ti": "0.5"}).to_query() == {"tf": "1,1,1,2", "ti": "0.5"}
    e = error(p=4, tf="1,1,2")
    assert e.field == "tf" and str(e) == "--tf has 3 per-stage values; the schedule has 4 stages"
    assert error(schedules="dualpipe-v", p=4, tb="2,2,2,4").field == "tb"  # dualpipe-v has 8 stages
    assert error(tf="1,x").field == "tf" and error(tw=",".join(["1"] * 3000)).field == "tw"


def test_the_all_to_all_is_a_setting_and_a_lane_under_each_rank():
    res = run(schedules="dualpipe-v", p=4, m=8, a2a="0.5")["results"][0]
    cli = result(generate("dualpipe-v", 4, 8), api.costs_for(api.Settings(schedules=("dualpipe-v",), a2a=0.5),
                                                             generate("dualpipe-v", 4, 8)))
    assert res["makespan"] == cli["makespan"] and res["exposed_a2a"] == cli["exposed_a2a"]
    (lane,) = res["lanes"]
    assert lane["key"] == "a2a" and len(lane["rows"]) == 4
    assert sum(w for row in lane["rows"] for _, _, w, _ in row) == pytest.approx(sum(res["exposed_a2a"]))
    assert lane["rows"][0][0][3] == "all-to-all of 0F0" and run(p=4, m=8)["results"][0]["lanes"] == []
    assert error(a2a=0.5, tfb=3).field == "tfb"


def test_fsdp_and_a_bandwidth_draw_a_communication_lane_and_open_a_bubble():
    free = run(p=4, m=8, fsdp=2)["results"][0]
    slow = run(p=4, m=8, fsdp=2, bandwidth="0.25")["results"][0]
    assert free["lanes"] == [] and free["makespan"] == run(p=4, m=8)["results"][0]["makespan"]
    (lane,) = slow["lanes"]
    assert lane["key"] == "comm" and lane["rows"][0][0] == [0.0, 2.0, 2.0, "the all-gather of stage 0 over fsdp"]
    assert slow["makespan"] > free["makespan"] and slow["bubble_fraction"] > free["bubble_fraction"]
    assert error(fsdp=9).field == "fsdp" and error(fsdp=2, bandwidth=0).field == "bandwidth"


def test_every_colour_of_the_page_comes_from_the_palette():
    from stagewise.explain import CAUSES
    from stagewise.render import palette

    style = api.families()["style"]
    assert style["page"] == palette.PAGE and style["kinds"] == palette.KIND_COLOURS
    assert set(style["causes"]) == set(CAUSES)
    for name, c in style["causes"].items():
        assert (c["colour"], c["pattern"]) == palette.CAUSES[name] and c["label"] and c["meaning"]
    import re
    from pathlib import Path

    static = Path(api.__file__).with_name("static")
    for f in [*static.glob("*.js"), static / "app.css"]:
        assert not re.findall(r"#[0-9a-fA-F]{3,6}\b", f.read_text()), f.name  # no colour of its own


def test_result_is_the_cli_result_plus_the_drawing():
    res = run(schedules="gpipe", p=3, m=5, tf="1.5", tb=2.5, per="stage")["results"][0]
    sched = generate("gpipe", 3, 5)
    cli = result(sched, Costs(t_f=1.5, t_b=2.5))
    assert {k: res[k] for k in cli} == cli
    tl = simulate(sched, Costs(t_f=1.5, t_b=2.5))
    for r in range(3):
        assert [op[0] for op in res["ops"][r]] == [str(op) for op in sched.programs[r]]
        assert [(op[4], op[5]) for op in res["ops"][r]] == [(s, e) for _, s, e in tl.rows(r)]
        assert res["memory"][r] == [list(x) for x in tl.memory_curve(r)]


@pytest.mark.parametrize("settings, field, text", [
    ({"m": "0"}, "m", "--microbatches must be >= 1; got 0"),
    ({"p": 0}, "p", "--ranks must be >= 1; got 0"),
    ({"schedules": "gpipe", "v": 2}, "v", "gpipe needs --chunks 1; got 2"),
    ({"tb": -1}, "tb", "--tb must be a finite number >= 0"),
    ({"latency": "-0.5"}, "latency", "--latency must be a finite number >= 0"),
    ({"m": "eight"}, "m", "--microbatches: expected a whole number; got 'eight'"),
    ({"tf": "fast"}, "tf", "--tf: expected a finite number; got 'fast'"),
    ({"tf": "nan"}, "tf", "expected a finite number"),
    ({"skew": 0}, "skew", "skew (cost factor of the first and last stage) must be > 0"),
    ({"schedules": "nope"}, "schedules", "unknown schedule 'nope'"),
    ({"schedules": []}, "schedules", "choose at least one schedule"),
    ({"p": 65}, "p", "--ranks must be <= 64 in the workshop"),
    ({"per": "chunk"}, "per", "per must be 'rank' or 'stage'"),
    ({"schedules": "gpipe,1f1b", "p": 64, "m": 256}, "m", "these settings make up to 65536 actions; the page draws at most"),
    ({"colour": "red"}, "schedules", "unknown setting 'colour'"),
])
def test_invalid_settings_name_their_control(settings, field, text):
    e = error(**settings)
    assert (e.field, text in str(e)) == (field, True), str(e)


def test_messages_are_the_cli_messages(capsys):
    from stagewise.cli import main

    assert main(["simulate", "dualpipe", "-p", "4", "-m", "6"]) == 2
    assert str(error(schedules="dualpipe", m=6)) in capsys.readouterr().err


def test_field_of_reads_the_first_known_option():
    assert api.field_of("dualpipe needs --microbatches >= 2 * --ranks (8); got 4") == "m"
    assert api.field_of("dualpipe needs an even --ranks; got 3") == "p"
    assert api.field_of("deadlock: wait cycle") == "schedules"


def test_blank_controls_take_the_defaults_and_the_query_keeps_only_changes():
    s = api.parse_settings({"p": "", "m": "16", "ti": "", "schedules": "1f1b, gpipe,1f1b"})
    assert (s.p, s.m, s.ti, s.schedules) == (4, 16, None, ("1f1b", "gpipe"))
    assert s.to_query() == {"m": "16", "schedules": "1f1b,gpipe"}


def test_skew_weighs_the_first_and_last_stage_of_each_lane():
    sched = generate("1f1b", 4, 8)
    c = api.costs_for(api.Settings(skew=2.0, tf=1.0, tb=2.0), sched)
    assert c.t_f == [2.0, 1.0, 1.0, 2.0] and c.t_b == [4.0, 2.0, 2.0, 4.0] and c.t_i is None
    res = run(skew=2)["results"][0]
    assert res["formula_bubble_fraction"] is None  # uneven stages: the closed form does not apply
    assert res["makespan"] > run()["results"][0]["makespan"]


def test_per_rank_costs_split_a_rank_among_its_chunks():
    sched = generate("interleaved-1f1b", 4, 8, 2) if "interleaved-1f1b" in api.available() else None
    if sched is None:
        pytest.skip("interleaved-1f1b is not built yet")
    per_rank = api.costs_for(api.Settings(), sched)
    assert (per_rank.t_f, per_rank.t_b, per_rank.activation) == (0.5, 1.0, 0.5)
    per_stage = api.costs_for(api.Settings(per="stage"), sched)
    assert (per_stage.t_f, per_stage.t_b, per_stage.activation) == (1.0, 2.0, 1.0)
    # same total work per rank as 1f1b, so the busy time per rank is equal
    inter = run(schedules="interleaved-1f1b,1f1b", p=4, m=8)["results"]
    assert inter[0]["busy"] == pytest.approx(inter[1]["busy"])


@given(p=st.integers(1, 8), m=st.integers(1, 12), skew=st.sampled_from([0.5, 1.0, 3.0]),
       per=st.sampled_from(["rank", "stage"]))
def test_every_available_family_draws_what_it_simulates(p, m, skew, per):
    for name in api.available():
        try:
            out = run(schedules=name, p=p, m=m, skew=skew, per=per)
        except api.SettingError as e:
            assert e.field in ("p", "m", "v"), str(e)  # the family's own rule, on the right control
            continue
        res = out["results"][0]
        sched = generate(name, p, m)
        assert sum(len(row) for row in res["ops"]) == sched.num_actions
        ends = [op[5] for row in res["ops"] for op in row]
        assert max(ends) == pytest.approx(res["makespan"])
        for row in res["ops"]:
            for op in row:
                assert op[4] <= op[5] and op[2] < res["chunks"]
                assert (len(op) == 8) == (op[1] == "F&B")
        assert max(x for row in res["memory"] for _, x in row) == pytest.approx(max(res["peak_activations"]))


def test_pairs_carry_their_backward_for_the_lower_half():
    if "dualpipe" not in api.available():
        pytest.skip("dualpipe is not built yet")
    res = run(schedules="dualpipe", p=4, m=8)["results"][0]
    sched = generate("dualpipe", 4, 8)
    pairs = [op for prog in sched.programs for op in prog if type(op) is Pair]
    drawn = [op for row in res["ops"] for op in row if op[1] == "F&B"]
    assert len(drawn) == len(pairs) > 0
    assert [op[0] for op in drawn] == [str(op) for op in pairs]
    assert [op[6] for op in drawn] == [op.backward.kind for op in pairs]
    assert all(0 <= op[7] < res["chunks"] for op in drawn)


def test_colours_are_the_renderers_palette():
    from stagewise.render import palette

    res = run(schedules="1f1b")["results"][0]
    assert res["colours"]["F"] == [palette.colour("F")] and res["colours"]["B"] == [palette.colour("B")]
    assert res["ink"][palette.colour("F")] == palette.text_colour(palette.colour("F"))


def test_families_lists_what_exists_with_defaults():
    info = api.families()
    names = [f["name"] for f in info["families"]]
    assert names[:2] == ["gpipe", "1f1b"] and names == api.available()
    assert info["defaults"]["p"] == 4 and info["defaults"]["schedules"] == ("1f1b",)


def test_downloads_are_the_owning_modules_output():
    s = api.parse_settings({"schedules": "1f1b", "p": 2, "m": 3})
    name, ctype, body = download("csv", s)
    assert name == "1f1b-p2-m3.csv" and ctype.startswith("text/csv")
    assert body.decode() == torch_csv.dumps(generate("1f1b", 2, 3))
    name, _, body = download("svg", s)
    assert name.endswith(".svg") and body.startswith(b"<svg")
    with pytest.raises(api.SettingError, match="format must be one of"):
        download("gif", s)
    with pytest.raises(api.SettingError, match="one schedule"):
        download("csv", api.parse_settings({"schedules": "1f1b,gpipe"}))


def test_an_unexecutable_schedule_is_reported_on_the_schedule_control(monkeypatch):
    from stagewise.validate import ScheduleError

    def stuck(schedule, costs):
        raise ScheduleError("deadlock: wait cycle: rank 0 position 1 (0B0) waits for 1B0 at rank 1 position 0")

    import stagewise.compare

    monkeypatch.setattr(stagewise.compare, "simulate", stuck)
    e = error(schedules="1f1b")
    assert e.field == "schedules" and str(e).startswith("deadlock: wait cycle")


def test_a_cap_or_cost_change_reuses_the_schedules_and_the_answer_follows_it():
    api.generated.cache_clear()
    fits = run(schedules="v-half", p=4, m=8, cap=3)["results"][0]
    before = api.generated.cache_info()
    over = run(schedules="v-half", p=4, m=8, cap="2.5", tf=2)["results"][0]
    assert api.generated.cache_info().hits == before.hits + 1  # not generated again
    assert fits["within_cap"] and fits["peak_activations"] == [3.0] * 4  # (p+2)//2
    assert not over["within_cap"] and over["memory_cap"] == [2.5] * 4 and over["makespan"] > fits["makespan"]
    assert error(schedules="v-half", p=4, m=8, cap=0).field == "cap"  # a cached schedule still gets its error
    run(schedules="v-half", p=5, m=8)
    assert api.generated.cache_info().misses == before.misses + 1  # a new p: generated


def test_a_view_over_the_limit_is_refused_before_any_schedule_is_made(monkeypatch):
    from stagewise.schedules import FAMILIES

    def never(*args):
        raise AssertionError("generated a schedule for a view the page refuses")

    api.generated.cache_clear()
    monkeypatch.setattr(api, "generated", never)
    e = error(schedules=",".join(FAMILIES), p=64, m=256)  # 663k actions: refused from p, m and v alone
    assert e.field == "m" and "make up to 819200 actions; the page draws at most 56000" in str(e)
    monkeypatch.setenv("STAGEWISE_MAX_WORKSHOP_ACTIONS", "100")
    assert "at most 100" in str(error(schedules="1f1b", p=8, m=8))


def test_the_bound_holds_every_family_and_the_largest_documented_view_fits():
    from stagewise.schedules import FAMILIES, generate

    for name in api.available():
        for p, m, v in [(4, 8, None), (6, 12, None), (4, 8, 3)]:
            try:
                sched = generate(name, p, m, v if FAMILIES[name].chunks is None else None)
            except Exception:
                continue
            assert sched.num_compute_actions <= api.most_actions((name,), p, m, v)
    names = tuple(api.available())
    assert api.most_actions(names, 16, 64, None) <= limits.WORKSHOP_ACTIONS.default  # the README's 13 families


def test_a_size_limit_met_while_generating_is_a_400_on_its_control(monkeypatch):
    monkeypatch.setenv("STAGEWISE_MAX_ACTIONS", "10")
    api.generated.cache_clear()
    e = error(schedules="1f1b", p=4, m=8)
    assert e.field == "m" and "STAGEWISE_MAX_ACTIONS" in str(e)


def test_why_explains_one_gap_of_the_view():
    s = api.parse_settings({"schedules": "gpipe,1f1b", "p": 4, "m": 8})
    gap = api.why(s, "1f1b", "0", 4)
    assert gap["waits_for"]["op"] == "1B0" and gap["cause"] == "fill" and gap["text"].startswith("rank 0 idle 4..10")
    assert api.why(s, "1f1b", 3, -1)["cause"] == "drain"  # rank 3's wait for the step's end
    for schedule, rank, pos, text in [("zb-v", 0, 4, "not in this view"), ("1f1b", 0, 1, "no idle gap before position 1"),
                                      ("1f1b", 9, 0, "rank must be a whole number in 0..3"),
                                      ("1f1b", 0, "x", "pos must be a whole number")]:
        with pytest.raises(api.SettingError, match=text):
            api.why(s, schedule, rank, pos)


def test_each_result_carries_its_gaps_and_on_request_its_messages():
    res = run(schedules="1f1b", p=4, m=8)["results"][0]
    assert "messages" not in res and res["idle_by_cause"]["fill"] == res["idle_by_cause"]["drain"] == 18
    assert [0, 4.0, 10.0, 4, "fill"] in res["gaps"]
    assert sum(b - a for _, a, b, _, _ in res["gaps"]) == sum(res["idle"])
    msgs = api.payload(api.parse_settings({"p": 4, "m": 8}), with_messages=True)["results"][0]["messages"]
    assert len(msgs) == 2 * 3 * 8 and [0, 0, 1, 0, 1.0, 0] in msgs  # 0F0's activation reaches rank 1 at 1


def test_the_examples_in_the_docstrings_run():
    import doctest

    assert doctest.testmod(api).failed == 0
