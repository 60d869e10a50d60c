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
