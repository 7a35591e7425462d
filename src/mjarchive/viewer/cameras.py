"""The pages' cameras in the viewer: where they start (a home view of the whole grid of worlds),
the bodies one may follow, and following one, each page keeping its own offset from the body.

Viser moves a page's camera only as far as the page allows: a page that is connecting or leaving
may refuse, and is left alone (the next frame tries again).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import mujoco
import numpy as np

__all__ = ["NO_BODY", "BodyFollow", "body_choices", "home_view", "move_home", "set_initial"]

#: The 'Follow body' choice that follows nothing.
NO_BODY = "none (free orbit)"


def body_choices(model: mujoco.MjModel) -> dict[str, int]:
    """Dropdown label -> body id of every body but the world; names come from the archive:
    bounded, printable, never NO_BODY, each label once."""
    names: dict[str, int] = {}
    for b in range(1, model.nbody):
        raw = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) or ""
        name = "".join(ch for ch in raw if ch.isprintable())[:64] or f"body {b}"
        names[name if name not in names and name != NO_BODY else f"{name} ({b})"] = b
    return names


def home_view(model: mujoco.MjModel, offsets: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(eye, look-at point) in metres: looking along +y (MuJoCo's default azimuth, as the scene
    render's first world top-left), far enough back to see the whole grid of worlds at `offsets` (W, 3)."""
    offsets = np.asarray(offsets, np.float64)
    span = float(np.ptp(offsets, axis=0).max()) if len(offsets) > 1 else 0.0
    extent = float(model.stat.extent)
    center = np.asarray(model.stat.center, dtype=np.float64) + offsets.mean(axis=0)
    distance = 0.9 * span + 1.2 * extent + 0.5
    elevation = math.radians(25.0)
    eye = center + distance * np.array([0.0, -math.cos(elevation), math.sin(elevation)])
    return tuple(map(float, eye)), tuple(map(float, center))


def move_home(clients: Iterable[Any], home: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    """Put each client's camera at `home` (`home_view`), z up."""
    position, look_at = home
    for client in clients:
        with contextlib.suppress(Exception):  # a page that is just connecting or leaving
            client.camera.up_direction = (0.0, 0.0, 1.0)
            client.camera.position = position
            client.camera.look_at = look_at


def set_initial(server: Any, home: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    """Where pages that connect from now on start (viser >= 1.1; older ones are moved on connect)."""
    initial = getattr(server, "initial_camera", None)
    if initial is not None:
        initial.position, initial.look_at, initial.up = home[0], home[1], (0.0, 0.0, 1.0)


class BodyFollow:
    """Moves each page's camera with a followed body: the first time it looks at the body, then it
    moves by as much as the body moved, so each page keeps the view its user chose around it."""

    def __init__(self):
        self._prev: dict[Any, np.ndarray] = {}  # client id -> the target its camera was last moved to

    def forget(self) -> None:
        """Start over: the next `move` looks at the target again (another body, world or home view)."""
        self._prev.clear()

    def move(self, clients: dict[Any, Any], target: np.ndarray) -> None:
        """Move the cameras of `clients` (id -> viser client) to follow `target` (3,) metres."""
        for client_id, client in clients.items():
            with contextlib.suppress(Exception):  # a page that is just connecting or leaving
                prev = self._prev.get(client_id)
                if prev is None:
                    client.camera.look_at = target
                else:
                    client.camera.position = client.camera.position + (target - prev)  # moves look_at too
                self._prev[client_id] = np.array(target, np.float64)
