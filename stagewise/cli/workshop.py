"""`stagewise workshop`: the interactive page on a local server."""

from __future__ import annotations

from .common import UsageError, whole_int


def register(sub) -> None:
    p = sub.add_parser("workshop", help="open the interactive page: change p, m, v, costs and watch the bubble",
                       description="Serve the workshop page on 127.0.0.1 (no network access) and open it: pick "
                       "schedules, p, m, v and costs (one number or one per stage, as --tf 1,1,1,2), and see every "
                       "family drawn to scale with its bubble next to the closed form, memory per rank and a memory "
                       "cap; play a step in time, ask any idle gap why it waits (in plain words first), move the "
                       "actions yourself, and follow a lesson per idea, each ending with a question the page "
                       "checks. Ctrl-C stops it.")
    p.add_argument("--port", type=whole_int, default=8765,
                   help="port on 127.0.0.1 (default 8765; 0 picks a free one)")
    p.add_argument("--no-browser", action="store_true", help="print the address but do not open a browser")
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    p.set_defaults(func=cmd_workshop)


def cmd_workshop(args) -> int:
    from ..workshop.server import Server, serve

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535; got {args.port}")
    try:
        httpd = Server(args.port, verbose=args.verbose)
    except OSError as e:
        raise UsageError(f"--port {args.port}: cannot listen on 127.0.0.1: {e.strerror or e}; "
                         "choose another port, or --port 0 for a free one") from None
    return serve(httpd, open_browser=not args.no_browser)
