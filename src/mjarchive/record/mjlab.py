"""mjlab: record a `ManagerBasedRlEnv` while it trains or plays (`mjarchive.mjlab.RecordTrajectory`).

Wraps the env the way mjlab's own `VideoRecorder` does (a `ManagerBasedRlEnv` that hands every
other attribute to the env it wraps), so `RslRlVecEnvWrapper` and the runner see the env they
expect. After each `step()` (and the first `reset()`) the selected envs' `qpos` and mocap poses
are gathered on the env's device by torch and only their rows reach the host (the array path of
`mjarchive.Recorder`). A frame is kept every `k` env steps, the fewest steps whose rate is at most
the requested `fps` (default: every step, as mjlab's video). Time is the env's step count ×
`step_dt`, on the host: no device synchronization per step. Resets come from the env's own
signals: `reset_buf` after an auto-reset step, the ids given to `reset()`, and any env whose
`episode_length_buf` did not grow (reset by someone else, e.g. mjlab's viewer); the first recorded
frame after a reset starts a new episode, so no frame spans two episodes. The model is the env's
scene spec (`env.scene.spec`) with each entity's mesh and texture files (an attached robot's files
are relative to its own XML), bundled bit-exactly where the installed MuJoCo can write an MjSpec as
written (3.16 and later; before: its compiled values, see `ModelBundle.written_as`, and textures
built from pixel buffers are dropped, which MuJoCo before 3.16 cannot write).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from mjlab.envs import ManagerBasedRlEnv
from mjlab.utils.xml import strip_buffer_textures

from .._errors import BundleError, MjArchiveError
from ..archive.bundle.model_bundle import ModelBundle
from .recorder import Recorder

__all__ = ["RecordTrajectory", "default_env_ids", "scene_bundle"]

_TRACK_RE = re.compile(r"[^a-z0-9_]")


def default_env_ids(env: ManagerBasedRlEnv) -> list[int]:
    """The envs mjlab's viewer and video show: `viewer.env_idx` (clamped) and the `max_extra_envs`
    envs whose origins are nearest to it."""
    viewer = getattr(env.cfg, "viewer", None)
    n = int(env.num_envs)
    first = min(max(int(getattr(viewer, "env_idx", 0)), 0), n - 1)
    extra = max(int(getattr(viewer, "max_extra_envs", 2)), 0)
    origins = torch.as_tensor(env.scene.env_origins, dtype=torch.float64).cpu().reshape(n, -1)
    distance = ((origins - origins[first]) ** 2).sum(dim=1)
    distance[first] = -1.0  # itself first, even where origins coincide
    nearest = torch.argsort(distance, stable=True)[:extra + 1]
    return sorted(int(i) for i in nearest)


def scene_bundle(env: ManagerBasedRlEnv) -> ModelBundle:
    """The env's scene as a bundle: its spec, with each attached entity's files (relative to that
    entity's own XML and mesh/texture directory) read into the spec's assets under unique names."""
    spec = env.scene.spec.copy()
    assets = dict(spec.assets)
    by_name: dict[tuple[str, str], str] = {}  # (kind, element name) -> absolute file
    for entity in env.scene.entities.values():
        child = getattr(entity, "spec", None)
        if child is None:
            continue
        base_dir = child.modelfiledir or ""
        for kind, elements, directory in (("mesh", child.meshes, child.meshdir), ("hfield", child.hfields, child.meshdir),
                                          ("skin", child.skins, child.meshdir),
                                          ("texture", child.textures, child.texturedir)):
            for element in elements:
                if element.name and element.file:
                    by_name[kind, element.name] = os.path.join(base_dir, directory or "", element.file)
    for kind, elements in (("mesh", spec.meshes), ("hfield", spec.hfields), ("skin", spec.skins),
                           ("texture", spec.textures)):
        for element in elements:
            path = by_name.get((kind, element.name))
            if element.file and path is not None and os.path.isfile(path):
                key = f"{element.name}/{os.path.basename(element.file)}"
                with open(path, "rb") as f:
                    assets[key] = f.read()
                element.file = key
    spec.assets = assets
    try:
        return ModelBundle.from_spec(spec)
    except BundleError as exc:
        if "buffer texture" not in str(exc):
            raise
        strip_buffer_textures(spec)  # MuJoCo before 3.16 cannot write textures made from pixels
        return ModelBundle.from_spec(spec)


def command_track(name: str) -> str:
    """The track name of command term `name` (`command_` + its name in lower case, `_` for others)."""
    return ("command_" + _TRACK_RE.sub("_", name.lower()))[:64]


class RecordTrajectory(ManagerBasedRlEnv):
    """Record envs of an mjlab `ManagerBasedRlEnv` into an mjarchive archive.

    `env_ids`: the envs recorded (default: those mjlab's video and viewer show, see
    `default_env_ids`); they keep their index as world ID. `fps`: frames per second of simulated
    time at most (default: every env step, 1 / step_dt). `actions`, `rewards`: also record the
    action the policy gave (`action`, (action_dim,): mjlab's `action_manager.action`, which it
    zeroes when an env resets, so 0 on a frame right after a reset) and the step's reward
    (`reward`, (): on a frame right after an auto-reset, the terminal step's; 0 on the first
    frame); `commands`: command terms recorded as tracks `command_<name>`. Other keyword arguments go to
    `mjarchive.create` (e.g. `dtype="float64"`, `chunk_frames`). Close it (or the env wrapping it)
    to finalize the archive; frames up to the last commit survive a crash either way.
    """

    def __init__(self, env: ManagerBasedRlEnv, path: Any, *, env_ids: Iterable[int] | None = None,
                 fps: float | None = None, actions: bool = False, rewards: bool = False,
                 commands: Sequence[str] = (), **create_kwargs: Any):
        if not isinstance(env, ManagerBasedRlEnv):
            raise MjArchiveError(f"RecordTrajectory wraps an mjlab ManagerBasedRlEnv (got {type(env).__name__}); wrap it "
                                 "before the RSL-RL wrapper: env = RslRlVecEnvWrapper(RecordTrajectory(env, path))")
        # Like mjlab's VideoRecorder: no super().__init__(), the wrapped env holds the state.
        self._wrapped_env = env
        base = env.unwrapped
        ids = default_env_ids(base) if env_ids is None else [int(i) for i in env_ids]
        bad = [i for i in ids if not 0 <= i < base.num_envs]
        if not ids or bad or len(set(ids)) != len(ids):
            raise MjArchiveError(f"env_ids must be distinct envs of 0..{base.num_envs - 1}, got {ids[:16]}")
        step_dt = float(base.step_dt)
        if fps is not None and not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise MjArchiveError(f"fps must be a positive number of frames per second, got {fps!r}")
        self.steps_per_frame = 1 if fps is None else max(1, math.ceil(round(1.0 / (fps * step_dt), 9)))
        known = list(getattr(base.command_manager, "active_terms", []))
        missing = [c for c in commands if c not in known]
        if missing:
            raise MjArchiveError(f"no command term {missing[0]!r} in this env; its command terms: {known}")
        self._commands = {command_track(c): c for c in commands}
        tracks: dict[str, Any] = {}
        if actions:
            tracks["action"] = (int(base.action_manager.total_action_dim),)
        if rewards:
            tracks["reward"] = ()
        for track, term in self._commands.items():
            tracks[track] = tuple(base.command_manager.get_command(term).shape[1:])
        self._actions, self._rewards = actions, rewards
        self._time_step = step_dt
        self._lengths = None  # episode_length_buf at the last call: an env whose count did not grow was reset
        self.recorder = Recorder(
            path, scene_bundle(base), worlds=ids, n_worlds=base.num_envs,
            output_fps=1.0 / (self.steps_per_frame * step_dt), tracks=tracks,
            timestep=float(base.physics_dt), **create_kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped_env, name)

    @property
    def unwrapped(self) -> ManagerBasedRlEnv:
        return self._wrapped_env.unwrapped

    @property
    def env_ids(self) -> list[int]:
        return [int(i) for i in self.recorder.world_ids]

    def reset(self, *args: Any, env_ids: Any = None, **kwargs: Any) -> Any:
        out = self._wrapped_env.reset(*args, env_ids=env_ids, **kwargs)
        base = self.unwrapped
        mask = torch.zeros(base.num_envs, dtype=torch.bool, device=base.device)
        if env_ids is None:
            mask[:] = True
        else:
            mask[torch.as_tensor(env_ids, dtype=torch.long, device=base.device)] = True
        self._lengths = base.episode_length_buf.clone()
        self._record(mask)  # the first state is a frame; later, the mask waits for the next frame
        return out

    def step(self, action: torch.Tensor) -> Any:
        out = self._wrapped_env.step(action)
        base = self.unwrapped
        # Auto-reset envs were reset inside step(); without auto-reset the caller's reset() says so;
        # an env reset elsewhere (mjlab's viewer, a direct unwrapped.reset) counts from 0 again.
        lengths = base.episode_length_buf
        reset = base.reset_buf if base.cfg.auto_reset else None
        if self._lengths is not None:
            restarted = lengths <= self._lengths
            reset = restarted if reset is None else reset | restarted
        self._lengths = lengths.clone()
        self._record(reset)
        return out

    def _record(self, reset: torch.Tensor | None) -> None:
        """Offer the recorder this state: it keeps a frame when its clock says so (the recorder
        gathers nothing on other calls) and keeps `reset` for the next frame either way."""
        base = self.unwrapped
        data = base.sim.data
        arrays = {"qpos": data.qpos[:]}
        if base.sim.mj_model.nmocap:
            arrays["mocap_pos"], arrays["mocap_quat"] = data.mocap_pos[:], data.mocap_quat[:]
        if self._actions:
            arrays["action"] = base.action_manager.action
        if self._rewards:  # before the first step (the state after reset()) no reward was computed: 0
            arrays["reward"] = getattr(base, "reward_buf", None)
            if arrays["reward"] is None:
                arrays["reward"] = torch.zeros(base.num_envs, device=base.device)
        for track, term in self._commands.items():
            arrays[track] = base.command_manager.get_command(term)
        self.recorder.record(reset=reset, time=base.common_step_counter * self._time_step, **arrays)

    def close(self) -> None:
        try:
            self.recorder.close()
        finally:
            self._wrapped_env.close()
