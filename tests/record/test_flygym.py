"""flygym 2.x into mjarchive: the importer of flygym's `.npz` folders (hostile files included) and the
recorders with flygym's call shape; with flygym installed, side by side with flygym's own recorder
and renderer on NeuroMechFly built by flygym's own code."""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive.testing import neuromechfly_world
from mjarchive.cli.main import main
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)
from mjarchive.flygym import FrameClock, TrajectoryRecorder, WarpTrajectoryRecorder, import_flygym

XML = """<mujoco><option timestep="0.002"/><worldbody>
  <body name="torso" pos="0 0 1"><freejoint/><geom type="capsule" size="0.05 0.2"/>
    <body name="arm"><joint name="elbow" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/></body>
  </body>
  <body name="target" mocap="true" pos="1 0 1"><geom type="sphere" size="0.05" contype="0" conaffinity="0"/></body>
  <camera name="side" pos="0 -3 1" xyaxes="1 0 0 0 0 1"/>
</worldbody></mujoco>"""
NQ, NMOCAP = 8, 1


@pytest.fixture
def model_xml(tmp_path) -> Path:
    path = tmp_path / "model" / "m.xml"
    path.parent.mkdir()
    path.write_text(XML)
    return path


def save(path: Path, time, qpos, *, output_fps=25, playback_speed=0.2, world_id=0, mocap=True, **extra) -> Path:
    """A file exactly as flygym's `RecordedTrajectory.save` writes it (np.savez_compressed of its keys)."""
    arrays = {"time": time, "qpos": qpos, "output_fps": np.asarray(output_fps),
              "playback_speed": np.asarray(playback_speed), "world_id": np.asarray(world_id)}
    if mocap:
        n = len(qpos)
        arrays["mocap_pos"] = np.tile([1.0, 0.0, 1.0], (n, NMOCAP, 1)) + np.arange(n)[:, None, None] * 0.01
        arrays["mocap_quat"] = np.tile([1.0, 0.0, 0.0, 0.0], (n, NMOCAP, 1))
    arrays.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    return path


def trajectory(seed: int, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    qpos = rng.normal(0, 0.3, (n, NQ))
    qpos[:, 3:7] /= np.linalg.norm(qpos[:, 3:7], axis=1, keepdims=True)
    return 0.0001 + 0.008 * np.arange(n), qpos


def folder_of(tmp_path: Path, ids=(3, 7, 9), n: int = 40) -> Path:
    src = tmp_path / "trajs"
    for i, w in enumerate(ids):
        save(src / f"world{w}.npz", *trajectory(i, n), world_id=w)
    return src


def leftovers(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith("."))


def test_import_reads_back_bit_exact(tmp_path, model_xml):
    src = folder_of(tmp_path)
    (src / "notes.txt").write_text("not a trajectory: skipped")
    out = tmp_path / "run.mjarchive"
    result = mjarchive.import_flygym(src, model_xml, out, progress=False, chunk_frames=16)  # 40 frames: 3 chunks
    assert result.world_ids == (3, 7, 9) and result.n_frames == 40
    assert result.files == ("world3.npz", "world7.npz", "world9.npz")
    with mjarchive.open(out) as a:
        assert a.world_ids == (3, 7, 9) and a.output_fps == 25 and a.playback_speed == 0.2
        assert a.manifest.timestep == 0.002 and a.manifest.dtype == "float64"
        sel = a.select()
        for i, w in enumerate((3, 7, 9)):
            with np.load(src / f"world{w}.npz", allow_pickle=False) as z:
                assert np.array_equal(sel.time, z["time"])
                assert np.array_equal(sel.qpos[:, i], z["qpos"])
                assert np.array_equal(sel.mocap_pos[:, i], z["mocap_pos"])
                assert np.array_equal(sel.mocap_quat[:, i], z["mocap_quat"])
        assert a.verify().ok
    assert leftovers(tmp_path) == []


def test_world_ids_from_order_and_shortest(tmp_path, model_xml):
    src = tmp_path / "cpu_runs"
    save(src / "b.npz", *trajectory(0, 30))  # CPU runs: world_id 0 in every file
    save(src / "a.npz", *trajectory(1, 25))
    with pytest.raises(mjarchive.MjArchiveError, match=r"a\.npz and b\.npz both hold world_id 0.*world_ids='order'"):
        import_flygym(src, model_xml, tmp_path / "x.mjarchive", progress=False, shortest=True)
    with pytest.raises(mjarchive.SelectionError, match=r"a\.npz has 25 frames and b\.npz 30.*shortest=True"):
        import_flygym(src, model_xml, tmp_path / "x.mjarchive", progress=False, world_ids="order")
    calls = []
    result = import_flygym(src, model_xml, tmp_path / "x.mjarchive", world_ids="order", shortest=True,
                           progress=lambda done, total: calls.append((done, total)))
    assert result.files == ("a.npz", "b.npz") and result.world_ids == (0, 1) and result.n_frames == 25
    assert calls[-1] == (25, 25)
    with mjarchive.open(tmp_path / "x.mjarchive") as a:
        assert np.array_equal(a.select(worlds=[1]).qpos[:, 0], trajectory(0, 30)[1][:25])
    assert leftovers(tmp_path) == []


def _pickled(src: Path) -> None:
    time, qpos = trajectory(5)
    obj = np.empty(len(time), object)
    obj[:] = [float(t) for t in time]
    np.savez(src / "evil.npz", time=obj, qpos=qpos, output_fps=np.asarray(25), playback_speed=np.asarray(0.2),
             world_id=np.asarray(1), mocap_pos=np.zeros((40, 1, 3)), mocap_quat=np.zeros((40, 1, 4)))


def _huge_shape(src: Path) -> None:
    """A qpos member whose header declares 10**12 frames over a few bytes of data."""
    time, qpos = trajectory(5)
    save(src / "evil.npz", time, qpos, world_id=1)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**12, NQ)})
    with zipfile.ZipFile(src / "evil.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["qpos.npy"] = header.getvalue() + qpos.tobytes()
    with zipfile.ZipFile(src / "evil.npz", "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in members.items():
            z.writestr(n, data)


HOSTILE = {
    # case: (make the bad file in the folder, error class, what the message says)
    "wrong_nq": (lambda s: save(s / "evil.npz", trajectory(5)[0], np.zeros((40, NQ + 1)), world_id=1),
                 mjarchive.LayoutMismatchError, r"evil\.npz: qpos has nq=9, the model has nq=8"),
    "no_mocap": (lambda s: save(s / "evil.npz", *trajectory(5), world_id=1, mocap=False),
                 mjarchive.LayoutMismatchError, r"evil\.npz: it holds 0 mocap bodies, the model has 1"),
    "nan": (lambda s: save(s / "evil.npz", trajectory(5)[0], np.where(np.arange(40)[:, None] == 33, np.nan,
                                                                       trajectory(5)[1]), world_id=1),
            mjarchive.FormatError, r"evil\.npz: its qpos holds a non-finite value .* at frame 33"),
    "pickled": (_pickled, mjarchive.FormatError, r"evil\.npz: its member 'time' holds object values \(pickled"),
    "int_qpos": (lambda s: save(s / "evil.npz", trajectory(5)[0], np.zeros((40, NQ), np.int64), world_id=1),
                 mjarchive.FormatError, r"evil\.npz: qpos is int64"),
    "unequal_frames": (lambda s: save(s / "evil.npz", *trajectory(5, 39), world_id=1),
                       mjarchive.SelectionError, r"evil\.npz has 39 frames and good\.npz 40"),
    "other_times": (lambda s: save(s / "evil.npz", trajectory(5)[0] * 2, trajectory(5)[1], world_id=1),
                    mjarchive.SelectionError, r"evil\.npz and good\.npz differ in time at frame 0 \(0.0002 vs "),
    "unequal_fps": (lambda s: save(s / "evil.npz", *trajectory(5), world_id=1, output_fps=30),
                    mjarchive.MjArchiveError, r"evil\.npz and good\.npz differ in output_fps \(30\.0 vs 25\.0\)"),
    "duplicate_id": (lambda s: save(s / "evil.npz", *trajectory(5), world_id=0),
                     mjarchive.MjArchiveError, r"evil\.npz and good\.npz both hold world_id 0"),
    "symlink": (lambda s: os.symlink(s / "good.npz", s / "evil.npz"),
                mjarchive.FormatError, r"evil\.npz in .* is a symbolic link; links are never followed"),
    "huge_shape": (_huge_shape, mjarchive.FormatError,
                   r"evil\.npz: its member 'qpos' declares shape \(1000000000000, 8\) .* but holds 2560"),
    "not_npz": (lambda s: (s / "evil.npz").write_text("hello"), mjarchive.FormatError,
                r"evil\.npz: it is not an npz \(zip\) file"),
    "extra_member": (lambda s: save(s / "evil.npz", *trajectory(5), world_id=1, reward=np.zeros(40)),
                     mjarchive.FormatError, r"evil\.npz: it holds the members .*reward\.npy"),
    "missing_member": (lambda s: np.savez_compressed(s / "evil.npz", time=trajectory(5)[0], qpos=trajectory(5)[1]),
                       mjarchive.FormatError, r"evil\.npz: it lacks \['output_fps', 'playback_speed', 'world_id'\]"),
    "negative_fps": (lambda s: save(s / "evil.npz", *trajectory(5), world_id=1, output_fps=-25),
                     mjarchive.FormatError, r"evil\.npz: output_fps is -25"),
    "time_backwards": (lambda s: save(s / "evil.npz", trajectory(5)[0][::-1].copy(), trajectory(5)[1], world_id=1),
                       mjarchive.FormatError, r"evil\.npz: its time is not finite and strictly increasing"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("out_kind", ["new", "existing"])
def test_hostile_files_are_refused_and_nothing_is_left(tmp_path, model_xml, case, out_kind):
    make, error, message = HOSTILE[case]
    src = tmp_path / "trajs"
    save(src / "good.npz", *trajectory(0))
    make(src)
    out = tmp_path / "run.mjarchive"
    if out_kind == "existing":  # an earlier import, replaced only by a complete new one
        solo = tmp_path / "solo"
        save(solo / "good.npz", *trajectory(0))
        import_flygym(solo, model_xml, out, progress=False)
    with pytest.raises(error, match=message):
        import_flygym(src, model_xml, out, progress=False, overwrite=True)
    if out_kind == "new":
        assert not out.exists()
    else:
        with mjarchive.open(out) as a:
            assert a.n_worlds == 1 and a.n_frames == 40
    assert leftovers(tmp_path) == []


def test_empty_folder_bounds_and_existing_output(tmp_path, model_xml):
    (tmp_path / "empty").mkdir()
    with pytest.raises(mjarchive.MjArchiveError, match="holds no .npz files"):
        import_flygym(tmp_path / "empty", model_xml, tmp_path / "a.mjarchive", progress=False)
    src = folder_of(tmp_path)
    with pytest.raises(mjarchive.MjArchiveError, match=r"more than 2 \.npz files"):
        import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False, max_files=2)
    with pytest.raises(mjarchive.MjArchiveError, match=r"world7\.npz holds 5144 decoded bytes, past the 2856 left"):
        import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False, max_bytes=8000)
    assert not (tmp_path / "a.mjarchive").exists()
    import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False)
    with pytest.raises(mjarchive.ArchiveExistsError, match="overwrite=True"):
        import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False)
    with mjarchive.open(tmp_path / "a.mjarchive", mode="a"):  # a writer holds it: not replaced under it
        with pytest.raises(mjarchive.WriterLockedError):
            import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False, overwrite=True)
    import_flygym(src, model_xml, tmp_path / "a.mjarchive", progress=False, overwrite=True, world_ids="order")
    assert mjarchive.open(tmp_path / "a.mjarchive").world_ids == (0, 1, 2)
    (tmp_path / "link.mjarchive").symlink_to(tmp_path / "a.mjarchive")
    with pytest.raises(mjarchive.ArchiveExistsError, match="a file or a link"):
        import_flygym(src, model_xml, tmp_path / "link.mjarchive", progress=False, overwrite=True)
    assert leftovers(tmp_path) == []


def test_s3_output_is_deleted_on_failure_and_kept_when_not_ours(tmp_path, model_xml, s3_server, s3_url):
    so = s3_server.storage_options()
    src = folder_of(tmp_path)
    save(src / "world99.npz", trajectory(9)[0], np.full((40, NQ), np.nan), world_id=99)
    with pytest.raises(mjarchive.FormatError, match=r"world99\.npz: its qpos holds a non-finite value .* frame 0"):
        import_flygym(src, model_xml, s3_url, progress=False, storage_options=so)
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open(s3_url, storage_options=so)
    (src / "world99.npz").unlink()
    import_flygym(src, model_xml, s3_url, progress=False, storage_options=so)
    with pytest.raises(mjarchive.ArchiveExistsError):  # refused before anything: the archive there stays
        import_flygym(src, model_xml, s3_url, progress=False, storage_options=so)
    with mjarchive.open(s3_url, storage_options=so) as a:
        assert a.world_ids == (3, 7, 9) and a.n_frames == 40


def test_url_output_is_deleted_on_failure(tmp_path, model_xml):
    src = folder_of(tmp_path)
    save(src / "world99.npz", trajectory(9)[0], np.full((40, NQ), np.inf), world_id=99)
    with pytest.raises(mjarchive.FormatError, match=r"world99\.npz: its qpos holds a non-finite value"):
        import_flygym(src, model_xml, "memory://flygym-failed", progress=False)
    with pytest.raises(mjarchive.ArchiveNotFoundError):
        mjarchive.open("memory://flygym-failed")
    (src / "world99.npz").unlink()
    import_flygym(src, model_xml, "memory://flygym-ok", progress=False)
    with mjarchive.open("memory://flygym-ok") as a:
        assert a.world_ids == (3, 7, 9)


def test_cli(tmp_path, model_xml, capsys):
    src = tmp_path / "cpu_runs"
    save(src / "run0.npz", *trajectory(0))
    save(src / "run1.npz", *trajectory(1))
    out = tmp_path / "cli.mjarchive"
    args = ["import", "flygym", str(src), "--model", str(model_xml), "-o", str(out), "--no-progress"]
    assert main(args) == 1
    assert "both hold world_id 0" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--world-ids", "order"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["run0.npz -> world 0", "run1.npz -> world 1"]
    assert "2 worlds, 40 frames (verified)" in captured.err
    assert mjarchive.open(out).n_frames == 40
    assert main([*args, "--world-ids", "order"]) == 1 and "already exists" in capsys.readouterr().err


def test_recorder_records_flygyms_frames(tmp_path, model_xml):
    """flygym's FrameClock, not mjarchive's cadence: at 30 fps, speed 1 and a 2 ms step a frame is due
    every 16.67 steps; flygym records every 17th step (from the last frame's time), as here."""
    m = mujoco.MjModel.from_xml_path(str(model_xml))
    d = mujoco.MjData(m)
    expected_t, expected_q = [], []
    with TrajectoryRecorder(tmp_path / "r.mjarchive", model_xml, playback_speed=1.0, output_fps=30) as rec:
        for step in range(200):
            d.ctrl[:] = 0
            mujoco.mj_step(m, d)
            d.mocap_pos[0, 2] = step * 1e-3
            if rec.record_as_needed(d):
                expected_t.append(d.time)
                expected_q.append(d.qpos.copy())
        assert len(expected_t) == 12 and np.allclose(np.diff(expected_t), 17 * 0.002)
        rec.reset()  # what flygym's Simulation.reset() calls
        mujoco.mj_resetData(m, d)
        mujoco.mj_step(m, d)
        assert rec.record_as_needed(d)
    with mjarchive.open(tmp_path / "r.mjarchive") as a:
        sel = a.select()
        assert np.array_equal(sel.time[:12], expected_t) and np.array_equal(sel.qpos[:12, 0], np.stack(expected_q))
        assert sel.time[12] == pytest.approx(expected_t[-1] + 1 / 30 + 0.002)  # time goes on after a reset
        assert [e[0] for e in a.episodes(0)] == [0, 12]
        assert sel.mocap_pos[11, 0, 0, 2] == pytest.approx(0.187)


def test_frame_clock_is_flygyms():
    clock = FrameClock(0.2, 25, 1e-4)
    t, due = 0.0, []
    for step in range(1, 400):
        t += 1e-4
        if clock.tick(t):
            due.append(step)
    assert due == [1, 81, 161, 241, 321]


def test_warp_recorder_selected_worlds(tmp_path, humanoid_xml):
    pytest.importorskip("mujoco_warp")
    import mujoco_warp as mjw
    import warp as wp

    wp.config.quiet = True
    mjm = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=6)
    times, qpos = d.time.numpy(), d.qpos.numpy()  # zero-copy views on the "cpu" device
    kept = []
    with WarpTrajectoryRecorder(tmp_path / "w.mjarchive", humanoid_xml, 6, worlds=[1, 4], output_fps=25,
                                playback_speed=1.0) as rec:
        for step in range(100):
            times[:] = np.float32(step * mjm.opt.timestep)
            qpos[:] = np.arange(6)[:, None] + step
            if rec.record_as_needed(d):
                kept.append(qpos[[1, 4]].copy())
    with mjarchive.open(tmp_path / "w.mjarchive") as a:
        assert a.world_ids == (1, 4) and a.n_frames == len(kept) == 13
        assert np.array_equal(a.select().qpos, np.stack(kept))


# -- with flygym -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nmf():
    """NeuroMechFly in a flat world, built by flygym's own composition code (as benchmarks/bench_peer_flygym.py)."""
    flygym = pytest.importorskip("flygym")
    world, camera = neuromechfly_world()
    return flygym, world, camera


def _run(flygym, sim, n_steps: int, seed: int, extra=None) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n_steps):
        sim.mj_data.ctrl[:] = rng.normal(0, 0.3, sim.mj_model.nu)
        sim.step()
        sim.record_as_needed()
        if extra is not None:
            extra.record_as_needed(sim.mj_data)


def test_flygym_simulation_records_what_flygym_records(tmp_path, nmf):
    flygym, world, _camera = nmf
    sim = flygym.Simulation(world, timestep=2e-4)
    theirs = flygym.TrajectoryRecorder(sim.mj_model)
    sim.recorder = TrajectoryRecorder(tmp_path / "fly.mjarchive", sim)  # the one line
    _run(flygym, sim, 200, 0, theirs)
    first = theirs.trajectory
    sim.reset()  # resets both: ours starts an episode, flygym's drops its frames
    theirs.reset()
    _run(flygym, sim, 100, 1, theirs)
    sim.recorder.close()
    second = theirs.trajectory
    with mjarchive.open(tmp_path / "fly.mjarchive") as a:
        assert a.manifest.timestep == 2e-4 and a.output_fps == 25 and a.playback_speed == 0.2
        sel = a.select()
        n = first.n_frames
        assert n == 5 and second.n_frames == 3 and a.n_frames == n + 3
        assert np.array_equal(sel.time[:n], first.time) and np.array_equal(sel.qpos[:n, 0], first.qpos)
        assert np.array_equal(sel.qpos[n:, 0], second.qpos)
        assert np.allclose(sel.time[n:] - sel.time[n - 1] - 0.008, second.time, rtol=0, atol=1e-12)
        assert [e[0] for e in a.episodes(0)] == [0, n]
        replay = a.model()
    for field in ("body_pos", "body_quat", "body_mass", "geom_size", "geom_pos", "geom_quat", "geom_rgba",
                  "mesh_vert", "jnt_range", "qpos0", "cam_pos", "light_pos", "mat_rgba"):
        assert np.array_equal(getattr(replay, field), getattr(sim.mj_model, field)), field


def test_flygym_npz_import_replays_like_flygym(tmp_path, nmf):
    flygym, world, camera = nmf
    folder = tmp_path / "flygym_out"
    trajs = []
    for seed in (0, 1):
        sim = flygym.Simulation(world)
        sim.set_trajectory_recorder()
        _run(flygym, sim, 250, seed)
        trajs.append(sim.recorder.trajectory)
        trajs[-1].save(folder / f"run{seed}.npz")
    import_flygym(folder, sim, tmp_path / "fly.mjarchive", world_ids="order", progress=False)
    size = (48, 64)
    theirs = flygym.render_trajectories(sim.mj_model, trajs, camera, camera_res=size)
    with mjarchive.open(tmp_path / "fly.mjarchive") as a:
        assert a.n_frames == trajs[0].n_frames == 4
        assert np.array_equal(a.select(worlds=[1]).qpos[:, 0], trajs[1].qpos)
        for w in (0, 1):
            ours = [rgb for _w, _f, rgb in mjarchive.iter_frames(a, worlds=[w], camera=camera, size=size)]
            assert np.array_equal(np.stack(ours), theirs[w][camera]), w


def test_flygym_gpu_simulation_records_what_flygym_records(tmp_path, nmf):
    """GPUSimulation on Warp's default device (the CPU here: about 40 s of kernel compiles on a first run)."""
    flygym, world, _camera = nmf
    pytest.importorskip("flygym.warp")
    from flygym.warp import GPUSimulation
    from flygym.warp.recording import WarpTrajectoryRecorder as Theirs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flygym's: "MJWarp does not support noslip iterations"
        sim = GPUSimulation(world, 4)
    theirs = Theirs(sim.mj_model, 4, worlds=[1, 3])
    sim.recorder = WarpTrajectoryRecorder(tmp_path / "gpu.mjarchive", sim, worlds=[1, 3])  # the one line
    sim.reset()
    for _ in range(170):
        sim.step()
        sim.record_as_needed()
        theirs.record_as_needed(sim.mjw_data)
    sim.recorder.close()
    trajs = theirs.trajectories
    with mjarchive.open(tmp_path / "gpu.mjarchive") as a:
        assert a.world_ids == (1, 3) and a.n_frames == trajs[0].n_frames == 3
        sel = a.select()
        assert np.array_equal(sel.time, trajs[0].time.astype(np.float64))
        for i in range(2):
            assert np.array_equal(sel.qpos[:, i], trajs[i].qpos)
