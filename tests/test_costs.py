"""Cost scaling for same-model comparisons (--costs-per rank)."""

import json

import pytest

from stagewise.cli import main
from stagewise.costs import Costs, rank_share_weights, scaled
from stagewise.schedules import generate


@pytest.mark.parametrize("name, weight", [("1f1b", 1.0), ("interleaved-1f1b", 0.5), ("zb-v", 0.5),
                                          ("dualpipe", 1.0), ("dualpipe-v", 0.5)])
def test_a_stage_costs_its_share_of_a_ranks_model_part(name, weight):
    assert set(rank_share_weights(generate(name, 4, 8))) == {weight}


def test_scaled_keeps_uniform_costs_scalar_and_scales_lists():
    c = scaled(Costs(t_f=1, t_b=2, activation_bytes=[4, 8]), [0.5, 0.5])
    assert (c.t_f, c.t_b, c.t_i, c.activation, c.activation_bytes) == (0.5, 1.0, None, 0.5, [2, 4])
    c = scaled(Costs(t_f=1), [1, 2], activation=False)
    assert c.t_f == [1, 2] and c.activation == 1.0


def test_compare_costs_per_rank_is_the_same_model(capsys):
    assert main(["compare", "-p", "4", "-m", "8", "--schedules", "1f1b,interleaved-1f1b,zb-v",
                 "--costs-per", "rank", "--json"]) == 0
    got = {r["schedule"]: r for r in json.loads(capsys.readouterr().out)}
    assert got["interleaved-1f1b"]["makespan"] == pytest.approx(28.5)
    assert got["zb-v"]["peak_activations"] == [4, 4, 4, 4]  # half-size chunks: 1F1B's memory
    assert got["1f1b"]["makespan"] == 33
