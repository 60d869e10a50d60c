"""Dense timelines as pixel columns: to scale, colours mixed by time, idle see-through, small pictures unchanged."""

import base64
import re
import struct
import zlib

import pytest

from stagewise.costs import Costs
from stagewise.render import palette, raster
from stagewise.render.svg import timeline_svg
from stagewise.schedules import generate
from stagewise.simulate import simulate


def decode_png(data: bytes):
    """(width, height, rows of RGBA bytes) of a PNG written by ``raster.png``."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4:idat])[0]
    raw = zlib.decompress(data[idat + 4:idat + 4 + size])
    stride = 1 + 4 * width
    return width, height, [raw[i * stride + 1:(i + 1) * stride] for i in range(height)]


def test_pixels_mix_colours_by_time_and_leave_idle_transparent():
    tl = simulate(generate("gpipe", 1, 2), Costs(t_f=1, t_b=2))  # F F B B on one rank: 0..2 F, 2..6 B
    (strip,) = raster.rank_strips(tl, columns=4, scale=0.5)  # 2 time units per pixel, 8 units wide
    px = [tuple(strip.top[4 * c:4 * c + 4]) for c in range(4)]
    f, b = palette.rgb(palette.colour("F")), palette.rgb(palette.colour("B"))
    assert px[0] == (*f, 255) and px[1] == px[2] == (*b, 255)
    assert px[3][3] == 0  # idle after the makespan
    (half,) = raster.rank_strips(tl, columns=3, scale=1 / 3)  # pixel 0 = 2 F + 1 B, pixel 1 = 3 B
    mixed = tuple(half.top[:3])
    assert mixed == tuple(round((2 * x + y) / 3) for x, y in zip(f, b))


def test_png_round_trips():
    rows = [bytes(range(16)), bytes(16)]
    assert decode_png(raster.png(rows, 4)) == (4, 2, rows)


def test_small_pictures_stay_one_rect_per_action():
    tl = simulate(generate("zb-v", 4, 8), Costs())
    svg = timeline_svg(tl)
    assert "dense" not in svg and svg.count('<rect class="a ') == tl.schedule.num_actions


@pytest.mark.parametrize("name,m", [("zb-v", 256), ("dualpipe", 512)])
def test_dense_pictures_are_one_image_to_scale(name, m):
    tl = simulate(generate(name, 16, m), Costs())
    svg = timeline_svg(tl, width=900, memory=True)
    assert '<rect class="a ' not in svg and svg.count('class="cells dense"') == 1
    assert len(svg) < 400_000  # thousands of rects would be megabytes
    data = base64.b64decode(re.search(r'href="data:image/png;base64,([^"]+)"', svg)[1])
    width, height, rows = decode_png(data)
    assert height == 16 * 26 - 4  # ROW + GAP per rank, no gap after the last
    busy = [sum(row[3::4]) / 255 for row in rows[:11]]  # rank 0, top half: busy pixels' weight
    span = max(max(e) for e in tl.ends) - min(min(s) for s in tl.starts)
    assert busy[0] == pytest.approx(sum(e - s for s, e in zip(tl.starts[0], tl.ends[0])) * width / span, rel=0.02)


def test_report_and_draw_of_zb_v_at_p64_m1024_stay_small(capsys, tmp_path):
    """Issue 10's size: 393,216 actions; the page was 109 MB drawn action by action."""
    import time

    from cli_helpers import run

    t0 = time.process_time()
    rc, out, err = run(capsys, "report", "--schedules", "zb-v", "-p", "64", "-m", "1024", "-o", str(tmp_path))
    assert rc == 0, err
    assert (tmp_path / "report.html").stat().st_size < 5 * 2**20
    rc, out, err = run(capsys, "draw", "zb-v", "-p", "64", "-m", "1024", "--memory", "-o", str(tmp_path / "z.html"))
    assert rc == 0, err
    assert (tmp_path / "z.html").stat().st_size < 5 * 2**20
    assert time.process_time() - t0 < 120  # a hang bound: CPU seconds for both, about 5 idle and 22 on a busy machine
