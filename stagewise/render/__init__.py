"""Pictures of timelines: SVG (pure Python), matplotlib figures, terminal text, Chrome/Perfetto traces and a
self-contained HTML report. Every renderer takes a ``Timeline`` (simulated or measured) and reads it
through ``cells``; none knows which schedule family or source it draws. Colours are ``palette``'s. Only
``figure`` needs matplotlib (and numpy with it), imported when a figure is drawn.

May import: the core, `stagewise.lowering` (a transfer's words), `matplotlib`, `numpy`.
"""
