"""`stagewise explain`: one line per idle gap with the action it waits for and its cause."""

import json
import re

from cli_helpers import fails, run

from stagewise import torch_csv
from stagewise.schedules import generate

WORDS = re.compile(r"rank (\d+) idle ([\d.]+)\.\.([\d.]+) \(([\d.]+)\): rank \1 [^()]*(\(the pipeline [a-z ]+\))?")
EXACT = re.compile(r"    .*: (fill|drain|slow stage|link|order): .+")


def test_each_gap_in_plain_words_then_in_exact_terms(capsys):
    rc, out, err = run(capsys, "explain", "1f1b", "-p", "4", "-m", "8")
    assert rc == 0 and not err
    head, *lines = out.splitlines()
    assert head == "1f1b p=4 m=8 v=1, costs per stage: makespan 33, bubble 27.3% (closed form 27.3%): idle 36 = fill 18 + drain 18"
    words, exact = lines[::2], lines[1::2]
    assert len(words) == len(exact) == 15 and all(WORDS.fullmatch(x) for x in words), words
    assert all(EXACT.fullmatch(x) for x in exact), exact
    assert not any(re.search(r"\d[FBIW]\d", x) for x in words)  # no op codes in the plain words
    idle = {}
    for x in words:
        r, a, b, n, _ = WORDS.fullmatch(x).groups()
        assert float(b) - float(a) == float(n)
        idle[r] = idle.get(r, 0) + float(n)
    assert idle == {str(r): 9.0 for r in range(4)}  # (p-1)(t_F+t_B) on every rank
    assert ("rank 0 idle 4..10 (6): rank 0 waits for micro-batch 0's gradient: it comes back only after micro-batch 0 "
            "has gone through every later stage (the pipeline is still filling)\n"
            "    0B0 waits for 1B0 (gradient from rank 1) <- 2B0 <- 3B0 <- 3F0 <- 2F0 <- 1F0 <- 0F0: fill") in out
    assert ("rank 3 idle 27..33 (6): rank 3 has finished its part of the step and waits for the other ranks to finish "
            "(the pipeline drains)\n    rank 3 has run its program: drain") in out


def test_json_and_one_rank(capsys):
    rc, out, _ = run(capsys, "explain", "zb-h1", "-p", "4", "-m", "8", "--json")
    data = json.loads(out)
    assert rc == 0 and data["idle_by_cause"]["fill"] == data["idle"] == sum(g["length"] for g in data["gaps"])
    first = data["gaps"][0]
    assert first["before"]["op"] == "0I0" and first["waits_for"] == {"op": "1I0", "rank": 1, "position": 3}
    assert first["plain"] == ("rank 0 waits for micro-batch 0's gradient: it comes back only after micro-batch 0 has "
                              "gone through every later stage (the pipeline is still filling)")
    assert first["label"] == "the pipeline fills" and first["meaning"].startswith("a rank has nothing to do yet")
    rc, out, _ = run(capsys, "explain", "1f1b", "--rank", "2", "--latency", "0.5")
    lines = out.splitlines()
    assert rc == 0 and "link" in lines[0] and all(x.startswith("rank 2 ") for x in lines[1::2])
    assert any(": link: " in x for x in lines[2::2])
    assert ("rank 2 idle 13..14 (1): rank 2 waits for micro-batch 3's activation, held up by messages between ranks on "
            "its way: with free links most of this wait would go") in out


def test_costs_name_a_slow_stage(capsys):
    rc, out, _ = run(capsys, "explain", "1f1b", "--tf", "1,1,1,2", "--tb", "2,2,2,4")
    assert rc == 0 and "slow stage: " in out and "stage 3's B takes 4; the fastest stage's 2" in out
    assert "waits on a slow stage: stage 3's backward takes 4 where the fastest stage's takes 2" in out


def test_a_dualpipe_pair_is_worded_by_its_halves(capsys):
    rc, out, _ = run(capsys, "explain", "dualpipe-v", "-p", "4", "-m", "8", "--rank", "0")
    first, exact = out.splitlines()[1:3]
    assert first == ("rank 0 idle 20..23 (3): rank 0 waits for micro-batch 4's activation from rank 1: it is late "
                     "because rank 3 ran micro-batch 4's forward (stage 3) first, as its program orders")
    assert exact.startswith("    (7F4;0B0)OVERLAP_F_B waits for (6F4;1B0)OVERLAP_F_B")


def test_the_summary_says_what_the_costs_are_per(capsys):
    """Per stage (the default) a v-chunk family's makespan is v times the one of one rank's share, which demo and
    the workshop draw: the summary says which it is, and how to get the other."""
    rc, out, _ = run(capsys, "explain", "dualpipe-v", "-p", "4", "-m", "8")
    assert rc == 0 and out.startswith("dualpipe-v p=4 m=8 v=2, costs per stage (--costs-per rank: one rank's "
                                      "share, as demo and the workshop): makespan 54,")
    rc, out, _ = run(capsys, "explain", "dualpipe-v", "-p", "4", "-m", "8", "--costs-per", "rank", "--json")
    assert rc == 0 and (json.loads(out)["makespan"], json.loads(out)["costs_per"]) == (27, "rank")
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", "dualpipe-v")
    assert rc == 0 and out.splitlines()[-1].startswith("costs: per stage")


def test_a_torch_csv_is_explained_too(capsys, tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(torch_csv.dumps(generate("gpipe", 3, 4)))
    rc, out, _ = run(capsys, "explain", "--csv", str(path))
    assert rc == 0 and out.startswith("mine p=3 m=4 v=1, costs per stage: ") and "fill" in out and "drain" in out


def test_bad_input_is_one_line(capsys):
    assert "--rank must be in 0..3; got 4" in fails(capsys, "explain", "1f1b", "--rank", "4")
    assert "unknown schedule 'nope'" in fails(capsys, "explain", "nope")
    assert "needs --chunks 1" in fails(capsys, "explain", "gpipe", "-v", "2")
