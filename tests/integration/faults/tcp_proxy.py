"""A TCP proxy a test can cut: while cut, nothing listens and every open connection is closed,
as when the server behind it is stopped; `restore` listens again on the same port."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000  # <sched.h>


def in_namespace(namespace: str | None, make: Callable[[], T]) -> T:
    """`make()` run in the network namespace `namespace` (`ip netns` name; None: this one).
    A socket it makes stays in that namespace: it listens there, and is accepted on from any
    thread. Only a helper thread enters the namespace (setns(2) is per thread), so the rest of
    the process, its upstream connections included, stays where it was. Raises what `make`
    raises, or OSError when the namespace cannot be entered."""
    if namespace is None:
        return make()
    found: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns {namespace}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            found.append(make())
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return found[0]


class TcpProxy:
    """Forwards `listen_host`:`port` (default 127.0.0.1, a free port) to `upstream` (host,
    port), one thread pair per connection. `namespace`: it listens in that network namespace
    (`ip netns` name) and connects upstream from this one."""

    def __init__(
        self,
        upstream: tuple[str, int],
        listen_host: str = "127.0.0.1",
        namespace: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.listen_host = listen_host
        self.namespace = namespace
        self.port = 0  # chosen by the first listen
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        def listen() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.listen_host, self.port))
            sock.listen(64)
            return sock

        listener = in_namespace(self.namespace, listen)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and close every open connection (both ends)."""
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = self._sockets, []
        for sock in [s for s in (listener,) if s is not None] + open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
