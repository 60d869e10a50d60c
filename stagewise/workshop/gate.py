"""Admission of connections to the workshop server: no thread for a client that has sent nothing.

``ThreadingHTTPServer`` starts a thread per accepted connection, so 100 idle
sockets hold 100 threads. The gate instead waits for each connection's first
byte in one selector thread; only then does the connection get one of
``max_threads`` worker threads. A connection that sends nothing within
``timeout`` seconds is closed, and at most ``max_waiting`` (256) wait at once (the
oldest is dropped first). The worker's own deadline (``server.REQUEST_TIMEOUT``)
bounds how long a slow client keeps its thread.

Example (what ``server.Server`` does)::

    gate = Gate(httpd, max_threads=16, timeout=10.0)
    gate.admit(sock, address)   # from the accept loop; returns at once
    gate.close()                # on server_close
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time


class Gate:
    """One selector thread that hands readable connections to a bounded pool of worker threads.

    Mutable: it owns sockets and a thread; ``close`` stops it.
    """

    def __init__(self, server, *, max_threads: int, timeout: float, max_waiting: int = 256):
        self.server = server
        self.timeout = timeout
        self.max_waiting = max_waiting
        self.slots = threading.BoundedSemaphore(max_threads)
        self.incoming: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: dict[socket.socket, tuple[object, float]] = {}  # insertion order = age
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="workshop-gate", daemon=True)
        self.thread.start()

    def admit(self, sock: socket.socket, address) -> None:
        """Queue an accepted connection; it gets a worker once it has sent a byte."""
        self.incoming.put((sock, address))
        self._wake()

    def close(self) -> None:
        """Stop the gate and close every connection still waiting."""
        self.closed = True
        self._wake()
        self.thread.join(timeout=5)

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:  # the buffer is full (a wake is pending) or the gate is closed
            pass

    def _run(self) -> None:
        try:
            while not self.closed:
                self._take_incoming()
                for key, _ in self.selector.select(timeout=self._next_expiry()):
                    if key.fileobj is self.wake_r:
                        self._drain_wake()
                    elif key.fileobj in self.waiting:
                        self._dispatch(key.fileobj)
                self._expire()
        finally:
            self._take_incoming()
            for sock in list(self.waiting):
                self._drop(sock)
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()

    def _take_incoming(self) -> None:
        while True:
            try:
                sock, address = self.incoming.get_nowait()
            except queue.Empty:
                return
            if len(self.waiting) >= self.max_waiting:
                self._drop(next(iter(self.waiting)))
            self.waiting[sock] = (address, time.monotonic() + self.timeout)
            self.selector.register(sock, selectors.EVENT_READ)

    def _drain_wake(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except OSError:  # nothing more to read
            pass

    def _next_expiry(self) -> float | None:
        if not self.waiting:
            return None
        first = next(iter(self.waiting.values()))[1]  # deadlines grow with insertion order
        return max(0.0, first - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for sock, (_, deadline) in list(self.waiting.items()):
            if deadline > now:
                break
            # the gate may have spent the deadline waiting for a worker: a client that has sent its
            # request meanwhile is served, not dropped
            if _has_sent(sock):
                self._dispatch(sock)
            else:
                self._drop(sock)

    def _dispatch(self, sock: socket.socket) -> None:
        address, _ = self.waiting.pop(sock)
        self.selector.unregister(sock)
        # every worker busy: wait for one (each is freed within its request's deadline); new connections
        # queue meanwhile, in the kernel or in ``incoming``
        while not self.slots.acquire(timeout=0.25):
            if self.closed:
                self.server.shutdown_request(sock)
                return
        threading.Thread(target=self._serve, args=(sock, address), name="workshop-request", daemon=True).start()

    def _serve(self, sock: socket.socket, address) -> None:
        try:
            self.server.process_request_thread(sock, address)  # handles, then closes the connection
        finally:
            self.slots.release()

    def _drop(self, sock: socket.socket) -> None:
        self.waiting.pop(sock, None)
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        self.server.shutdown_request(sock)


def _has_sent(sock: socket.socket) -> bool:
    """Whether bytes wait on ``sock`` (a closed or failed one has none worth serving)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError: nothing yet; anything else: the connection is gone
        return False
