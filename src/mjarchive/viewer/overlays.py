"""Recorded debug overlays (format 1.1) in the viewer: each track's primitives at the shown frame.

One frame of an overlay track (`OverlayRows` over the window's worlds, `PoseWindow.overlays`) becomes
scene primitives by the rule the render draws with (`replay.views.overlay_draw.row_primitives`: grid offsets, labels
without a position at the world's body 1, arrows without length left out). `OverlayLayer` keeps
one viser node per track (a batched mesh of spheres of the overlay's radius for points, arrows of
its width, a pool of labels for text) and updates it per frame; counts vary per frame and world.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..archive.overlays import Overlay, OverlayRows
from ..replay.views.overlay_draw import FramePrimitives, row_primitives
from .chunks import MAX_LABELS, VIEW_PRIMITIVES_PER_TRACK
from .geometry import unit_sphere

__all__ = ["MAX_LABELS", "VIEW_PRIMITIVES_PER_TRACK", "OverlayLayer"]


class OverlayLayer:
    """The scene nodes of an archive's overlay tracks (`Archive.overlays`), under /overlays/<name>.

    `show(name, primitives)` draws one track's frame; `set_visible(name, on)` hides or shows a track
    (a hidden track is not updated). Call from one thread, inside the caller's atomic viser update.
    """

    def __init__(self, scene: Any, overlays: dict[str, Overlay]):
        self._scene = scene
        self._specs = dict(overlays)
        self.visible = {name: True for name in overlays}
        self._nodes: dict[str, Any] = {}  # points and arrows: one node per track, made at its first primitive
        self._node_on: dict[str, bool] = {}
        self._labels: dict[str, list[Any]] = {name: [] for name in overlays}
        self._labels_on: dict[str, int] = {name: 0 for name in overlays}  # labels of the pool shown now
        self._sphere = unit_sphere()

    def add_checkboxes(self, gui: Any, on_change: Any) -> None:
        """A checkbox per track in the open GUI folder; `on_change(name, on)` when a page toggles one."""
        for name, spec in self._specs.items():
            box = gui.add_checkbox(name, self.visible[name], hint=f"draw the recorded {spec.kind} of '{name}'")
            box.on_update(lambda e, name=name: on_change(name, bool(e.target.value)))

    def show_frame(self, tracks: dict[str, OverlayRows], offsets: np.ndarray, anchors: np.ndarray | None,
                   hidden: dict[str, int] | None = None) -> int:
        """Draw every visible track at one frame (`PoseWindow.overlays(frame)`; offsets and anchors as
        `row_primitives` takes them); returns how many labels are not shown (those past MAX_LABELS
        that `show` drops, and `hidden`: per track, those the window never read, `PoseWindow.hidden_primitives`)."""
        hidden = hidden or {}
        return sum(self.show(name, row_primitives(self._specs[name].kind, rows, offsets, anchors))
                   + hidden.get(name, 0) for name, rows in tracks.items() if self.visible[name])

    def show(self, name: str, prims: FramePrimitives) -> int:
        """Draw `prims` for track `name`; returns how many labels could not be shown (MAX_LABELS)."""
        if not self.visible[name]:
            return 0
        spec = self._specs[name]
        if spec.kind == "text":
            return self._show_labels(name, prims)
        if not len(prims):
            self._set_node_visible(name, False)  # viser's batched nodes need at least one instance
            return 0
        node = self._nodes.get(name)
        if node is None:
            self._node_on[name] = True  # made visible
        if spec.kind == "points":
            wxyzs = np.zeros((len(prims), 4))
            wxyzs[:, 0] = 1.0
            if node is None:
                self._nodes[name] = self._scene.add_batched_meshes_simple(
                    f"/overlays/{name}", self._sphere[0] * np.float32(spec.size), self._sphere[1],
                    batched_wxyzs=wxyzs, batched_positions=prims.positions, batched_colors=_rgb(spec),
                    opacity=_opacity(spec), lod="off", cast_shadow=False, receive_shadow=False)
            else:
                node.batched_positions = prims.positions
                node.batched_wxyzs = wxyzs
        elif node is None:
            self._nodes[name] = self._add_arrows(name, spec, prims.positions)
        else:
            node.points = prims.positions
        self._set_node_visible(name, True)
        return 0

    def set_visible(self, name: str, on: bool) -> None:
        self.visible[name] = bool(on)
        if not on:
            self._set_node_visible(name, False)
            for label in self._labels[name][:self._labels_on[name]]:
                label.visible = False
            self._labels_on[name] = 0

    def remove(self) -> None:
        for node in self._nodes.values():
            node.remove()
        for pool in self._labels.values():
            for label in pool:
                label.remove()
        self._nodes.clear()
        self._node_on.clear()
        self._labels = {name: [] for name in self._specs}
        self._labels_on = {name: 0 for name in self._specs}

    # -- internals -------------------------------------------------------------------------------------------
    def _set_node_visible(self, name: str, on: bool) -> None:
        node = self._nodes.get(name)
        if node is not None and self._node_on.get(name) != on:
            node.visible = on
            self._node_on[name] = on

    def _add_arrows(self, name: str, spec: Overlay, points: np.ndarray) -> Any:
        width = float(spec.size)
        if hasattr(self._scene, "add_arrows"):  # viser >= 1.1: shaft and head, as MuJoCo's arrows
            return self._scene.add_arrows(f"/overlays/{name}", points, _rgb(spec), shaft_radius=width,
                                          head_radius=2.0 * width, head_length=4.0 * width)
        return self._scene.add_line_segments(f"/overlays/{name}", points, _rgb(spec), thickness=2.0 * width)

    def _show_labels(self, name: str, prims: FramePrimitives) -> int:
        pool = self._labels[name]
        n = min(len(prims), MAX_LABELS)
        for k in range(n):
            position = tuple(float(x) for x in prims.positions[k])
            if k < len(pool):
                label = pool[k]
                label.text = prims.labels[k]
                label.position = position
                if k >= self._labels_on[name]:
                    label.visible = True
            else:
                pool.append(self._add_label(f"/overlays/{name}/label_{k}", prims.labels[k], position))
        for label in pool[n:self._labels_on[name]]:
            label.visible = False
        self._labels_on[name] = n
        return len(prims) - n


    def _add_label(self, node: str, text: str, position: tuple[float, ...]) -> Any:
        try:
            return self._scene.add_label(node, text, position=position, anchor="bottom-center")
        except TypeError:  # viser < 1.1 has no anchor
            return self._scene.add_label(node, text, position=position)


def _rgb(spec: Overlay) -> tuple[int, int, int]:
    return tuple(int(round(255 * c)) for c in spec.rgba[:3])  # type: ignore[return-value]


def _opacity(spec: Overlay) -> float | None:
    return float(spec.rgba[3]) if spec.rgba[3] < 1.0 else None
