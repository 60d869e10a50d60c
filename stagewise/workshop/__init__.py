"""The workshop: a local page to explore schedules (server.py, api.py, static/).

Standard library only; the page's assets are served from ``static/`` with no
network access.
"""
