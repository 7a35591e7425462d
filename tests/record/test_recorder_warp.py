"""The MuJoCo Warp recorder on Warp's "cpu" device, and on CUDA where there is one: selected worlds
only, exact bytes, resets, mocap."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import mjarchive

wp = pytest.importorskip("warp")
mjw = pytest.importorskip("mujoco_warp")

from conftest import warp_devices  # noqa: E402
from test_recorder import expected_steps, mocap_model  # noqa: E402

NWORLD = 8


@pytest.fixture(scope="module", params=warp_devices())
def device(request):
    return request.param


@pytest.fixture(scope="module")
def humanoid(humanoid_xml, device):
    """One device model per device (Warp kernels compile once, ~30 s uncached)."""
    mjm = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.opt.warn_overflow = 0
    return mjm, m


def fresh_data(mjm, device, nworld=NWORLD):
    with wp.ScopedDevice(device):
        return mjw.put_data(mjm, mujoco.MjData(mjm), nworld=nworld)


@pytest.mark.parametrize("gather", ["numpy", "kernel"])
def test_selected_worlds_only(tmp_path, humanoid, humanoid_xml, monkeypatch, gather, device):
    """On the "cpu" device the gather is NumPy by default; the Warp kernel path (CUDA's) too. On CUDA
    the kernels gather whatever the NumPy switch says, into the device block copied once per block."""
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", gather == "numpy")
    mjm, m = humanoid
    d = fresh_data(mjm, device)
    rng = np.random.default_rng(0)
    copies, steps = [], []
    with wp.ScopedDevice(device):
        rec = mjarchive.Recorder(tmp_path / "w", humanoid_xml, worlds=[1, 5], tracks=("qvel",),
                                 block_frames=4, ring_buffers=2, chunk_frames=16)
        for n in range(240):
            d.ctrl.assign(rng.uniform(-1, 1, (NWORLD, mjm.nu)).astype(np.float32))
            if rec.record(d):
                copies.append((d.qpos.numpy()[[1, 5]], d.qvel.numpy()[[1, 5]]))
                steps.append(n)
            mjw.step(m, d)
        rec.close()
    assert (rec._gatherer._numpy_views is not None) == (gather == "numpy" and device == "cpu")
    assert steps == expected_steps(30, 1.0, mjm.opt.timestep, 240)
    # Only the selected worlds' state ever crosses to the host.
    assert rec.bytes_copied == len(steps) * 2 * (mjm.nq + mjm.nv) * 4
    with mjarchive.open(tmp_path / "w") as archive:
        assert archive.world_ids == (1, 5)
        assert archive.manifest.producer["backend"] == "mujoco_warp"
        sel = archive.select()
        assert_array_equal(sel.qpos, np.array([c[0] for c in copies]))
        assert_array_equal(sel.qvel, np.array([c[1] for c in copies]))
        assert_array_equal(archive.time, np.array(steps) * mjm.opt.timestep)
        assert not sel.reset.any()
        assert not np.array_equal(sel.qpos[-1, 0], sel.qpos[-1, 1])  # different random controls per world


def test_reset_masks_round_trip(tmp_path, humanoid, humanoid_xml, device):
    mjm, m = humanoid
    d = fresh_data(mjm, device)
    with wp.ScopedDevice(device):
        with mjarchive.Recorder(tmp_path / "r", humanoid_xml, worlds=[1, 5, 6], block_frames=3) as rec:
            for n in range(100):
                reset = None
                if n == 30:  # a Warp bool mask, as mjw.reset_data takes it
                    reset = wp.array(np.arange(NWORLD) == 5, dtype=wp.bool)
                    mjw.reset_data(m, d, reset=reset)
                elif n in (61, 62):  # two NumPy masks between frames: one marker
                    reset = np.arange(NWORLD) == 1
                elif n == 75:  # a Warp int32 mask on an unselected and a selected world
                    reset = wp.array((np.arange(NWORLD) == 2) | (np.arange(NWORLD) == 6), dtype=wp.int32)
                rec.record(d, reset=reset)
                mjw.step(m, d)
    steps = expected_steps(30, 1.0, mjm.opt.timestep, 100)
    after = lambda n: next(i for i, s in enumerate(steps) if s >= n)  # noqa: E731
    with mjarchive.open(tmp_path / "r") as archive:
        end = archive.n_frames
        assert archive.episodes(5) == [range(0, after(30)), range(after(30), end)]
        assert archive.episodes(1) == [range(0, after(61)), range(after(61), end)]
        assert archive.episodes(6) == [range(0, after(75)), range(after(75), end)]
        assert int(archive.select().reset.sum()) == 3


def test_cpu_and_warp_paths_write_the_same_archive(tmp_path, humanoid, humanoid_xml, device):
    mjm, _m = humanoid
    d = fresh_data(mjm, device)
    cpu_batch = [mujoco.MjData(mjm) for _ in range(NWORLD)]
    kw = dict(worlds=[1, 5], tracks=("qvel", "ctrl"), output_fps=50)
    with wp.ScopedDevice(device):
        with mjarchive.Recorder(tmp_path / "warp", humanoid_xml, **kw) as rec_w, \
                mjarchive.Recorder(tmp_path / "cpu", humanoid_xml, **kw) as rec_c:
            for n in range(10):  # time advances by hand: no physics needed for this comparison
                t = n * mjm.opt.timestep
                d.time.fill_(t)
                for x in cpu_batch:
                    x.time = t
                assert rec_w.record(d) == rec_c.record(cpu_batch)
    with mjarchive.open(tmp_path / "warp") as a_w, mjarchive.open(tmp_path / "cpu") as a_c:
        man_w, man_c = a_w.manifest.to_dict(0, "x"), a_c.manifest.to_dict(0, "x")
        assert man_w.pop("producer")["backend"] == "mujoco_warp"
        assert man_c.pop("producer")["backend"] == "mujoco"
        man_w.pop("created"), man_c.pop("created")
        assert man_w == man_c
        assert a_w.n_frames == a_c.n_frames == 3
        for name in ("qpos", "qvel", "ctrl", "reset", "time"):
            assert_array_equal(getattr(a_w.select(), name), getattr(a_c.select(), name))


def test_mocap_from_both_paths(tmp_path, device):
    xml = mocap_model(tmp_path)
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    with wp.ScopedDevice(device):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=3)
        cpu = [mujoco.MjData(mjm) for _ in range(3)]
        rng = np.random.default_rng(2)
        with mjarchive.Recorder(tmp_path / "mw", xml, worlds=[2, 0], output_fps=250) as rec_w, \
                mjarchive.Recorder(tmp_path / "mc", xml, worlds=[2, 0], output_fps=250) as rec_c:
            for n in range(20):
                pos = rng.normal(size=(3, 1, 3)).astype(np.float32)
                quat = rng.normal(size=(3, 1, 4)).astype(np.float32)
                quat /= np.linalg.norm(quat, axis=-1, keepdims=True)
                d.mocap_pos.assign(pos)
                d.mocap_quat.assign(quat)
                d.time.fill_(n * mjm.opt.timestep)
                for i, x in enumerate(cpu):
                    x.mocap_pos[:], x.mocap_quat[:], x.time = pos[i], quat[i], n * mjm.opt.timestep
                rec_w.record(d)
                rec_c.record(cpu)
                if n == 0:
                    first = (pos[[2, 0]], quat[[2, 0]])
        assert rec_w.bytes_copied == 10 * 2 * (mjm.nq + 7) * 4
    with mjarchive.open(tmp_path / "mw") as a_w, mjarchive.open(tmp_path / "mc") as a_c:
        assert a_w.n_frames == a_c.n_frames == 10
        sw, sc = a_w.select(), a_c.select()
        assert_array_equal(sw.mocap_pos[0], first[0])
        assert_array_equal(sw.mocap_quat[0], first[1])
        assert_array_equal(sw.mocap_pos, sc.mocap_pos)
        assert_array_equal(sw.mocap_quat, sc.mocap_quat)
        assert_array_equal(sw.qpos, sc.qpos)


def test_warp_errors(tmp_path, humanoid, humanoid_xml, device):
    mjm, _m = humanoid
    d = fresh_data(mjm, device)
    with wp.ScopedDevice(device):
        rec = mjarchive.Recorder(tmp_path / "e", humanoid_xml, worlds=[9])
        with pytest.raises(mjarchive.MjArchiveError, match="out of range"):
            rec.record(d)
        rec = mjarchive.Recorder(tmp_path / "e2", humanoid_xml, worlds=[0])
        with pytest.raises(mjarchive.AppendError, match="shape"):
            rec.record(d, reset=wp.zeros(3, dtype=wp.bool))
        with pytest.raises(mjarchive.AppendError, match="bool or int32"):
            rec.record(d, reset=wp.zeros(NWORLD, dtype=wp.float32))
        if device != "cpu":  # a mask on another device than the Data's
            with pytest.raises(mjarchive.AppendError, match="reset mask is on cpu"):
                rec.record(d, reset=wp.zeros(NWORLD, dtype=wp.bool, device="cpu"))
        with pytest.raises(mjarchive.AppendError, match="one Recorder per backend"):
            rec.record(mujoco.MjData(mjm))
        rec.close()


def test_benchmark_script_runs(tmp_path):
    """benchmarks/bench_recorder.py still runs and its built-in correctness check passes (no timing)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_recorder.py"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(script), "--nworld", "4", "--selected", "2", "--steps", "12",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert metrics["check.archive_equals_device_copies"] == "True"
    assert metrics["check.bytes_copied_exact"] == "True"
    assert float(metrics["host_bytes_vs_readback_all"]) == 0.5
    assert not list(tmp_path.iterdir()), "the benchmark left scratch files behind"


CUDA = [d for d in warp_devices() if d != "cpu"]


@wp.kernel(enable_backward=False)
def _slow_fill(q: wp.array2d(dtype=wp.float32), value: float, spins: int):
    """q[:] = value, after a busy loop: the work a recorder's copy must wait for."""
    i, j = wp.tid()
    x = float(0.0)
    for _ in range(spins):
        x = wp.sin(x) + 1.0
    q[i, j] = value + wp.min(x, 0.0)  # x >= 0: the loop stays, the value is exact


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("side", ["every frame, closed outside", "the later frames", "the earlier frames"])
def test_cuda_side_stream_loses_no_frame(tmp_path, humanoid_xml, side):
    """Frames recorded on a side stream (wp.ScopedStream: entering it waits for the default stream,
    leaving it does not), blocks mixing both, the last one sealed by close() on the default stream:
    every block's copy waits for all its gathers. A Data per frame: the test's own writes never race."""
    import contextlib

    mjm = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    n = 11  # blocks of 4 frames, frames 0-5 or 6-10 on the side stream: two blocks mix streams
    with wp.ScopedDevice(CUDA[0]):
        datas = [mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD) for _ in range(n)]
        stream = wp.Stream(CUDA[0])
        rec = mjarchive.Recorder(tmp_path / "s", humanoid_xml, worlds=[1, 6], output_fps=1, block_frames=4,
                                 ring_buffers=2)
        for f, d in enumerate(datas):
            on_side = {"every": True, "the later frames": f >= 6, "the earlier frames": f < 6}[side.split(",")[0]]
            with wp.ScopedStream(stream) if on_side else contextlib.nullcontext():
                wp.launch(_slow_fill, dim=d.qpos.shape, inputs=[d.qpos, float(f), 200_000])
                assert rec.record(d, time=float(f))
        rec.close()
    with mjarchive.open(tmp_path / "s") as archive:
        assert_array_equal(archive.select().qpos, np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None],
                                                                  (n, 2, mjm.nq)))


def test_graph_capture_is_refused_and_costs_only_its_frame(tmp_path, humanoid, humanoid_xml, device):
    """record() inside wp.ScopedCapture (Warp captures on the "cpu" device too) is refused before
    anything is launched or counted: a reset given before it still lands on the next recorded frame, and
    the refused call's overlays are not given to it."""
    mjm, _m = humanoid
    d = fresh_data(mjm, device)
    with wp.ScopedDevice(device):
        with mjarchive.Recorder(tmp_path / "g", humanoid_xml, worlds=[0, 3], output_fps=1, block_frames=2,
                                overlays={"target": mjarchive.Overlay.points(max_count=4)}) as rec:
            assert rec.record(d, time=0.0)
            assert not rec.record(d, time=0.5, reset=np.arange(NWORLD) == 3)  # pending until the next frame
            with wp.ScopedCapture(device=device):
                with pytest.raises(mjarchive.AppendError, match="graph capture"):
                    rec.record(d, time=1.0, overlays={"target": np.ones((NWORLD, 1, 3))})
                with pytest.raises(mjarchive.AppendError, match="graph capture"):
                    rec.record(d, time=1.5, reset=wp.zeros(NWORLD, dtype=wp.bool))
            assert rec.record(d, time=2.0)
    with mjarchive.open(tmp_path / "g") as archive:
        assert archive.time.tolist() == [0.0, 2.0]
        assert archive.episodes(3) == [range(0, 1), range(1, 2)]
        assert archive.episodes(0) == [range(0, 2)]
        target = archive.select().overlay("target")
        assert len(target.items(1, 0)) == len(target.items(1, 1)) == 0


@pytest.mark.parametrize("gather", ["numpy", "kernel"])
def test_a_first_call_inside_a_graph_capture_makes_nothing(tmp_path, humanoid, humanoid_xml, monkeypatch, gather,
                                                           device):
    """Refused before the ring is made (made inside the capture, its buffers would be filled only at
    the graph's replays): recording afterwards stores exactly what it gets."""
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", gather == "numpy")
    mjm, _m = humanoid
    d = fresh_data(mjm, device)
    q = np.arange(NWORLD * mjm.nq, dtype=np.float32).reshape(NWORLD, mjm.nq)
    with wp.ScopedDevice(device):
        d.qpos.assign(q)
        with mjarchive.Recorder(tmp_path / "f", humanoid_xml, worlds=[1, 6], output_fps=1) as rec:
            with wp.ScopedCapture(device=device):
                with pytest.raises(mjarchive.AppendError, match="graph capture"):
                    rec.record(d, time=0.0, reset=np.arange(NWORLD) == 6)
            for f in range(3):
                assert rec.record(d, time=float(f + 1))
    with mjarchive.open(tmp_path / "f") as archive:
        assert_array_equal(archive.select().qpos, np.broadcast_to(q[[1, 6]], (3, 2, mjm.nq)))
        assert not archive.select().reset.any()  # the refused call's reset was not taken either
