"""Scene replay: the selected worlds side by side in one 3D scene, as training viewers show them.

Each world of an archive is an independent simulation of the same model, so the scene is a
replay-only model holding one copy of the recorded model per world, attached at its grid offset
(`compile_child.apply_recipe`), whose qpos is the copies' qpos in turn. `ScenePlan` lays out the
grid and maps archived states onto that model; `build_scene_model` compiles it, in a limited
child process for an untrusted bundle.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from ..._errors import BundleError, LayoutMismatchError, MjArchiveError, SelectionError
from ...archive.bundle.model_bundle import QposLayout
from ...archive.bundle.compile_child import MAX_SCENE_COPIES, REPLAY_NAME, Refused, apply_recipe
from ...archive.bundle.sandbox import compile_untrusted

__all__ = ["MAX_SCENE_WORLDS", "REPLAY_NAME", "ScenePlan", "bodies_per_copy", "build_scene_model", "derived_model",
           "replay_elements", "with_replay_cameras"]

#: The most worlds one scene holds (one model copy each).
MAX_SCENE_WORLDS = MAX_SCENE_COPIES
#: The widest spacing between neighbouring worlds (metres), so offsets stay within the recipe's bounds.
MAX_SPACING = 1e4


@dataclasses.dataclass(frozen=True)
class ScenePlan:
    """Where each selected world stands in the scene: `offsets[i]` (metres) for `world_ids[i]`."""

    world_ids: tuple[int, ...]
    spacing: float
    offsets: tuple[tuple[float, float, float], ...]

    def __post_init__(self):
        if not 1 <= len(self.world_ids) == len(self.offsets) <= MAX_SCENE_WORLDS:
            raise MjArchiveError(f"a ScenePlan needs one offset per world, 1 to {MAX_SCENE_WORLDS} of them; "
                                 f"got {len(self.world_ids)} worlds and {len(self.offsets)} offsets")

    @classmethod
    def grid(cls, world_ids: Sequence[int], spacing: float) -> ScenePlan:
        """A near-square grid centred at the origin, row-major in the given order, `spacing` metres
        apart: seen from MuJoCo's default azimuth (90, looking along +y) the first world is top-left."""
        ids = tuple(int(w) for w in world_ids)
        if not ids:
            raise SelectionError("a scene needs at least one world")
        if len(ids) > MAX_SCENE_WORLDS:
            raise SelectionError(f"at most {MAX_SCENE_WORLDS} worlds in one scene; select fewer with worlds=... "
                                 f"or use layout='grid' ({len(ids)} selected)")
        if len(set(ids)) != len(ids):
            raise SelectionError(f"a scene shows each world once; worlds {sorted(ids)} repeat one")
        if isinstance(spacing, bool) or not isinstance(spacing, (int, float, np.integer, np.floating)) or not (
                math.isfinite(spacing) and 0 < spacing <= MAX_SPACING):
            raise MjArchiveError(f"scene spacing must be a number of metres in (0, {MAX_SPACING:g}], not {spacing!r}")
        cols = math.ceil(math.sqrt(len(ids)))
        rows = math.ceil(len(ids) / cols)
        offsets = tuple(((i % cols - (cols - 1) / 2) * spacing, ((rows - 1) / 2 - i // cols) * spacing, 0.0)
                        for i in range(len(ids)))
        return cls(ids, float(spacing), offsets)

    def recipe(self, extra_cameras: Sequence[float] = ()) -> dict[str, Any]:
        """The JSON recipe for `apply_recipe`: a copy per world, plus fixed replay cameras whose
        vertical fields of view (degrees) are `extra_cameras`."""
        return {"copies": [list(o) for o in self.offsets], "cameras": [float(f) for f in extra_cameras]}

    def combine(self, base_model: mujoco.MjModel | QposLayout, qpos: Any, mocap_pos: Any = None,
                mocap_quat: Any = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Archived states of the plan's worlds as states of the scene model.

        qpos (n, W, nq) -> (n, W*nq), each free joint's position plus its world's offset;
        mocap_pos (n, W, nmocap, 3) -> (n, W*nmocap, 3) plus the offsets; mocap_quat
        (n, W, nmocap, 4) -> (n, W*nmocap, 4). W = len(world_ids), in the plan's order; a
        state not given comes back as None. Free-joint positions and mocap positions are world
        coordinates, so the copy's frame offset does not move them; the rest moves with the frame.
        `base_model`: the recorded model, or the archive's qpos layout (`QposLayout`).
        """
        offsets = np.asarray(self.offsets, dtype=np.float64)  # (W, 3)
        n_worlds = len(self.world_ids)
        qpos = np.asarray(qpos)
        _check_shape("qpos", qpos, (n_worlds, int(base_model.nq)))
        out = qpos.astype(np.result_type(qpos.dtype, np.float32), copy=True)
        if isinstance(base_model, QposLayout):
            free = np.asarray([adr for _, kind, adr in base_model.joints if kind == "free"], np.int64)
        else:
            free = np.asarray(base_model.jnt_qposadr)[np.asarray(base_model.jnt_type) == mujoco.mjtJoint.mjJNT_FREE]
        if free.size:
            out[..., free[:, None] + np.arange(3)] += offsets[None, :, None, :].astype(out.dtype)
        out = out.reshape(len(out), -1)
        pos = quat = None
        if mocap_pos is not None:
            mocap_pos = np.asarray(mocap_pos)
            _check_shape("mocap_pos", mocap_pos, (n_worlds, int(base_model.nmocap), 3))
            dtype = np.result_type(mocap_pos.dtype, np.float32)
            pos = (mocap_pos.astype(dtype) + offsets.astype(dtype)[None, :, None, :]).reshape(len(mocap_pos), -1, 3)
        if mocap_quat is not None:
            mocap_quat = np.asarray(mocap_quat)
            _check_shape("mocap_quat", mocap_quat, (n_worlds, int(base_model.nmocap), 4))
            quat = mocap_quat.reshape(len(mocap_quat), -1, 4)
        return out, pos, quat


    def bodies_per_copy(self, model: mujoco.MjModel) -> int | None:
        """Bodies of each world's copy in the scene model `model` (see `bodies_per_copy`)."""
        return bodies_per_copy(model, len(self.world_ids))

    def check_model(self, model: mujoco.MjModel, layout: QposLayout) -> None:
        """Refuse a scene model whose state is not one recorded state per world."""
        n = len(self.world_ids)
        if (model.nq, model.nmocap) != (n * layout.nq, n * layout.nmocap):
            raise LayoutMismatchError(f"the scene model has nq={model.nq}, nmocap={model.nmocap}; {n} worlds of "
                                      f"the recorded model need nq={n * layout.nq}, nmocap={n * layout.nmocap}")


#: The name of the body the replay recipe adds: REPLAY_NAME, or REPLAY_NAME~k where the model uses it.
_REPLAY_BODY = re.compile(re.escape(REPLAY_NAME) + r"(~[0-9]+)?")


def replay_elements(model: mujoco.MjModel, kind: str) -> int:
    """How many of the model's last bodies (kind "body") or cameras ("cam") the replay recipe added:
    they belong to no world. 0 for other kinds. Found by place, not by name alone: the recipe's body
    is the last body, a child of the world named REPLAY_NAME (or REPLAY_NAME~k, see apply_recipe),
    and its cameras are the last cameras. A recorded model may look the same (valid names are the
    model's to choose): callers that know how many elements their model has check against that
    (`variant_map.VariantLayout`), and copies in a scene are prefixed, so theirs never look so."""
    if kind not in ("body", "cam") or model.nbody < 2:
        return 0
    last = int(model.nbody) - 1
    if int(model.body_parentid[last]) != 0 or not _REPLAY_BODY.fullmatch(
            mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, last) or ""):
        return 0
    if kind == "body":
        return 1
    on_it = np.flatnonzero(np.asarray(model.cam_bodyid) == last)
    return len(on_it) if len(on_it) and int(on_it[0]) == model.ncam - len(on_it) else 0


def bodies_per_copy(model: mujoco.MjModel, copies: int = 1) -> int | None:
    """Bodies of each world's copy in a replay model of `copies` copies, the world body and the
    replay cameras' body left out; None when they do not split evenly into the copies. Copy k's
    bodies are `1 + k * n ... (k + 1) * n` (`compile_child.apply_recipe` attaches copy after copy)."""
    n = int(model.nbody) - 1 - replay_elements(model, "body")
    return n // copies if copies > 0 and n >= 0 and n % copies == 0 else None


def _check_shape(what: str, array: np.ndarray, tail: tuple[int, ...]) -> None:
    if array.ndim != len(tail) + 1 or array.shape[1:] != tail:
        expected = ", ".join(map(str, tail))
        raise MjArchiveError(f"{what} for the scene must have shape (n, {expected}), not {array.shape}")


def derived_model(source: Any, recipe: dict[str, Any], *, trusted: bool) -> mujoco.MjModel:
    """The replay model a recipe derives from a ModelBundle (`compile_child.apply_recipe`):
    compiled in this process when `trusted`, else in a limited child process."""
    if not trusted:
        return compile_untrusted(source, recipe)
    spec = source.spec()
    try:
        return apply_recipe(spec, recipe).compile()
    except Refused as exc:
        raise BundleError(f"cannot build the replay model: {exc}") from None
    except Exception as exc:  # MuJoCo raises plain ValueError/Exception from attach and compile
        raise BundleError(f"MuJoCo could not build the replay model: {exc}") from None


def build_scene_model(source: Any, plan: ScenePlan, extra_cameras: Sequence[float] = (), *,
                      trusted: bool) -> mujoco.MjModel:
    """The scene model of `plan` for a ModelBundle: a copy per world, then the replay cameras
    (`extra_cameras`: fovy in degrees; ids `ncam - len(extra_cameras) + j`)."""
    return derived_model(source, plan.recipe(extra_cameras), trusted=trusted)


def with_replay_cameras(source: Any, fovys: Sequence[float], *, trusted: bool) -> mujoco.MjModel:
    """The recorded model plus fixed replay cameras `mjarchive-replay-{j}` (fovy in degrees), last
    in camera order; the qpos layout is unchanged."""
    return derived_model(source, {"cameras": [float(f) for f in fovys]}, trusted=trusted)
