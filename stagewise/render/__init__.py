"""Pictures of timelines: SVG (pure Python), matplotlib figures, terminal text, Chrome/Perfetto traces and a
self-contained HTML report. Every renderer takes a ``Timeline`` (simulated or measured) and reads it
through ``cells``; none knows which schedule family or source it draws. Colours are ``palette``'s. Only
``figure`` needs matplotlib (and numpy with it), imported when a figure is drawn.

Drawing a timeline (``Pipeline.step(..., timeline=True)``'s, or ``simulate``'s), the format by the suffix::

    stagewise.render.write_timeline(res.timeline, "step.svg")   # .svg .png .pdf .json (trace) .html .txt
    print(stagewise.render.draw_text(res.timeline))             # in the terminal

May import: the core, `stagewise.lowering` (a transfer's words), `matplotlib`, `numpy`.
"""

from .ascii import draw_text
from .output import OutputError, write_comparison, write_timeline

__all__ = ["write_timeline", "write_comparison", "draw_text", "OutputError"]
