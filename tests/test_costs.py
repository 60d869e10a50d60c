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


def test_dispatch_bytes_count_the_ranks_a_token_reaches_once_each():
    from stagewise.costs import expert_dispatch_bytes

    h, n = 1024, 4096
    assert expert_dispatch_bytes(n, h, 2, ep=4) == n * h * 2 * 3 * 2 / 4  # one expert a rank: k (ep-1)/ep copies
    # two experts a rank (E = 4), top-2: another rank misses both with probability C(2,2)/C(4,2) = 1/6
    assert expert_dispatch_bytes(n, h, 2, ep=2, experts_per_rank=2) == pytest.approx(n * h * 2 * 5 / 6)
    assert expert_dispatch_bytes(n, h, 8, ep=8) == n * h * 2 * 7  # k = E: every other rank gets every token
    assert expert_dispatch_bytes(n, h, 1, ep=1) == 0.0


def test_all_to_all_time_is_two_per_moe_layer_and_none_without_a_group():
    from stagewise.costs import expert_all_to_all, expert_dispatch_bytes

    one = expert_dispatch_bytes(4096, 1024, 2, 4) / 50e9
    assert expert_all_to_all(4096, 1024, 2, 4, bandwidth=50e9, latency=1e-5, layers=3) == \
        pytest.approx(3 * 2 * (one + 1e-5))
    assert expert_all_to_all(4096, 1024, 2, 1, 2, bandwidth=50e9, latency=1e-5) == 0.0


@pytest.mark.parametrize("kwargs, words", [
    (dict(top_k=9, ep=4, experts_per_rank=2), r"--moe-top-k \(9\) must be at most the experts of the group"),
    (dict(top_k=0, ep=4), "--moe-top-k must be a whole number >= 1; got 0"),
    (dict(top_k=2, ep=4, bandwidth=0), "--a2a-bandwidth must be > 0"),
    (dict(top_k=2, ep=4, latency=-1), "--a2a-latency must be a finite number >= 0"),
])
def test_bad_moe_shapes_name_the_option(kwargs, words):
    from stagewise.costs import CostError, expert_all_to_all

    kwargs = {"bandwidth": 1e9, **kwargs}
    with pytest.raises(CostError, match=words):
        expert_all_to_all(4096, 1024, kwargs.pop("top_k"), kwargs.pop("ep"), **kwargs)


def test_a_chunk_of_a_v_chunk_schedule_pays_its_share_of_the_all_to_all():
    c = scaled(Costs(a2a=1.0, a2a_b=[2, 4]), [0.5, 0.5])
    assert (c.a2a, c.a2a_b) == (0.5, [1, 2])
