"""One comparison core: the CLI, the notebook and the workshop pick, generate and simulate families alike."""

from __future__ import annotations

import json

import pytest
from cli_helpers import raises_said

from cli_helpers import run
from stagewise.compare import compare, schedules_for
from stagewise.costs import Costs, rank_share_weights, scaled
from stagewise.schedules import ScheduleArgError


def test_v_goes_only_to_the_families_that_take_it():
    scheds = schedules_for(["1f1b", "interleaved-1f1b", "v-min"], 4, 8, 3)
    assert [s.chunks for s in scheds] == [1, 3, 2]


def test_all_families_skip_those_that_refuse_p_and_m_but_a_named_one_raises():
    names = [s.name for s in schedules_for(None, 3, 4)]
    assert "dualpipe" not in names and "v-half" in names  # dualpipe needs an even p
    with raises_said(ScheduleArgError, "dualpipe needs an even --ranks"):
        schedules_for(["dualpipe"], 3, 4)


def test_the_cli_notebook_and_workshop_report_the_same_numbers(capsys):
    from stagewise.notebook import compare as notebook_compare
    from stagewise.workshop import api

    names = ["zb-h1", "zb-v", "v-half"]
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", ",".join(names), "--costs-per", "rank",
                     "--json")
    cli = [r["makespan"] for r in json.loads(out)]
    per_rank = lambda s: scaled(Costs(), rank_share_weights(s))  # noqa: E731
    core = [e.result["makespan"] for e in compare(names, 4, 8, costs=per_rank)]
    page = [r["makespan"] for r in api.payload(api.parse_settings({"schedules": ",".join(names)}))["results"]]
    nb = [tl.ends[0][-1] - tl.starts[0][0] for tl in notebook_compare(names, 4, 8, costs=Costs())]
    assert rc == 0 and cli == core == page
    assert len(nb) == 3 and nb[0] == pytest.approx(27)  # zb-h1 per stage: rank 0 spans the step
