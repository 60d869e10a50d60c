"""The workshop's web server: the page's assets and the JSON API, on loopback only.

Standard library only (``http.server``). It serves exactly the files in
``static/`` (an allow-list read at start, so no path can reach outside it),
and answers ``/api/families``, ``/api/simulate`` (GET query or POST JSON), ``/api/why``
(one gap's explanation), ``/api/messages`` (what crosses ranks, for Play), ``/api/edit`` (POST: programs typed or dragged on the page),
``/api/teach`` and ``/api/download``. Errors are JSON ``{"error": message, "field": control}``.
Every ``STAGEWISE_MAX_*`` variable is read when the server starts, so a bad one is refused then
(``LimitError`` naming it) rather than answered with a 500 later.

It cannot be held open: a connection waits for its first byte without a
thread (``gate.Gate``), a bounded number of threads serve requests, and each
request must arrive whole within ``REQUEST_TIMEOUT`` (a deadline over all its
reads, so a byte every few seconds does not keep it alive). A client that goes
away is dropped without a traceback.
"""

from __future__ import annotations

import io
import json
import signal
import socket
import sys
import threading
import time
import traceback
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from .. import limits
from ..flags import say
from . import api, editor, teach
from .downloads import download
from .gate import Gate

HOST = "127.0.0.1"
STATIC = Path(__file__).with_name("static")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
#: the page needs nothing from the network: say so to the browser
CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'")
MAX_BODY = 64 * 1024
REQUEST_TIMEOUT = 10.0  #: seconds for a whole request to arrive (and for an idle connection to be kept)
MAX_THREADS = 16  #: requests served at once; the page needs a handful


def assets() -> dict[str, Path]:
    """URL path -> file: ``/`` and ``/static/NAME`` for each file directly in static/."""
    files = {f"/static/{p.name}": p for p in STATIC.iterdir() if p.is_file() and p.suffix in TYPES}
    files["/"] = files["/index.html"] = STATIC / "index.html"
    return files


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


class Handler(BaseHTTPRequestHandler):
    """One request. Routes are few and fixed; nothing here touches the file system but ``assets``."""

    server_version = "stagewise-workshop"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self._raw = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._raw)

    def handle_one_request(self) -> None:
        # the deadline covers the request line, headers and body; http.server drops the connection on
        # TimeoutError, quietly (log_message is silent unless verbose)
        self._raw.deadline = time.monotonic() + self.server.request_timeout
        super().handle_one_request()

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _get(self, path: str, query: dict) -> None:
        if path == "/api/families":
            return self._json(api.families())
        if path == "/api/simulate":
            extra, settings = _split(query, "messages")
            return self._json(api.payload(api.parse_settings(settings), with_messages=_yes(extra["messages"])))
        if path == "/api/why":
            extra, settings = _split(query, "schedule", "rank", "pos")
            return self._json(api.why(api.parse_settings(settings), extra["schedule"], extra["rank"], extra["pos"]))
        if path == "/api/messages":
            return self._json(api.messages_of(api.parse_settings(query)))
        if path == "/api/teach":
            return self._json(teach.payload(api.parse_settings(query)))
        if path == "/api/download":
            fmt = query.pop("format", "csv")
            name, ctype, body = download(fmt, api.parse_settings(query))
            return self._send(HTTPStatus.OK, ctype, body, {"Content-Disposition": f'attachment; filename="{name}"'})
        file = self.server.assets.get(path)
        if file is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"not found: {path}")
        self._send(HTTPStatus.OK, TYPES[file.suffix], file.read_bytes(), {"Content-Security-Policy": CSP})

    def _post(self, path: str, query: dict) -> None:
        if path not in ("/api/simulate", "/api/edit", "/api/why"):
            raise HttpError(HTTPStatus.NOT_FOUND, f"not found: POST {path}")
        body = self._body_json()
        if not isinstance(body, dict):
            raise api.SettingError("the request body must be a JSON object of settings", "schedules")
        if path == "/api/simulate":
            extra, settings = _split(body, "messages")
            return self._json(api.payload(api.parse_settings(settings), with_messages=_yes(extra["messages"])))
        if path == "/api/edit":
            extra, settings = _split(body, "programs", "messages")
            return self._json(editor.edit(api.parse_settings(settings), extra["programs"] or "",
                                          with_messages=_yes(extra["messages"])))
        extra, settings = _split(body, "programs", "schedule", "rank", "pos")
        s = api.parse_settings(settings)
        if extra["programs"] is not None:
            return self._json(editor.why(s, extra["programs"], extra["rank"], extra["pos"]))
        self._json(api.why(s, extra["schedule"], extra["rank"], extra["pos"]))

    def _body_json(self):
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise HttpError(HTTPStatus.LENGTH_REQUIRED, "a JSON body with a Content-Length is required") from None
        if not 0 <= length <= MAX_BODY:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body must be at most {MAX_BODY} bytes")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"malformed JSON: {e}") from None
        except RecursionError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "malformed JSON: nested too deeply") from None
        except ValueError:  # int() refuses more than 4,300 digits
            raise HttpError(HTTPStatus.BAD_REQUEST, "malformed JSON: a number with too many digits") from None

    def _answer(self, route) -> None:
        url = urlsplit(self.path)
        try:
            self._check_host()
            route(url.path, dict(parse_qsl(url.query)))
        except HttpError as e:
            self._error(e.status, str(e), e.field)
        except api.SettingError as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e), e.field)
        except limits.LimitError as e:  # a size over a limit (the variables themselves are read at start)
            said = say(str(e))
            self._error(HTTPStatus.BAD_REQUEST, said, api.field_of(said, "m"))
        except (ConnectionError, TimeoutError):  # the client went away or stalled: nothing to answer
            self.close_connection = True
        except Exception as e:  # a bug of ours: say so, keep serving
            traceback.print_exc(file=sys.stderr)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}: {e}")

    def _check_host(self) -> None:
        # a page on another site could reach a loopback port through DNS rebinding: accept our own names only
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:  # RFC 7230 5.4: more than one Host is a 400
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{len(hosts)} Host headers; a request has one")
        host = (hosts[0] if hosts else "").rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost"):
            raise HttpError(HTTPStatus.FORBIDDEN, f"unexpected Host {host!r}; open the page at http://{HOST}:PORT/")

    def _json(self, obj) -> None:
        self._send(HTTPStatus.OK, "application/json", api.dumps(obj))

    def _error(self, status: HTTPStatus, message: str, field: str | None = None) -> None:
        # close: a body we did not read must not be taken for the next request
        self._send(status, "application/json", api.dumps({"error": message, "field": field}), {"Connection": "close"})

    def _send(self, status: HTTPStatus, ctype: str, body: bytes, headers: dict | None = None) -> None:
        self.connection.settimeout(self.server.request_timeout)  # a client that stops reading is let go
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server API
        if self.server.verbose:
            super().log_message(format, *args)


class _DeadlineReader(io.RawIOBase):
    """The socket's reads, each given only what is left of the request's deadline."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.deadline = time.monotonic() + REQUEST_TIMEOUT

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Server(ThreadingHTTPServer):
    """A loopback HTTP server with the asset allow-list; connections are admitted by a ``Gate``."""

    daemon_threads = True
    request_queue_size = 128  #: listen backlog: a burst of connections is accepted, not retried by the kernel

    def __init__(self, port: int = 0, *, verbose: bool = False, request_timeout: float = REQUEST_TIMEOUT,
                 max_threads: int = MAX_THREADS):
        check_limits()
        self.assets = assets()
        self.verbose = verbose
        self.request_timeout = request_timeout
        super().__init__((HOST, port), Handler)
        self.gate = Gate(self, max_threads=max_threads, timeout=request_timeout)

    def process_request(self, request, client_address) -> None:
        self.gate.admit(request, client_address)  # a thread only once the client has sent something

    def server_close(self) -> None:
        super().server_close()
        if getattr(self, "gate", None) is not None:  # None when the port could not be bound
            self.gate.close()

    def handle_error(self, request, client_address) -> None:
        # a browser that closes a connection early (reload, new setting) is not an error worth a traceback
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"


def check_limits() -> None:
    """Read every ``STAGEWISE_MAX_*`` variable once: ``LimitError`` naming the first bad one."""
    for limit in limits.ALL.values():
        limit.value


def _split(data: dict, *keys: str) -> tuple[dict, dict]:
    """(the request's ``keys``, None where absent; the rest: the page's settings)."""
    rest = dict(data)
    return {k: rest.pop(k, None) for k in keys}, rest


def _yes(flag) -> bool:
    return flag in (True, 1, "1", "true")


def serve(httpd: Server, *, open_browser: bool = True) -> int:
    """Serve until Ctrl-C (KeyboardInterrupt), then close the socket; exit status 0."""
    print(f"stagewise workshop: {httpd.url}  (Ctrl-C to stop)", flush=True)
    if open_browser:
        opener = threading.Timer(0.5, webbrowser.open, (httpd.url,))
        opener.daemon = True
        opener.start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    print("stagewise workshop: stopped", flush=True)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt
