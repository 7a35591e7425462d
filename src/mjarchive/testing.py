"""Helpers for testing code that uses mjarchive: tiny models, deterministic frames, Hypothesis
strategies for shapes and selections, a detector for files being opened, and SIGKILL crash trials
(used by tests/test_crash.py and benchmarks/crash_trials.py).

Hypothesis is only imported by the strategy functions, so importing this module does not need it.

Example::

    from hypothesis import given
    from mjarchive.testing import archive_shapes

    @given(archive_shapes())
    def test_roundtrip(shape): ...
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import os
import struct
from typing import Any

import numpy as np

__all__ = [
    "ArchiveShape",
    "CrashChild",
    "CrashTrial",
    "ForkServer",
    "OpenWatcher",
    "archive_shapes",
    "check_archive_frames",
    "crash_append",
    "crash_child_main",
    "crash_expected",
    "crash_time",
    "decode_video",
    "neuromechfly_world",
    "deterministic_frames",
    "example_archive",
    "frame_selections",
    "hinge_chain_xml",
    "run_crash_trial",
    "world_selections",
]


def neuromechfly_world() -> tuple[Any, str]:
    """(world, tracking camera name): NeuroMechFly (all biological joints, position actuators on the
    legs, a tracking camera) in a flat world, built by flygym 2.x's own composition code (flygym is
    imported here; its deprecation warnings are silenced)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from flygym.anatomy import ActuatedDOFPreset, AxisOrder, JointPreset, Skeleton
        from flygym.compose import ActuatorType, FlatGroundWorld, KinematicPosePreset, NeuroMechFly
        from flygym.utils.math import Rotation3D

        fly = NeuroMechFly()
        skeleton = Skeleton(axis_order=AxisOrder.YAW_PITCH_ROLL, joint_preset=JointPreset.ALL_BIOLOGICAL)
        pose = KinematicPosePreset.NEUTRAL
        fly.add_joints(skeleton, neutral_pose=pose)
        fly.add_actuators(skeleton.get_actuated_dofs_from_preset(ActuatedDOFPreset.LEGS_ACTIVE_ONLY),
                          ActuatorType.POSITION, neutral_input=pose, kp=50.0)
        camera = fly.add_tracking_camera()
        world = FlatGroundWorld()
        world.add_fly(fly, (0, 0, 0.7), Rotation3D("quat", (1, 0, 0, 0)))
    return world, camera.name if "/" in camera.name else f"{fly.name}/{camera.name}"


def decode_video(path: Any) -> tuple[np.ndarray, float]:
    """Every frame of a video, stacked (n, H, W, 3) uint8, and its frame rate (needs imageio-ffmpeg)."""
    import imageio.v2 as iio

    with iio.get_reader(path, format="FFMPEG") as reader:
        fps = reader.get_meta_data()["fps"]
        return np.stack([frame for frame in reader]), fps  # list(reader) asks len(): unreliable


def hinge_chain_xml(n_joints: int, *, n_mocap: int = 0) -> str:
    """MJCF of a chain of `n_joints` hinge joints (nq = nv = n_joints) and `n_mocap` mocap bodies."""
    body = ""
    for j in reversed(range(n_joints)):
        body = (f'<body name="b{j}" pos="0 0 0.1"><joint name="j{j}" type="hinge" axis="0 1 0"/>'
                f'<geom type="capsule" size="0.02" fromto="0 0 0 0 0 0.1"/>{body}</body>')
    mocap = "".join(f'<body name="m{i}" mocap="true"><geom size="0.01"/></body>' for i in range(n_mocap))
    return f'<mujoco model="chain{n_joints}"><worldbody>{body}{mocap}</worldbody></mujoco>'


def example_archive(path: Any, *, world_ids: Any = (3, 7, 42), n_frames: int = 120, overwrite: bool = False,
                    storage_options: dict | None = None) -> Any:
    """A small humanoid archive (mujoco_warp's test model) at `path` for examples and documentation:
    `world_ids` walk in place, each with its own swing of the limbs, with a `qvel` track, every
    world resetting every 50 frames (staggered), at 30 frames per second. `path` may be a URL (with
    `storage_options`). Returns `path`."""
    from importlib.resources import files

    import mujoco

    from .archive.writer import create

    xml = str(files("mujoco_warp") / "test_data" / "humanoid" / "humanoid.xml")
    model = mujoco.MjModel.from_xml_path(xml)
    W = len(world_ids)
    t = np.arange(n_frames) / 30.0
    phase = np.arange(W)[None, :, None] * 0.7 + np.arange(model.nq - 7)[None, None, :] * 0.3
    qpos = np.tile(model.qpos0, (n_frames, W, 1))
    qpos[:, :, 2] = 1.3
    qpos[:, :, 7:] = 0.4 * np.sin(2 * np.pi * 0.8 * t[:, None, None] + phase)
    qvel = np.zeros((n_frames, W, model.nv))
    qvel[1:, :, 6:] = np.diff(qpos[:, :, 7:], axis=0) * 30.0
    reset = (np.arange(n_frames)[:, None] + 17 * np.arange(W)[None, :]) % 50 == 0
    with create(path, xml, world_ids=list(world_ids), tracks={"qvel": (model.nv,)}, overwrite=overwrite,
                storage_options=storage_options) as writer:
        writer.append(t, qpos, qvel=qvel, reset=reset)
    return path


def deterministic_frames(start: int, stop: int, n_worlds: int, nq: int, dtype: Any = np.float32) -> np.ndarray:
    """Frames [start, stop) as a (stop - start, n_worlds, nq) array derived only from the indices.

    Every value is exactly representable in float32 and nonzero, so a fill value (0) or a frame
    from the wrong position is always detected; another process can recompute the same frames.
    """
    f = np.arange(start, stop, dtype=np.float64)[:, None, None]
    w = np.arange(n_worlds, dtype=np.float64)[None, :, None]
    q = np.arange(nq, dtype=np.float64)[None, None, :]
    return (1.0 + f + w / 64.0 + q / 4096.0 + ((f * 7 + w * 3 + q) % 5) / 8.0).astype(dtype)


@dataclasses.dataclass(frozen=True)
class ArchiveShape:
    """Dimensions of a small test archive."""

    n_worlds: int
    nq: int
    n_frames: int
    chunk_frames: int
    shard_worlds: int


def archive_shapes(*, max_worlds: int = 6, max_nq: int = 4, max_frames: int = 80,
                   chunk_frames: tuple[int, int] = (4, 16)):
    """Hypothesis strategy of ArchiveShape with at least one frame."""
    from hypothesis import strategies as st

    return st.builds(
        ArchiveShape,
        n_worlds=st.integers(1, max_worlds),
        nq=st.integers(1, max_nq),
        n_frames=st.integers(1, max_frames),
        chunk_frames=st.integers(*chunk_frames),
        shard_worlds=st.integers(1, max_worlds),
    )


def frame_selections(n_frames: int):
    """Hypothesis strategy of valid frame selections: None, an int, a positive-step slice or an
    index array (possibly unsorted, repeated or negative)."""
    from hypothesis import strategies as st

    bound = st.one_of(st.none(), st.integers(-n_frames, n_frames))
    stop = st.one_of(st.none(), st.integers(-n_frames, n_frames))
    return st.one_of(
        st.none(),
        st.integers(-n_frames, n_frames - 1),
        st.builds(slice, bound, stop, st.one_of(st.none(), st.integers(1, 5))),
        st.lists(st.integers(-n_frames, n_frames - 1), min_size=1, max_size=12).map(np.array),
    )


def world_selections(world_ids: tuple[int, ...]):
    """Hypothesis strategy of valid world selections by original ID: None, an int, or a list
    (any order, no repeats)."""
    from hypothesis import strategies as st

    ids = list(world_ids)
    return st.one_of(
        st.none(),
        st.sampled_from(ids),
        st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True),
    )


class OpenWatcher:
    """Detects any open or read of the watched paths by any process (Linux inotify).

    inotify reports IN_OPEN/IN_ACCESS from the kernel, for C code like MuJoCo's file loader as well
    as Python, regardless of `noatime` mounts. Watching a directory reports opens of every file in
    it. Use as a context manager; `events()` returns the names opened so far.

    >>> with OpenWatcher([sentinel_dir]) as watcher:
    ...     do_something()
    ...     assert not watcher.events()
    """

    _IN_ACCESS, _IN_OPEN, _IN_NONBLOCK = 0x1, 0x20, 0o4000
    # modify, attrib, close_write, moved_from, moved_to, create, delete
    _IN_WRITES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200

    @staticmethod
    def available() -> bool:
        return os.uname().sysname == "Linux" and bool(ctypes.util.find_library("c"))

    def __init__(self, paths: list[str | os.PathLike], *, writes: bool = False):
        """Watch `paths` (files or directories) for opens and reads, and with `writes` also for
        creating, changing, renaming or deleting anything in them."""
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = self._libc.inotify_init1(self._IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._names: dict[int, str] = {}
        for path in paths:
            mask = self._IN_OPEN | self._IN_ACCESS | (self._IN_WRITES if writes else 0)
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch({path}) failed")
            self._names[wd] = os.fspath(path)
        self._seen: list[str] = []

    def events(self) -> list[str]:
        """Paths opened or read since the watcher started (a directory's own listing included)."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16: offset + 16 + length].rstrip(b"\0").decode(errors="replace")
                self._seen.append(os.path.join(self._names.get(wd, "?"), name))
                offset += 16 + length
        return list(self._seen)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OpenWatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- crash trials ------------------------------------------------------------------------------------
# A child process appends deterministic frames and is killed with SIGKILL; the parent then checks
# the archive. Used by tests/test_crash.py and benchmarks/crash_trials.py.

CRASH_WORLDS, CRASH_NQ = 3, 3


def crash_time(start: int, stop: int) -> np.ndarray:
    """Simulation time of frames [start, stop) in crash trials: strictly increasing, exact."""
    return (np.arange(start, stop, dtype=np.float64) + 1.0) / 64.0


def crash_expected(start: int, stop: int) -> dict[str, np.ndarray]:
    """Every stored array's values for frames [start, stop) of a crash trial."""
    q = deterministic_frames(start, stop, CRASH_WORLDS, CRASH_NQ + 7)
    idx = np.arange(start, stop)[:, None]
    return {
        "qpos": q[..., :CRASH_NQ],
        "mocap_pos": q[..., CRASH_NQ:CRASH_NQ + 3, None].transpose(0, 1, 3, 2),
        "mocap_quat": q[..., CRASH_NQ + 3:, None].transpose(0, 1, 3, 2),
        "reward": (idx * 0.25 + np.arange(CRASH_WORLDS)).astype(np.float32),
        "reset": (idx + np.arange(CRASH_WORLDS)) % 7 == 0,
    }


def crash_variant(frame: int, world: int, ngeom: int) -> np.ndarray:
    """The geom_rgba a crash trial sets for a world at its reset frame: exact, in [0, 1]."""
    v = np.full((ngeom, 4), ((frame * 7 + world) % 16) / 16.0, np.float32)
    v[:, 3] = 1.0
    return v


def crash_events(stop: int, ngeom: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frame, world position, value) of every variant event of frames [0, stop), in order."""
    reset = crash_expected(0, stop)["reset"]
    frames, worlds = np.nonzero(reset)
    values = np.stack([crash_variant(f, w, ngeom) for f, w in zip(frames, worlds)]) if len(frames) else (
        np.zeros((0, ngeom, 4), np.float32))
    return frames.astype(np.int64), worlds.astype(np.int32), values


def crash_append(writer: Any, start: int, stop: int) -> None:
    """Append frames [start, stop) of a crash trial (one frame if stop == start + 1), with a
    geom_rgba variant event for every world at every frame where it resets."""
    e = crash_expected(start, stop)
    t = crash_time(start, stop)
    ngeom = writer.manifest.variants["geom_rgba"].shape[0]
    for f, w in zip(*np.nonzero(e["reset"])):
        writer.set_variant(writer.world_ids[w], frame=start + int(f), geom_rgba=crash_variant(start + int(f), int(w), ngeom))
    if stop - start == 1:
        writer.append(t[0], e["qpos"][0], mocap_pos=e["mocap_pos"][0], mocap_quat=e["mocap_quat"][0],
                      reset=e["reset"][0], reward=e["reward"][0])
    else:
        writer.append(t, e["qpos"], mocap_pos=e["mocap_pos"], mocap_quat=e["mocap_quat"],
                      reset=e["reset"], reward=e["reward"])


def crash_child_main(argv: list[str]) -> None:
    """Child of a crash trial: `archive progress seed chunk_frames [max_frames] [sleep_s]`.

    Appends until killed (or max_frames), flushing at random points. Before each append it records
    `intent N` (frames handed to the writer after this call), after each flush `flushed N`, one
    line each, appended to `progress`.
    """
    import time as _time

    import mjarchive

    path, progress, seed, chunk_frames = argv[0], argv[1], int(argv[2]), int(argv[3])
    max_frames = int(argv[4]) if len(argv) > 4 else 1 << 40
    sleep_s = float(argv[5]) if len(argv) > 5 else 0.0
    rng = np.random.default_rng(seed)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    writer = mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(CRASH_NQ, n_mocap=1)),
                              world_ids=[11, 3, 25], chunk_frames=chunk_frames, tracks={"reward": ()},
                              variant_fields=("geom_rgba",))
    os.write(fd, b"created 0\n")
    n = 0
    while n < max_frames:
        k = min(int(rng.choice([1, 1, 2, 3, 5, 9])), max_frames - n)
        os.write(fd, b"intent %d\n" % (n + k))
        crash_append(writer, n, n + k)
        n += k
        if rng.random() < 0.15:
            writer.flush()
            os.write(fd, b"flushed %d\n" % n)
        if sleep_s:
            _time.sleep(sleep_s)
    writer.close()
    os.write(fd, b"closed %d\n" % n)


# Children fork from one helper process that has already imported mjarchive (a start costs
# milliseconds instead of a fresh interpreter's second). Commands and replies are JSON lines; no
# pickle crosses the process boundary.
_FORK_SERVER_SOURCE = r"""
import importlib, json, os, sys, traceback
# `python -c` puts the working directory on sys.path; children may work in directories under test.
sys.path[:] = json.loads(sys.argv[2]) + [p for p in sys.path if p not in ("", ".")]
module, _, name = sys.argv[1].partition(":")
target = getattr(importlib.import_module(module), name)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "start":
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                target(cmd["args"])
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        reply = {"pid": pid}
    else:
        pid, status = os.waitpid(cmd["pid"], 0 if cmd["op"] == "wait" else os.WNOHANG)
        reply = {"exitcode": None if pid == 0 else os.waitstatus_to_exitcode(status)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


class ForkServer:
    """A helper process that forks children running `target` ("module:function", called with one
    JSON-able argument) from a warm interpreter. `path`: directories put first on its sys.path.

    `start(args)` returns a child's pid; `poll(pid)` and `wait(pid)` its exit code (None while it
    runs; negative: killed by that signal).
    """

    def __init__(self, target: str, path: list[str] | None = None):
        self._argv = [target, json.dumps([str(p) for p in path or ()])]
        self._proc: Any = None

    def _call(self, **cmd: Any) -> dict:
        import atexit
        import subprocess
        import sys

        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", _FORK_SERVER_SOURCE, *self._argv],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            atexit.register(self._proc.stdin.close)
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def start(self, args: Any) -> int:
        return self._call(op="start", args=args)["pid"]

    def poll(self, pid: int) -> int | None:
        return self._call(op="poll", pid=pid)["exitcode"]

    def wait(self, pid: int) -> int:
        return self._call(op="wait", pid=pid)["exitcode"]


_CRASH_SERVER = ForkServer("mjarchive.testing:crash_child_main")


class CrashChild:
    """A process running `crash_child_main(argv)`; `exitcode` follows `multiprocessing` (-9 = SIGKILL)."""

    def __init__(self, argv: list[str]):
        self.pid: int = _CRASH_SERVER.start([str(a) for a in argv])
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        if self.exitcode is None:
            self.exitcode = _CRASH_SERVER.poll(self.pid)
        return self.exitcode is None

    def kill(self) -> None:
        import signal

        if self.is_alive():
            os.kill(self.pid, signal.SIGKILL)

    def join(self) -> int:
        if self.exitcode is None:
            self.exitcode = _CRASH_SERVER.wait(self.pid)
        return self.exitcode


@dataclasses.dataclass
class CrashTrial:
    """What one crash trial observed; `ok` when every check held."""

    seed: int
    killed_after_s: float
    intent: int = 0        # upper bound on frames handed to append() before the kill
    flushed: int = 0       # lower bound: frames a completed flush() made durable
    committed: int = 0     # frames the archive reports after the kill
    opened: bool = False
    verify_ok: bool = False
    bit_identical: bool = False
    resumed_ok: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.opened and self.verify_ok and self.bit_identical and self.resumed_ok
                and self.flushed <= self.committed <= self.intent and not self.problems)


def _progress(path: str) -> dict[str, int]:
    out = {"created": -1, "intent": 0, "flushed": 0}
    with open(path, "rb") as f:
        for line in f.read().split(b"\n"):
            parts = line.split()
            if len(parts) == 2 and parts[0].decode() in out and parts[1].isdigit():
                out[parts[0].decode()] = max(out[parts[0].decode()], int(parts[1]))
    return out


def check_archive_frames(archive: Any, start: int, stop: int) -> list[str]:
    """Compare committed frames [start, stop) of a crash-trial archive with the generator."""
    if stop <= start:
        return []
    sel = archive.select(frames=slice(start, stop))
    expected = crash_expected(start, stop)
    problems = []
    if not np.array_equal(sel.time, crash_time(start, stop)):
        problems.append(f"time differs in frames [{start}, {stop})")
    for name, values in expected.items():
        got = getattr(sel, name)
        if got.shape != values.shape or not np.array_equal(got, values.astype(got.dtype)) or \
                got.tobytes() != values.astype(got.dtype).tobytes():
            problems.append(f"{name} differs from what was appended in frames [{start}, {stop})")
    if start == 0 and "geom_rgba" in archive.variant_fields:  # events commit with the frames they start at
        got = archive.variant_events("geom_rgba")
        got = {k: v[got["frame"] < stop] for k, v in got.items()}
        want = crash_events(stop, archive.manifest.variants["geom_rgba"].shape[0])
        if any(g.shape != w.shape or g.tobytes() != w.tobytes() for g, w in zip(got.values(), want)):
            problems.append(f"variant events differ from those of frames [0, {stop}) "
                            f"({len(got['frame'])} stored, {len(want[0])} expected)")
    return problems


def run_crash_trial(directory: str | os.PathLike, seed: int, *, chunk_frames: int = 4,
                    max_delay_s: float = 0.4, resume_frames: int = 6) -> CrashTrial:
    """Start a child that appends, SIGKILL it after a random delay, then check the archive:
    it opens, verify() passes, flushed <= committed <= appended, committed frames are bit-identical
    to what was appended, and appending resumes."""
    import signal
    import time as _time

    import mjarchive

    rng = np.random.default_rng(seed)
    directory = os.fspath(directory)
    path, progress = os.path.join(directory, f"crash{seed}.zarr"), os.path.join(directory, f"crash{seed}.log")
    child = CrashChild([path, progress, seed, chunk_frames])
    delay = float(rng.uniform(0.0, max_delay_s))
    trial = CrashTrial(seed=seed, killed_after_s=delay)
    try:
        deadline = _time.monotonic() + 60
        while (not os.path.exists(progress) or _progress(progress)["created"] < 0) and child.is_alive():
            if _time.monotonic() > deadline:
                break
            _time.sleep(0.005)
        _time.sleep(delay)
    finally:
        child.kill()
        child.join()
    if child.exitcode != -signal.SIGKILL:
        trial.problems.append(f"child was not killed by SIGKILL (exit code {child.exitcode})")
        return trial
    marks = _progress(progress)
    trial.intent, trial.flushed = marks["intent"], marks["flushed"]
    try:
        with mjarchive.open(path) as archive:
            trial.opened = True
            trial.committed = archive.n_frames
            report = archive.verify()
            trial.verify_ok = report.ok
            trial.problems += report.problems
            frame_problems = check_archive_frames(archive, 0, archive.n_frames)
            trial.bit_identical = not frame_problems
            trial.problems += frame_problems
        n = trial.committed
        with mjarchive.open(path, mode="a") as writer:
            stray = [f for _, _, files in os.walk(path) for f in files if f.endswith(".partial")]
            if stray:
                trial.problems.append(f"temporary files left after resuming: {stray[:3]}")
            if writer.n_frames != n:
                trial.problems.append(f"resumed writer starts at {writer.n_frames}, committed {n}")
            crash_append(writer, n, n + resume_frames)
        with mjarchive.open(path) as archive:
            resumed = archive.n_frames == n + resume_frames and archive.verify().ok
            more = check_archive_frames(archive, 0, archive.n_frames)
            trial.resumed_ok = resumed and not more and archive.status == "finalized"
            trial.problems += more
    except Exception as exc:  # reported, not raised: the trial records what went wrong
        trial.problems.append(f"{type(exc).__name__}: {exc}")
    if not trial.flushed <= trial.committed <= trial.intent:
        trial.problems.append(f"committed {trial.committed} outside [flushed {trial.flushed}, appended {trial.intent}]")
    return trial
