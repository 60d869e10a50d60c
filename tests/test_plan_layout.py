"""Layout strings: format, parse, round-trip, and the layouts that lose or duplicate a layer."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise.split import LayoutError, Split, format_layout, parse_layout

GPT = ["E"] + ["t"] * 32 + ["H"]


def test_format_collapses_runs():
    assert format_layout(GPT, [8, 8, 8, 10]) == "E+t*7 | t*8 | t*8 | t*9+H"
    assert format_layout(["E", "t", "H"], [1, 1, 1]) == "E | t | H"


def test_abbreviated_long_layout():
    text = format_layout(GPT, [2] * 17, abbreviate=True)
    assert text == "E+t | t*2 | ... | t+H"


@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.data())
def test_round_trip(counts, data):
    n = sum(counts)
    symbols = data.draw(st.lists(st.sampled_from(["E", "t", "H", "moe"]), min_size=n, max_size=n))
    text = format_layout(symbols, counts)
    assert parse_layout(text, symbols) == tuple(counts)


def test_spaces_and_single_terms_parse():
    assert parse_layout(" E + t*2|t * 3 | t+ H ", ["E"] + ["t"] * 6 + ["H"]) == (3, 3, 2)


@pytest.mark.parametrize("text, words", [
    ("E+t*7 | t*8 | t*8 | t*8+H", "loses 1 t"),
    ("E+t*9 | t*8 | t*8 | t*8+H", "duplicates 1 t"),
    ("E+t*8 | t*8 | t*8 | t*8+H+H", "duplicates 1 H"),
    ("E+t*8 | t*8 | t*8 | t*8", "loses 1 H"),
    ("E+t*8 | t*8 | t*8 | t*8+X", "unknown layer symbol 'X'"),
    ("H+t*8 | t*8 | t*8 | t*8+E", "stage 0 has H where the model has E"),
    ("E+t*8 | | t*8 | t*16+H", "stage 1 is empty"),
    ("E+t* | t*8 | t*8 | t*16+H", "not SYMBOL or SYMBOL*COUNT"),
    ("E+t*0 | t*8 | t*8 | t*16+H", "count 0"),
    ("E+t*7 | ... | t*7+H", "an abbreviation in tables"),
])
def test_rejects_with_reason(text, words):
    with pytest.raises(LayoutError) as e:
        parse_layout(text, GPT)
    assert words in str(e.value)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.data())
def test_split_round_trips_through_text_counts_and_ranges(counts, data):
    n = sum(counts)
    symbols = data.draw(st.lists(st.sampled_from(["E", "t", "H", "moe"]), min_size=n, max_size=n))
    split = Split(tuple(counts))
    assert Split.parse(split.text(symbols), symbols) == split == Split.parse(str(split), symbols)
    assert Split.parse(split.text(symbols), n) == split  # symbols unknown: the counts still add up
    assert [i for r in split.ranges for i in r] == list(range(n)) and [len(r) for r in split.ranges] == counts
    assert (split.stages, split.layers) == (len(counts), n)


def test_split_even_and_its_errors():
    assert Split.even(10, 4).counts == (3, 3, 2, 2) and str(Split.even(6, 3)) == "2,2,2"
    with pytest.raises(LayoutError, match="3,0: every stage needs at least one layer"):
        Split((3, 0))
    with pytest.raises(LayoutError, match="'3,2' covers 5 layers; the model has 6"):
        Split.parse("3,2", 6)
    with pytest.raises(LayoutError, match="stage 1 has H where the model has t"):
        Split.parse("E+t | H+t", ["E", "t", "t", "H"])
