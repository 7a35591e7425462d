"""The CPU recorder: real mj_step loops, exact cadence, resets, mocap, tracks."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import mjarchive

MOCAP_XML = """
<mujoco>
  <option timestep="{timestep}"/>
  <worldbody>
    <body name="target" mocap="true" pos="0 0 1"><geom type="sphere" size="0.05" contype="0" conaffinity="0"/></body>
    <body name="ball" pos="0 0 0.5"><freejoint/><geom type="sphere" size="0.1"/></body>
  </worldbody>
</mujoco>
"""


def mocap_model(tmp_path, timestep=0.002):
    path = tmp_path / f"mocap_{timestep}.xml"
    path.write_text(MOCAP_XML.format(timestep=timestep))
    return path


def expected_steps(output_fps, playback_speed, timestep, n_steps, every=1):
    """Independent statement of the cadence: frame k's render time is k·interval; it is recorded by
    the first call at or after it, and one call records at most one frame."""
    interval = playback_speed / output_fps
    calls = range(0, n_steps, every)
    steps, next_time = [], 0.0
    for n in calls:
        if n * timestep >= next_time - 1e-9 * timestep:
            steps.append(n)
            k = math.floor(n * timestep / interval + 1e-9) + 1
            next_time = k * interval
    return steps


def test_humanoid_random_controls_match_hand_copies(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    rng = np.random.default_rng(0)
    copies, times, steps = [], [], []
    with mjarchive.Recorder(tmp_path / "a", humanoid_xml, tracks=("qvel", "ctrl"), chunk_frames=8) as rec:
        for n in range(300):
            data.ctrl[:] = rng.uniform(-1, 1, model.nu)
            if rec.record(data):
                copies.append((data.qpos.copy(), data.qvel.copy(), data.ctrl.copy()))
                times.append(data.time)
                steps.append(n)
            mujoco.mj_step(model, data)
    assert steps == expected_steps(30, 1.0, model.opt.timestep, 300)
    with mjarchive.open(tmp_path / "a") as archive:
        assert archive.status == "finalized" and archive.world_ids == (0,)
        assert archive.n_frames == len(copies)
        sel = archive.select()
        assert_array_equal(sel.qpos[:, 0], np.array([c[0] for c in copies], np.float32))
        assert_array_equal(sel.qvel[:, 0], np.array([c[1] for c in copies], np.float32))
        assert_array_equal(sel.ctrl[:, 0], np.array([c[2] for c in copies], np.float32))
        assert_array_equal(archive.time, np.array(steps) * model.opt.timestep)
        np.testing.assert_allclose(archive.time, times, rtol=0, atol=1e-9)
        assert archive.manifest.producer["backend"] == "mujoco"
        assert archive.output_fps == 30 and archive.timestep == model.opt.timestep


@pytest.mark.parametrize(("output_fps", "playback_speed", "timestep", "every"), [
    (30, 1.0, 0.002, 1),      # 16.67 steps per frame
    (60, 1.0, 0.005, 1),      # 3.33
    (25, 0.5, 0.001, 1),      # 20 exactly
    (30, 2.0, 0.01, 1),       # 6.67, fast-forward
    (24, 0.25, 0.0025, 1),    # 4.17, slow motion
    (500, 1.0, 0.005, 1),     # more frames than steps: every step
    (30, 1.0, 0.002, 7),      # the caller records only every 7th step
])
def test_cadence_exact_frame_times(tmp_path, output_fps, playback_speed, timestep, every):
    xml = mocap_model(tmp_path, timestep)
    model = mujoco.MjModel.from_xml_path(str(xml))
    data = mujoco.MjData(model)
    n_steps = 400
    recorded = []
    with mjarchive.Recorder(tmp_path / "c", xml, output_fps=output_fps, playback_speed=playback_speed) as rec:
        for n in range(n_steps):
            if n % every == 0 and rec.record(data):
                recorded.append(n)
            mujoco.mj_step(model, data)
    expected = expected_steps(output_fps, playback_speed, timestep, n_steps, every)
    assert recorded == expected
    with mjarchive.open(tmp_path / "c") as archive:
        assert_array_equal(archive.time, np.array(expected) * timestep)
        assert archive.playback_speed == playback_speed


def test_long_run_has_no_drift(tmp_path):
    """Float accumulation of time would drift; the step grid does not (1e5 steps, 3 frames per 50)."""
    from mjarchive.record.cadence import Cadence

    cadence = Cadence(30.0, 1.0, 0.002)
    t, due = 0.0, []
    for n in range(100_000):
        if cadence.advance(t):
            due.append(n)
        t += 0.002
    assert len(due) == 100_000 // 50 * 3 + 1 - (100_000 % 50 == 0)
    assert due[-3:] == [99_950, 99_967, 99_984]


def test_batch_of_mjdata_selected_worlds_and_resets(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    batch = [mujoco.MjData(model) for _ in range(4)]
    rng = np.random.default_rng(1)
    expected_qpos = []
    with mjarchive.Recorder(tmp_path / "b", humanoid_xml, worlds=[3, 1], chunk_frames=4) as rec:
        for n in range(120):
            mask = None
            if n in (10, 11, 60):  # world 1 at 10 and 11 (between frames), world 3 at 60
                mask = np.zeros(4, bool)
                mask[1 if n < 60 else 3] = True
                for w in np.nonzero(mask)[0]:
                    mujoco.mj_resetData(model, batch[w])
                    batch[w].time = batch[0].time
            if rec.record(batch, reset=mask):
                expected_qpos.append(np.stack([batch[3].qpos, batch[1].qpos]))
            for d in batch:
                d.ctrl[:] = rng.uniform(-1, 1, model.nu)
                mujoco.mj_step(model, d)
        assert rec.world_ids == (3, 1)
    steps = expected_steps(30, 1.0, model.opt.timestep, 120)
    with mjarchive.open(tmp_path / "b") as archive:
        assert archive.world_ids == (3, 1)
        assert_array_equal(archive.select().qpos, np.array(expected_qpos, np.float32))
        frame_after = lambda n: next(i for i, s in enumerate(steps) if s >= n)  # noqa: E731
        assert archive.episodes(1) == [range(0, frame_after(10)), range(frame_after(10), archive.n_frames)]
        assert archive.episodes(3) == [range(0, frame_after(60)), range(frame_after(60), archive.n_frames)]
        assert archive.select(worlds=[1]).reset.sum() == 1  # two resets between frames give one marker


def test_time_going_back_after_reset_keeps_frames_monotonic(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    recorded = []
    with mjarchive.Recorder(tmp_path / "r", humanoid_xml) as rec:
        for n in range(100):
            reset = None
            if n == 50:
                mujoco.mj_resetData(model, data)  # time back to 0
                reset = np.ones(1, bool)
            if rec.record(data, reset=reset):
                recorded.append(n)
            mujoco.mj_step(model, data)
    # The reference world's time restarted at 0, so the step of the reset call is not counted:
    # the clock reads n - 1 from call 50 on (see the cadence rule in mjarchive.record.recorder).
    clock_due = expected_steps(30, 1.0, model.opt.timestep, 99)
    assert recorded == [c if c < 50 else c + 1 for c in clock_due]
    with mjarchive.open(tmp_path / "r") as archive:
        assert_array_equal(archive.time, np.array(clock_due) * model.opt.timestep)
        assert len(archive.episodes(0)) == 2


def test_mocap_recorded(tmp_path):
    xml = mocap_model(tmp_path)
    model = mujoco.MjModel.from_xml_path(str(xml))
    data = mujoco.MjData(model)
    expected = []
    with mjarchive.Recorder(tmp_path / "m", xml, output_fps=100) as rec:
        for n in range(60):
            data.mocap_pos[0] = [0.01 * n, 0.0, 1.0]
            data.mocap_quat[0] = [np.cos(0.01 * n), 0, 0, np.sin(0.01 * n)]
            if rec.record(data):
                expected.append((data.mocap_pos.copy(), data.mocap_quat.copy()))
            mujoco.mj_step(model, data)
    with mjarchive.open(tmp_path / "m") as archive:
        assert archive.nmocap == 1
        sel = archive.select()
        assert_array_equal(sel.mocap_pos[:, 0], np.array([e[0] for e in expected], np.float32))
        assert_array_equal(sel.mocap_quat[:, 0], np.array([e[1] for e in expected], np.float32))


def test_existing_writer_is_flushed_not_closed(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    writer = mjarchive.create(tmp_path / "w", humanoid_xml, world_ids=[7], tracks={"qvel": (model.nv,)})
    with pytest.raises(mjarchive.MjArchiveError, match="names 2 worlds"):
        mjarchive.Recorder(writer, worlds=[0, 1])
    with mjarchive.Recorder(writer, worlds=[0], tracks=["qvel"]) as rec:
        for _ in range(20):
            rec.record(data)
            mujoco.mj_step(model, data)
    assert writer.n_committed == rec.frames_recorded == 3
    writer.append(1.0, np.zeros((1, model.nq)), qvel=np.zeros((1, model.nv)))
    writer.close()
    with mjarchive.open(tmp_path / "w") as archive:
        assert archive.world_ids == (7,) and archive.n_frames == 4


def test_errors(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    with pytest.raises(mjarchive.MjArchiveError, match="not an MjData array field"):
        mjarchive.Recorder(tmp_path / "e0", humanoid_xml, tracks=("nope",))
    with pytest.raises(mjarchive.MjArchiveError, match="empty"):
        mjarchive.Recorder(tmp_path / "e0", humanoid_xml, tracks=("act",))  # na == 0
    rec = mjarchive.Recorder(tmp_path / "e1", humanoid_xml, worlds=[0, 2])
    with pytest.raises(mjarchive.MjArchiveError, match="out of range"):
        rec.record([data, mujoco.MjData(model)])
    rec = mjarchive.Recorder(tmp_path / "e2", humanoid_xml)
    with pytest.raises(mjarchive.AppendError, match="record\\(\\) takes"):
        rec.record(np.zeros(3))
    rec.record(data)
    with pytest.raises(mjarchive.AppendError, match="earlier calls had 1"):
        rec.record([data, data])
    with pytest.raises(mjarchive.AppendError, match="reset must be"):
        rec.record(data, reset=np.zeros(3, bool))
    rec.close()
    with pytest.raises(mjarchive.ClosedError):
        rec.record(data)


def test_float64_and_create_options_pass_through(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    copies = []
    with mjarchive.Recorder(tmp_path / "f", humanoid_xml, dtype="float64", tracks="qvel", n_worlds=1,
                            chunk_frames=2, output_fps=100) as rec:
        assert rec.writer is not None and rec.writer.manifest.chunk_frames == 2  # created eagerly
        for _ in range(10):
            if rec.record(data):
                copies.append((data.qpos.copy(), data.qvel.copy()))
            mujoco.mj_step(model, data)
    with mjarchive.open(tmp_path / "f") as archive:
        assert archive.manifest.dtype == "float64" and archive.tracks["qvel"].dtype == "float64"
        assert_array_equal(archive.select().qpos[:, 0], [c[0] for c in copies])
        assert_array_equal(archive.select().qvel[:, 0], [c[1] for c in copies])


def test_cpu_recording_never_imports_warp(tmp_path, humanoid_xml):
    import subprocess
    import sys

    code = (
        "import sys, mujoco, mjarchive\n"
        f"m = mujoco.MjModel.from_xml_path({str(humanoid_xml)!r}); d = mujoco.MjData(m)\n"
        f"with mjarchive.Recorder({str(tmp_path / 'x')!r}, {str(humanoid_xml)!r}) as rec:\n"
        "    rec.record(d)\n"
        "assert 'warp' not in sys.modules and 'mujoco_warp' not in sys.modules, 'warp was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
