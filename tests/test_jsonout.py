"""stagewise.jsonout: every output is strict JSON (no NaN, no Infinity)."""

import json
import math

import pytest

from stagewise import jsonout


def test_non_finite_floats_become_null_anywhere():
    obj = {"a": math.inf, "b": [1.5, -math.inf, (math.nan, 2)], "c": {"d": 3, "e": "x"}}
    assert jsonout.finite(obj) == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": 3, "e": "x"}}
    text = jsonout.dumps(obj)
    assert json.loads(text, parse_constant=pytest.fail) == jsonout.finite(obj)


def test_cli_json_and_api_answers_go_through_it(capsys):
    from stagewise.cli.common import print_json
    from stagewise.workshop import api

    print_json({"makespan": math.inf})
    assert json.loads(capsys.readouterr().out) == {"makespan": None}
    assert api.dumps({"x": math.nan}) == b'{"x":null}'
