"""The V-Half / V-Min grid: its peak (the run-length count equals the slot-by-slot definition), and long
steps spliced from a shorter one equal to the full build."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise.actions import Action
from stagewise.schedules import v_shape
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


@given(cells=st.dictionaries(st.integers(0, 40), st.sampled_from("FIW"), min_size=2),
       moves=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 45)), max_size=12), with_w=st.booleans())
def test_the_squeezes_incremental_peak_equals_the_definition(cells, moves, with_w):
    """While a squeeze runs the grid keeps each rank's peak incrementally (a prefix-max tree with the W's,
    the scan resumed without them): after any moves it is still the definition, and ``raised`` says what
    moving an F earlier would make it without making the move."""
    grid = _Grid(1, len(cells))
    acts = []
    for mb, (slot, kind) in enumerate(sorted(cells.items())):
        a = Action(kind, 0, mb)
        grid.put(0, a, slot)
        acts.append(a)
    grid._track(with_w)
    for pick, to in moves:
        a = acts[pick % len(acts)]
        if to in grid.slots[0]:
            continue
        if with_w and a.kind == "F" and to < grid.at[a]:
            predicted = grid._trees[0].raised(to, grid.at[a])
            grid.move(0, a, to)
            assert predicted == peak_slot_by_slot(grid.slots[0], True)
        else:
            grid.move(0, a, to)
        assert grid.peak(0, with_w) == peak_slot_by_slot(grid.slots[0], with_w)
    grid._track(None)
    assert grid.peak(0, with_w) == peak_slot_by_slot(grid.slots[0], with_w)


V_FAMILIES = [("v-half", v_shape.v_half, v_shape.half_offsets), ("v-min", v_shape.v_min, v_shape.min_offsets)]
#: even and odd, multiples of 3 (V-Min's gap) and not, and two larger ones
SPLICE_RANKS = [*range(1, 13), 16, 24]


@pytest.mark.parametrize("name, generate, offsets", V_FAMILIES, ids=[f[0] for f in V_FAMILIES])
def test_long_steps_spliced_from_a_shorter_one_equal_the_full_build(name, generate, offsets):
    """Past ``steady_from`` the generator builds the step at ``steady_from`` and splices steady periods in:
    the programs are the slot-by-slot build's, from one micro-batch to several periods past it."""
    for p in SPLICE_RANKS:
        m0 = v_shape.steady_from(p, offsets)
        assert v_shape._periodic_at(p, offsets, v_shape._cut(p, offsets)) is not None, p  # no fallback
        for m in range(1, m0 + 5):
            assert generate(p, m) == v_shape._full(name, p, m, offsets), (p, m)


@pytest.mark.parametrize("name, generate, offsets", V_FAMILIES, ids=[f[0] for f in V_FAMILIES])
def test_a_splice_whose_period_does_not_repeat_falls_back_to_the_full_build(name, generate, offsets,
                                                                            monkeypatch):
    p = 6
    m0 = v_shape.steady_from(p, offsets)
    assert v_shape._periodic_at(p, offsets, 0) is None  # slot 0: the warm-up, no period
    monkeypatch.setattr(v_shape, "_cut", lambda p, offsets: 0)
    assert generate(p, m0 + 3) == v_shape._full(name, p, m0 + 3, offsets)
