"""Build your own: programs typed or dragged on the page, checked and simulated at once."""

import pytest

from stagewise import torch_csv
from stagewise.costs import Costs
from stagewise.report import result
from stagewise.schedules import generate
from stagewise.simulate import simulate
from stagewise.workshop import api, editor


def edit(text, **settings):
    return editor.edit(api.parse_settings({"schedules": "1f1b", "p": 2, "m": 2, **settings}), text)


def test_the_family_order_is_the_family_and_a_changed_one_is_edited():
    sched = generate("zb-h1", 3, 6)
    out = edit(editor.text_of(sched), schedules="zb-h1", p=3, m=6)
    res = out["results"][0]
    family = result(sched, Costs(), simulate(sched))
    assert out["valid"] and out["untouched"] and res["schedule"] == "zb-h1"  # untouched: not "(edited)"
    assert res["bubble_fraction"] == family["bubble_fraction"]
    assert res["formula_bubble_fraction"] == family["formula_bubble_fraction"]  # it is the family's order
    assert torch_csv.loads(out["csv"]).programs == sched.programs
    assert res["gaps"] and sum(res["idle_by_cause"].values()) == pytest.approx(sum(res["idle"]))
    lines = editor.text_of(sched).splitlines()
    swapped = lines[2].split()
    swapped[-1], swapped[-2] = swapped[-2], swapped[-1]  # rank 2 runs 2W5 before 2W4: it still runs
    out = edit("\n".join(lines[:2] + [" ".join(swapped)]), schedules="zb-h1", p=3, m=6)
    res = out["results"][0]
    assert out["valid"] and not out["untouched"] and res["schedule"] == "zb-h1 (edited)"
    assert res["formula_bubble_fraction"] is None  # an edited order is no family's: no closed form claimed


def test_text_may_be_spaced_or_comma_separated_with_rank_prefixes():
    a = edit("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0, 1B0, 1F1, 1B1\n")
    assert a["valid"] and a["programs"] == "0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1"


def test_a_deadlock_comes_back_with_its_cycle_what_ran_and_what_did_not():
    out = edit("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1")
    # positions count from 1, as the page numbers a rank's ops; the same cycle in plain words first
    assert not out["valid"] and out["error"] == ("deadlock: wait cycle: rank 0 position 2 (0B0) waits for 1B0 at rank 1 "
                                                 "position 3; rank 1 position 2 (1F1) waits for 0F1 at rank 0 position 3; "
                                                 "back to rank 0")
    assert out["plain"] == ("the ranks wait for each other in a loop, so none can go on: rank 0 waits at its op 2 (0B0) "
                            "for 1B0, rank 1's op 3; rank 1 waits at its op 2 (1F1) for 0F1, rank 0's op 3. Move one of "
                            "these ops earlier or later to open the loop.")
    assert out["cycle"] == [[0, 1, 1, 2], [1, 1, 0, 2]] and out["closed"] and out["at"] == [0, 1]
    d = out["drawing"]
    assert [[op[0] for op in row] for row in d["ops"]] == [["0F0"], ["1F0"]]
    assert [[op[0] for op in row] for row in d["pending"]] == [["0B0", "0F1", "0B1"], ["1F1", "1B0", "1B1"]]
    # each rank's unreached ops follow what it ran, at their durations
    assert [op[4:6] for op in d["pending"][0]] == [[1.0, 3.0], [3.0, 4.0], [4.0, 6.0]]


@pytest.mark.parametrize("text, message, at", [
    ("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1Bx", "row 2 (rank 1) column 4: not an action: '1Bx'", [1, 3]),
    ("0F0 0F0 0B0 0B1\n1F0 1B0 1F1 1B1", "rank 0 position 2 (0F0): duplicate action 0F0", [0, 1]),
    ("0F0 0F1 0B0\n1F0 1B0 1F1 1B1", "missing", None),
    ("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 \uff11B1", "row 2 (rank 1) column 4: not an action: '\uff11B1'", [1, 3]),  # fullwidth 1
    ("0F0 0F1 0B0 0B1 1F0\n1B0 1F1 1B1", "stage 1 is on two ranks: rank 0 position 5 (1F0)", [0, 4]),
])
def test_structural_problems_are_the_validator_messages(text, message, at):
    out = edit(text)
    assert not out["valid"] and message in out["error"] and out["at"] == at


def test_sizes_are_bounded_before_work(monkeypatch):
    with pytest.raises(api.SettingError, match="at most 60000 characters"):
        edit("0F0 " * 20_000)
    with pytest.raises(api.SettingError) as e:
        edit("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1", tb=-1)
    assert e.value.field == "tb"
    with pytest.raises(api.SettingError) as e:  # a bad cap is the cap's error (it was a 500)
        edit("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1", cap=-1)
    assert e.value.field == "cap" and str(e.value).startswith("--cap must be > 0")
    monkeypatch.setenv("STAGEWISE_MAX_WORKSHOP_ACTIONS", "6")
    out = edit("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1")
    assert not out["valid"] and "the programs have 8 actions: over the limit of 6" in out["error"]


def test_why_explains_a_gap_of_the_edited_order():
    s = api.parse_settings({"schedules": "1f1b", "p": 2, "m": 2})
    gap = editor.why(s, "0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1", 0, 2)
    assert gap["waits_for"]["op"] == "1B0" and gap["cause"] == "fill"
    with pytest.raises(api.SettingError, match="deadlock"):
        editor.why(s, "0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1", 0, 1)
