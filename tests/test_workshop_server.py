"""The workshop server without a browser: loopback only, its assets only, clear errors, clean stop."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from stagewise import torch_csv
from stagewise.schedules import generate
from stagewise.workshop.server import Server


@pytest.fixture(scope="module")
def server():
    httpd = Server(0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def request(server, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_binds_to_loopback_only(server):
    assert server.server_address[0] == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.server_address[1]}/"
    address = outward_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    with pytest.raises(OSError):  # the same port on the machine's network address: nobody listens
        socket.create_connection((address, server.server_address[1]), timeout=2).close()


def outward_address():
    """This machine's IPv4 address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_page_and_assets_are_served_with_a_local_only_policy(server):
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"/static/app.js" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name, ctype in [("app.js", "text/javascript"), ("app.css", "text/css"), ("favicon.svg", "image/svg+xml")]:
        status, headers, body = request(server, "GET", f"/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(ctype) and body
    # no asset reaches the network: no absolute URLs to other hosts
    from stagewise.workshop.server import STATIC

    for name in sorted(f.name for f in STATIC.iterdir()):
        text = request(server, "GET", f"/static/{name}")[2].decode()
        assert "http://" not in text.replace('"http://www.w3.org/2000/svg"', "") and "https://" not in text


@pytest.mark.parametrize("path", [
    "/static/../server.py", "/static/%2e%2e/server.py", "/static/..%2fapi.py", "/../../etc/passwd",
    "//etc/passwd", "/static//etc/passwd", "/static/", "/static", "/server.py", "/static/app.js/..",
    "/static/.%2e/__init__.py", "/%2e%2e/%2e%2e/etc/passwd",
])
def test_paths_outside_the_assets_are_404(server, path):
    status, headers, body = request(server, "GET", path)
    assert status == 404 and json.loads(body)["error"].startswith("not found")


def test_malformed_json_is_a_400_with_the_parser_message(server):
    status, _, body = request(server, "POST", "/api/simulate", body=b'{"p": 4,', headers={
        "Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"].startswith("malformed JSON: ")
    status, _, body = request(server, "POST", "/api/simulate", body=b"[1, 2]")
    assert status == 400 and "JSON object" in json.loads(body)["error"]
    status, _, body = request(server, "POST", "/api/simulate", body=b"\xff\xfe")
    assert status == 400 and "malformed JSON" in json.loads(body)["error"]


def test_oversized_and_unknown_requests(server):
    status, _, _ = request(server, "POST", "/api/simulate", body=b" " * (64 * 1024 + 1))
    assert status == 413
    assert request(server, "POST", "/api/families", body=b"{}")[0] == 404
    assert request(server, "GET", "/", headers={"Host": "evil.example:80"})[0] == 403


def test_invalid_settings_are_400_with_the_field(server):
    status, _, body = request(server, "POST", "/api/simulate", body=json.dumps({"schedules": ["1f1b"], "m": "0"}))
    assert status == 400
    assert json.loads(body) == {"error": "--microbatches must be >= 1; got 0", "field": "m"}
    status, _, body = request(server, "GET", "/api/simulate?tb=-2")
    assert status == 400 and json.loads(body)["field"] == "tb"


def test_simulate_by_get_and_post_agree(server):
    body = json.dumps({"schedules": ["1f1b"], "p": 16, "m": 8}).encode()
    status, headers, posted = request(server, "POST", "/api/simulate", body=body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    got = request(server, "GET", "/api/simulate?schedules=1f1b&p=16&m=8")[2]
    assert json.loads(posted) == json.loads(got)
    assert round(json.loads(got)["results"][0]["bubble_fraction"], 3) == 0.652


def test_download_csv_and_trace(server):
    status, headers, body = request(server, "GET", "/api/download?format=csv&schedules=1f1b&p=3&m=4")
    assert status == 200 and 'filename="1f1b-p3-m4.csv"' in headers["Content-Disposition"]
    assert body.decode() == torch_csv.dumps(generate("1f1b", 3, 4))
    status, headers, body = request(server, "GET", "/api/download?format=trace&schedules=1f1b&p=3&m=4")
    assert status == 200 and headers["Content-Type"] == "application/json"
    events = [e for e in json.loads(body)["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in events) == sorted(str(a) for a in generate("1f1b", 3, 4).actions())
    status, _, body = request(server, "GET", "/api/download?format=trace&schedules=1f1b,gpipe")
    assert status == 400 and json.loads(body)["field"] == "schedules"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_cli_serves_until_ctrl_c_then_exits_0(stop):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stagewise", "workshop", "--port", "0", "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("stagewise workshop: http://127.0.0.1:"), line
        port = int(line.split(":")[3].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/families")
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)  # a hang bound: the gate's join alone may take 5 s
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_cli_port_in_use_is_one_line_exit_2(server, capsys):
    from stagewise.cli import main

    assert main(["workshop", "--port", str(server.server_address[1]), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port" in err and "--port 0" in err
    assert main(["workshop", "--port", "70000", "--no-browser"]) == 2
    assert "--port must be in 0..65535; got 70000" in capsys.readouterr().err


def test_why_edit_and_teach_routes(server):
    status, _, body = request(server, "GET", "/api/why?p=4&m=8&schedule=1f1b&rank=0&pos=4")
    assert status == 200 and json.loads(body)["waits_for"]["op"] == "1B0"
    status, _, body = request(server, "GET", "/api/why?p=4&m=8&schedule=1f1b&rank=0&pos=1")
    assert status == 400 and json.loads(body)["error"] == "rank 0 has no idle gap before position 1 (0F1)"
    edit = {"schedules": ["1f1b"], "p": 2, "m": 2, "programs": "0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1"}
    status, _, body = request(server, "POST", "/api/edit", body=json.dumps(edit))
    answer = json.loads(body)
    assert status == 200 and answer["valid"] and answer["csv"] == torch_csv.dumps(generate("1f1b", 2, 2))
    status, _, body = request(server, "POST", "/api/why", body=json.dumps({**edit, "rank": 0, "pos": 2}))
    assert status == 200 and json.loads(body)["cause"] == "fill"
    status, _, body = request(server, "POST", "/api/edit", body=json.dumps({**edit, "programs": "0F0 0B0\n1B0 1F0"}))
    assert status == 200 and not json.loads(body)["valid"] and json.loads(body)["error"].startswith("deadlock")
    status, _, body = request(server, "GET", "/api/teach?p=4&m=8")
    assert status == 200 and {r["schedule"] for r in json.loads(body)["rows"]} >= {"gpipe", "1f1b"}
    status, _, body = request(server, "GET", "/api/teach?schedules=nope&p=4&m=8")  # was a 200
    assert status == 400 and json.loads(body)["field"] == "schedules" and "unknown schedule 'nope'" in json.loads(body)["error"]
    status, _, body = request(server, "POST", "/api/edit", body=json.dumps({**edit, "cap": -1}))  # was a 500
    assert status == 400 and json.loads(body)["field"] == "cap" and json.loads(body)["error"].startswith("--cap must be > 0")
    status, _, body = request(server, "GET", "/api/simulate?p=4&m=8&tf=1,1,1,2&tb=2,2,2,4")  # the CLI's lists
    assert status == 200 and json.loads(body)["results"][0]["makespan"] == 57
    assert json.loads(body)["query"] == {"tf": "1,1,1,2", "tb": "2,2,2,4"}
    status, _, body = request(server, "GET", "/api/simulate?p=4&m=8&messages=1")
    assert status == 200 and len(json.loads(body)["results"][0]["messages"]) == 48
    status, _, body = request(server, "GET", "/api/messages?schedules=gpipe,1f1b&p=4&m=8")
    got = json.loads(body)["results"]
    assert status == 200 and [r["schedule"] for r in got] == ["gpipe", "1f1b"] and len(got[1]["messages"]) == 48


def test_a_view_over_the_page_limit_is_a_400_before_any_schedule_is_made(server, monkeypatch):
    from stagewise.schedules import FAMILIES
    from stagewise.workshop import api

    def never(*args):
        raise AssertionError("a schedule was generated")

    monkeypatch.setattr(api, "generated", never)
    status, _, body = request(server, "GET", f"/api/simulate?schedules={','.join(FAMILIES)}&p=64&m=256")
    assert status == 400 and json.loads(body)["field"] == "m"
    assert "make up to 819200 actions; the page draws at most 56000" in json.loads(body)["error"]


def test_a_bad_limit_variable_stops_the_server_at_start_and_is_never_a_500(server, monkeypatch, capsys):
    from stagewise.cli import main
    from stagewise.limits import LimitError

    monkeypatch.setenv("STAGEWISE_MAX_RANKS", "\u00b2")
    assert main(["workshop", "--port", "0", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "STAGEWISE_MAX_RANKS='\u00b2': expected a whole number >= 1" in err
    with pytest.raises(LimitError, match="STAGEWISE_MAX_RANKS"):
        Server(0)
    # a variable changed under a running server (read at each check) is a 400 naming it, not a 500
    monkeypatch.setenv("STAGEWISE_MAX_WORKSHOP_ACTIONS", "lots")
    status, _, body = request(server, "GET", "/api/simulate?p=4&m=8")
    assert status == 400 and "STAGEWISE_MAX_WORKSHOP_ACTIONS='lots'" in json.loads(body)["error"]
