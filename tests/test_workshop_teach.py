"""Teach: the lesson's numbers are the page's simulations and the closed forms' values."""

import pytest

from stagewise import formulas
from stagewise.schedules import generate
from stagewise.workshop import api, teach


@pytest.mark.parametrize("p, m", [(4, 8), (3, 12), (8, 8), (2, 5)])
@pytest.mark.parametrize("per", ["rank", "stage"])
def test_the_formula_text_has_the_closed_form_value(p, m, per):
    s = api.parse_settings({"p": p, "m": m, "per": per})
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1"):
        sched = generate(name, p, m)
        costs = api.costs_for(s, sched)
        f = teach.formula(name, p, m, sched.chunks, costs)
        expected = formulas.bubble_fraction(name, p, m, sched.chunks, costs)
        assert (f is None) == (expected is None), name
        if f:
            assert f["value"] == pytest.approx(expected)
            if name != "zb-h1":  # the text ends in the fraction it reduces to: 'a/b'
                num, den = f["numbers"].rsplit(" = ", 1)[1].split("/")
                assert int(num) / int(den) == pytest.approx(expected)


def test_no_closed_form_is_claimed_for_uneven_stages_or_links():
    sched = generate("1f1b", 4, 8)
    assert teach.formula("1f1b", 4, 8, 1, api.costs_for(api.Settings(skew=2.0), sched)) is None
    assert teach.formula("1f1b", 4, 8, 1, api.costs_for(api.Settings(latency=0.1), sched)) is None
    assert teach.formula("zb-v", 4, 8, 2, api.costs_for(api.Settings(), generate("zb-v", 4, 8))) is None


def test_the_lesson_simulates_each_taught_family_at_the_page_settings():
    out = teach.payload(api.parse_settings({"p": 4, "m": 8, "cap": 2}))
    rows = {r["schedule"]: r for r in out["rows"]}
    assert set(rows) == set(teach.TAUGHT) & set(api.available())
    assert rows["gpipe"]["peak_activations"] == [8.0] * 4 and rows["1f1b"]["peak_activations"] == [4.0, 3.0, 2.0, 1.0]
    assert rows["1f1b"]["bubble_fraction"] == pytest.approx(3 / 11) == rows["1f1b"]["formula"]["value"]
    assert rows["interleaved-1f1b"]["chunks"] == 2 and rows["zb-h1"]["idle_by_cause"]["drain"] == 0
    assert "error" not in rows["dualpipe-v"]
    rows = {r["schedule"]: r for r in teach.payload(api.parse_settings({"p": 4, "m": 6}))["rows"]}
    assert rows["dualpipe-v"]["error"].startswith("dualpipe-v needs --microbatches >= 2 * --ranks")


def test_the_examples_in_the_docstrings_run():
    import doctest

    assert doctest.testmod(teach).failed == 0


#: each lesson's answer, as a student gets there from its start (the browser test drives the same controls)
ANSWERS = {
    "bubble": {"m": 64},
    "memory": {"m": 16},
    "interleaving": {"v": 4},
    "zero-bubble": {"m": 10},
    "v-shape": {"cap": 5, "schedules": "v-half"},
    "dualpipe": {"a2a": 0.25},
    "uneven": {"tf": "1.25,1.25,1.25,1.25", "tb": "2.5,2.5,2.5,2.5"},
    "slices": {"slices": 3},
}


def lesson(key, settings):
    out = teach.payload(api.parse_settings(settings))
    return next(x for x in out["lessons"] if x["key"] == key)


@pytest.mark.parametrize("key", [x.key for x in teach.LESSONS])
def test_each_lesson_starts_unanswered_and_its_answer_is_checked(key):
    start = next(x.start for x in teach.LESSONS if x.key == key)
    before = lesson(key, start)
    assert not before["answered"] and before["question"].endswith(".") and before["now"]
    after = lesson(key, {**start, **ANSWERS[key]})
    assert after["answered"], after["now"]


def test_a_near_answer_is_not_an_answer():
    assert not lesson("bubble", {"schedules": "1f1b", "p": 8, "m": 63})["answered"]  # 7/70 = 10.0%
    assert not lesson("interleaving", {"schedules": "interleaved-1f1b", "p": 4, "m": 8, "v": 3})["answered"]
    assert not lesson("zero-bubble", {"schedules": "zb-h1", "p": 4, "m": 11})["answered"]  # m at most 10
    assert not lesson("v-shape", {"schedules": "v-min", "p": 8, "m": 16, "cap": 5})["answered"]  # fits, not the best
    assert not lesson("v-shape", {"schedules": "zb-v", "p": 8, "m": 16, "cap": 5})["answered"]  # best, does not fit
    assert not lesson("uneven", {"schedules": "1f1b", "p": 4, "m": 8, "tf": 1, "tb": 2})["answered"]  # less work
    assert lesson("uneven", {"schedules": "1f1b", "p": 4, "m": 8, "tf": "1,1,1,2", "tb": "2,2,2,4"})["now"] == (
        "t_F sums to 5, t_B to 10: makespan 57")
    two = lesson("slices", {"schedules": "1f1b,seq1f1b", "p": 8, "m": 8, "slices": 2})  # (8+1)/2 = 4.5 of 8
    assert not two["answered"] and two["now"] == "at p=8, m=8, 2 slices: Seq1F1B's peak 4.5, 1F1B's 8 (56%)"


def test_an_unknown_schedule_is_refused_not_taught():
    with pytest.raises(api.SettingError, match="unknown schedule 'nope'"):
        teach.payload(api.parse_settings({"schedules": "nope"}))
