"""Recorder side of format 1.1: model variants captured from the simulator's models, set_variant
and overlays forwarded; Warp on its "cpu" device (the NumPy gather and the kernels used on CUDA), and
the Warp captures on CUDA too where there is one."""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import mjarchive

wp = pytest.importorskip("warp")
mjw = pytest.importorskip("mujoco_warp")

from conftest import warp_devices  # noqa: E402

NWORLD = 4
EVERY = 4  # steps per recorded frame


@pytest.fixture(scope="module")
def humanoid(humanoid_xml):
    wp.config.quiet = True
    mjm = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    return mjm


@pytest.fixture(params=warp_devices())
def device(request):
    return request.param


def colours(nworld, ngeom, shift=0.0):
    """Distinct rgba per (world, geom), exactly representable in float32."""
    w, g = np.meshgrid(np.arange(nworld), np.arange(ngeom), indexing="ij")
    return np.stack([w / 8 + shift, g / 32, np.full_like(w, 0.5, float), np.ones_like(w, float)], -1).astype(np.float32)


def fps(mjm):
    return 1.0 / (EVERY * mjm.opt.timestep)


def frame_of(step):
    """Archive frame recorded at or after `step` (the recorder records every EVERY steps from 0)."""
    return -(-step // EVERY)


@pytest.mark.parametrize("gather", ["numpy", "kernel"])
def test_warp_batched_rgba_captured_at_first_frame_and_resets(tmp_path, humanoid, humanoid_xml, monkeypatch, gather,
                                                              device):
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", gather == "numpy")
    mjm = humanoid
    ng = mjm.ngeom
    rgba = colours(NWORLD, ng)
    new3, new0 = colours(1, ng, shift=0.25)[0], colours(1, ng, shift=0.375)[0]
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.geom_rgba = wp.array(rgba, dtype=wp.vec4)  # per world; geom_size stays shared (leading dim 1)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        rec = mjarchive.Recorder(tmp_path / "v", humanoid_xml, worlds=[1, 3], sim_model=m, output_fps=fps(mjm),
                                 variant_fields=("geom_rgba", "geom_size"), block_frames=3, ring_buffers=2)
        for n in range(60):
            reset = None
            if n == 21:  # between recorded frames: the change lands on the next one
                values = m.geom_rgba.numpy()
                values[3], values[0] = new3, new0  # world 0 is not recorded
                m.geom_rgba.assign(values)
                reset = wp.array(np.isin(np.arange(NWORLD), [0, 1, 3]), dtype=wp.bool)  # 1 resets unchanged
                mjw.reset_data(m, d, reset=reset)
            elif n == 40:  # a NumPy mask on a recorded step; the field replaced: world 3 back to its first colour
                values = m.geom_rgba.numpy()
                values[3] = rgba[3]
                m.geom_rgba = wp.array(values, dtype=wp.vec4)
                reset = np.arange(NWORLD) == 3
            rec.record(d, reset=reset)
            mjw.step(m, d)
        rec.close()
    captured = rec._gatherer._variants.rows_captured
    assert captured == 2 + 2 + 1  # both worlds at frame 0, the two resetting ones twice: never the others
    with mjarchive.open(tmp_path / "v") as archive:
        f1, f2, end = frame_of(21), frame_of(40), archive.n_frames
        assert archive.variant_fields == ("geom_rgba", "geom_size")
        assert archive.variant_changes(1).tolist() == []  # its reset changed nothing: no event
        assert archive.variant_changes(3).tolist() == [f1, f2]
        assert archive.variant_event_counts["geom_size"] == 0  # shared and the model's own (at float32)
        for f in range(end):
            assert_array_equal(archive.variant(1, f)["geom_rgba"], rgba[1])
            want3 = new3 if f1 <= f < f2 else rgba[3]
            assert_array_equal(archive.variant(3, f)["geom_rgba"], want3)
            assert_array_equal(archive.variant(3, f)["geom_size"], mjm.geom_size)
        assert archive.episodes(3)[1].start == f1


def test_warp_changes_of_one_world_do_not_leak(tmp_path, humanoid, humanoid_xml, device):
    """A world changed without a reset is not captured; a world reset later captures its value then."""
    mjm = humanoid
    ng = mjm.ngeom
    rgba = colours(NWORLD, ng)
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.geom_rgba = wp.array(rgba, dtype=wp.vec4)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "l", humanoid_xml, worlds=[0, 2], sim_model=m, output_fps=fps(mjm),
                                variant_fields="geom_rgba", block_frames=4) as rec:
            for n in range(40):
                reset = None
                if n == 8:  # world 2 changes, world 0 resets: world 0's row is captured, not 2's
                    values = m.geom_rgba.numpy()
                    values[2] = colours(1, ng, shift=0.5)[0]
                    m.geom_rgba.assign(values)
                    reset = np.arange(NWORLD) == 0
                elif n == 16:
                    reset = np.arange(NWORLD) == 2
                rec.record(d, time=n * mjm.opt.timestep, reset=reset)
    with mjarchive.open(tmp_path / "l") as archive:
        assert archive.variant_changes(0).tolist() == []
        assert archive.variant_changes(2).tolist() == [frame_of(16)]
        assert_array_equal(archive.variant(2, frame_of(16) - 1)["geom_rgba"], rgba[2])
        assert_array_equal(archive.variant(2, frame_of(16))["geom_rgba"], colours(1, ng, shift=0.5)[0])
        assert_array_equal(archive.variant(0, archive.n_frames - 1)["geom_rgba"], rgba[0])


def test_cpu_models_per_world(tmp_path, humanoid, humanoid_xml):
    mjm = humanoid
    models = [copy.deepcopy(mjm) for _ in range(3)]
    models[2].geom_rgba[:] = colours(1, mjm.ngeom, 0.125)[0]  # differs from the start
    batch = [mujoco.MjData(x) for x in models]
    size0 = mjm.geom_size * 1.5
    with mjarchive.Recorder(tmp_path / "c", humanoid_xml, worlds=[0, 2], sim_model=models, output_fps=fps(mjm),
                            variant_fields=("geom_rgba", "geom_size")) as rec:
        for n in range(30):
            reset = None
            if n == 10:  # skipped call: accumulated to the next frame
                models[0].geom_size[:] = size0
                models[1].geom_size[:] = size0 * 2  # not recorded
                reset = np.array([True, True, False])
            for x in batch:
                x.time = n * mjm.opt.timestep
            rec.record(batch, reset=reset)
    with mjarchive.open(tmp_path / "c") as archive:
        f = frame_of(10)
        assert archive.variant_changes(0).tolist() == [f]
        assert archive.variant_changes(2).tolist() == []
        assert_array_equal(archive.variant(2, 0)["geom_rgba"], colours(1, mjm.ngeom, 0.125)[0])
        assert_array_equal(archive.variant(0, 0)["geom_rgba"], mjm.geom_rgba)
        assert_array_equal(archive.variant(0, f - 1)["geom_size"], mjm.geom_size)
        assert_array_equal(archive.variant(0, f)["geom_size"], size0)
        assert_array_equal(archive.variant(2, f)["geom_size"], mjm.geom_size)
        assert archive.variant_event_counts == {"geom_rgba": 1, "geom_size": 1}  # unchanged values: no events


def test_existing_writer_writes_first_values(tmp_path, humanoid, humanoid_xml):
    """Appending through an open writer: the archive may hold events already, so frame 0's captured
    values are written even where they equal the model's own."""
    mjm = humanoid
    writer = mjarchive.create(tmp_path / "w", humanoid_xml, world_ids=[7, 9], variant_fields=("geom_rgba",))
    models = [copy.deepcopy(mjm) for _ in range(2)]
    batch = [mujoco.MjData(x) for x in models]
    rec = mjarchive.Recorder(writer, worlds=[0, 1], sim_model=models)
    rec.record(batch)
    rec.close()
    writer.close()
    with mjarchive.open(tmp_path / "w") as archive:
        assert archive.variant_event_counts == {"geom_rgba": 2}
        assert_array_equal(archive.variant(9, 0)["geom_rgba"], mjm.geom_rgba)


@pytest.mark.parametrize("path", ["mujoco", "warp", "numpy"])
def test_set_variant_forwarded_at_recorded_frames(tmp_path, humanoid, humanoid_xml, path):
    """Without sim_model: set_variant events land on the recorder's frames, also while a block is in flight."""
    mjm = humanoid
    red = np.tile(np.float32([1, 0, 0, 1]), (mjm.ngeom, 1))
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD) if path == "warp" else None
        batch = [mujoco.MjData(mjm) for _ in range(NWORLD)]
        with mjarchive.Recorder(tmp_path / "s", humanoid_xml, worlds=[1, 2], output_fps=fps(mjm),
                                variant_fields=("geom_rgba",), block_frames=4) as rec:
            rec.set_variant(2, geom_rgba=red)  # before the archive exists: frame 0
            for n in range(40):
                if n == 20:  # frames 0-4 are in flight on the Warp path: still frame 5
                    rec.set_variant([1, 2], geom_rgba=np.stack([red * 0.5, red * 0.25]))
                    rec.set_variant(1, frame=8, geom_rgba=red)
                t = n * mjm.opt.timestep
                if path == "warp":
                    rec.record(d, time=t)
                elif path == "numpy":  # the array ring: same blocks as Warp
                    rec.record(qpos=np.zeros((NWORLD, mjm.nq)), time=t)
                else:
                    for x in batch:
                        x.time = t
                    rec.record(batch)
            with pytest.raises(mjarchive.AppendError, match="not recorded"):
                rec.set_variant(3, geom_rgba=red)
            with pytest.raises(mjarchive.AppendError, match="declared variant fields"):
                rec.set_variant(1, geom_size=mjm.geom_size)
    with mjarchive.open(tmp_path / "s") as archive:
        assert archive.variant_changes(2).tolist() == [5]
        assert archive.variant_changes(1).tolist() == [5, 8]
        assert_array_equal(archive.variant(2, 0)["geom_rgba"], red)
        assert_array_equal(archive.variant(1, 4)["geom_rgba"], mjm.geom_rgba)
        assert_array_equal(archive.variant(1, 5)["geom_rgba"], red * 0.5)
        assert_array_equal(archive.variant(2, 9)["geom_rgba"], red * 0.25)
        assert_array_equal(archive.variant(1, 9)["geom_rgba"], red)


@pytest.mark.parametrize("path", ["mujoco", "warp", "numpy"])
def test_overlays_forwarded_for_recorded_frames(tmp_path, humanoid, humanoid_xml, path):
    mjm = humanoid
    ov = {"target": mjarchive.Overlay.points(max_count=4), "label": mjarchive.Overlay.text(max_count=2)}
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD) if path == "warp" else None
        batch = [mujoco.MjData(mjm) for _ in range(NWORLD)]
        buf = np.zeros((NWORLD, 1, 3))
        with mjarchive.Recorder(tmp_path / "o", humanoid_xml, worlds=[3, 1], output_fps=fps(mjm),
                                overlays=ov, block_frames=3) as rec:
            for n in range(20):
                buf[:, 0] = [[n, w, 0] for w in range(NWORLD)]  # one buffer reused: the recorder copies
                overlays = {"target": buf}
                if n == 8:  # per recorded world (worlds order), a variable count and labels
                    overlays = {"target": [np.zeros((2, 3)), None], "label": [["three"], [((0, 0, 1), "one")]]}
                t = n * mjm.opt.timestep
                if path == "warp":
                    rec.record(d, time=t, overlays=overlays)
                elif path == "numpy":
                    rec.record(qpos=np.zeros((NWORLD, mjm.nq)), time=t, overlays=overlays)
                else:
                    for x in batch:
                        x.time = t
                    rec.record(batch, overlays=overlays)
    with mjarchive.open(tmp_path / "o") as archive:
        target = archive.select().overlay("target")
        label = archive.select().overlay("label")
        assert archive.n_frames == 5
        for f in (0, 1, 3, 4):  # recorded steps 0, 4, 12, 16: the skipped calls' overlays are dropped
            assert_array_equal(target.items(f, 0), [[f * EVERY, 3, 0]])
            assert_array_equal(target.items(f, 1), [[f * EVERY, 1, 0]])
            assert label.items(f, 0) == []
        assert_array_equal(target.items(2, 0), np.zeros((2, 3)))
        assert len(target.items(2, 1)) == 0
        assert label.items(2, 0) == [(None, "three")]
        (pos, text), = label.items(2, 1)
        assert text == "one"
        assert_array_equal(pos, [0, 0, 1])


def test_bad_overlay_refused_at_its_call(tmp_path, humanoid, humanoid_xml):
    mjm = humanoid
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "b", humanoid_xml, worlds=[0], output_fps=fps(mjm),
                                overlays={"p": mjarchive.Overlay.points(max_count=1)}) as rec:
            with pytest.raises(mjarchive.AppendError, match="max_count"):
                rec.record(d, time=0.0, overlays={"p": np.zeros((NWORLD, 2, 3))})
            with pytest.raises(mjarchive.AppendError, match="unknown overlay"):
                rec.record(d, time=1.0, overlays={"q": None, "r": np.zeros((NWORLD, 1, 3))})


def test_errors_say_what_to_pass(tmp_path, humanoid, humanoid_xml):
    mjm = humanoid
    with pytest.raises(mjarchive.MjArchiveError, match="variant_fields"):
        mjarchive.Recorder(tmp_path / "e1", humanoid_xml, sim_model=[mjm])
    with pytest.raises(mjarchive.MjArchiveError, match="list of mujoco.MjModel"):
        mjarchive.Recorder(tmp_path / "e2", humanoid_xml, sim_model=mjm, variant_fields="geom_rgba")
    rec = mjarchive.Recorder(tmp_path / "e3", humanoid_xml, sim_model=[mjm] * 2, variant_fields="geom_rgba")
    with pytest.raises(mjarchive.MjArchiveError, match="one MjModel per simulated world"):
        rec.record([mujoco.MjData(mjm) for _ in range(3)])
    rec.close()
    rec = mjarchive.Recorder(tmp_path / "e4", humanoid_xml)
    with pytest.raises(mjarchive.MjArchiveError, match="variant_fields"):
        rec.set_variant(0, geom_rgba=mjm.geom_rgba)
    rec.close()
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        rec = mjarchive.Recorder(tmp_path / "e5", humanoid_xml, sim_model=[mjm] * NWORLD, variant_fields="geom_rgba")
        with pytest.raises(mjarchive.BackendError, match="mujoco_warp Model"):
            rec.record(d, time=0.0)
        rec.close()
        m = mjw.put_model(mjm)
        m.geom_rgba = wp.zeros((3, mjm.ngeom + 1), dtype=wp.vec4)  # not the model's geoms
        rec = mjarchive.Recorder(tmp_path / "e6", humanoid_xml, sim_model=m, variant_fields="geom_rgba")
        with pytest.raises(mjarchive.BackendError, match="nworld=4, 1"):
            rec.record(d, time=0.0)
        rec.close()


def test_no_variants_no_capture(tmp_path, humanoid, humanoid_xml):
    """Without variant fields the gatherer carries no capture (the benchmarked path is unchanged)."""
    mjm = humanoid
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "n", humanoid_xml, worlds=[0]) as rec:
            rec.record(d, time=0.0)
            assert rec._gatherer._variants is None and rec._variants is None


# -- review fixes ----------------------------------------------------------------------------------

def _record(rec, path, d, batch, t, **kw):
    """One record() call of the parametrized path: MjData batch, Warp Data or NumPy arrays."""
    if path == "warp":
        return rec.record(d, time=t, **kw)
    if path == "numpy":
        return rec.record(qpos=np.stack([x.qpos for x in batch]), time=t, **kw)
    for x in batch:
        x.time = t
    return rec.record(batch, **kw)


@pytest.mark.parametrize("path", ["mujoco", "warp", "numpy"])
def test_overlays_follow_worlds_when_worlds_reorder_the_batch(tmp_path, humanoid, humanoid_xml, path):
    """A value with one entry per simulated world is indexed by `worlds`, also when `worlds` names
    every world in another order (len(worlds) == nworld); one of len(worlds) < nworld entries is
    taken in `worlds` order."""
    mjm = humanoid
    ov = {"p": mjarchive.Overlay.points(max_count=2), "t": mjarchive.Overlay.text(max_count=1)}
    with wp.ScopedDevice("cpu"):
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD) if path == "warp" else None
        batch = [mujoco.MjData(mjm) for _ in range(NWORLD)]
        per_sim = np.array([[[w, 0.0, 0.0]] for w in range(NWORLD)])
        labels = [[f"sim {w}"] for w in range(NWORLD)]
        for name, worlds in (("all", [3, 1, 0, 2]), ("some", [2, 0])):
            with mjarchive.Recorder(tmp_path / name, humanoid_xml, worlds=worlds, output_fps=fps(mjm),
                                    overlays=ov, block_frames=2) as rec:
                _record(rec, path, d, batch, 0.0, overlays={"p": per_sim, "t": labels})
                _record(rec, path, d, batch, EVERY * mjm.opt.timestep, overlays={"p": list(per_sim)})
                if name == "some":  # per recorded world, in worlds order
                    _record(rec, path, d, batch, 2 * EVERY * mjm.opt.timestep,
                            overlays={"p": np.array([[[20.0, 0, 0]], [[0.0, 0, 0]]])})
            with mjarchive.open(tmp_path / name) as archive:
                points, text = archive.select().overlay("p"), archive.select().overlay("t")
                for k, w in enumerate(archive.world_ids):
                    assert_array_equal(points.items(0, k), [[w, 0, 0]])
                    assert_array_equal(points.items(1, k), [[w, 0, 0]])
                    assert text.items(0, k) == [(None, f"sim {w}")]
                    if name == "some":
                        assert_array_equal(points.items(2, k), [[10 * w, 0, 0]])


def _nan_then_reset(tmp_path, humanoid, humanoid_xml, path, device="cpu"):
    """Every step recorded in blocks of 4; step 5 holds a NaN (refused), world 1 changes at step 6
    (a Warp capture, or set_variant on the array path) and world 0 at step 5, the refused frame."""
    mjm = humanoid
    dt = mjm.opt.timestep
    blue = np.tile(np.float32([0, 0, 1, 1]), (mjm.ngeom, 1))
    green = np.tile(np.float32([0, 1, 0, 1]), (mjm.ngeom, 1))
    refused = []
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.geom_rgba = wp.array(np.tile(mjm.geom_rgba[None], (2, 1, 1)).astype(np.float32), dtype=wp.vec4)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=2)
        kw = dict(sim_model=m) if path != "numpy" else {}
        rec = mjarchive.Recorder(tmp_path / "r", humanoid_xml, output_fps=1 / dt, variant_fields=("geom_rgba",),
                                 block_frames=4, ring_buffers=2, **kw)
        q0 = d.qpos.numpy().copy()
        for n in range(12):
            q, reset = q0.copy(), None
            if n == 5:
                q[0, 0] = np.nan
            if n in (5, 6):
                w, value = (0, green) if n == 5 else (1, blue)
                if path == "numpy":
                    rec.set_variant(w, geom_rgba=value)
                else:
                    v = m.geom_rgba.numpy()
                    v[w] = value
                    m.geom_rgba.assign(v)
                    reset = np.arange(2) == w
            try:
                if path == "numpy":
                    rec.record(qpos=q, time=n * dt, reset=reset)
                else:
                    d.qpos.assign(q)
                    rec.record(d, time=n * dt, reset=reset)
            except mjarchive.AppendError:
                refused.append(n)
        try:
            rec.close()
        except mjarchive.AppendError as exc:
            refused.append(str(exc))
    assert len(refused) == 1  # the NaN frame's refusal, raised once when its block reached the writer
    return blue, green


@pytest.mark.parametrize("path", ["numpy-gather", "kernel", "numpy"])
def test_variant_event_lands_on_its_frame_after_a_refused_frame(tmp_path, humanoid, humanoid_xml, monkeypatch,
                                                                path, device):
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", path != "kernel")
    blue, green = _nan_then_reset(tmp_path, humanoid, humanoid_xml, path, device)
    dt = humanoid.opt.timestep
    with mjarchive.open(tmp_path / "r") as archive:
        steps = np.round(archive.select().time / dt).astype(int).tolist()
        assert steps == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]  # the NaN frame alone is dropped
        assert archive.variant_changes(1).tolist() == [steps.index(6)]
        # world 0's change was captured at the refused frame: it holds from the next frame kept
        assert archive.variant_changes(0).tolist() == [steps.index(6)]
        assert_array_equal(archive.variant(1, steps.index(4))["geom_rgba"], humanoid.geom_rgba)
        assert_array_equal(archive.variant(1, steps.index(6))["geom_rgba"], blue)
        assert_array_equal(archive.variant(0, steps.index(6))["geom_rgba"], green)


def test_set_variant_refuses_bad_values_at_the_call(tmp_path, humanoid, humanoid_xml):
    mjm = humanoid
    batch = [mujoco.MjData(mjm) for _ in range(2)]
    rec = mjarchive.Recorder(tmp_path / "v", humanoid_xml, output_fps=fps(mjm),
                             variant_fields=("geom_rgba", "geom_matid"))
    with pytest.raises(mjarchive.AppendError, match="colours must lie in"):  # before the archive exists
        rec.set_variant(0, geom_rgba=np.full((mjm.ngeom, 4), 2.0))
    _record(rec, "mujoco", None, batch, 0.0)
    with pytest.raises(mjarchive.AppendError, match=r"geom_rgba of world 1: colours"):
        rec.set_variant([0, 1], geom_rgba=np.stack([mjm.geom_rgba, np.full((mjm.ngeom, 4), -1.0)]))
    with pytest.raises(mjarchive.AppendError, match="material ids"):  # ids: checked against the model
        rec.set_variant(1, geom_matid=np.full(mjm.ngeom, mjm.nmat))
    with pytest.raises(mjarchive.AppendError, match="must be integer"):
        rec.set_variant(1, geom_matid=np.zeros(mjm.ngeom))
    for i in range(1, 4):
        assert _record(rec, "mujoco", None, batch, i * EVERY * mjm.opt.timestep)
    assert rec.frames_recorded == rec.writer.n_frames == 4
    rec.close()
    # Through an open writer, ids are checked against the writer's model.
    writer = mjarchive.create(tmp_path / "w", humanoid_xml, world_ids=[5], variant_fields=("geom_matid",))
    rec = mjarchive.Recorder(writer, worlds=[0])
    with pytest.raises(mjarchive.AppendError, match="material ids"):
        rec.set_variant(5, geom_matid=np.full(mjm.ngeom, -2))
    rec.set_variant(5, geom_matid=np.full(mjm.ngeom, 1))
    rec.record(mujoco.MjData(mjm))
    rec.close()
    writer.close()
    with mjarchive.open(tmp_path / "w") as archive:
        assert archive.variant(5, 0)["geom_matid"].tolist() == [1] * mjm.ngeom


def test_refused_captured_values_keep_the_frame(tmp_path, humanoid, humanoid_xml):
    """MjData path: a captured value the writer refuses is raised after its frame was appended."""
    mjm = humanoid
    models = [copy.deepcopy(mjm) for _ in range(2)]
    batch = [mujoco.MjData(x) for x in models]
    with mjarchive.Recorder(tmp_path / "c", humanoid_xml, sim_model=models, output_fps=fps(mjm),
                            variant_fields=("geom_rgba",)) as rec:
        for n in range(3):
            reset = None
            if n == 1:
                models[1].geom_rgba[:] = 2.0  # not a colour
                reset = np.array([False, True])
            if n == 2:
                models[1].geom_rgba[:] = 0.5
                reset = np.array([False, True])
            if n == 1:
                with pytest.raises(mjarchive.AppendError, match="colours must lie in"):
                    _record(rec, "mujoco", None, batch, n * EVERY * mjm.opt.timestep, reset=reset)
            else:
                assert _record(rec, "mujoco", None, batch, n * EVERY * mjm.opt.timestep, reset=reset)
            assert rec.writer.n_frames == rec.frames_recorded == n + 1
    with mjarchive.open(tmp_path / "c") as archive:
        assert archive.n_frames == 3
        assert archive.variant_changes(1).tolist() == [2]
        assert archive.episodes(1)[1].start == 1  # the reset itself was recorded
        assert_array_equal(archive.variant(1, 2)["geom_rgba"], np.full((mjm.ngeom, 4), 0.5, np.float32))


@pytest.mark.parametrize("gather", ["numpy", "kernel"])
def test_warp_fields_replaced_at_the_same_address(tmp_path, humanoid, humanoid_xml, monkeypatch, gather, device):
    """Views of one array share its address: the capture follows their shape and strides, and a
    leading dimension n other than 1 or nworld gives world w row w % n, as mujoco_warp reads it."""
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", gather == "numpy")
    mjm = humanoid
    rgba8 = colours(8, mjm.ngeom)
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        big = wp.array(rgba8, dtype=wp.vec4)
        m.geom_rgba = big[0:4]  # rows 0..3: world w -> row w
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "a", humanoid_xml, worlds=[1, 3], sim_model=m, output_fps=fps(mjm),
                                variant_fields="geom_rgba", block_frames=2) as rec:
            for n in range(40):
                reset = None
                if n == 8:
                    m.geom_rgba = big[::2]  # same address and shape, other strides: world 3 -> row 6
                    reset = np.arange(NWORLD) == 3
                elif n == 16:
                    m.geom_rgba = big[0:3]  # 3 rows: world 3 -> row 0, world 1 -> row 1
                    reset = np.arange(NWORLD) == 3
                elif n == 24:
                    m.geom_rgba = big[0:1]  # shared
                    reset = wp.array(np.arange(NWORLD) >= 0, dtype=wp.bool)
                rec.record(d, time=n * mjm.opt.timestep, reset=reset)
    with mjarchive.open(tmp_path / "a") as archive:
        f1, f2, f3 = frame_of(8), frame_of(16), frame_of(24)
        assert archive.variant_changes(3).tolist() == [f1, f2]
        assert archive.variant_changes(1).tolist() == [f3]
        assert_array_equal(archive.variant(3, 0)["geom_rgba"], rgba8[3])
        assert_array_equal(archive.variant(3, f1)["geom_rgba"], rgba8[6])
        assert_array_equal(archive.variant(3, f2)["geom_rgba"], rgba8[0])
        assert_array_equal(archive.variant(1, f3)["geom_rgba"], rgba8[0])
        assert_array_equal(archive.variant(1, f3 - 1)["geom_rgba"], rgba8[1])


@pytest.mark.parametrize("gather", ["numpy", "kernel"])
def test_warp_refused_first_frame_leaves_the_first_capture_to_the_next(tmp_path, humanoid, humanoid_xml, monkeypatch,
                                                                      gather, device):
    """A first frame refused for a badly shaped variant field (after a refused call made the capture)
    captures nothing; the frame then recorded first captures every selected world, as a first does."""
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", gather == "numpy")
    mjm = humanoid
    rgba = colours(NWORLD, mjm.ngeom)
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "f", humanoid_xml, worlds=[1, 3], sim_model=m, output_fps=fps(mjm),
                                variant_fields="geom_rgba", block_frames=2) as rec:
            with pytest.raises(mjarchive.AppendError, match="reset must have shape"):  # the capture is made
                rec.record(d, time=0.0, reset=wp.zeros(NWORLD + 1, dtype=wp.bool))
            m.geom_rgba = wp.array(np.zeros((NWORLD, mjm.ngeom + 1, 4), np.float32), dtype=wp.vec4)
            with pytest.raises(mjarchive.BackendError, match="geom_rgba has shape"):
                rec.record(d, time=0.0)
            assert rec.frames_recorded == 0
            m.geom_rgba = wp.array(rgba, dtype=wp.vec4)
            for n in range(1, 4):  # the refused frame at time 0 took its place in the cadence
                rec.record(d, time=n * EVERY * mjm.opt.timestep)
    assert rec._gatherer._variants.rows_captured == 2
    with mjarchive.open(tmp_path / "f") as archive:
        assert archive.n_frames == 3
        for w in (1, 3):
            assert archive.variant_changes(w).tolist() == []
            assert_array_equal(archive.variant(w, 0)["geom_rgba"], rgba[w])
            assert_array_equal(archive.variant(w, 2)["geom_rgba"], rgba[w])


SITE_XML = """<mujoco><worldbody><body pos="0 0 1"><freejoint/><geom type="sphere" size=".1"/>
<site name="s" size=".05" rgba="1 0 0 1"/></body></worldbody></mujoco>"""


def test_warp_model_without_a_declared_field_warns(tmp_path, device):
    import warnings

    xml = tmp_path / "site.xml"
    xml.write_text(SITE_XML)
    mjm = mujoco.MjModel.from_xml_path(str(xml))
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        assert getattr(m, "site_rgba", None) is None
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=2)
        with mjarchive.Recorder(tmp_path / "s", xml, sim_model=m, output_fps=100,
                                variant_fields=("geom_rgba", "site_rgba")) as rec:
            with pytest.warns(UserWarning, match=r"no site_rgba.*rec\.set_variant\(world_ids, site_rgba=") as got:
                rec.record(d, time=0.0)
            assert got[0].filename == __file__  # points at the record() call
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                rec.record(d, time=1.0)  # once
            rec.set_variant(1, site_rgba=np.float32([[0, 0, 1, 1]]))
            rec.record(d, time=2.0)
    with mjarchive.open(tmp_path / "s") as archive:
        assert archive.variant_changes(1).tolist() == [2]
        assert archive.variant_event_counts["geom_rgba"] == 0


def test_device_masks_capture_only_resetting_worlds(tmp_path, humanoid, humanoid_xml, monkeypatch, device):
    """Kernel path with device reset masks: the row copies run one thread per selected world (not
    one per world × element), and only resetting worlds' rows are captured."""
    import mjarchive.record.warp as rw

    monkeypatch.setattr(rw, "CPU_NUMPY_GATHER", False)
    mjm = humanoid
    rgba = colours(NWORLD, mjm.ngeom)
    new = colours(1, mjm.ngeom, shift=0.5)[0]
    none = wp.zeros(NWORLD, dtype=wp.bool, device=device)
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        m.geom_rgba = wp.array(rgba, dtype=wp.vec4)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
        with mjarchive.Recorder(tmp_path / "d", humanoid_xml, worlds=[0, 1, 2], sim_model=m, output_fps=fps(mjm),
                                variant_fields="geom_rgba", block_frames=4) as rec:
            for n in range(48):
                reset = none
                if n == 20:
                    values = m.geom_rgba.numpy()
                    values[2] = new
                    m.geom_rgba.assign(values)
                    reset = wp.array(np.arange(NWORLD) == 2, dtype=wp.bool)
                rec.record(d, time=n * mjm.opt.timestep, reset=reset)
            variants = rec._gatherer._variants
            for _key, _mark, rows in variants._launches:
                for cmd in rows:
                    assert cmd.bounds.size == 3  # k threads, not k × ngeom
    assert variants.rows_captured == 3 + 1
    with mjarchive.open(tmp_path / "d") as archive:
        assert archive.variant_changes(2).tolist() == [frame_of(20)]
        assert archive.variant_changes(0).tolist() == archive.variant_changes(1).tolist() == []
        assert_array_equal(archive.variant(2, frame_of(20))["geom_rgba"], new)
