"""The workshop server cannot be held open: slow and idle clients, odd headers, hostile numbers.

Loopback only, with a short request timeout so each test takes seconds.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from stagewise.workshop.server import Server

TIMEOUT = 1.0  #: the servers' request timeout in these tests
HANG_S = 10.0  #: catches a server that holds a client forever; never a speed bound (a loaded machine)


def strict(body: bytes):
    """JSON as browsers parse it: NaN and Infinity are errors."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(body, parse_constant=refuse)


@pytest.fixture
def server():
    httpd = Server(0, request_timeout=TIMEOUT, max_threads=4)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def port(server) -> int:
    return server.server_address[1]


def request(server, method, path, body=None, headers=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port(server), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def workers() -> int:
    return sum(t.name == "workshop-request" for t in threading.enumerate())


def closed_by_server(sock: socket.socket, within: float) -> float:
    """Seconds until the server closes ``sock`` (reads until EOF); fails past ``within``."""
    sock.settimeout(within)
    t0 = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_a_slow_client_loses_its_thread_at_the_deadline(server):
    """A byte every 0.2 s never completes the headers; the deadline covers the whole request."""
    with socket.create_connection(("127.0.0.1", port(server))) as s:
        s.sendall(b"GET /api/families HTTP/1.1\r\n")
        t0 = time.monotonic()
        done = False
        while time.monotonic() - t0 < 3 * TIMEOUT and not done:
            try:
                s.sendall(b"X")
            except OSError:
                done = True
            time.sleep(0.2)
            s.setblocking(False)
            try:
                done = done or s.recv(4096) == b""
            except BlockingIOError:
                pass
            except OSError:
                done = True
            s.setblocking(True)
        assert done, "the server kept a trickling client past its deadline"
        assert time.monotonic() - t0 < HANG_S
    deadline = time.monotonic() + 2
    while workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers() == 0


def test_a_body_shorter_than_its_length_is_dropped(server):
    with socket.create_connection(("127.0.0.1", port(server))) as s:
        s.sendall(b"POST /api/simulate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"p\":")
        assert closed_by_server(s, within=HANG_S) < HANG_S


def test_many_idle_sockets_do_not_stop_requests_or_hold_threads(server):
    idle = [socket.create_connection(("127.0.0.1", port(server))) for _ in range(100)]
    try:
        t0 = time.monotonic()
        status, body = request(server, "GET", "/api/families")
        assert status == 200 and "families" in strict(body)
        assert time.monotonic() - t0 < HANG_S  # held behind 100 idle sockets it would take ~25 s
        assert workers() <= 4  # max_threads; the idle ones wait in the gate's selector
        assert closed_by_server(idle[0], within=HANG_S) < HANG_S  # and are closed at the deadline
    finally:
        for s in idle:
            s.close()


def test_more_slow_clients_than_threads_still_leave_room_after_the_deadline(server):
    slow = [socket.create_connection(("127.0.0.1", port(server))) for _ in range(8)]  # 2x max_threads
    try:
        for s in slow:
            s.sendall(b"GET / HTTP/1.1\r\n")  # each takes a worker, then stalls
        status, _ = request(server, "GET", "/api/families", timeout=3 * TIMEOUT + 5)
        assert status == 200
    finally:
        for s in slow:
            s.close()


def test_a_request_sent_while_the_gate_waits_for_a_worker_is_served_not_expired(server):
    """The gate blocks on a worker for longer than the first-byte deadline; what arrived meanwhile is served."""
    early = socket.create_connection(("127.0.0.1", port(server)))  # waits in the gate, silent
    slow = [socket.create_connection(("127.0.0.1", port(server))) for _ in range(8)]
    try:
        time.sleep(TIMEOUT / 2)  # every connection registered; half of early's deadline gone
        for s in slow:
            s.sendall(b"GET / HTTP/1.1\r\n")  # 4 take the workers, the gate waits ~TIMEOUT for a 5th
        time.sleep(TIMEOUT / 4)
        early.sendall(b"GET /api/families HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        early.settimeout(3 * TIMEOUT + 5)
        answer = b""
        while chunk := early.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    finally:
        early.close()
        for s in slow:
            s.close()


def test_two_host_headers_are_a_400(server):
    with socket.create_connection(("127.0.0.1", port(server)), timeout=5) as s:
        s.sendall(b"GET /api/families HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):  # the server closes after an error
            answer += chunk
    text = answer.decode("latin-1")
    assert text.startswith("HTTP/1.1 400") and "2 Host headers" in text


@pytest.mark.parametrize("method,path,body,field", [
    ("GET", "/api/simulate?m=" + "9" * 5000, None, "m"),
    ("GET", "/api/simulate?tf=" + "9" * 5000, None, "tf"),
    ("GET", "/api/simulate?tf=1e308", None, "tf"),  # finite, but the makespan overflows
    ("GET", "/api/simulate?latency=nan", None, "latency"),
    ("GET", "/api/simulate?schedules=zb-v&p=64&m=1024", None, "m"),  # the page's own limit, answered at once
    ("POST", "/api/simulate", '{"m": ' + "9" * 5000 + "}", None),
    ("POST", "/api/simulate", '{"tf": 1e400}', "tf"),
    ("POST", "/api/simulate", "[" * 65536, None),
])
def test_hostile_numbers_and_nesting_are_400_with_strict_json(server, method, path, body, field):
    t0 = time.monotonic()
    status, data = request(server, method, path, body=body)
    assert status == 400, data[:300]
    answer = strict(data)
    assert answer["field"] == field and answer["error"]
    assert time.monotonic() - t0 < HANG_S


def test_large_finite_costs_answer_strict_json(server):
    status, data = request(server, "GET", "/api/simulate?tf=1e300&tb=1e300&schedules=1f1b,zb-v")
    assert status == 200
    results = strict(data)["results"]
    assert all(r["makespan"] > 1e300 for r in results)


def test_a_client_that_goes_away_mid_answer_leaves_no_traceback(server, capfd):
    path = "/api/download?format=svg&schedules=gpipe,1f1b,zb-h1,zb-v&p=16&m=64"
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", port(server)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        s.recv(64)  # the answer has started
        s.close()
    time.sleep(0.5)
    status, _ = request(server, "GET", "/api/families")  # still serving
    assert status == 200
    assert "Traceback" not in capfd.readouterr().err
