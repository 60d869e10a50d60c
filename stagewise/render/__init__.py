"""Pictures of timelines: SVG (pure Python), matplotlib figures, terminal text,
Chrome/Perfetto traces and a self-contained HTML report.

Every renderer takes a ``Timeline`` (simulated or measured) and reads it
through ``cells``; none knows which schedule family or source it draws.
Only ``figure`` needs matplotlib, imported when a figure is drawn.
"""
