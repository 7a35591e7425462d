"""`mjarchive demo`: simulate a real model in many worlds, record it, then render from the archive.

Models come from the test data shipped inside the installed `mujoco_warp` package: the humanoid
(random smoothed controls, reset when its torso falls below 0.75 m) and the ALOHA scene with a pot
(scripted sinusoidal arm motions from the neutral keyframe, each world reset every 4 s with a
per-world offset). Simulation runs on MuJoCo (a list of MjData, one per world) or MuJoCo Warp
(one `mujoco_warp.Data` with `nworld` worlds).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import sys
import time as _time
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import BackendError, MjArchiveError
from .info import archive_info, format_info

__all__ = ["run_demo", "DemoResult", "DEMO_MODELS"]


@dataclasses.dataclass(frozen=True)
class _DemoModel:
    path: str  # inside mujoco_warp/test_data
    camera: str  # the camera the demo renders
    keyframe: int | None  # initial state; None: the model's qpos0


DEMO_MODELS = {
    "humanoid": _DemoModel("humanoid/humanoid.xml", "side", None),
    "aloha": _DemoModel("aloha_pot/scene.xml", "overhead_cam", 0),
}
HUMANOID_FALL_HEIGHT = 0.75  # m: torso (free joint) height below which a humanoid counts as fallen
ALOHA_EPISODE_S = 4.0


@dataclasses.dataclass
class DemoResult:
    """Where `run_demo` put everything."""

    archive: Path
    videos: list[Path]
    contact_sheet: Path
    model_xml: Path
    rendered_worlds: list[int]


def model_path(name: str) -> Path:
    """The MJCF file of a demo model inside the installed mujoco_warp package."""
    if name not in DEMO_MODELS:
        raise MjArchiveError(f"unknown demo model {name!r}; choose one of {sorted(DEMO_MODELS)}")
    try:
        root = Path(str(importlib.resources.files("mujoco_warp") / "test_data"))
    except ModuleNotFoundError:
        raise BackendError("the demo models ship with mujoco_warp; install them with: pip install 'mjarchive[all]'") from None
    path = root / DEMO_MODELS[name].path
    if not path.is_file():
        raise BackendError(f"{path} is missing from the installed mujoco_warp; reinstall it (pip install -U mujoco-warp)")
    return path


class _Controller:
    """Controls and reset decisions for all worlds, vectorized over worlds (host side, NumPy)."""

    def __init__(self, name: str, model: mujoco.MjModel, n_worlds: int, rng: np.random.Generator):
        self.name, self.model, self.rng = name, model, rng
        lo, hi = model.actuator_ctrlrange.T.copy()
        self.lo, self.hi = lo, hi
        self.ctrl = np.zeros((n_worlds, model.nu))
        if name == "aloha":
            self.center = model.key_ctrl[0].copy() if model.nkey else (lo + hi) / 2
            amp = np.minimum(0.45, (hi - lo) / 2)
            gripper = (hi - lo) < 0.1
            amp[gripper] = (hi - lo)[gripper] / 2
            self.center[gripper] = ((hi + lo) / 2)[gripper]
            self.amp = amp * rng.uniform(0.4, 1.0, (n_worlds, model.nu))
            self.freq = rng.uniform(0.15, 0.6, (n_worlds, model.nu))  # Hz
            self.phase = rng.uniform(0, 2 * np.pi, (n_worlds, model.nu))
            # Staggered episode clocks, so worlds reset at different frames.
            self.episode_start = -rng.uniform(0, ALOHA_EPISODE_S, n_worlds)
        else:
            self.target = np.zeros_like(self.ctrl)
            self.scale = rng.uniform(0.05, 0.4, n_worlds)[:, None]  # some worlds flail more than others

    def controls(self, t: float, step: int) -> np.ndarray:
        if self.name == "aloha":
            local = t - self.episode_start
            self.ctrl = self.center + self.amp * np.sin(2 * np.pi * self.freq * local[:, None] + self.phase)
        else:
            if step % 20 == 0:  # a new random target every 20 steps (0.1 s); controls follow it smoothly
                self.target = self.rng.uniform(self.lo, self.hi, self.ctrl.shape) * self.scale
            self.ctrl += 0.2 * (self.target - self.ctrl)
        return np.clip(self.ctrl, self.lo, self.hi)

    def resets(self, t: float, torso_z: np.ndarray | None) -> np.ndarray:
        """Boolean mask of worlds to reset now."""
        if self.name == "aloha":
            mask = t - self.episode_start >= ALOHA_EPISODE_S
            self.episode_start[mask] = t
            return mask
        mask = torso_z < HUMANOID_FALL_HEIGHT
        self.ctrl[mask] = 0.0
        return mask


def _initial_state(model: mujoco.MjModel, data: mujoco.MjData, keyframe: int | None, rng: np.random.Generator | None) -> None:
    if keyframe is not None and model.nkey > keyframe:
        mujoco.mj_resetDataKeyframe(model, data, keyframe)
    else:
        mujoco.mj_resetData(model, data)
    if rng is not None and keyframe is None:  # small joint noise so worlds differ from the start
        free = model.jnt_type == mujoco.mjtJoint.mjJNT_FREE
        start = 7 if free.any() and model.jnt_qposadr[np.argmax(free)] == 0 else 0
        data.qpos[start:] += rng.uniform(-0.05, 0.05, model.nq - start)
        data.qvel[:] = rng.normal(0, 0.1, model.nv)


def _simulate_cpu(model: mujoco.MjModel, spec: _DemoModel, ctl: _Controller, recorder: Any, n_worlds: int,
                  n_steps: int, bar: Any, rng: np.random.Generator) -> int:
    datas = [mujoco.MjData(model) for _ in range(n_worlds)]
    for d in datas:
        _initial_state(model, d, spec.keyframe, rng)
        mujoco.mj_forward(model, d)
    dt = model.opt.timestep
    resets_total = 0
    reset = np.zeros(n_worlds, bool)
    for step in range(n_steps):
        t = step * dt
        recorder.record(datas, reset=reset, time=t)  # the state at time t, before stepping on
        ctrl = ctl.controls(t, step)
        for d, c in zip(datas, ctrl):
            d.ctrl[:] = c
            mujoco.mj_step(model, d)
        torso = np.array([d.qpos[2] for d in datas]) if ctl.name == "humanoid" else None
        reset = ctl.resets(t + dt, torso)
        for i in np.nonzero(reset)[0]:
            _initial_state(model, datas[i], spec.keyframe, rng)
            mujoco.mj_forward(model, datas[i])
        resets_total += int(reset.sum())
        bar.update(1)
    recorder.record(datas, reset=reset, time=n_steps * dt)
    return resets_total


def _simulate_warp(model: mujoco.MjModel, spec: _DemoModel, ctl: _Controller, recorder: Any, n_worlds: int,
                   n_steps: int, bar: Any) -> int:
    try:
        import warp as wp

        wp.config.quiet = True  # before Warp initializes: no banner, no per-kernel log lines
        if hasattr(wp, "LOG_WARNING"):
            wp.config.log_level = wp.LOG_WARNING
        import mujoco_warp as mjw
    except ImportError as exc:
        raise BackendError(f"--backend warp needs MuJoCo Warp: {exc}; pip install 'mjarchive[warp]'") from None
    mjd = mujoco.MjData(model)
    _initial_state(model, mjd, spec.keyframe, None)
    mujoco.mj_forward(model, mjd)
    print(f"mjarchive demo: MuJoCo Warp on device {wp.get_device()} (the first step compiles kernels, "
          "which can take a minute)", file=sys.stderr)
    m = mjw.put_model(model)
    # A flailing humanoid hits the solver's line-search limit now and then; that is harmless here.
    m.opt.warn_overflow &= ~int(mjw.OverflowType.LS_ITERATIONS)
    d = mjw.put_data(model, mjd, nworld=n_worlds, nconmax=64 * n_worlds, njmax=256 * n_worlds)
    dt = model.opt.timestep
    resets_total = 0
    reset = np.zeros(n_worlds, bool)
    for step in range(n_steps):
        t = step * dt
        recorder.record(d, reset=reset, time=t)
        d.ctrl.assign(ctl.controls(t, step).astype(np.float32))
        mjw.step(m, d)
        torso = d.qpos.numpy()[:, 2] if ctl.name == "humanoid" else None  # one column is all it needs
        reset = ctl.resets(t + dt, torso)
        if reset.any():
            if spec.keyframe is not None:
                keys = np.where(reset, spec.keyframe, -1).astype(np.int32)
                mjw.reset_data_keyframe(m, d, wp.array(keys, dtype=wp.int32, device=d.qpos.device))
            else:
                mjw.reset_data(m, d, reset=wp.array(reset, dtype=bool, device=d.qpos.device))
            mjw.forward(m, d)
        resets_total += int(reset.sum())
        bar.update(1)
    recorder.record(d, reset=reset, time=n_steps * dt)
    return resets_total


def _pick_worlds(archive: Any, name: str) -> tuple[list[int], str]:
    """Two worlds worth watching, and why they were chosen."""
    ids = list(archive.world_ids)
    if len(ids) == 1:
        return ids, "the only world"
    episodes = archive.episode_counts() - 1  # resets per world (frame 0 is not one)
    if name == "humanoid":
        most, least = int(np.argmax(episodes)), int(np.argmin(episodes))
        if most == least:
            least = (most + 1) % len(ids)
        return [ids[least], ids[most]], (f"world {ids[least]} fell least often ({episodes[least]}×), "
                                         f"world {ids[most]} most often ({episodes[most]}×)")
    return [ids[0], ids[-1]], "the first and the last world"


def run_demo(out: str | os.PathLike = "mjarchive-demo", *, model: str = "humanoid", n_worlds: int = 64,
             seconds: float = 10.0, backend: str = "cpu", size: tuple[int, int] = (240, 320),
             quality: str = "fast", workers: int | None = None, progress: bool = True, seed: int = 0) -> DemoResult:
    """Simulate `n_worlds` worlds of a demo model for `seconds` of simulated time, record them into
    `out/demo.mjarchive`, render two worlds to `out/videos/*.mp4`, write `out/contact_sheet.png`
    and export the bundled model to `out/model/`. Prints a summary; returns the paths."""
    from tqdm.auto import tqdm

    import mjarchive

    from .preview import contact_sheet

    if n_worlds < 1:
        raise MjArchiveError("--worlds must be at least 1")
    if not 0 < seconds <= 3600:
        raise MjArchiveError("--seconds must be in (0, 3600]")
    if backend not in ("cpu", "warp"):
        raise MjArchiveError(f"unknown backend {backend!r}; choose 'cpu' or 'warp'")
    spec = DEMO_MODELS.get(model)
    xml = model_path(model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    archive_path = out / "demo.mjarchive"
    mj_model = mujoco.MjModel.from_xml_path(str(xml))
    n_steps = int(round(seconds / mj_model.opt.timestep))
    rng = np.random.default_rng(seed)
    ctl = _Controller(model, mj_model, n_worlds, rng)
    say = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)

    say(f"mjarchive demo: {model} ({xml}), {n_worlds} worlds × {seconds:g} s simulated on "
        f"{'MuJoCo Warp' if backend == 'warp' else 'MuJoCo (CPU)'}; recording to {archive_path}")
    t0 = _time.perf_counter()
    with mjarchive.Recorder(archive_path, xml, output_fps=30, tracks=("ctrl",), overwrite=True,
                            backend="mujoco_warp" if backend == "warp" else "mujoco") as recorder, \
            tqdm(total=n_steps, unit="step", desc="simulate + record", disable=not progress) as bar:
        if backend == "warp":
            n_resets = _simulate_warp(mj_model, spec, ctl, recorder, n_worlds, n_steps, bar)
        else:
            n_resets = _simulate_cpu(mj_model, spec, ctl, recorder, n_worlds, n_steps, bar, rng)
    t_sim = _time.perf_counter() - t0

    with mjarchive.open(archive_path) as archive:
        info = archive_info(archive, sizes=True)
        worlds, why = _pick_worlds(archive, model)
        say(f"recorded {archive.n_frames} frames × {archive.n_worlds} worlds in {t_sim:.1f} s "
            f"({n_resets} resets); rendering worlds {worlds}: {why}")
        t0 = _time.perf_counter()
        videos = mjarchive.render(archive, out / "videos", worlds=worlds, cameras=[spec.camera], size=size,
                                  quality=quality, workers=workers, progress=progress)
        sheet = contact_sheet(archive, out / "contact_sheet.png", worlds=list(archive.world_ids[:4]),
                              camera=spec.camera, size=(120, 160), quality=quality)
        t_render = _time.perf_counter() - t0
        model_xml = archive.bundle.export(out / "model")

    print(format_info(info))
    print()
    print(f"archive        {archive_path}")
    for v in videos:
        print(f"video          {v}")
    print(f"contact sheet  {sheet}")
    print(f"model          {model_xml}")
    print(f"timing         simulate + record {t_sim:.1f} s, render + contact sheet {t_render:.1f} s")
    print()
    print("next:")
    print(f"  mjarchive info {archive_path}")
    print(f"  mjarchive verify {archive_path}")
    print(f"  mjarchive render {archive_path} --out {out / 'grid'} --worlds 0:4 --camera {spec.camera} --layout grid "
          "--size 240x320 --quality fast")
    print(f"  mjarchive preview {archive_path} --out {out / 'sheet.png'} --worlds 0:8 --frames ::30")
    return DemoResult(archive_path, list(videos), sheet, model_xml, worlds)
