"""What a viewer request may ask, checked: world lists typed in the page or on the command line,
the limits, the host and port to listen on; and text made safe for the page's markdown."""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import re
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import MjArchiveError, SelectionError
from ..archive.reader import parse_selection
from .frames import MAX_VIEW_WORLDS

__all__ = ["parse_worlds", "check_max_worlds", "check_listen", "format_ids", "is_loopback", "url_for",
           "quiet", "markdown_text", "resets_text", "short_ids"]


def parse_worlds(text: str) -> int | list[int] | slice:
    """World IDs as typed in the page or on the command line: `7`, `7,42` or a slice over IDs `0:8`
    (the syntax of `select` and the CLI's `--worlds`). Raises SelectionError with an example."""
    if len(str(text).strip()) > 1000:
        raise SelectionError("that world list is too long; write a range such as 0:16 instead")
    return parse_selection(text, "7, 7,42 or a range 0:8", list_name="world list")


def check_max_worlds(max_worlds: Any) -> int:
    if isinstance(max_worlds, bool) or not isinstance(max_worlds, (int, np.integer)) or not (
            1 <= max_worlds <= MAX_VIEW_WORLDS):
        raise MjArchiveError(f"max_worlds (--max-worlds) must be an integer from 1 to {MAX_VIEW_WORLDS}, "
                             f"got {max_worlds!r}")
    return int(max_worlds)


def format_ids(ids: Sequence[int]) -> str:
    """`0:4` for consecutive ascending IDs (more than two), else `7,42`."""
    ids = list(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}:{ids[-1] + 1}"
    return ",".join(map(str, ids))


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, port: Any) -> int:
    """The port to hand viser: a free one for port 0. viser silently moves to the next port when one is
    taken and waits forever on a host it cannot bind, so both are checked here first."""
    if isinstance(port, bool) or not isinstance(port, (int, np.integer)) or not 0 <= port <= 65535:
        raise MjArchiveError(f"port must be an integer from 0 to 65535 (0: any free port), got {port!r}")
    if not isinstance(host, str) or not host:
        raise MjArchiveError(f"host must be a host name or IP address such as 127.0.0.1, got {host!r}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
            probe.bind(addr)
            return int(probe.getsockname()[1])
    except OSError as exc:
        if int(port) and exc.errno == errno.EADDRINUSE:
            raise MjArchiveError(f"port {port} on {host} is in use; choose another with --port "
                                 "(or --port 0 for any free port)") from None
        raise MjArchiveError(f"cannot listen on {host}:{port}: {exc}; use --host 127.0.0.1 and an SSH tunnel "
                             "to reach the viewer from elsewhere") from None


def url_for(host: str, port: int) -> str:
    shown = "localhost" if host in ("0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


@contextlib.contextmanager
def quiet():
    """viser prints a banner and 'Server stopped' with rich on stdout; the viewer prints its own URL."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def markdown_text(text: str) -> str:
    """Plain text for a markdown element: characters markdown would interpret are escaped."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>])", r"\\\1", " ".join(text.split()))


def short_ids(ids: Sequence[int]) -> str:
    ids = list(ids)
    return f"{', '.join(map(str, ids[:6]))}, …, {', '.join(map(str, ids[-3:]))} ({len(ids)} worlds)"


def resets_text(per_world: dict[int, Sequence[int]], totals: dict[int, int] | None = None) -> str:
    """The resets list of the page: each world's episode starts after frame 0 (at most 12 named);
    `totals`: each world's number of resets where `per_world` lists only the first."""
    lines = []
    for w, starts in per_world.items():
        resets = [s for s in starts[:13] if s > 0]
        total = (totals or {}).get(w, len([s for s in starts if s > 0]))
        shown = ", ".join(map(str, resets[:12])) + (f", … ({total} in all)" if total > 12 else "")
        lines.append(f"world {w}: {shown or 'none'}")
    return ("Resets (episode starts) — " + "; ".join(lines)) if lines else ""
