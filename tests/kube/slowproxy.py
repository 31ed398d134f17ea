"""``SlowProxy``: a TCP proxy on 127.0.0.1 that delays every chunk it forwards, in front of an API
server (issue 24).

The fake server slows its requests by fault injection (``FaultConfig(latency_s=...)``); the real
kube-apiserver cannot be told to, so a process that must be slow talks to it through this proxy.
It forwards bytes, TLS included, unchanged: the client verifies the apiserver's own certificate,
valid for 127.0.0.1 whatever the port, and authenticates with the same token. ``delay_s`` may be
changed while connections are open (0: no delay); ``drop()`` cuts every open connection;
``kubeconfig`` writes a copy of a kubeconfig pointing at the proxy.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class SlowProxy:
    """Forwards 127.0.0.1:<port> to ``upstream`` (``https://host:port``), ``delay_s`` per chunk."""

    def __init__(self, upstream: str, delay_s: float = 0.0) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 443)
        self.scheme = u.scheme
        self.delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="slowproxy-accept").start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def kubeconfig(self, source: Path, dest: Path) -> Path:
        """``source`` with every cluster's server replaced by the proxy (credentials, CA kept)."""
        config = yaml.safe_load(source.read_text())
        for c in config.get("clusters") or []:
            c["cluster"]["server"] = self.url
        dest.write_text(yaml.safe_dump(config, sort_keys=False))
        dest.chmod(0o600)
        return dest

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=30)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True, name="slowproxy").start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self.delay_s > 0:
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> int:
        """Cut every connection open now (as a network fault does: requests in flight fail,
        watches end); returns how many sockets were closed. New connections are accepted."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        return len(socks)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


__all__ = ["SlowProxy"]
