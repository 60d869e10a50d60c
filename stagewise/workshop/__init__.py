"""The workshop: a local page to explore schedules (server.py, api.py, static/).

Standard library only; the page's assets are served from ``static/`` with no network access. The API
answers with the core's own calls and the renderers' colours; errors are said in the CLI's flags.

May import: the core, `stagewise.schedules`, `stagewise.lowering`, `stagewise.render`, `stagewise.flags`.
"""
