"""The causes of idle time in plain words (stagewise.causes): one sentence per gap, without op codes."""

import re

import pytest

from stagewise import causes
from stagewise.costs import Costs
from stagewise.explain import CAUSES, explain
from stagewise.schedules import FAMILIES, generate
from stagewise.simulate import simulate

CODE = re.compile(r"\d+[FBIW]\d+|OVERLAP|<-")


def test_every_cause_has_its_words():
    assert set(causes.MEANING) == set(CAUSES)
    for cause in CAUSES:
        assert causes.label(cause) and causes.meaning(cause).startswith("a ")


@pytest.mark.parametrize("costs", [Costs(), Costs(t_f=[1, 1, 1, 2], t_b=[2, 2, 2, 4]), Costs(latency=0.5)],
                         ids=["even", "slow last stage", "links"])
def test_each_gap_of_every_family_reads_in_plain_words(costs):
    seen = set()
    for name in FAMILIES:
        try:
            sched = generate(name, 4, 8)
        except Exception:  # a family that needs other p or m
            continue
        if isinstance(costs.t_f, list) and sched.stages != 4:  # the per-stage lists are for 4 stages
            continue
        tl = simulate(sched, costs)
        for gap in explain(tl):
            text = causes.plain(gap, tl)
            assert text.startswith(f"rank {gap.rank} ") and not CODE.search(text), (name, gap.text, text)
            words, exact = causes.lines(gap, tl)
            assert words.endswith(text) and gap.text.endswith(exact)
            seen.add(gap.cause)
    assert seen >= {"fill", "drain"}


def test_the_words_of_each_cause():
    def first(name, cause, costs=Costs(), p=4, m=8):
        tl = simulate(generate(name, p, m), costs)
        return causes.plain(next(g for g in explain(tl) if g.cause == cause), tl)

    assert first("1f1b", "fill") == ("rank 0 waits for micro-batch 0's gradient: it comes back only after micro-batch 0 "
                                     "has gone through every later stage (the pipeline is still filling)")
    assert first("zb-v", "fill") == "rank 1 has nothing to do yet: micro-batch 0 has not reached it (the pipeline is filling)"
    assert first("1f1b", "drain").startswith("rank 0 has no forward left to run, so it can only wait for micro-batch 5's")
    assert first("1f1b", "slow stage", Costs(t_f=[1, 1, 1, 2], t_b=[2, 2, 2, 4])) == (
        "rank 0 waits on a slow stage: stage 3's backward takes 4 where the fastest stage's takes 2, and the slowest "
        "stage sets the pace")
    assert first("1f1b", "link", Costs(latency=1), m=4) == (
        "rank 0 waits for a message: micro-batch 1's gradient is ready on rank 1 but still on its way over the link")
    assert first("dualpipe-v", "order") == ("rank 0 waits for micro-batch 4's activation from rank 1: it is late because "
                                            "rank 3 ran micro-batch 4's forward (stage 3) first, as its program orders")


def test_a_gap_as_json_carries_its_words():
    tl = simulate(generate("1f1b", 4, 8))
    got = causes.gap_json(explain(tl)[0], tl)
    assert got["plain"].startswith("rank 0 waits for micro-batch 0's gradient") and got["label"] == "the pipeline fills"
    assert got["chain"][0]["op"] == "1B0" and got["text"].endswith("fill: the chain starts at 0F0, the step's first action")


def test_the_examples_in_the_docstrings_run():
    import doctest

    assert doctest.testmod(causes).failed == 0
