"""`stagewise demo`'s sizes and the verdict on its claims (the real run: tests/test_runtime_cli.py)."""

import doctest

from stagewise.cli import demo
from stagewise.runtime.result import RunResult


def result(name, measured, predicted, steps):
    return RunResult(schedule=name, ranks=2, microbatches=4, losses=(1.0,), step_time_s=steps,
                     measured_bubble_fraction=measured, predicted_bubble_fraction=predicted)


def test_one_rank_per_core_two_to_four():
    assert [demo.run_sizes(c).ranks for c in (1, 2, 3, 4, 64)] == [2, 2, 3, 4, 4]
    assert demo.run_sizes(2).microbatches == 4 and demo.run_sizes(8).microbatches == 8


def test_claims_that_hold_say_so_and_nothing_more():
    lines = demo.verdict([result("1f1b", 0.21, 0.20, (1, 0.3, 0.3)), result("zb-h1", 0.09, 0.08, (1, 0.26, 0.26))],
                         cores=2, ranks=2, load=0.2)
    assert lines == ["claims, within 5 points: 1f1b's bubble 21.0% measured, 20.0% predicted: held; zb-h1's bubble "
                     "9.0% measured, 8.0% predicted: held",
                     "zb-h1's step shorter than 1f1b's: held (260.0 ms against 300.0 ms, the median of steps 2..3)"]


def test_a_missed_claim_says_why_it_may_have_missed():
    slow = [result("1f1b", 0.30, 0.20, (1, 0.3, 0.3)), result("zb-h1", 0.09, 0.08, (1, 0.31, 0.32))]
    lines = demo.verdict(slow, cores=1, ranks=2, load=0.0)
    assert "missed (10.0 points)" in lines[0] and lines[1].startswith("zb-h1's step shorter than 1f1b's: missed")
    assert lines[2] == ("why a claim missed: 2 ranks share 1 core here: an op stretches while more ranks compute than "
                        "there are cores, so the measured bubble lies above the prediction")
    assert "load average 3.0 on 2 cores" in demo.verdict(slow, cores=2, ranks=2, load=3.0)[2]
    assert "the machine was idle" in demo.verdict(slow, cores=4, ranks=2, load=0.5)[2]


def test_the_examples_in_the_docstrings_run():
    assert doctest.testmod(demo).failed == 0


def test_with_predicted_steps_the_second_claim_is_the_predicted_order():
    """Fed the ops' measured costs, the simulator may predict ZB-H1 longer (a split backward costing more than a
    fused one on a CPU): the claim is then that it measured longer too."""
    runs = [result("1f1b", 0.21, 0.20, (1, 0.3, 0.3)), result("zb-h1", 0.09, 0.08, (1, 0.33, 0.33))]
    held = demo.verdict(runs, cores=2, ranks=2, load=0.2, predicted={"1f1b": 10.0, "zb-h1": 11.0})
    assert held[1] == ("zb-h1's step against 1f1b's, in the predicted order: held (measured 1.10x: 330.0 ms against "
                       "300.0 ms, the median of steps 2..3; predicted 1.10x from the ops' measured costs, zb-h1 "
                       "longer here)") and len(held) == 2
    missed = demo.verdict(runs, cores=2, ranks=2, load=0.2, predicted={"1f1b": 10.0, "zb-h1": 9.0})
    assert ": missed (measured 1.10x" in missed[1] and missed[2].startswith("why a claim missed")
