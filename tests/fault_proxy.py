"""A small fault-injecting HTTP/1.1 proxy on 127.0.0.1, put by the tests in front of the moto S3 server.

Each client connection gets a thread that reads one request at a time (keep-alive; `Content-Length`,
chunked bodies and `Expect: 100-continue` understood), forwards it to the upstream server over a fresh
connection and writes the answer back, unless a fault rule matches the request. Faults are switched on
with `inject()` and apply deterministically to the matching requests they count: the next `times` of
them (None: all, a permanent fault), or every `every`-th one.

Fault modes:

- ``reset``: the connection is reset (RST, SO_LINGER 0) before anything is forwarded;
- ``reset_mid``: forwarded, then the headers and half the body (no body: half the headers) are sent and
  the connection is reset;
- ``slowdown``: answered ``503 SlowDown`` with S3's XML error body, nothing forwarded;
- ``stall``: nothing is answered for `stall_s` seconds (longer than the client's read timeout), then the
  connection is closed;
- ``truncate``: forwarded, then the headers with the full `Content-Length` and half the body (no body:
  half the headers) are sent, then the connection is closed (FIN).

Every loop is bounded: connections time out when idle, a stall ends by itself, and the proxy shuts
down by itself after `max_lifetime_s`.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

MODES = ("reset", "reset_mid", "slowdown", "stall", "truncate")
_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}
_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>")


@dataclass
class Rule:
    mode: str
    method: str | None = None  # e.g. "GET", "PUT"; None: any
    path: str | None = None  # a substring of the request path; None: any
    times: int | None = 1  # faults left to inject; None: every matching request (permanent)
    every: int = 1  # fault every `every`-th matching request (1, 2, ...)
    stall_s: float = 5.0
    first_per_path: bool = False  # fault only the first matching request for each path (not its retries)
    seen: int = 0
    applied: list = field(default_factory=list)

    def take(self, method: str, path: str) -> bool:
        """Whether this rule faults the request (counting it if it matches)."""
        if (self.method and method != self.method) or (self.path and self.path not in path):
            return False
        if self.times is not None and self.times <= 0:
            return False
        self.seen += 1
        if (self.seen - 1) % self.every or (self.first_per_path and any(p == path for _, p in self.applied)):
            return False
        if self.times is not None:
            self.times -= 1
        self.applied.append((method, path))
        return True


class FaultProxy:
    """The proxy: `start()`, then point clients at `endpoint_url`; `inject()` faults; `stop()`."""

    def __init__(self, upstream_url: str, *, idle_timeout_s: float = 30.0, max_lifetime_s: float = 900.0):
        host, port = upstream_url.split("://", 1)[1].rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.idle_timeout_s = idle_timeout_s
        self.max_lifetime_s = max_lifetime_s
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self.endpoint_url = ""
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, fault mode or None)

    # -- control ---------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def inject(self, mode: str, *, times: int | None = 1, every: int = 1, method: str | None = None,
               path: str | None = None, stall_s: float = 5.0, first_per_path: bool = False) -> Rule:
        """Fault the next `times` matching requests (None: all of them), every `every`-th one; with
        `first_per_path`, only the first request for each path (its retries pass)."""
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}; one of {MODES}")
        rule = Rule(mode, method, path, times, max(1, every), stall_s, first_per_path)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every fault rule (requests pass through again) and forget the requests seen."""
        with self._lock:
            self._rules.clear()
            self.requests.clear()

    def faults(self) -> list[str]:
        """The fault modes applied so far, in order."""
        with self._lock:
            return [f for _, _, f in self.requests if f]

    def _fault_for(self, method: str, path: str) -> Rule | None:
        with self._lock:
            rule = next((r for r in self._rules if r.take(method, path)), None)
            self.requests.append((method, path, rule.mode if rule else None))
            return rule

    # -- serving ---------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        deadline = time.monotonic() + self.max_lifetime_s
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    conn, _ = self._listener.accept()
                except (TimeoutError, socket.timeout):
                    continue
                except OSError:
                    return
                threading.Thread(target=self._serve, args=(conn,), name="fault-proxy-conn", daemon=True).start()
        finally:
            self._stop.set()
            self._listener.close()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.idle_timeout_s)
        reader = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                request = _read_request(reader, conn)
                if request is None:
                    return
                method, target, headers, body = request
                rule = self._fault_for(method, target)
                mode = rule.mode if rule else None
                if mode == "reset":
                    _reset(conn)
                    return
                if mode == "slowdown":
                    conn.sendall(_response_head(503, "Slow Down", [("Content-Type", "application/xml")], len(_SLOWDOWN))
                                 + _SLOWDOWN)
                    continue
                if mode == "stall":
                    self._stop.wait(rule.stall_s)
                    return
                status, reason, resp_headers, data = self._forward(method, target, headers, body)
                head = _response_head(status, reason, resp_headers, None if method == "HEAD" else len(data))
                if mode in ("reset_mid", "truncate"):
                    # Half the body; with no body to cut (a PUT's answer, HEAD), half the head.
                    has_body = method != "HEAD" and len(data) > 1
                    conn.sendall(head + data[: len(data) // 2] if has_body else head[: len(head) // 2])
                    if mode == "reset_mid":
                        _reset(conn)
                    else:
                        conn.shutdown(socket.SHUT_RDWR)
                    return
                conn.sendall(head + (b"" if method == "HEAD" else data))
        except (OSError, ValueError):  # the peer went away, or sent something that is not HTTP
            return
        finally:
            try:
                reader.close()
                conn.close()
            except OSError:
                pass

    def _forward(self, method: str, target: str, headers: list, body: bytes) -> tuple[int, str, list, bytes]:
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in _HOP and k.lower() != "content-length":
                    upstream.putheader(k, v)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.putheader("Connection", "close")
            upstream.endheaders(body)
            resp = upstream.getresponse()
            data = resp.read()
            keep = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP
                    and (k.lower() != "content-length" or method == "HEAD")]
            return resp.status, resp.reason, keep, data
        finally:
            upstream.close()


def _read_request(reader, conn: socket.socket) -> tuple[str, str, list, bytes] | None:
    """One request (method, target, headers, body) from a client; None when the client closed."""
    line = reader.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(65537)
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers = []
    for _ in range(200):
        h = reader.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers.append((k.strip(), v.strip()))
    lower = {k.lower(): v for k, v in headers}
    if lower.get("expect", "").lower() == "100-continue":
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in lower.get("transfer-encoding", "").lower():
        parts = []
        for _ in range(1 << 20):
            size = int(reader.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            parts.append(reader.read(size))
            reader.readline(16)
        body = b"".join(parts)
    else:
        body = reader.read(int(lower.get("content-length", "0") or 0))
    return method, target, headers, body


def _response_head(status: int, reason: str, headers: list, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reset(conn: socket.socket) -> None:
    """Close with RST rather than FIN."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        conn.close()
