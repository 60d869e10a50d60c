"""One preloaded interpreter for the docs' commands: each command still runs in a process of its own, forked
from a server that imported torch (and what ranks import) once, instead of a fresh interpreter that imports
them again (seconds per command; a `stagewise train` twice: its own process and its ranks' forkserver).

``Preloaded(env, modules)`` starts the server (``python -c``, with ``env``) and writes two shims into a folder:
``stagewise`` (put first on PATH) and ``run-python-file`` (for ``python FILE``). A shim (``python -I -S``,
milliseconds) sends its argv, cwd, environment and fds 0-2 to the server, which forks a child that takes them
on and runs the file as ``__main__`` (the venv's console script for ``stagewise``), exits as the interpreter
would (non-daemon threads joined, atexit run) and reports the status, which the shim exits with.

What a fresh process would do differently is kept out or checked: the preload must print nothing and start no
thread (``start`` fails otherwise, so an import-time warning still shows); nothing of the command's own runs
before it forks; ``multiprocessing.process.ORIGINAL_DIR`` is the command's cwd. A command's multiprocessing
forkserver (its ranks') is forked from the server too (``_ensure_running``), with the command's stdio, cwd and
environment, so its ranks start as they would but without importing torch again.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET_ENV = "DOCS_PRELOADED_SOCKET"  #: where a shim or a command finds the server (not a STAGEWISE_ variable)
MESSAGE = 1 << 20  #: the largest request (argv, cwd, environment)
#: the `stagewise` commands that import torch, run forked; any other is the console script itself
HEAVY = ("train", "profile", "demo")

SHIM = """#!{python} -IS
import json, os, socket, sys
argv = {argv}
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(os.environ[{env!r}])
req = {{"kind": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2])
reply = s.recv(64)
code = int(reply) if reply else 1
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
#: the server's command line: this file as ``__main__`` (``python -c``: no folder of the suite's on sys.path)
SERVE = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
#: ``stagewise``: the commands that import torch run forked, any other is the console script itself (faster)
DISPATCH = """#!/bin/bash
case "${{1-}}" in
  {heavy}) exec {forked} "$@" ;;
  *) exec {console} "$@" ;;
esac
"""


class Preloaded:
    """The server and its shims' folder; ``close()`` ends the server (and any command still running)."""

    def __init__(self, folder: Path, env: dict, modules: tuple[str, ...]):
        folder.mkdir(parents=True, exist_ok=True)
        self.bin = folder / "bin"
        self.bin.mkdir(exist_ok=True)
        self.socket = str(folder / "server.sock")
        self.log = folder / "server.log"
        console = shutil.which("stagewise", path=str(Path(sys.executable).parent))
        assert console, "the venv has no stagewise console script"
        for name, argv in (("forked-stagewise", f"[{console!r}, *sys.argv[1:]]"),
                           ("run-python-file", "[os.path.abspath(sys.argv[1]), *sys.argv[2:]]")):
            (self.bin / name).write_text(SHIM.format(python=sys.executable, env=SOCKET_ENV, argv=argv))
        (self.bin / "stagewise").write_text(DISPATCH.format(heavy="|".join(HEAVY), forked=self.bin / "forked-stagewise",
                                                            console=console))
        for shim in self.bin.iterdir():
            shim.chmod(0o755)
        self.env = {**env, SOCKET_ENV: self.socket}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVE, __file__, self.socket, *modules], env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 240  # a hang bound: the imports take seconds
        while not os.path.exists(self.socket + ".ready"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the preloaded server did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        said = self.log.read_text()
        if said:  # what a fresh interpreter would print with each command, which the docs would have to show
            self.close()
            raise RuntimeError(f"importing {modules} printed something:\n{said[-3000:]}")

    def path(self, path: str) -> str:
        """PATH with the shims first."""
        return str(self.bin) + os.pathsep + path

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- the server (run as a script: ``python -c ... preloaded.py SOCKET MODULE...``)

def _serve(path: str, modules: list[str]) -> None:
    import importlib
    import signal

    import threading

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    importlib.import_module("torch")
    torch_threads = threads()  # importing torch starts a native thread: every forkserver forks ranks with it
    for m in modules:
        importlib.import_module(m)
    if threads() != torch_threads or threading.active_count() != 1:  # an OpenMP pool, a Python thread...
        sys.stderr.write(f"the preload started {threads() - torch_threads} threads more than `import torch`; "
                         "forking it would not be a fresh process\n")
        sys.exit(1)
    _patch_forkserver()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    open(path + ".ready", "w").close()
    running: dict[int, socket.socket | None] = {}  # child pid -> the shim's connection (None: a forkserver)
    parent = os.getppid()
    while not stopping and os.getppid() == parent:  # ends with the suite however the suite ends
        conns = {c.fileno(): (pid, c) for pid, c in running.items() if c is not None}
        try:
            ready, _, _ = select.select([listener, *(c for _, c in conns.values())], [], [], 0.05)
        except InterruptedError:
            ready = []
        for r in ready:
            if r is listener:
                conn, _ = listener.accept()
                _accept(conn, listener, running)
            else:  # a shim went away (killed) before its command ended: end the command
                pid, conn = conns[r.fileno()]
                if not conn.recv(1, socket.MSG_PEEK):
                    _kill(pid)
        _reap(running)
    for pid in running:
        _kill(pid)
    os._exit(0)  # not torch's seconds of teardown


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(running: dict) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            try:
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass
            conn.close()


def _accept(conn: socket.socket, listener: socket.socket, running: dict) -> None:
    msg, fds, _, _ = socket.recv_fds(conn, MESSAGE, 8)
    req = json.loads(msg)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        if req["kind"] == "run":
            running[pid] = conn
        else:  # a command's forkserver: the command learns its pid, the server reaps it
            running[pid] = None
            conn.send(str(pid).encode())
            conn.close()
        return
    code = 1
    try:
        listener.close()
        for c in running.values():
            if c is not None:
                c.close()
        conn.close()
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds[:3]:
            if fd > 2:
                os.close(fd)
        _become(req)
        if req["kind"] == "run":
            code = _run_main(req["argv"])
        else:
            from multiprocessing import forkserver

            listener_fd, alive_r = fds[3:5]
            try:
                forkserver.main(listener_fd, alive_r, req["preload"], **req["data"])
            except SystemExit:
                pass
            code = 0
    finally:
        os._exit(code)


def _become(req: dict) -> None:
    """Take on the command's cwd and environment (what a fresh process started there would have)."""
    import multiprocessing.process

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    multiprocessing.process.ORIGINAL_DIR = req["cwd"]


def _run_main(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` and end as the interpreter does; the exit status."""
    import atexit
    import runpy
    import threading

    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != argv[0]:  # from the script's frame on
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb or e.__traceback__), tb or e.__traceback__)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _patch_forkserver() -> None:
    """A command's multiprocessing forkserver is forked from this server (what it imports already imported)
    with the command's stdio, cwd and environment, instead of a fresh interpreter importing it all again."""
    from multiprocessing import connection, forkserver, resource_tracker, spawn, util

    def ensure_running(self):
        with self._lock:
            resource_tracker.ensure_running()
            if self._forkserver_pid is not None:
                if _alive(self._forkserver_pid):
                    return
                os.close(self._forkserver_alive_fd)
                self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None
            data = {}
            if self._preload_modules:
                data = {k: v for k, v in spawn.get_preparation_data("ignore").items() if k in ("main_path", "sys_path")}
            with socket.socket(socket.AF_UNIX) as listener:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                alive_r, alive_w = os.pipe()
                try:
                    req = {"kind": "forkserver", "preload": list(self._preload_modules), "data": data,
                           "cwd": os.getcwd(), "env": dict(os.environ)}
                    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                        s.connect(os.environ[SOCKET_ENV])
                        socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2, listener.fileno(), alive_r])
                        pid = int(s.recv(64))
                except BaseException:
                    os.close(alive_w)
                    raise
                finally:
                    os.close(alive_r)
            self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, pid

    def stop_unlocked(self):
        if self._forkserver_pid is None:
            return
        os.close(self._forkserver_alive_fd)
        self._forkserver_alive_fd = None
        while _alive(self._forkserver_pid):  # the server reaps it (its parent)
            time.sleep(0.01)
        self._forkserver_pid = None
        if not util.is_abstract_socket_namespace(self._forkserver_address):
            os.unlink(self._forkserver_address)
        self._forkserver_address = None

    forkserver.ForkServer.ensure_running = ensure_running
    forkserver.ForkServer._stop_unlocked = stop_unlocked


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie the server has not reaped yet is gone
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2:])
