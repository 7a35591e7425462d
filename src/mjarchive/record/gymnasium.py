"""Gymnasium wrappers that record MuJoCo envs (single and `SyncVectorEnv`) into an archive.

The frame clock. Gymnasium envs are stepped, not timed, and a reset starts the simulator's clock
again at 0, so the wrappers keep their own monotonic clock, counted in model timesteps and passed
to the Recorder as `time=` (stored frame time = count × `model.opt.timestep`, seconds):

* every `step` advances it by `frame_skip` timesteps (the env's `dt`);
* every event that starts an episode (a `reset`, or a vector step in which a recorded sub-env is
  autoreset) advances it by `max(frame_skip, ceil(r))` timesteps, where `r` is the Recorder's
  timesteps per output frame (`playback_speed / (output_fps × timestep)`). At the env's
  `render_fps` (≈ 1/dt) that is one `dt`: like `gymnasium.wrappers.RecordVideo`, which captures a
  frame after every reset and every step, each reset and each step is one frame. At a lower
  `output_fps` the reset still falls on a render point, so the state right after a reset is always
  the first frame of its episode;
* the clock runs through episodes that `episode_trigger` leaves unrecorded, so frame time tells
  how far into the run (steps and resets since the wrapper was created) a frame was taken.

Frame times therefore increase strictly and never restart; they are a host-side step count, not
any world's `data.time`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.envs.mujoco import MujocoEnv
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv, VectorWrapper

from .._errors import LayoutMismatchError, MjArchiveError
from ..archive.bundle.model_bundle import QposLayout
from ..archive.writer import as_bundle
from .recorder import Recorder

__all__ = ["RecordTrajectory", "RecordVectorTrajectory"]

#: Options the wrappers set from the env; passing them is refused with the reason.
_FROM_ENV = {
    "timestep": "the archive takes the env model's opt.timestep (set env.unwrapped.model.opt.timestep)",
    "n_worlds": "the number of worlds is the number of (selected) envs",
}


def _every_episode(episode_id: int) -> bool:
    return True


def _mujoco_base(env: Any, who: str) -> MujocoEnv:
    """`env.unwrapped`, checked to be a Gymnasium MujocoEnv."""
    if isinstance(env, VectorEnv):
        raise MjArchiveError(f"{who} wraps a single env, got the vector env {env}; use "
                             "mjarchive.gymnasium.RecordVectorTrajectory for vector envs")
    base = getattr(env, "unwrapped", None)
    if not isinstance(base, MujocoEnv):
        spec = getattr(env, "spec", None)
        name = f"{spec.id!r} ({type(base).__name__})" if spec is not None else type(base).__name__
        raise MjArchiveError(
            f"{who} records Gymnasium MuJoCo envs, whose env.unwrapped is a "
            f"gymnasium.envs.mujoco.MujocoEnv (e.g. gymnasium.make('Ant-v5')); {name} is not one. For "
            "another simulator, record its MjData with mjarchive.Recorder"
        )
    return base


def _free_render_contexts(base: MujocoEnv) -> None:
    """Free the env's MjrContexts while their own OpenGL context is current (before `env.close()`).

    Gymnasium's offscreen viewers free their GL context on close but leave the MjrContext to the
    garbage collector, which then deletes its OpenGL objects by name in whatever context is current
    in that thread. When that is another MuJoCo renderer's context (mjarchive replay in the same
    process, say), that renderer loses its framebuffers and renders garbage from then on. Best
    effort: these are Gymnasium internals, stable from 1.0 to 1.4.
    """
    viewers = getattr(getattr(base, "mujoco_renderer", None), "_viewers", None)
    for viewer in list(viewers.values()) if isinstance(viewers, dict) else ():
        con = getattr(viewer, "con", None)
        if con is None:
            continue
        try:
            viewer.make_context_current()
            con.free()
        except Exception:  # a viewer that is already closed or half built: nothing left to protect
            pass


def _check_options(options: dict[str, Any]) -> None:
    for name, why in _FROM_ENV.items():
        if name in options:
            raise MjArchiveError(f"do not pass {name}=: {why}")


def _check_model(compiled: mujoco.MjModel, env_model: mujoco.MjModel, source: str, where: str,
                 given: bool) -> None:
    """Raise LayoutMismatchError when the bundled model cannot stand for the env's model."""
    what = "model=" if given else "the env's MJCF file"
    hint = (f"{what} is not the model the env simulates (it may build or change its model after loading a "
            "file); pass model= the MJCF path or mujoco.MjSpec of the model the env simulates")
    for field in ("nq", "nv", "nmocap", "njnt", "nbody", "ngeom", "ncam"):
        mine, theirs = int(getattr(compiled, field)), int(getattr(env_model, field))
        if mine != theirs:
            raise LayoutMismatchError(f"the model bundled from {source} has {field}={mine}, but {where} "
                                      f"simulates {field}={theirs}; {hint}")
    if QposLayout.from_model(compiled) != QposLayout.from_model(env_model):
        raise LayoutMismatchError(f"the model bundled from {source} names its joints, mocap bodies or "
                                  f"cameras differently from {where}'s model; {hint}")


def _frame_steps(output_fps: float, playback_speed: float, timestep: float) -> int:
    """Timesteps an episode start advances the clock so that it falls on a render point."""
    if not output_fps > 0 or not playback_speed > 0:
        raise MjArchiveError(f"output_fps and playback_speed must be > 0, got {output_fps!r} and {playback_speed!r}")
    # The Recorder's steps per frame, as the same exact fraction (see record/recorder.py).
    r = Fraction(playback_speed / (output_fps * timestep)).limit_denominator(10**6)
    return max(1, math.ceil(r))


class _Tape:
    """The Recorder and the frame clock shared by both wrappers (see the module docstring)."""

    def __init__(self, path: Any, bases: Sequence[MujocoEnv], *, worlds: Any, output_fps: float | None,
                 tracks: Sequence[str], options: dict[str, Any]):
        _check_options(options)
        base = bases[0]
        model = options.pop("model", None)
        timestep = float(base.model.opt.timestep)
        self.frame_skip = int(base.frame_skip)
        for i, b in enumerate(bases):
            where = "the env" if len(bases) == 1 else f"sub-env {i}"
            if float(b.model.opt.timestep) != timestep or int(b.frame_skip) != self.frame_skip:
                raise MjArchiveError(
                    f"{where} steps with timestep {b.model.opt.timestep} × frame_skip {b.frame_skip}, sub-env 0 with "
                    f"{timestep} × {self.frame_skip}; one archive has one frame clock: record differently configured "
                    "envs into separate archives"
                )
            if model is None and os.path.realpath(b.fullpath) != os.path.realpath(base.fullpath):
                raise MjArchiveError(f"{where} loads {b.fullpath}, sub-env 0 loads {base.fullpath}; one archive holds "
                                     "one model: record envs of different models into separate archives")
        bundle = as_bundle(base.fullpath if model is None else model)
        compiled = bundle.compile()
        source = base.fullpath if model is None else (
            str(model) if isinstance(model, (str, os.PathLike)) else f"the given {type(model).__name__}")
        for i, b in enumerate(bases):
            _check_model(compiled, b.model, source, "the env" if len(bases) == 1 else f"sub-env {i}", model is not None)
        if output_fps is None:
            output_fps = base.metadata.get("render_fps") or 1.0 / base.dt
        self.output_fps = float(output_fps)
        self.start_steps = max(self.frame_skip,
                               _frame_steps(self.output_fps, float(options.get("playback_speed", 1.0)), timestep))
        self.timestep = timestep
        options.setdefault("backend", "gymnasium")
        self.recorder = Recorder(path, bundle, worlds=worlds, output_fps=self.output_fps, tracks=tracks,
                                 timestep=timestep, **options)
        self._sel = np.arange(len(bases)) if worlds is None else np.atleast_1d(np.asarray(worlds))
        self.clock: int | None = None  # timesteps since the first event

    def starts_recorded(self, starting: np.ndarray) -> bool:
        """Whether `starting` (an (n_envs,) bool mask) starts an episode of a recorded world."""
        return bool(starting[self._sel].any())

    def event(self, datas: list[mujoco.MjData], starting: np.ndarray, record: bool = True) -> bool:
        """Advance the clock for one reset or step; record a frame if `record` and one is due.

        `starting`: (n_envs,) bool, the envs whose episode starts with the state in `datas`."""
        if self.clock is None:
            self.clock = 0
        else:
            self.clock += self.start_steps if self.starts_recorded(starting) else self.frame_skip
        if not record:
            return False
        return self.recorder.record(datas, reset=starting, time=self.clock * self.timestep)

    def close(self) -> None:
        self.recorder.close()


class RecordTrajectory(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Record a Gymnasium MuJoCo env's trajectory into an mjarchive archive, as world 0.

    `env`: any env whose `env.unwrapped` is a `gymnasium.envs.mujoco.MujocoEnv` (e.g.
    `gymnasium.make("Ant-v5")`). The archive bundles the env's MJCF file (`env.unwrapped.fullpath`;
    pass `model=` an MJCF path or `mujoco.MjSpec` for an env that builds its model otherwise), checked
    against the env's compiled model, and the env model's `opt.timestep` (env kwargs may change it).

    Frames, like `gymnasium.wrappers.RecordVideo`: the state right after each `reset` (marked as the
    start of an episode) and after each `step`, at `output_fps` frames per second of simulated time
    (default: the env's `metadata["render_fps"]`, one frame per step and per reset). `episode_trigger`
    (episode id → bool, ids count resets from 0) picks the episodes to record; default: every one.
    Frame time is the wrapper's own step clock (see `mjarchive.record.gymnasium`): it increases
    strictly across episodes. `tracks` names further MjData fields to store (e.g. `("qvel",)`);
    further keyword arguments go to `mjarchive.Recorder` and `mjarchive.create` (`dtype="float64"`
    for bit-exact replay, `overwrite=True`, `chunk_frames`, `playback_speed`, ...).

    A single env is one world with ID 0 (`worlds=None` or `[0]` are accepted and change nothing).
    The archive is created at the first recorded frame and finalized by `close()`. Only qpos (and
    mocap) is stored: changes the env makes to its model at run time (e.g. randomized colours or
    sizes) and its renderer's options (`visual_options`, `max_geom`) are not replayed. Replay draws
    each recorded qpos exactly; `env.render()` right after `step()` instead draws MuJoCo's derived
    positions, which still belong to the last substep's start (`mujoco.mj_forward` brings them up).

    Example::

        env = RecordTrajectory(gymnasium.make("Ant-v5", max_episode_steps=200), "ant.mjarchive")
        obs, info = env.reset(seed=0)
        for _ in range(1000):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                obs, info = env.reset()
        env.close()
    """

    def __init__(self, env: gym.Env, path: Any, *, output_fps: float | None = None, tracks: Sequence[str] = (),
                 episode_trigger: Callable[[int], bool] | None = None, **recorder_options: Any):
        gym.utils.RecordConstructorArgs.__init__(self, path=path, output_fps=output_fps, tracks=tracks,
                                                 episode_trigger=episode_trigger, _disable_deepcopy=True,
                                                 **recorder_options)
        base = _mujoco_base(env, "RecordTrajectory")
        gym.Wrapper.__init__(self, env)
        worlds = recorder_options.pop("worlds", None)
        if worlds is not None and np.atleast_1d(np.asarray(worlds)).tolist() != [0]:
            raise MjArchiveError(f"a single env is one world with ID 0, got worlds={worlds!r}; to record some envs "
                                 "of a vector env, use RecordVectorTrajectory(envs, path, worlds=[...])")
        self.episode_trigger = _every_episode if episode_trigger is None else episode_trigger
        self.episode_id = -1
        self.recording = False
        self._base = base
        self._tape = _Tape(path, [base], worlds=None, output_fps=output_fps, tracks=tracks,
                           options=dict(recorder_options))
        self._closed = False

    @property
    def recorder(self) -> Recorder:
        """The underlying `mjarchive.Recorder` (its writer exists from the first recorded frame)."""
        return self._tape.recorder

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the env; if `episode_trigger(episode_id)` says so, record its first state."""
        obs, info = super().reset(seed=seed, options=options)
        self.episode_id += 1
        self.recording = bool(self.episode_trigger(self.episode_id))
        self._tape.event([self._base.data], np.ones(1, bool), self.recording)
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step the env; record the new state if this episode is being recorded and a frame is due."""
        result = self.env.step(action)
        self._tape.event([self._base.data], np.zeros(1, bool), self.recording)
        return result

    def close(self) -> None:
        """Close the env, then finalize the archive (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            _free_render_contexts(self._base)
            super().close()
        finally:
            self._tape.close()


def _autoreset_mode(envs: VectorEnv) -> str:
    """"NextStep", "SameStep" or "Disabled" (gymnasium 1.0 has only NEXT_STEP and no metadata tag)."""
    mode = envs.metadata.get("autoreset_mode", getattr(envs.unwrapped, "autoreset_mode", "NextStep"))
    mode = str(getattr(mode, "value", mode))
    if mode not in ("NextStep", "SameStep", "Disabled"):
        raise MjArchiveError(f"unknown vector autoreset mode {mode!r}; expected NextStep, SameStep or Disabled")
    return mode


class RecordVectorTrajectory(VectorWrapper):
    """Record the sub-envs of a Gymnasium `SyncVectorEnv` of MuJoCo envs as the worlds of one archive.

    `envs`: a `gymnasium.vector.SyncVectorEnv` (or `gymnasium.make_vec(..., vectorization_mode="sync")`),
    possibly wrapped, whose sub-envs are `MujocoEnv`s of one model. Sub-env `i` is world ID `i`;
    `worlds` selects the sub-env indices to record (default: all). Each sub-env's episode start is
    marked at the frame that first holds its new episode's state, for each autoreset mode:

    * NEXT_STEP (the default): the `step` after the one that returned terminated or truncated
      resets the sub-env instead of stepping it; that step's frame starts its episode;
    * SAME_STEP: the step that terminates or truncates also resets; its frame starts the episode
      (the terminal state exists only in `info["final_obs"]` and is not recorded);
    * DISABLED: `reset(options={"reset_mask": mask})` resets the masked sub-envs and records a frame
      (the other sub-envs' states repeat their previous frame).

    Every `reset` that resets a recorded sub-env records a frame. The frame clock, `output_fps`,
    `tracks`, `model=` and further options are as for `RecordTrajectory` (one clock for all
    sub-envs, so they must share timestep and frame_skip). `AsyncVectorEnv` is refused: its
    sub-envs' MjData live in other processes.
    """

    def __init__(self, envs: VectorEnv, path: Any, *, worlds: Any = None, output_fps: float | None = None,
                 tracks: Sequence[str] = (), **recorder_options: Any):
        if not isinstance(envs, VectorEnv):
            hint = ("; use RecordTrajectory for a single env" if isinstance(envs, gym.Env) else "")
            raise MjArchiveError(f"RecordVectorTrajectory wraps a gymnasium.vector.VectorEnv, got "
                                 f"{type(envs).__name__}{hint}")
        sync = envs.unwrapped
        if isinstance(sync, AsyncVectorEnv):
            raise MjArchiveError("RecordVectorTrajectory cannot record an AsyncVectorEnv: its sub-envs' MjData "
                                 "live in other processes. Use gymnasium.vector.SyncVectorEnv, or "
                                 "gymnasium.make_vec(..., vectorization_mode='sync')")
        if not isinstance(sync, SyncVectorEnv):
            raise MjArchiveError(f"RecordVectorTrajectory records a gymnasium.vector.SyncVectorEnv of MuJoCo envs, "
                                 f"got {type(sync).__name__}; use gymnasium.make_vec(..., vectorization_mode='sync')")
        super().__init__(envs)
        bases = [_mujoco_base(e, f"RecordVectorTrajectory (sub-env {i})") for i, e in enumerate(sync.envs)]
        if worlds is not None:
            sel = np.atleast_1d(np.asarray(worlds))
            if sel.dtype.kind not in "iu" or sel.ndim != 1 or not sel.size or sel.min() < 0 or sel.max() >= len(bases):
                raise MjArchiveError(f"worlds must be sub-env indices in [0, {len(bases)}), got {worlds!r}")
        self._bases = bases
        self._mode = _autoreset_mode(envs)
        # options["reset_mask"] (partial reset) arrived with the autoreset modes, in gymnasium 1.1.
        self._partial_reset = hasattr(sync, "autoreset_mode")
        self._pending = np.zeros(len(bases), bool)  # NEXT_STEP: reset by the next step
        self._tape = _Tape(path, bases, worlds=worlds, output_fps=output_fps, tracks=tracks,
                           options=dict(recorder_options))
        self._closed = False

    @property
    def recorder(self) -> Recorder:
        """The underlying `mjarchive.Recorder`."""
        return self._tape.recorder

    def _datas(self) -> list[mujoco.MjData]:
        return [b.data for b in self._bases]

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs (or those in `options["reset_mask"]`) and record a frame."""
        mask = None
        if self._partial_reset and options is not None and options.get("reset_mask") is not None:
            mask = np.array(options["reset_mask"], dtype=bool)  # SyncVectorEnv pops it from `options`
        obs, info = self.env.reset(seed=seed, options=options)
        starting = np.ones(len(self._bases), bool) if mask is None else mask
        self._pending[starting] = False
        if self._tape.starts_recorded(starting):  # a partial reset of unrecorded sub-envs adds no frame
            self._tape.event(self._datas(), starting)
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step all sub-envs and record a frame when one is due, marking the sub-envs whose episode
        starts at this step (per the autoreset mode)."""
        starting = self._pending.copy() if self._mode == "NextStep" else np.zeros(len(self._bases), bool)
        result = self.env.step(actions)
        done = np.logical_or(np.asarray(result[2]), np.asarray(result[3])).astype(bool).reshape(-1)
        if self._mode == "NextStep":
            self._pending = done
        elif self._mode == "SameStep":
            starting = done
        self._tape.event(self._datas(), starting)
        return result

    def close(self, **kwargs: Any) -> None:
        """Close the envs, then finalize the archive (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            for base in self._bases:
                _free_render_contexts(base)
            super().close(**kwargs)
        finally:
            self._tape.close()
