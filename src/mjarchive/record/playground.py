"""MuJoCo Playground: record jitted, scanned rollouts of its MJX envs (`mjarchive.playground`).

Playground steps many worlds with `jax.lax.scan` inside `jit` and hands back the stacked states,
leading dimensions (steps, nworld). `PlaygroundRecorder` is a `Recorder` set up from the env, so a
scan loop adds `record_state` after `reset` and `record_rollout` after each scanned chunk:

* Model: the env's MJCF (`env.xml_path`, its includes and assets read beside it) with the env's
  `opt.timestep` (Playground sets it to `sim_dt` after compiling), checked against `env.mj_model`:
  a different structure (an env that builds its model in code) is refused, different values (one
  that edits its compiled model) are warned about, by field; `model=` gives the model instead.
* Clock: control steps on the host, so no device read: the archive's timestep is the env step
  (`env.dt` × the `EpisodeWrapper`'s `action_repeat`), a rollout's rows are the states after steps
  `steps + 1 ... steps + T`, and a `record_state` after earlier states counts as one more step.
  Frame times thus count env steps since the first recorded state; a world's own `data.time`
  restarts at its resets and is not the clock.
* Resets: Playground's `BraxAutoResetWrapper` (and Brax's `AutoResetWrapper`) returns a done
  world's reset state in the very step that ended its episode, with `done = 1`: so `done[t]` marks
  the first state of a new episode at step t, the recorder's reset mask. Without such a wrapper
  `done` marks a terminal state, not a reset, and is not used.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from mujoco_playground import wrapper as playground_wrapper  # first: a missing Playground is named as such
from brax.envs.wrappers.training import AutoResetWrapper  # noqa: I001  (Brax comes with Playground)

from .._errors import AppendError, BundleError, MjArchiveError
from ..archive.bundle.model_bundle import ModelBundle
from ..archive.writer import ArchiveWriter
from .recorder import Recorder

__all__ = ["PlaygroundRecorder", "env_bundle", "env_step_dt", "model_differences"]

_AUTO_RESET = (playground_wrapper.BraxAutoResetWrapper, AutoResetWrapper)


def _chain(env: Any) -> list[Any]:
    """The env and every env it wraps (Playground and Brax wrappers keep theirs in `.env`)."""
    chain = [env]
    while len(chain) < 64:
        inner = vars(chain[-1]).get("env")  # not getattr: wrappers forward unknown attributes inward
        if inner is None:
            break
        chain.append(inner)
    return chain


def env_step_dt(env: Any) -> float:
    """Seconds of simulated time per `env.step`: the control step `env.dt` times the action repeat
    of any Brax `EpisodeWrapper` in the chain."""
    repeat = math.prod(int(vars(e).get("action_repeat", 1)) for e in _chain(env))
    return float(env.dt) * repeat


def _auto_resets(env: Any) -> bool:
    return any(isinstance(e, _AUTO_RESET) for e in _chain(env))


def model_differences(model: mujoco.MjModel, reference: mujoco.MjModel) -> tuple[list[str], list[str]]:
    """(sizes, values): the size fields (`nq`, `ngeom`, ...) and the array and `opt` fields in which
    `model` differs from `reference`, bit for bit (NaN equal to NaN). The arena size (`narena`: Data
    memory, which a replay may raise) is no part of the model compared."""
    sizes, values = [], []
    for name in dir(reference):
        if name.startswith("_") or name == "narena":
            continue
        ref = getattr(reference, name)
        if isinstance(ref, int) and name.startswith("n"):
            if getattr(model, name) != ref:
                sizes.append(name)
        elif isinstance(ref, np.ndarray):
            got = getattr(model, name)
            if got.shape != ref.shape or not np.array_equal(got, ref, equal_nan=ref.dtype.kind == "f"):
                values.append(name)
    for name in dir(reference.opt):
        ref = getattr(reference.opt, name)
        if not name.startswith("_") and isinstance(ref, (int, float, np.ndarray)):
            if not np.array_equal(getattr(model.opt, name), ref):
                values.append(f"opt.{name}")
    return sizes, values


def env_bundle(env: Any) -> ModelBundle:
    """The env's model as a bundle: `env.xml_path` with its includes and assets (files beside it,
    else `env.model_assets`) and `env.mj_model.opt.timestep`, checked against `env.mj_model`.

    Raises BundleError when the structure differs (the env builds its model in code); warns, naming
    the fields, when values differ (the env edits its compiled model). Either way `model=` on
    `PlaygroundRecorder` gives the model to record instead."""
    mj_model = env.mj_model
    path = Path(env.xml_path)
    try:
        bundle = ModelBundle.from_file(path)
    except BundleError:  # an XML whose files only the env's asset table holds
        bundle = ModelBundle.from_xml(path.read_text(), getattr(env, "model_assets", None))
    if bundle.compile().opt.timestep != mj_model.opt.timestep:  # Playground sets sim_dt after compiling
        spec = bundle.spec()
        spec.option.timestep = mj_model.opt.timestep
        bundle = ModelBundle.from_spec(spec)
    sizes, values = model_differences(bundle.compile(), mj_model)
    name = type(env.unwrapped).__name__
    if sizes:
        raise BundleError(f"{path.name} compiles to another model than {name}'s env.mj_model ({', '.join(sizes)} "
                          "differ): the env builds its model in code. Pass the model it compiles: "
                          "PlaygroundRecorder(path, env, model=<MJCF path, MjSpec or ModelBundle>)")
    if values:
        warnings.warn(f"the recorded model ({path.name}) differs from {name}'s env.mj_model in "
                      f"{', '.join(values[:8])}{' ...' if len(values) > 8 else ''}: the env edits its model "
                      "after compiling it, and replays show the file's values. Pass model= to record another",
                      stacklevel=3)
    return bundle


class PlaygroundRecorder(Recorder):
    """Record a MuJoCo Playground env's scanned rollouts into an archive.

    `env`: a Playground `MjxEnv`, bare or wrapped (`wrapper.wrap_for_brax_training`, Brax
    wrappers). `worlds`: batch indices to record (default all). Frames are kept at `output_fps`
    frames per second of simulated time (× `playback_speed`), on the env-step grid. `model`: what
    to record instead of the env's own model (see `env_bundle`). Further keyword arguments go to
    `mjarchive.Recorder` and `mjarchive.create` (`tracks=("qvel",)`, `{"reward": ()}`,
    `dtype="float64"`, `overwrite=True`, ...). `steps` is the env steps recorded so far.

    Example::

        rec = PlaygroundRecorder("run.mjarchive", env, worlds=[0, 1])
        state = jax.jit(env.reset)(jax.random.split(key, 64))
        rec.record_state(state)                         # the reset pose: the first frame
        for _ in range(10):
            state, states = rollout(state)              # jax.lax.scan over env.step
            rec.record_rollout(states)
        rec.close()
    """

    def __init__(self, path: Any, env: Any, *, worlds: Any = None, output_fps: float = 30.0,
                 playback_speed: float = 1.0, model: Any = None, **kwargs: Any):
        if "timestep" in kwargs:
            raise MjArchiveError("PlaygroundRecorder takes the timestep from the env (env.dt × action_repeat); "
                                 "to record on another grid use mjarchive.Recorder with time=")
        self.env = env
        self.step_dt = env_step_dt(env)
        self.steps = 0
        self._at_steps = False  # a state at `steps` was recorded: the next record_state is a step later
        self._auto_reset = _auto_resets(env)
        if isinstance(path, ArchiveWriter) and not math.isclose(path.manifest.timestep, self.step_dt):
            raise MjArchiveError(f"the archive's timestep is {path.manifest.timestep} s, the env steps "
                                 f"{self.step_dt} s; append with a Recorder of the archive's own cadence")
        impl = getattr(getattr(env.mjx_model, "impl", None), "value", "jax")
        kwargs.setdefault("backend", "mjx" if impl == "jax" else f"mjx-{impl}")
        if model is None and not isinstance(path, ArchiveWriter):  # a writer holds its model already
            model = env_bundle(env)
        super().__init__(path, model, worlds=worlds, output_fps=output_fps, playback_speed=playback_speed,
                         timestep=self.step_dt, **kwargs)

    def record_rollout(self, rollout: Any = None, *, reset: Any = None, **arrays: Any) -> int:
        """Record the stacked states of `jax.lax.scan` over `env.step` (a State, or its MJX Data, of
        leading dimensions (steps, nworld)); returns the frames recorded. Arrays named as tracks
        (e.g. `reward=states.reward`, (steps, nworld)) join the State's fields. `reset` (steps,
        nworld): default the auto-reset wrapper's `done` (none without such a wrapper)."""
        if "time" in arrays:
            raise MjArchiveError("PlaygroundRecorder keeps the clock itself (env steps × step_dt); use "
                                 "mjarchive.Recorder.record_rollout to give time=")
        fields = self._fields(rollout, arrays)
        shape = tuple(fields["qpos"].shape)
        if len(shape) == 2:
            raise AppendError(f"qpos has shape {shape}: one state per world, no step axis; record a state "
                              "(e.g. env.reset's) with rec.record_state(state)")
        if len(shape) != 3:
            raise AppendError(f"qpos has shape {shape}; a rollout's qpos is (steps, nworld, nq)")
        steps, nworld = shape[:2]
        if reset is None:
            done = getattr(rollout, "done", None)
            reset = done if self._auto_reset and done is not None else np.zeros((steps, nworld), bool)
        times = (self.steps + np.arange(1, steps + 1)) * self.step_dt
        clock = self._cadence.clock
        try:
            return super().record_rollout(time=times, reset=reset, **fields)
        finally:
            if self._cadence.clock != clock:  # the steps were taken, even if the writer refused a frame
                self.steps += steps
                self._at_steps = True

    def record_state(self, state: Any, *, reset: Any = True, **arrays: Any) -> bool:
        """Record one state per world (leading dimension nworld), e.g. `env.reset`'s; returns whether
        it became a frame (the first state always does). `reset`: True (every world starts an episode
        here: a fresh `env.reset`), False, or a mask over the worlds (nworld,). After earlier states
        it counts as one more env step."""
        fields = self._fields(state, arrays)
        shape = tuple(fields["qpos"].shape)
        if len(shape) != 2:
            raise AppendError(f"qpos has shape {shape}; record_state takes one state per world, (nworld, nq) "
                              "(a scanned rollout goes to record_rollout)")
        mask = np.asarray(reset)
        if mask.shape not in ((), shape[:1]):
            raise AppendError(f"reset has shape {mask.shape}; pass True, False or a mask over the worlds, "
                              f"({shape[0]},)")
        fields = {name: a[None] for name, a in fields.items()}
        step = self.steps + 1 if self._at_steps else self.steps
        clock = self._cadence.clock
        try:
            n = super().record_rollout(time=np.array([step * self.step_dt]),
                                       reset=np.broadcast_to(mask, (1, shape[0])), **fields)
        finally:
            if self._cadence.clock != clock:  # the step was taken, even if the writer refused the frame
                self.steps, self._at_steps = step, True
        return n == 1

    def _fields(self, state: Any, arrays: dict[str, Any]) -> dict[str, Any]:
        """The recorded fields: those of `state.data` (or an MJX Data), then the named arrays."""
        if state is None:
            if "qpos" not in arrays:
                raise AppendError("pass the stacked State of a scanned rollout (or qpos=... and the other fields)")
            return arrays
        data = getattr(state, "data", state)
        if not hasattr(data, "qpos"):
            raise AppendError(f"expected a Playground State or an MJX Data, got {type(state).__name__}")
        fields = {name: getattr(data, name) for name in self._field_shapes()
                  if name not in arrays and hasattr(data, name)}
        return {**fields, **arrays}
