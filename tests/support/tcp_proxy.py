"""A TCP proxy on 127.0.0.1 for wire faults: pass bytes through, add latency, or hold connections silently.

``TcpProxy(upstream_port)`` listens on a free port and forwards every connection to
``127.0.0.1:upstream_port``. Its modes change while it runs:

* ``latency_s = d``: every chunk the server sends reaches the client ``d`` seconds after the proxy
  received it (a slow answer: the server has already done the work when the answer is late);
  requests pass at once, so the server sees each request when the client sends it;
* ``with proxy.black_hole():``: the proxy keeps accepting connections but forwards nothing in
  either direction - a server that accepts and never answers. Leaving the block closes every
  connection that was open during it (what was swallowed cannot be delivered any more).

``requests_sent()`` counts the HTTP requests the client sent through it, per path (the request
lines it forwarded or swallowed), so a test can tell what the client attempted from what the
server received. Threads only; no third-party code.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections import Counter
from typing import Iterator, Optional

__all__ = ["TcpProxy"]

_REQUEST_LINE = re.compile(rb"(?:^|\r\n)(?:GET|POST|PUT|DELETE|PATCH) (/[^ ?]*)[^ ]* HTTP/1\.[01]\r\n")
_CHUNK = 1 << 20
_BURST_GAP_S = 0.05


class TcpProxy:
    """See the module docstring. Use as a context manager, or call :meth:`close`."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, int(upstream_port))
        self.latency_s = 0.0
        self._holding = False
        self._lock = threading.Lock()
        self._sent: Counter = Counter()
        self._conns: list[socket.socket] = []  # every socket this proxy opened or accepted
        self._held: list[socket.socket] = []  # sockets open during a black hole
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"tcp-proxy-{self.port}", daemon=True).start()

    # ------------------------------------------------------------ modes
    @contextlib.contextmanager
    def black_hole(self) -> Iterator["TcpProxy"]:
        """Accept, read and swallow everything; answer nothing. On exit, drop the connections it held."""
        with self._lock:
            self._holding = True
            self._held = list(self._conns)
        try:
            yield self
        finally:
            with self._lock:
                self._holding = False
                held, self._held = self._held, []
            for sock in held:
                _close(sock)

    @contextlib.contextmanager
    def slow(self, latency_s: float) -> Iterator["TcpProxy"]:
        """Answers arrive ``latency_s`` late inside the block."""
        previous, self.latency_s = self.latency_s, float(latency_s)
        try:
            yield self
        finally:
            self.latency_s = previous

    def requests_sent(self) -> Counter:
        """HTTP requests the client sent through the proxy so far, per path (``/forward-backward``...)."""
        with self._lock:
            return Counter(self._sent)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            _close(sock)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.extend(socks)
            if self._holding:
                self._held.extend(socks)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            if self._holding:  # a new connection during a black hole: held, never connected upstream
                threading.Thread(target=self._pump, args=(client, None, True), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            self._track(server)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: Optional[socket.socket], from_client: bool) -> None:
        """Copy ``src`` -> ``dst`` until either side closes; swallow while holding; delay answers."""
        last_sent = 0.0
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                received = time.monotonic()
                if from_client:
                    paths = [m.group(1).decode() for m in _REQUEST_LINE.finditer(data)]
                    with self._lock:
                        self._sent.update(paths)
                if self._holding or dst is None or src in self._held:
                    continue  # swallowed: a black hole answers nothing
                # one delay per answer: the rest of an answer, already waiting in the buffer, follows at once
                if not from_client and self.latency_s > 0 and received - last_sent > _BURST_GAP_S:
                    time.sleep(max(0.0, received + self.latency_s - time.monotonic()))
                    if self._holding or src in self._held:
                        continue
                dst.sendall(data)
                last_sent = time.monotonic()
        except OSError:
            pass
        finally:
            if dst is not None and src not in self._held:
                _close(dst)
                _close(src)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
