"""`Recorder.record_rollout`: scanned rollouts of (steps, worlds, ...) arrays in one call.

The oracle is the per-step path: the same arrays handed to `record()` one step at a time give the
frames, times and episode starts a rollout must give; only the selected rows at frame steps may
reach the host.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import mjarchive
from mjarchive.record import rollout as rollout_module

from test_recorder import MOCAP_XML, expected_steps  # noqa: E402
from test_recorder_arrays import _convert  # noqa: E402

NWORLD = 6
SEL = [1, 4, 5]
STEPS = 120
DT = 0.01


@pytest.fixture
def mocap_xml(tmp_path):
    path = tmp_path / "mocap.xml"
    path.write_text(MOCAP_XML.format(timestep=DT))
    return path


def _rollout(model, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    fields = {
        "qpos": rng.standard_normal((steps, NWORLD, model.nq)).astype(np.float32),
        "mocap_pos": rng.standard_normal((steps, NWORLD, 1, 3)).astype(np.float32),
        "mocap_quat": rng.standard_normal((steps, NWORLD, 1, 4)).astype(np.float32),
        "reward": rng.standard_normal((steps, NWORLD)).astype(np.float32),
    }
    reset = np.zeros((max(steps, STEPS), NWORLD), bool)
    reset[7, 4] = True      # on a frame step? (0.01 s steps, 30 fps: frames at 0, 4, 7, 10, ...)
    reset[8, 1] = True      # between two frames
    reset[9, 5] = True      # and again the step before the next frame
    reset[30, 0] = True     # an unselected world: never copied, never an episode start
    reset[steps - 1, 5] = True  # after the rollout's last frame: carried into the next call
    return fields, reset[:steps]


def _read(path):
    with mjarchive.open(path) as archive:
        sel = archive.select()
        return {"qpos": sel.qpos, "mocap_pos": sel.mocap_pos, "mocap_quat": sel.mocap_quat,
                "reward": sel.reward, "reset": sel.reset, "time": np.asarray(archive.time),
                "world_ids": archive.world_ids, "episodes": [archive.episodes(w) for w in archive.world_ids]}


def _per_step(path, xml, fields, reset, chunks=1):
    """The reference: record() once per step, with the same masks (a mask of several steps is
    what the recorder accumulates between frames)."""
    steps = len(fields["qpos"])
    with mjarchive.Recorder(path, xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        for n in range(steps):
            rec.record(time=n * DT, reset=reset[n], **{k: v[n] for k, v in fields.items()})
    return _read(path)


@pytest.mark.parametrize("library", ["numpy", "jax", "torch", "torch-cuda", "jax-gpu", "cupy-cuda"])
def test_a_rollout_keeps_what_per_step_recording_keeps(tmp_path, mocap_xml, library):
    conv = _convert(library)
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    expected = _per_step(tmp_path / "steps", mocap_xml, fields, reset)
    half = STEPS // 2 + 1  # two scanned chunks, the second not starting on a frame
    with mjarchive.Recorder(tmp_path / "roll", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        n = 0
        for chunk in (slice(0, half), slice(half, STEPS)):
            steps = np.arange(STEPS)[chunk]
            n += rec.record_rollout(time=conv(steps * DT), reset=conv(reset[chunk]),
                                    **{k: conv(v[chunk]) for k, v in fields.items()})
    frames = expected_steps(30, 1.0, DT, STEPS)
    assert n == len(frames) == len(expected["time"])
    got = _read(tmp_path / "roll")
    for key, value in expected.items():
        assert_array_equal(np.asarray(got[key], dtype=object) if key == "episodes" else got[key],
                           np.asarray(value, dtype=object) if key == "episodes" else value, err_msg=key)
    assert_array_equal(got["qpos"], fields["qpos"][np.ix_(frames, SEL)])
    starts = {w: [f for f in range(n) if got["reset"][f, i]] for i, w in enumerate(SEL)}
    assert starts == {1: [frames.index(10)], 4: [frames.index(7)], 5: [frames.index(10)]}
    row_bytes = (model.nq + 7 + 1) * 4
    assert rec.row_bytes == row_bytes
    assert rec.bytes_copied == n * len(SEL) * row_bytes  # selected worlds x frames x row: nothing else


def test_a_reset_after_the_last_frame_starts_the_next_calls_first_frame(tmp_path, mocap_xml):
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        first = rec.record_rollout(time=np.arange(STEPS) * DT, reset=reset, **fields)
        t = STEPS * DT + np.arange(10) * DT
        rec.record_rollout(time=t, **{k: v[:10] for k, v in fields.items()})
    got = _read(tmp_path / "a")
    assert got["reset"][first].tolist() == [False, False, True]  # world 5 reset at the first call's last step


def test_record_then_rollout_keeps_order_and_pending_resets(tmp_path, mocap_xml):
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()},
                            block_frames=4) as rec:
        for n in range(20):  # per step, a device reset mask of world 4 at step 19 (no frame there)
            rec.record(time=n * DT, reset=jnp.asarray(np.arange(NWORLD) == 4) if n == 19 else None,
                       **{k: jnp.asarray(v[n]) for k, v in fields.items()})
        rec.record_rollout(time=jnp.asarray(np.arange(20, STEPS) * DT),
                           **{k: jnp.asarray(v[20:]) for k, v in fields.items()})
    frames = expected_steps(30, 1.0, DT, STEPS)
    got = _read(tmp_path / "a")
    assert_array_equal(got["qpos"], fields["qpos"][np.ix_(frames, SEL)])
    assert_array_equal(got["time"], np.asarray(frames) * DT)
    first_after = next(i for i, f in enumerate(frames) if f >= 20)
    assert got["reset"][first_after].tolist() == [False, True, False]


def test_a_stacked_mjx_rollout_and_state_done(tmp_path):
    """A jitted lax.scan over vmapped MJX steps hands its stacked Data; a State-like object's
    `.done` marks the resets."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    mjx = pytest.importorskip("mujoco.mjx", reason="mujoco-mjx is not installed")
    xml = tmp_path / "pendulum.xml"
    xml.write_text("""<mujoco><option timestep="0.01"/><worldbody><body name="pole">
      <joint name="hinge" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04"/>
      </body></worldbody></mujoco>""")
    model = mujoco.MjModel.from_xml_path(str(xml))
    mx = mjx.put_model(model)
    init = jax.vmap(lambda q: mjx.make_data(mx).replace(qpos=q))(jax.numpy.linspace(-1, 1, 8)[:, None])

    @jax.jit
    def rollout(d):
        def body(d, _):
            d = jax.vmap(mjx.step, in_axes=(None, 0))(mx, d)
            return d, d
        return jax.lax.scan(body, d, None, length=50)[1]

    states = rollout(init)

    class State:  # what Playground and Brax scan: .data stacked (T, W, ...), .done (T, W)
        data = states
        done = jax.numpy.zeros((50, 8)).at[25, 3].set(1.0)

    with mjarchive.Recorder(tmp_path / "m", xml, worlds=[3, 6], output_fps=20) as rec:
        n = rec.record_rollout(State())
    with mjarchive.Recorder(tmp_path / "d", xml, worlds=[3, 6], output_fps=20) as rec:
        assert rec.record_rollout(states) == n
    frames = expected_steps(20, 1.0, 0.01, 50)  # data.time runs 0.01 .. 0.50: the first step is a frame
    q = np.asarray(states.qpos)
    with mjarchive.open(tmp_path / "m") as archive:
        assert archive.manifest.producer["backend"] == "mjx"
        sel = archive.select()
        assert_array_equal(sel.qpos, q[np.ix_(frames, [3, 6])])
        np.testing.assert_allclose(archive.time, np.asarray(states.time)[frames, 0], atol=1e-6)
        starts = [f for f in range(n) if sel.reset[f, 0]]
        assert starts == [next(i for i, f in enumerate(frames) if f >= 25)]
        assert not sel.reset[:, 1].any()
    with mjarchive.open(tmp_path / "d") as archive:
        assert not archive.select().reset.any()


def test_a_long_rollout_goes_out_in_bounded_parts(tmp_path, mocap_xml, monkeypatch):
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    monkeypatch.setattr(rollout_module, "MAX_BLOCK_BYTES", 3 * len(SEL) * (model.nq + 8) * 4)  # 3 frames a part
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()},
                            chunk_frames=4) as rec:
        rec.record_rollout(time=np.arange(STEPS) * DT, reset=reset, **fields)
    expected = _per_step(tmp_path / "b", mocap_xml, fields, reset)
    got = _read(tmp_path / "a")
    assert_array_equal(got["qpos"], expected["qpos"])
    assert_array_equal(got["reset"], expected["reset"])


def test_refusals_name_the_problem(tmp_path, mocap_xml):
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model, steps=10)
    t = np.arange(10) * DT
    rec = mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, tracks={"reward": ()})
    with pytest.raises(mjarchive.AppendError, match=r"qpos has shape \(6, 7\); a rollout's qpos is"):
        rec.record_rollout(time=t, **{k: v[0] for k, v in fields.items()})
    with pytest.raises(mjarchive.AppendError, match=r"reward has shape \(9, 6\); expected"):
        rec.record_rollout(time=t, **dict(fields, reward=fields["reward"][:9]))
    with pytest.raises(mjarchive.AppendError, match="pass time="):
        rec.record_rollout(**fields)
    with pytest.raises(mjarchive.AppendError, match=r"time has shape \(9,\)"):
        rec.record_rollout(time=t[:9], **fields)
    with pytest.raises(mjarchive.AppendError, match="non-finite value at step 3"):
        rec.record_rollout(time=np.where(np.arange(10) == 3, np.nan, t), **fields)
    with pytest.raises(mjarchive.AppendError, match=r"reset has shape \(10, 5\)"):
        rec.record_rollout(time=t, reset=reset[:, :5], **fields)
    with pytest.raises(mjarchive.AppendError, match="needs \\['reward'\\]"):
        rec.record_rollout(time=t, **{k: v for k, v in fields.items() if k != "reward"})
    with pytest.raises(mjarchive.AppendError, match="dtype complex64"):
        rec.record_rollout(time=t, **dict(fields, reward=fields["reward"].astype(np.complex64)))
    with pytest.raises(mjarchive.AppendError, match="takes a stacked MJX Data"):
        rec.record_rollout(object())
    with pytest.raises(mjarchive.AppendError, match=r"time has shape \(10, 1, 2\)"):
        rec.record_rollout(time=[[[0.0, 0.0]]] * 10, **fields)
    with pytest.raises(mjarchive.AppendError, match="time must be numbers"):
        rec.record_rollout(time=["soon"] * 10, **fields)
    with pytest.raises(mjarchive.AppendError, match="no worlds"):
        rec.record_rollout(time=t, **{k: v[:, :0] for k, v in fields.items()})
    assert rec.writer is None or rec.writer.n_frames == 0  # nothing refused reached the archive
    assert rec.record_rollout(time=t.reshape(-1, 1).tolist(), reset=reset, **fields) > 0  # (steps, 1): a list
    rec.close()
    with pytest.raises(mjarchive.ClosedError):
        rec.record_rollout(time=t, **fields)


def test_a_step_by_step_warp_recorder_refuses_rollouts(tmp_path, mocap_xml):
    rec = mjarchive.Recorder(tmp_path / "a", mocap_xml)
    data = [mujoco.MjData(mujoco.MjModel.from_xml_path(str(mocap_xml))) for _ in range(2)]
    rec.record(data)
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, _ = _rollout(model, steps=3)
    with pytest.raises(mjarchive.AppendError, match="records mujoco data step by step"):
        rec.record_rollout(time=np.arange(3) * DT, **{k: v[:, :2] for k, v in fields.items() if k != "reward"})
    rec.close()


@pytest.mark.parametrize("fps,speed,timestep", [(30, 1.0, 0.01), (25, 0.2, 1e-4), (60, 2.0, 0.002), (7, 1.0, 0.05)])
def test_cadence_over_many_steps_equals_step_by_step(fps, speed, timestep):
    """The vectorized cadence picks the frames, times and end state of one `advance` per step,
    over clocks that stall, jump, restart (a reset of world 0) and start late."""
    from mjarchive.record.cadence import Cadence

    rng = np.random.default_rng(fps)
    for trial in range(40):
        one, many = Cadence(fps, speed, timestep), Cadence(fps, speed, timestep)
        step = int(rng.integers(0, 10**6)) if trial % 2 else 0
        for _chunk in range(int(rng.integers(1, 5))):
            deltas = rng.choice([0, 1, 1, 1, 2, 7, -3], size=int(rng.integers(0, 60)))
            steps = []
            for d in deltas:
                step = int(rng.integers(0, 5)) if d == -3 else step + int(d)  # -3: restart near 0
                steps.append(step)
            times = np.asarray(steps, np.float64) * timestep
            expected = [(i, one.time) for i, t in enumerate(times.tolist()) if one.advance(t)]
            index, stamps = many.advance_many(times)
            assert index.tolist() == [i for i, _ in expected]
            assert stamps.tolist() == [t for _, t in expected]
            assert many.clock == one.clock and many._next_k == one._next_k and many._last_m == one._last_m
        assert one.clock is None or many.time == one.time
    huge = Cadence(fps, speed, timestep)  # beyond int64's room: the per-step loop, same answers
    ref = Cadence(fps, speed, timestep)
    times = (2**50 + np.arange(20)) * timestep
    assert huge.advance_many(times)[0].tolist() == [i for i, t in enumerate(times.tolist()) if ref.advance(t)]


def test_a_refused_rollout_leaves_pending_device_resets(tmp_path, mocap_xml):
    """A rollout refused for its own arguments changes nothing: a device reset mask given to record()
    at a step that was no frame still starts the next frame's episode."""
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, _ = _rollout(model, steps=40)
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        for n in range(7):  # frames at steps 0 and 4; world 4 resets at step 5
            rec.record(time=n * DT, reset=jnp.asarray(np.arange(NWORLD) == 4) if n == 5 else None,
                       **{k: jnp.asarray(v[n]) for k, v in fields.items()})
        with pytest.raises(mjarchive.AppendError, match=r"time has shape \(3,\)"):
            rec.record_rollout(time=np.arange(7, 10) * DT, **{k: jnp.asarray(v[7:]) for k, v in fields.items()})
        rec.record_rollout(time=np.arange(7, 40) * DT, **{k: jnp.asarray(v[7:]) for k, v in fields.items()})
    got = _read(tmp_path / "a")
    assert_array_equal(got["time"], np.asarray(expected_steps(30, 1.0, DT, 40)) * DT)
    assert got["reset"][2].tolist() == [False, True, False]  # frame 2, step 7: world 4's reset at step 5


def test_a_refused_frame_costs_no_other_frame_of_the_rollout(tmp_path, mocap_xml, monkeypatch):
    """A NaN in the first part of a rollout sent in parts: the writer refuses that frame only; the
    parts after it, the cadence and the counters go on as per-step recording's do."""
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    frames = expected_steps(30, 1.0, DT, STEPS)
    fields["qpos"][frames[1], SEL[1], 0] = np.nan
    monkeypatch.setattr(rollout_module, "MAX_BLOCK_BYTES", 3 * len(SEL) * (model.nq + 8) * 4)  # 3 frames a part
    rec = mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()})
    with pytest.raises(mjarchive.AppendError, match="not finite"):
        rec.record_rollout(time=np.arange(STEPS) * DT, reset=reset, **fields)
    assert rec.frames_recorded == len(frames)
    assert rec.writer.n_frames == len(frames) - 1
    assert rec.record_rollout(time=np.arange(STEPS, STEPS + 10) * DT, **{k: v[20:30] for k, v in fields.items()}) == 3
    rec.close()
    got = _read(tmp_path / "a")
    kept = [f for f in frames if f != frames[1]]
    assert_array_equal(got["time"][: len(kept)], np.asarray(kept) * DT)
    assert_array_equal(got["qpos"][: len(kept)], fields["qpos"][np.ix_(kept, SEL)])
    assert_array_equal(got["time"][len(kept):], (STEPS + np.asarray([0, 4, 7])) * DT)


def test_a_refused_frame_of_earlier_record_calls_costs_no_frame_of_the_rollout(tmp_path, mocap_xml):
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, _ = _rollout(model, steps=40)
    fields["qpos"][4, SEL[0], 0] = np.nan  # step 4, frame 1: in the block record() still holds
    rec = mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()})
    for n in range(10):
        rec.record(time=n * DT, **{k: v[n] for k, v in fields.items()})
    with pytest.raises(mjarchive.AppendError, match="frame 1, world 1"):
        rec.record_rollout(time=np.arange(10, 40) * DT, **{k: v[10:] for k, v in fields.items()})
    rec.close()
    kept = [f for f in expected_steps(30, 1.0, DT, 40) if f != 4]
    got = _read(tmp_path / "a")
    assert_array_equal(got["time"], np.asarray(kept) * DT)
    assert_array_equal(got["qpos"], fields["qpos"][np.ix_(kept, SEL)])


def test_a_state_with_named_tracks(tmp_path, mocap_xml):
    """Tracks a State does not hold are named next to it; a named field stands in for the State's."""
    from types import SimpleNamespace

    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    t = np.repeat((np.arange(STEPS) * DT)[:, None], NWORLD, axis=1)
    data = SimpleNamespace(qpos=fields["qpos"] + 1, mocap_pos=fields["mocap_pos"], mocap_quat=fields["mocap_quat"],
                           time=t)
    states = SimpleNamespace(data=data, done=reset)
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        rec.record_rollout(states, reward=fields["reward"], qpos=fields["qpos"])
    expected = _per_step(tmp_path / "b", mocap_xml, fields, reset)
    got = _read(tmp_path / "a")
    for key in ("qpos", "reward", "reset", "time"):
        assert_array_equal(got[key], expected[key], err_msg=key)


def _failing_once(monkeypatch, at_call, exc):
    """rollout.gather_rows raising `exc` at its `at_call`-th call (0-based), as a device can (out of memory)."""
    real, calls = rollout_module.gather_rows, []

    def gather_rows(*args):
        calls.append(1)
        if len(calls) == at_call + 1:
            raise exc
        return real(*args)

    monkeypatch.setattr(rollout_module, "gather_rows", gather_rows)


def test_a_failed_gather_records_nothing_and_the_same_rollout_can_be_retried(tmp_path, mocap_xml, monkeypatch):
    """A device failure while gathering the rollout's only part: an AppendError, nothing recorded, the
    cadence and pending resets (a device mask given to record() between frames) as before the call,
    so handing over the same rollout again keeps exactly what per-step recording keeps."""
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()},
                            block_frames=4) as rec:
        for n in range(20):  # a device reset of world 4 at step 19, no frame there
            rec.record(time=n * DT, reset=jnp.asarray(np.arange(NWORLD) == 4) if n == 19 else None,
                       **{k: jnp.asarray(v[n]) for k, v in fields.items()})
        recorded = rec.frames_recorded
        rest = dict(time=jnp.asarray(np.arange(20, STEPS) * DT), **{k: jnp.asarray(v[20:]) for k, v in fields.items()})
        _failing_once(monkeypatch, 0, RuntimeError("RESOURCE_EXHAUSTED: out of memory"))
        with pytest.raises(mjarchive.AppendError, match="nothing of it was recorded.*RESOURCE_EXHAUSTED"):
            rec.record_rollout(**rest)
        assert rec.frames_recorded == recorded
        rec.record_rollout(**rest)
    frames = expected_steps(30, 1.0, DT, STEPS)
    got = _read(tmp_path / "a")
    assert_array_equal(got["time"], np.asarray(frames) * DT)
    assert_array_equal(got["qpos"], fields["qpos"][np.ix_(frames, SEL)])
    first_after = next(i for i, f in enumerate(frames) if f >= 20)
    assert got["reset"][first_after].tolist() == [False, True, False]


def test_a_gather_failing_in_a_later_part_says_what_was_recorded(tmp_path, mocap_xml, monkeypatch):
    """The frames before the failed part are kept; the resets of the frames after it are not lost:
    they start the next recorded frame's episodes."""
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model)
    frames = expected_steps(30, 1.0, DT, STEPS)
    reset[frames[8] - 1, SEL[0]] = True  # in the part that fails (frames 6..8)
    monkeypatch.setattr(rollout_module, "MAX_BLOCK_BYTES", 3 * len(SEL) * (model.nq + 8) * 4)  # 3 frames a part
    _failing_once(monkeypatch, 2, RuntimeError("CUDA out of memory"))
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        with pytest.raises(mjarchive.AppendError, match=rf"at its step {frames[6]}: its 6 frames before that step "
                                                        rf"were recorded, the {len(frames) - 6} from it on were not.*"
                                                        "hand over fewer steps per call"):
            rec.record_rollout(time=np.arange(STEPS) * DT, reset=reset, **fields)
        assert rec.frames_recorded == 6
        rec.record_rollout(time=(STEPS + np.arange(5)) * DT, **{k: v[:5] for k, v in fields.items()})
    got = _read(tmp_path / "a")
    assert_array_equal(got["qpos"][:6], fields["qpos"][np.ix_(frames[:6], SEL)])
    assert got["reset"][6].tolist() == [True, False, True]  # world 1 at frame 8's step, world 5 at the last step


def test_fields_on_two_devices_are_refused_before_anything_changes(tmp_path, mocap_xml):
    torch = pytest.importorskip("torch", reason="torch is not installed (no CPU wheel from PyPI here)")
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, reset = _rollout(model, steps=10)
    tensors = {k: torch.from_numpy(v) for k, v in fields.items()}
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, tracks={"reward": ()}) as rec:
        with pytest.raises(mjarchive.AppendError, match="reward is on meta, qpos on cpu: pass every field on one"):
            rec.record_rollout(time=np.arange(10) * DT, **dict(tensors, reward=tensors["reward"].to("meta")))
        assert rec.record_rollout(time=np.arange(10) * DT, **tensors) == len(expected_steps(30, 1.0, DT, 10))


def test_torch_cuda_reset_given_on_a_side_stream_reaches_the_next_rollout(tmp_path, mocap_xml):
    """A reset mask accumulated on a side stream whose work lands late, then a rollout on the default
    stream: the rollout's copy of the accumulator waits for it."""
    conv = _convert("torch-cuda")  # skips without CUDA
    import torch

    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, _ = _rollout(model, steps=40)
    dev = {k: conv(v) for k, v in fields.items()}
    side = torch.cuda.Stream()
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()}) as rec:
        for n in range(10):  # frames at steps 0, 4, 7; world 4 resets at step 9, no frame there
            with torch.cuda.stream(side):
                reset = None
                if n == 9:
                    torch.cuda._sleep(1_000_000_000)  # the mask below is written late
                    reset = torch.arange(NWORLD, device="cuda") == 4
                rec.record(time=n * DT, reset=reset, **{k: v[n] for k, v in dev.items()})
        rec.record_rollout(time=np.arange(10, 40) * DT, **{k: v[10:] for k, v in dev.items()})
    frames = expected_steps(30, 1.0, DT, 40)
    got = _read(tmp_path / "a")
    assert_array_equal(got["qpos"], fields["qpos"][np.ix_(frames, SEL)])
    assert got["reset"][frames.index(10)].tolist() == [False, True, False]


def test_torch_cuda_rollout_inside_a_graph_capture_is_refused(tmp_path, mocap_xml):
    conv = _convert("torch-cuda")  # skips without CUDA
    import torch

    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    fields, _ = _rollout(model, steps=10)
    dev = {k: conv(v) for k, v in fields.items()}
    frames = expected_steps(30, 1.0, DT, 10)
    graph = torch.cuda.CUDAGraph()
    t, t_dev = np.arange(10, 20) * DT, conv(np.arange(10, 20) * DT)  # made before the capture
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=30, tracks={"reward": ()},
                            block_frames=8) as rec:
        for n in range(10):  # a block of earlier record() calls left unsealed: the rollout would copy it
            rec.record(time=n * DT, **{k: v[n] for k, v in dev.items()})
        with torch.cuda.graph(graph):
            doubled = dev["qpos"] * 2  # something to capture
            for time in (t, t_dev):
                with pytest.raises(mjarchive.AppendError, match="inside a CUDA graph capture"):
                    rec.record_rollout(time=time, **dict(dev, qpos=doubled))
        graph.replay()
        assert rec.frames_recorded == len(frames)
        assert rec.record_rollout(time=t, **dict(dev, qpos=doubled)) == 3  # steps 10, 14, 17
    got = _read(tmp_path / "a")["qpos"]
    assert_array_equal(got[:len(frames)], fields["qpos"][np.ix_(frames, SEL)])
    assert_array_equal(got[len(frames):], 2 * fields["qpos"][np.ix_([0, 4, 7], SEL)])
