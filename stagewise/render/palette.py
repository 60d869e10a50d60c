"""Colours shared by every renderer and the workshop page: one hue per kind, safe for colour-blind readers.

Forward is blue and backward green as in the GPipe/1F1B figures; the split backward's halves get hues
of their own (I gold, W wine), so a ZB-V or DualPipe picture, which runs F, B, I, W and F&B pairs on
two chunks, shows four families of colour rather than eight shades of blue and green. Chunk ``c`` of a
rank is a lighter shade of its kind's hue, the way the Megatron and ZB-V figures tell a rank's chunks
apart. Under simulated protanopia and deuteranopia (Machado et al. 2009) every pair of kind x chunk
colours stays more than 10 CIELAB units apart, and the kinds' hues lie far apart
(tests/test_render_palette.py checks both).

The workshop page takes every colour it draws from here (``CAUSES``, ``PAGE``), through its API.
"""

from __future__ import annotations

#: base colour per action kind (chunk 0); a placed RECOMPUTE is lavender (a forward redone: its own hue)
KIND_COLOURS = {"F": "#3465C0", "B": "#2E8B3E", "I": "#E3B505", "W": "#882255", "RECOMPUTE": "#9E82B2"}
#: the compute kinds a picture draws in a rank's row, in legend order
KIND_ORDER = ("F", "B", "I", "W", "RECOMPUTE")
#: how far the last chunk of a rank moves toward white
CHUNK_TINT = 0.5
IDLE = "#FFFFFF"  #: idle time, the background, the hairline between cells
GRID = "#D0D0D0"
INK = "#222222"
MUTED = "#555555"  #: secondary text: subtitles, axis titles, legend notes
RULE = "#DDDDDD"  #: a table's rules (the HTML report)
RULE_STRONG = "#444444"  #: a table head's rule
#: the notebook's tables, in the workshop page's style
TABLE_TEXT = "#5B6673"
TABLE_RULE = "#D8DDE3"
TABLE_RULE_LIGHT = "#EEF0F2"
MEMORY = "#7B5EA7"  #: live-activation strips (purple: no kind uses it)
A2A = "#D55E00"  #: expert-parallel all-to-all lane (Okabe-Ito vermillion: no kind uses it)
A2A_HIDDEN = "#ECB78C"  #: the all-to-all that ran while the rank computed (A2A tinted)
COMM = "#006D5B"  #: lowered communication lane (gathers, reductions, sends): a deep bluish green
COMM_HIDDEN = "#9CCFC4"  #: the part of it that ran while the rank computed (COMM tinted)
HOST = "#8C6D1F"  #: the host link's lane (OFFLOAD, RELOAD): dark ochre, exposed part
HOST_HIDDEN = "#D9C89A"  #: the part that ran while the rank computed (HOST tinted)
#: one colour per rank for memory curves (Okabe-Ito order, then repeated)
RANK_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

KIND_LABELS = {"F": "F forward", "B": "B backward", "I": "I input-grad", "W": "W weight-grad",
               "RECOMPUTE": "R recompute"}

#: each cause of idle time (``explain.CAUSES``): its hatch colour and pattern (the page draws a gap with
#: both, so the causes stay apart in grey too; no two share a pattern)
CAUSES = {
    "fill": ("#CC79A7", "diagonal"),      # pink stripes /
    "drain": ("#7570B3", "backslash"),    # slate-violet stripes \
    "slow stage": ("#D55E00", "cross"),   # vermillion cross-hatch
    "link": ("#56B4E9", "dots"),          # sky-blue dots
    "order": ("#666666", "horizontal"),   # grey lines
    "collective": ("#009E73", "vertical"),  # bluish-green upright lines
}
#: the page's own colours (text, lines, panels, states), set as CSS variables from the API
PAGE = {
    "ink": "#1D2733", "muted": "#5B6673", "text": "#333333", "label": "#555555", "dim": "#777777",
    "line": "#D8DDE3", "rule": "#EEF0F2", "field": "#B9C1CA", "frame": "#CCCCCC", "axis": "#999999",
    "accent": "#3A6FB5", "bad": "#B3261E", "ok": "#2E7D32", "page": "#F6F7F9", "panel": "#FFFFFF",
    "soft": "#FBFBFC", "strip": "#F4F4F4", "highlight": "#FFE9A8", "hover": "#E8EEF8", "tip": "#1D2733",
    "arrow": INK,
}


def rgb(colour: str) -> tuple[int, int, int]:
    """'#RRGGBB' -> (r, g, b) in 0..255."""
    c = colour.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def hex_colour(r: float, g: float, b: float) -> str:
    return "#%02X%02X%02X" % tuple(max(0, min(255, round(x))) for x in (r, g, b))


def tint(colour: str, amount: float) -> str:
    """Mix ``colour`` with white: 0 keeps it, 1 gives white."""
    return hex_colour(*(x + (255 - x) * amount for x in rgb(colour)))


def colour(kind: str, chunk: int = 0, chunks: int = 1) -> str:
    """Fill colour of an action of ``kind`` on chunk ``chunk`` of ``chunks``."""
    base = KIND_COLOURS[kind]
    if chunks <= 1 or chunk <= 0:
        return base
    return tint(base, CHUNK_TINT * chunk / (chunks - 1))


def luminance(colour: str) -> float:
    """WCAG relative luminance in 0..1."""
    def lin(x: int) -> float:
        c = x / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(x) for x in rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_colour(fill: str) -> str:
    """White on the kinds' full colours, black on light tints and the yellow-green."""
    return "#000000" if luminance(fill) > 0.3 else "#FFFFFF"


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]
