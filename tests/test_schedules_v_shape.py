"""The V-Half / V-Min grid's peak: the run-length count equals the slot-by-slot definition."""

from hypothesis import given
from hypothesis import strategies as st

from stagewise.actions import Action
from stagewise.schedules.v_shape import _Grid


def peak_slot_by_slot(slots: dict, with_w: bool) -> int:
    """The definition: +1 at F, -1 at W; without the W's, each free slot pays one W owed by an earlier I."""
    live = peak = owed = 0
    for slot in range(max(slots) + 1):
        a = slots.get(slot)
        if a is None:
            if not with_w and owed:
                live, owed = live - 1, owed - 1
        elif a.kind == "F":
            live += 1
            peak = max(peak, live)
        elif a.kind == "W":
            live -= 1
        elif not with_w:
            owed += 1
    return peak


@given(cells=st.dictionaries(st.integers(0, 60), st.sampled_from("FIW"), min_size=1), with_w=st.booleans())
def test_peak_counts_runs_of_free_slots_as_the_definition_does(cells, with_w):
    grid = _Grid(1, len(cells))
    for mb, (slot, kind) in enumerate(sorted(cells.items())):
        grid.put(0, Action(kind, 0, mb), slot)
    assert grid.peak(0, with_w) == peak_slot_by_slot(grid.slots[0], with_w)
