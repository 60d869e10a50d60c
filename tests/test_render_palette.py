"""The palette: distinguishable under colour-vision deficiencies, readable text."""

import colorsys
import itertools

import pytest

from stagewise.explain import CAUSES
from stagewise.render import palette

# Machado, Oliveira & Fernandes 2009, severity 1.0, on linear RGB
CVD = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "normal": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
}


def _lin(c):
    return [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in (v / 255 for v in palette.rgb(c))]


def _lab(rgb_lin):
    m = ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))
    rgb_lin = [min(1.0, max(0.0, x)) for x in rgb_lin]
    xyz = [sum(a * b for a, b in zip(row, rgb_lin)) / w for row, w in zip(m, (0.9505, 1.0, 1.089))]
    f = [x ** (1 / 3) if x > 0.008856 else 7.787 * x + 16 / 116 for x in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def _seen(colour, matrix):
    lin = _lin(colour)
    return _lab([sum(a * b for a, b in zip(row, lin)) for row in matrix])


@pytest.mark.parametrize("vision", list(CVD))
def test_kind_and_chunk_colours_stay_apart(vision):
    """Every pair of (kind, chunk) colours for v=2 differs by > 10 CIELAB units (B and I never share a rank's
    row in our schedules, but they too stay apart)."""
    cols = {(k, c): palette.colour(k, c, 2) for k in "FBIW" for c in (0, 1)}
    for (ka, a), (kb, b) in itertools.combinations(cols.items(), 2):
        la, lb = _seen(a, CVD[vision]), _seen(b, CVD[vision])
        dist = sum((x - y) ** 2 for x, y in zip(la, lb)) ** 0.5
        assert dist > 10, f"{ka} {a} vs {kb} {b} under {vision}: {dist:.1f}"


def _hue(colour):
    return colorsys.rgb_to_hsv(*(x / 255 for x in palette.rgb(colour)))[0] * 360


def test_one_hue_per_kind_forward_blue_backward_green():
    """F blue and B green as in the papers; every kind a hue of its own (at least 40 degrees from the others),
    kept by its lighter chunks: a ZB-V or DualPipe picture shows four families of colour, not shades of one."""
    r, g, b = palette.rgb(palette.colour("F"))
    assert b > r and b > g
    r, g, b = palette.rgb(palette.colour("B"))
    assert g > r and g > b
    hues = {k: _hue(palette.colour(k)) for k in "FBIW"}
    for a, b in itertools.combinations(hues, 2):
        apart = abs(hues[a] - hues[b])
        assert min(apart, 360 - apart) >= 40, (a, b, hues)
    for k in "FBIW":
        for c in range(1, 4):
            assert abs(_hue(palette.colour(k, c, 4)) - hues[k]) < 6, (k, c)


def test_causes_differ_in_colour_and_pattern():
    assert set(palette.CAUSES) == set(CAUSES)
    colours, patterns = zip(*palette.CAUSES.values())
    assert len(set(colours)) == len(set(patterns)) == len(CAUSES)
    assert not set(colours) & set(palette.KIND_COLOURS.values())


def test_chunks_get_lighter_and_text_stays_readable():
    for kind in "FBIW":
        shades = [palette.colour(kind, c, 3) for c in range(3)]
        lum = [palette.luminance(s) for s in shades]
        assert lum == sorted(lum) and len(set(shades)) == 3
        for s in shades:
            ink = palette.luminance(palette.text_colour(s))
            hi, lo = max(ink, palette.luminance(s)), min(ink, palette.luminance(s))
            assert (hi + 0.05) / (lo + 0.05) >= 3.0, (kind, s)  # WCAG large-text contrast


@pytest.mark.parametrize("vision", list(CVD))
def test_a_placed_recompute_has_a_hue_of_its_own(vision):
    """RECOMPUTE (a memory action drawn in a rank's row) stays > 10 CIELAB units from every kind x chunk colour
    under each vision, and 40 degrees of hue from the other kinds; the host link's lane is no kind's colour."""
    others = [palette.colour(k, c, 2) for k in "FBIW" for c in (0, 1)]
    for c in (0, 1):
        mine = _seen(palette.colour("RECOMPUTE", c, 2), CVD[vision])
        for o in others:
            assert sum((x - y) ** 2 for x, y in zip(mine, _seen(o, CVD[vision]))) ** 0.5 > 10, (c, o)
    h = _hue(palette.colour("RECOMPUTE"))
    assert all(min(abs(h - _hue(palette.colour(k))), 360 - abs(h - _hue(palette.colour(k)))) >= 40 for k in "FBIW")
    assert not {palette.HOST, palette.HOST_HIDDEN} & set(palette.KIND_COLOURS.values())
