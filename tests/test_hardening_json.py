"""Every JSON output parses with a parser that rejects NaN and Infinity, even at extreme costs."""

import json

import pytest

from cli_helpers import run
from stagewise.schedules import FAMILIES

PROFILE = "data/profiles/gpt-l32-d256-cpu.json"


def strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_simulate_json_is_strict_at_huge_finite_costs(capsys, name):
    rc, out, err = run(capsys, "simulate", name, "-p", "4", "-m", "8", "--tf", "1e300", "--tb", "1e300",
                       "--latency", "1e300", "--json")
    assert rc == 0, err
    res = strict(out)
    assert res["makespan"] > 1e300 and 0 <= res["bubble_fraction"] < 1


def test_compare_auto_plan_and_trace_json_are_strict(capsys, tmp_path):
    rc, out, err = run(capsys, "compare", "-p", "4", "-m", "8", "--tf", "1e200", "--json")
    assert rc == 0 and len(strict(out)) >= 8, err
    rc, out, err = run(capsys, "auto", "-p", "3", "-m", "4", "--tf", "1e200", "--tb", "2e200", "--json")
    assert rc == 0 and strict(out)["auto"]["makespan"] > 1e200, err
    rc, out, err = run(capsys, "plan", "--profile", PROFILE, "-N", "2", "-G", "8", "--json", "-o",
                       str(tmp_path / "p.csv"))
    assert rc == 0 and strict(out)["best"], err
    rc, out, err = run(capsys, "draw", "zb-v", "-p", "4", "-m", "8", "--tf", "1e300", "-o", str(tmp_path / "t.json"))
    assert rc == 0, err
    assert strict((tmp_path / "t.json").read_text())["traceEvents"]


def test_overflowing_costs_are_refused_not_printed_as_infinity(capsys):
    rc, out, err = run(capsys, "simulate", "gpipe", "--tf", "1e308", "--tb", "1e308", "--json")
    assert rc == 2 and out == "" and "--tf" in err and "overflow" in err


@pytest.mark.parametrize("field,option", [("t_f", "--tf"), ("t_b", "--tb"), ("t_i", "--ti"), ("boundary_bytes",
                                          "--boundary-bytes"), ("latency", "--latency"), ("free_at_i", "--free-at-i")])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_the_python_api_refuses_non_finite_costs_naming_the_option(field, option, value):
    from stagewise.costs import CostError, Costs

    with pytest.raises(CostError, match=f"^{option} must be a finite number"):
        Costs(**{field: value}).resolve(4)
