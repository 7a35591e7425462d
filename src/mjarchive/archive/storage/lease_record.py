"""The writer lease's document (`Holder`) and what every held lease offers (`WriterLease`); the ways
of holding one are in lease.py (local disks, memory, unenforced) and s3_lease.py (S3)."""

from __future__ import annotations

import datetime
import json
import math
import os
import secrets
import socket
import time
from typing import Any

from ..._errors import FormatError, MjArchiveError
from ..format import LEASE_ATTR, MAX_LEASE_BYTES, MAX_JSON_DEPTH, json_depth, parse_json_bytes

__all__ = ["DEFAULT_LEASE_TTL", "MAX_LEASE_TTL", "Holder", "WriterLease", "check_ttl", "iso_time"]

#: Seconds an object-store lease lives after its last renewal (`lease_ttl`).
DEFAULT_LEASE_TTL = 60.0
MAX_LEASE_TTL = 86400.0
_MAX_HOST = 255


def check_ttl(ttl: Any) -> float:
    """`lease_ttl` as given by a caller: seconds, finite, in (0, 1 day]."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_LEASE_TTL:
        raise MjArchiveError(f"lease_ttl must be a number of seconds in (0, {MAX_LEASE_TTL:g}], got {ttl!r:.40}")
    return float(ttl)


def iso_time(seconds: float) -> str:
    try:  # an `expires` read from a hostile lease document may lie beyond year 9999
        return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{seconds:g} s after 1970 (beyond what dates can show)"


class Holder:
    """Who holds a lease, as stored in its document (values are untrusted when read)."""

    def __init__(self, host: str, pid: int, started: str, token: str, expires: float | None):
        self.host, self.pid, self.started, self.token, self.expires = host, pid, started, token, expires

    @classmethod
    def new(cls, expires: float | None) -> Holder:
        return cls(socket.gethostname()[:_MAX_HOST], os.getpid(), iso_time(time.time()), secrets.token_hex(16), expires)

    def renewed(self, expires: float | None) -> Holder:
        return Holder(self.host, self.pid, self.started, self.token, expires)

    def released(self) -> Holder:
        """The document a writer leaves at release: expired, naming no host or process."""
        return Holder("", 0, "", self.token, 0)

    @property
    def is_released(self) -> bool:
        return self.expires == 0 and not self.host

    def document(self) -> bytes:
        attrs = {"host": self.host, "pid": self.pid, "started": self.started, "token": self.token,
                 "expires": self.expires}
        doc = {"zarr_format": 3, "node_type": "group", "attributes": {LEASE_ATTR: attrs}}
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder:
        """Check a lease document read from storage; FormatError says what is wrong with it."""
        if len(data) > MAX_LEASE_BYTES:
            raise FormatError(f"is larger than {MAX_LEASE_BYTES} bytes")
        if json_depth(data) > MAX_JSON_DEPTH:
            raise FormatError(f"nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            doc = parse_json_bytes(data, "the lease document")
        except ValueError as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"is not JSON ({type(exc).__name__})") from None
        attrs = doc.get("attributes") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "group" \
                or not isinstance(attrs, dict) or not isinstance(attrs.get(LEASE_ATTR), dict):
            raise FormatError(f"is not a Zarr v3 group document with the attribute {LEASE_ATTR!r}")
        a = attrs[LEASE_ATTR]
        host, pid, started, token, expires = (a.get(k) for k in ("host", "pid", "started", "token", "expires"))
        if not (type(host) is str and len(host) <= _MAX_HOST and type(pid) is int and 0 <= pid < 2**63
                and type(started) is str and len(started) <= 64 and type(token) is str and 1 <= len(token) <= 64
                and (expires is None or type(expires) in (int, float) and math.isfinite(expires) and expires >= 0)):
            raise FormatError(f"has a malformed {LEASE_ATTR!r} (host, pid, started, token or expires)")
        return cls(host, pid, started, token, None if expires is None else float(expires))

    def describe(self) -> str:
        return f"host {self.host!r:.80}, pid {self.pid}, started {self.started!r:.70}"

    def is_me(self) -> bool:
        return self.host == socket.gethostname()[:_MAX_HOST] and self.pid == os.getpid()


class WriterLease:
    """A held writer lease. `renew()` before a write cycle, `check()` before each commit, then
    `release()`; both raise WriterLockedError once the lease was lost."""

    key: str
    holder: Holder

    def renew(self) -> None:
        self.check()

    def check(self) -> None:
        pass

    def release(self) -> None:
        pass
