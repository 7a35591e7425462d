"""Every replay backend by name, each imported only when chosen (CPU-only work never imports Warp)."""

from __future__ import annotations

import importlib

from ..._errors import MjArchiveError
from .base import Backend

__all__ = ["BACKENDS", "backend_for"]

#: name as users write it -> (module of this sub-wing whose BACKEND serves it, what it is). A new
#: backend is one module plus one line here.
BACKENDS = {
    "cpu": (".cpu", "MuJoCo's OpenGL renderer"),
    "warp": (".warp", "MuJoCo Warp; 'warp:cpu' or 'warp:cuda:0' to pick the Warp device"),
}


def _unknown(spec: object) -> MjArchiveError:
    choices = " or ".join(f"{name!r} ({summary})" for name, (_, summary) in BACKENDS.items())
    return MjArchiveError(f"unknown backend {spec!r}; choose {choices}")


def backend_for(spec: str) -> Backend:
    """The backend a spec names: 'cpu', 'warp', or 'NAME:DEVICE' for one that takes a device."""
    if not isinstance(spec, str):
        raise _unknown(spec)
    name, sep, device = spec.partition(":")
    if name not in BACKENDS:
        raise _unknown(spec)
    backend = importlib.import_module(BACKENDS[name][0], __package__).BACKEND
    if sep and not (backend.takes_device and device):
        raise _unknown(spec)
    return backend

