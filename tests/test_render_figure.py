"""matplotlib figures: colour areas follow the costs, every format writes, big schedules stay small."""

import pytest
from render_helpers import families, sim

pytest.importorskip("matplotlib")
import numpy as np  # noqa: E402
from matplotlib.image import imread  # noqa: E402

from stagewise.render import palette  # noqa: E402
from stagewise.render.figure import compare_figure, draw_figure  # noqa: E402


def pixels(path, colour: str, tol: int = 8) -> int:
    """Pixels within ``tol`` of ``colour`` in each channel."""
    img = (imread(path)[..., :3] * 255).round().astype(int)
    return int((np.abs(img - np.array(palette.rgb(colour))).max(axis=-1) <= tol).sum())


@pytest.mark.parametrize("tb", [2.0, 3.0])
def test_forward_and_backward_areas_follow_the_costs(tmp_path, tb):
    """1F1B does m forwards and m backwards per rank: blue:green area = t_f:t_b."""
    path = tmp_path / "1f1b.png"
    draw_figure(sim("1f1b", 4, 8, t_f=1.0, t_b=tb), path)
    f, b = pixels(path, palette.colour("F")), pixels(path, palette.colour("B"))
    assert f > 20_000  # a blank or wrong picture has no such area
    assert b / f == pytest.approx(tb, rel=0.05)


def test_rank_rows_show_work_and_idle_to_scale(tmp_path):
    """GPipe p=4, m=8, rank 0: forwards over [0, 8], idle (blank) over [8, 17], backwards over [17, 33]."""
    path = tmp_path / "gpipe.png"
    draw_figure(sim("gpipe", 4, 8), path)
    img = (imread(path)[..., :3] * 255).round().astype(int)
    blue = np.abs(img - np.array(palette.rgb(palette.colour("F")))).max(-1) <= 8
    green = np.abs(img - np.array(palette.rgb(palette.colour("B")))).max(-1) <= 8
    white = img.min(axis=-1) >= 250
    top = np.nonzero(blue.sum(axis=1) > 50)[0].min()  # rank 0 is the top row of cells
    y = top + 6  # inside the row, above the micro-batch numbers
    cols = np.nonzero(blue[y] | green[y])[0]
    x0, x1 = cols.min(), cols.max() + 1
    span = x1 - x0
    assert blue[y, x0:x1].sum() / span == pytest.approx(8 / 33, abs=0.02)
    assert green[y, x0:x1].sum() / span == pytest.approx(16 / 33, abs=0.02)
    assert white[y, x0:x1].sum() / span == pytest.approx(9 / 33, abs=0.03)  # plus thin cell edges


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_formats_by_suffix(tmp_path, suffix):
    path = draw_figure(sim("1f1b", 2, 3), tmp_path / f"t{suffix}", memory=True)
    head = path.read_bytes()[:8]
    assert {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}[suffix] in head


def test_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown suffix '.bmp'"):
        draw_figure(sim("1f1b", 2, 2), tmp_path / "t.bmp")


def test_memory_panel_and_comparison_render(tmp_path):
    plain, mem = tmp_path / "a.png", tmp_path / "b.png"
    draw_figure(sim("1f1b", 4, 8), plain)
    draw_figure(sim("1f1b", 4, 8), mem, memory=True)
    assert imread(mem).shape[0] > imread(plain).shape[0]
    assert pixels(mem, palette.MEMORY, tol=60) > pixels(plain, palette.MEMORY, tol=60)
    names = families(4, 8)[:3]
    path = tmp_path / "c.png"
    compare_figure([sim(n, 4, 8) for n in names], path)
    single = tmp_path / "s.png"
    compare_figure([sim(names[0], 4, 8)], single)
    assert imread(path).shape[0] > imread(single).shape[0] * 2


def test_large_schedule_writes_a_small_file(tmp_path):
    """p=32, m=256: tens of thousands of cells; the file stays far under 10 MB (timing: benchmarks/)."""
    name = "zb-v" if "zb-v" in families(32, 256) else "1f1b"
    tl = sim(name, 32, 256)
    for suffix in (".png", ".svg"):
        path = draw_figure(tl, tmp_path / f"big{suffix}")
        assert 10_000 < path.stat().st_size < 10 * 2**20


def test_the_all_to_all_lane_shows_exposed_and_hidden_time_to_scale(tmp_path):
    from stagewise.timeline import metrics

    path = tmp_path / "dp.png"
    tl = sim("dualpipe-v", 4, 8, a2a=0.75)
    mt = metrics(tl)
    draw_figure(tl, path)
    dark, pale = pixels(path, palette.A2A, tol=4), pixels(path, palette.A2A_HIDDEN, tol=4)
    assert dark > 2000 and pale > 500  # the lane has the same height everywhere: areas are times
    assert pale / dark == pytest.approx(sum(mt.hidden_a2a) / sum(mt.exposed_a2a), rel=0.12)
    plain = tmp_path / "plain.png"
    draw_figure(sim("1f1b", 4, 8, a2a=0.75), plain)
    dark = pixels(plain, palette.A2A, tol=4)
    assert dark > 2000 and pixels(plain, palette.A2A_HIDDEN, tol=4) < 0.05 * dark  # only anti-aliased edges
    compare_figure([tl, sim("zb-v", 4, 8, a2a=0.75)], tmp_path / "cmp.png")  # the table's a2a columns draw
