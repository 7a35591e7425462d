"""Recording from arrays: NumPy, torch and JAX (CPU builds), MJX Data and Warp arrays.

Each library's test runs where the library is installed and is skipped with the reason elsewhere
(torch has no CPU wheel on PyPI for every Python; CI's Python 3.11 run installs it). Arrays on a GPU
("torch-cuda", "jax-gpu", "cupy-cuda", Warp's "cuda:0") run where there is one: `-k "cuda or gpu"`
selects them (CuPy only ever runs there: it has no CPU build).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

import mjarchive

from conftest import warp_devices  # noqa: E402
from test_recorder import MOCAP_XML, expected_steps  # noqa: E402

NWORLD = 16
SEL = [2, 5, 11]


def _convert(library):
    """A function turning a NumPy array into an array of `library`, on its GPU for "torch-cuda",
    "jax-gpu" and "cupy-cuda" (skips when the library, or that GPU, is not here)."""
    if library == "numpy":
        return np.array
    if library.startswith("torch"):
        torch = pytest.importorskip("torch", reason="torch is not installed (no CPU wheel from PyPI here)")
        if library == "torch":
            return lambda a: torch.from_numpy(np.array(a))
        if not torch.cuda.is_available():
            pytest.skip("torch sees no CUDA device here")
        return lambda a: torch.from_numpy(np.array(a)).to("cuda")
    if library == "cupy-cuda":
        cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError:
            count = 0
        if not count:
            pytest.skip("CuPy sees no CUDA device here")
        return lambda a: cupy.asarray(np.array(a))
    jax = pytest.importorskip("jax", reason="jax is not installed")
    if library == "jax":
        return jax.numpy.asarray
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU here")
    return lambda a: jax.device_put(np.asarray(a), gpu)


@pytest.fixture
def mocap_xml(tmp_path):
    path = tmp_path / "mocap.xml"
    path.write_text(MOCAP_XML.format(timestep=0.01))
    return path


@pytest.mark.parametrize("library", ["numpy", "torch", "jax", "torch-cuda", "jax-gpu", "cupy-cuda"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_selected_rows_exact_bytes_and_resets(tmp_path, mocap_xml, library, dtype):
    """Only the selected worlds' rows are copied, in the arrays' own dtype; device and host reset
    masks both land on the next recorded frame; custom tracks with explicit shapes."""
    conv = _convert(library)
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    rng = np.random.default_rng(1)
    steps = 90
    qpos = rng.standard_normal((steps, NWORLD, model.nq)).astype(dtype)
    qvel = rng.standard_normal((steps, NWORLD, model.nv)).astype(dtype)
    mpos = rng.standard_normal((steps, NWORLD, 1, 3)).astype(dtype)
    mquat = rng.standard_normal((steps, NWORLD, 1, 4)).astype(dtype)
    reward = rng.standard_normal((steps, NWORLD)).astype(dtype)
    recorded = []
    with mjarchive.Recorder(tmp_path / "a", mocap_xml, worlds=SEL, output_fps=25,
                            tracks={"qvel": None, "reward": ()}, block_frames=4, ring_buffers=2,
                            chunk_frames=8) as rec:
        for n in range(steps):
            reset = None
            if n == 20:  # world 5 reset: a mask of the arrays' own library (accumulated on its device)
                reset = conv(np.arange(NWORLD) == 5)
            elif n == 41:  # world 11 reset, between two recorded frames: a NumPy mask
                reset = np.arange(NWORLD) == 11
            if rec.record(qpos=conv(qpos[n]), qvel=conv(qvel[n]), mocap_pos=conv(mpos[n]),
                          mocap_quat=conv(mquat[n]), reward=conv(reward[n]), time=n * 0.01, reset=reset):
                recorded.append(n)
            if n == 50:
                rec.flush()  # a partial block goes out; recording continues into the next one
    assert recorded == expected_steps(25, 1.0, 0.01, steps)
    itemsize = conv(qpos[0]).dtype.itemsize  # JAX without x64 makes float64 input float32
    assert rec.bytes_copied == len(recorded) * len(SEL) * (model.nq + model.nv + 7 + 1) * itemsize
    with mjarchive.open(tmp_path / "a") as archive:
        assert archive.world_ids == tuple(SEL)
        assert archive.manifest.producer["backend"] == library.split("-")[0]
        sel = archive.select()
        rows = np.ix_(recorded, SEL)
        assert_array_equal(sel.qpos, qpos[rows].astype(np.float32))
        assert_array_equal(sel.qvel, qvel[rows].astype(np.float32))
        assert_array_equal(sel.mocap_pos, mpos[rows].astype(np.float32))
        assert_array_equal(sel.mocap_quat, mquat[rows].astype(np.float32))
        assert_array_equal(sel.reward, reward[rows].astype(np.float32))
        expected_reset = np.zeros((len(recorded), len(SEL)), bool)
        expected_reset[recorded.index(20), 1] = True  # 20 is a recorded step
        expected_reset[next(i for i, n in enumerate(recorded) if n > 41), 2] = True
        assert_array_equal(sel.reset, expected_reset)


@pytest.mark.parametrize("library", ["torch", "jax", "torch-cuda", "jax-gpu", "cupy-cuda"])
def test_errors_name_the_problem(tmp_path, mocap_xml, library):
    conv = _convert(library)
    q, mp, mq = np.zeros((4, 7), np.float32), np.zeros((4, 1, 3), np.float32), np.zeros((4, 1, 4), np.float32)
    rec = mjarchive.Recorder(tmp_path / "e", mocap_xml, tracks=("qvel",))
    good = dict(qpos=conv(q), mocap_pos=conv(mp), mocap_quat=conv(mq), qvel=conv(np.zeros((4, 6), np.float32)))
    with pytest.raises(mjarchive.AppendError, match="time="):
        rec.record(**good)
    with pytest.raises(mjarchive.AppendError, match=r"needs \['qvel'\]"):
        rec.record(**{**good, "qvel": None}, time=0.0)
    with pytest.raises(mjarchive.AppendError, match=r"unknown fields \['ctrl'\]"):
        rec.record(**good, ctrl=conv(q), time=0.0)
    with pytest.raises(mjarchive.AppendError, match=r"qpos has shape \(4, 6\); expected"):
        rec.record(**{**good, "qpos": conv(q[:, :6])}, time=0.0)
    assert rec.record(**good, time=0.0)
    with pytest.raises(mjarchive.AppendError, match="numpy arrays|this Recorder records"):
        rec.record(**{**good, "qvel": np.zeros((4, 6), np.float32)}, time=1.0)
    with pytest.raises(mjarchive.AppendError, match="dtype"):
        rec.record(**{**good, "qpos": conv(q.astype(np.int32))}, time=1.0)
    with pytest.raises(mjarchive.AppendError, match="shape"):
        rec.record(**good, time=1.0, reset=conv(np.zeros(3, bool)))
    rec.close()
    with pytest.raises(mjarchive.AppendError, match="named arrays"):
        mjarchive.Recorder(tmp_path / "f", mocap_xml).record(conv(q), time=0.0)


def test_producer_backend_named_when_created_up_front(tmp_path, humanoid_xml):
    """n_worlds= creates the archive before any data is seen; the first record() names the backend."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    datas = [mujoco.MjData(model) for _ in range(3)]
    with mjarchive.Recorder(tmp_path / "p", humanoid_xml, n_worlds=3) as rec:
        with mjarchive.open(tmp_path / "p") as early:
            assert early.manifest.producer["backend"] == "unknown" and early.n_frames == 0
        rec.record(datas)
    with mjarchive.open(tmp_path / "p") as archive:
        assert archive.manifest.producer["backend"] == "mujoco"
    with mjarchive.Recorder(tmp_path / "q", humanoid_xml, n_worlds=2) as rec:
        rec.record(qpos=np.zeros((2, model.nq)), time=0.0)
    with mjarchive.open(tmp_path / "q") as archive:
        assert archive.manifest.producer["backend"] == "numpy"


def test_torch_tensor_loop_one_added_line(tmp_path, humanoid_xml):
    """A torch training loop that keeps its state as tensors (as mjlab-style stacks hand them out):
    one added line records it; replay renders exactly what MuJoCo renders for those states."""
    torch = pytest.importorskip("torch", reason="torch is not installed (no CPU wheel from PyPI here)")
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    data = mujoco.MjData(model)
    gen = torch.Generator().manual_seed(0)
    qpos = torch.as_tensor(model.qpos0, dtype=torch.float32).repeat(32, 1)
    dt = model.opt.timestep
    copies = []
    with mjarchive.Recorder(tmp_path / "t", humanoid_xml, worlds=[4, 20], output_fps=50) as rec:
        for step in range(40):
            qpos[:, 7:] += 0.05 * torch.randn((32, model.nq - 7), generator=gen)  # your policy and sim here
            if rec.record(qpos=qpos, time=step * dt):                             # the added line
                copies.append(qpos[[4, 20]].clone().numpy())
    assert len(copies) == len(expected_steps(50, 1.0, dt, 40))
    with mjarchive.open(tmp_path / "t") as archive:
        stored = archive.select().qpos
        frames = list(mjarchive.iter_frames(archive, worlds=[20], frames=[archive.n_frames - 1], size=(48, 64)))
    assert_array_equal(stored, np.array(copies))  # each frame as it was when recorded, not a later view
    data.qpos[:] = stored[-1, 1]
    mujoco.mj_forward(model, data)
    with mujoco.Renderer(model, 48, 64) as renderer:
        renderer.update_scene(data, camera=0)  # "back", the first named camera: replay's default
        renderer.render()  # a fresh renderer's first frame differs slightly (as in tests/replay): warm up,
        renderer.update_scene(data, camera=0)  # and build the scene again (rendering changes it)
        assert_array_equal(frames[0][2], renderer.render())


PENDULUM = """<mujoco><option timestep="0.01"/><worldbody>
<body name="target" mocap="true" pos="0 0 1"><geom type="sphere" size="0.05" contype="0" conaffinity="0"/></body>
<body name="arm" pos="0 0 1"><joint name="a" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" contype="0" conaffinity="0"/>
<body pos="0.5 0 0"><joint name="b" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" contype="0" conaffinity="0"/></body></body>
<camera name="side" pos="0.5 -3 1" xyaxes="1 0 0 0 0 1"/>
</worldbody><actuator><motor joint="a"/><motor joint="b"/></actuator></mujoco>"""


def test_mjx_playground_loop_64_worlds(tmp_path):
    """A MuJoCo Playground-style loop: jax.vmap-batched MJX Data of 64 worlds, jitted steps, one
    added line; the archive holds the selected worlds' states and replays them exactly."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    mjx = pytest.importorskip("mujoco.mjx", reason="mujoco-mjx is not installed")
    xml = tmp_path / "pendulum.xml"
    xml.write_text(PENDULUM)
    model = mujoco.MjModel.from_xml_path(str(xml))
    mx = mjx.put_model(model)

    def init(key):
        return mjx.make_data(mx).replace(qpos=jax.random.uniform(key, (model.nq,), minval=-1.5, maxval=1.5))

    batch = jax.jit(jax.vmap(init))(jax.random.split(jax.random.PRNGKey(0), 64))
    step = jax.jit(jax.vmap(mjx.step, in_axes=(None, 0)))
    states = []
    with mjarchive.Recorder(tmp_path / "m", xml, worlds=[0, 17, 63], output_fps=50, tracks=("qvel",)) as rec:
        for n in range(30):
            batch = step(mx, batch)
            if rec.record(batch):                               # the added line
                states.append((np.asarray(batch.qpos), np.asarray(batch.qvel), float(batch.time[0])))
    assert rec.bytes_copied == len(states) * 3 * (model.nq + model.nv + 7) * 4
    with mjarchive.open(tmp_path / "m") as archive:
        assert archive.manifest.producer["backend"] == "mjx"
        sel = archive.select()
        assert_array_equal(sel.qpos, np.array([s[0][[0, 17, 63]] for s in states]))
        assert_array_equal(sel.qvel, np.array([s[1][[0, 17, 63]] for s in states]))
        np.testing.assert_allclose(archive.time, [s[2] for s in states], atol=1e-6)
        (_w, _f, rgb), = mjarchive.iter_frames(archive, worlds=[17], frames=[len(states) - 1], camera="side",
                                                size=(48, 64))
    data = mujoco.MjData(model)
    data.qpos[:] = states[-1][0][17]
    mujoco.mj_forward(model, data)
    with mujoco.Renderer(model, 48, 64) as renderer:
        renderer.update_scene(data, camera="side")
        renderer.render()  # warm-up frame, as above
        renderer.update_scene(data, camera="side")
        assert_array_equal(rgb, renderer.render())


@pytest.mark.parametrize("device", warp_devices())
def test_warp_arrays_by_name(tmp_path, mocap_xml, device):
    wp = pytest.importorskip("warp")
    wp.config.quiet = True
    model = mujoco.MjModel.from_xml_path(str(mocap_xml))
    rng = np.random.default_rng(3)
    q = rng.standard_normal((30, 8, model.nq)).astype(np.float32)
    mp = rng.standard_normal((30, 8, 1, 3)).astype(np.float32)
    mq = rng.standard_normal((30, 8, 1, 4)).astype(np.float32)
    with wp.ScopedDevice(device):
        with mjarchive.Recorder(tmp_path / "w", mocap_xml, worlds=[1, 6], output_fps=100, block_frames=4) as rec:
            for n in range(30):
                rec.record(qpos=wp.array(q[n]), mocap_pos=wp.array(mp[n], dtype=wp.vec3),
                           mocap_quat=wp.array(mq[n], dtype=wp.quat), time=n * 0.01)
    with mjarchive.open(tmp_path / "w") as archive:
        assert archive.manifest.producer["backend"] == "warp"
        assert_array_equal(archive.select().qpos, q[:, [1, 6]])
        assert_array_equal(archive.select().mocap_quat, mq[:, [1, 6]])


def test_numpy_recording_imports_no_other_array_library(tmp_path, mocap_xml):
    code = f"""
import sys, numpy as np, mjarchive
with mjarchive.Recorder({str(tmp_path / 'n')!r}, {str(mocap_xml)!r}) as rec:
    rec.record(qpos=np.zeros((2, 7)), mocap_pos=np.zeros((2, 1, 3)), mocap_quat=np.ones((2, 1, 4)), time=0.0)
print(sorted(m for m in ("jax", "torch", "cupy", "warp", "mujoco_warp") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_n_worlds_is_checked_at_the_first_call(tmp_path, mocap_xml):
    args = dict(mocap_pos=np.zeros((4, 1, 3)), mocap_quat=np.ones((4, 1, 4)), time=0.0)
    for n_worlds in (3, 8):  # too few rows and too many: both refused, never clamped or truncated
        rec = mjarchive.Recorder(tmp_path / f"n{n_worlds}", mocap_xml, n_worlds=n_worlds)
        with pytest.raises(mjarchive.AppendError, match=f"got 4 worlds, but n_worlds={n_worlds}"):
            rec.record(qpos=np.zeros((4, 7)), **args)
        rec.close()


def test_a_refused_frame_costs_only_itself(tmp_path, mocap_xml):
    """The writer checks a block when it is handed over, frames later; the other frames of that
    block and every later block are kept, and the refusal names the frame and world."""
    rec = mjarchive.Recorder(tmp_path / "nan", mocap_xml, block_frames=4, ring_buffers=2, output_fps=100)
    for n in range(14):
        q = np.full((3, 7), float(n))
        if n == 9:
            q[1, 0] = np.nan
        rec.record(qpos=q, mocap_pos=np.zeros((3, 1, 3)), mocap_quat=np.ones((3, 1, 4)), time=n * 0.01)
    with pytest.raises(mjarchive.AppendError, match="not finite at frame 9, world 1"):
        rec.close()
    with mjarchive.open(tmp_path / "nan") as archive:
        assert_array_equal(archive.select().qpos[:, 0, 0], [n for n in range(14) if n != 9])


def test_existing_writer_tracks_default_to_all(tmp_path, mocap_xml):
    bundle = mjarchive.ModelBundle.from_file(mocap_xml)
    arrays = dict(qpos=np.zeros((2, 7)), mocap_pos=np.zeros((2, 1, 3)), mocap_quat=np.ones((2, 1, 4)))
    with mjarchive.create(tmp_path / "w", bundle, n_worlds=2, tracks={"reward": (), "qvel": (6,)}) as writer:
        with pytest.raises(mjarchive.MjArchiveError, match=r"also has tracks \['reward'\]"):
            mjarchive.Recorder(writer, tracks=("qvel",))
        with mjarchive.Recorder(writer) as rec:
            rec.record(**arrays, reward=np.ones(2), qvel=np.zeros((2, 6)), time=0.0)
    with mjarchive.open(tmp_path / "w") as archive:
        assert_array_equal(archive.select().reward, [[1.0, 1.0]])


def test_torch_first_call_under_inference_mode(tmp_path, mocap_xml):
    torch = pytest.importorskip("torch", reason="torch is not installed (no CPU wheel from PyPI here)")
    z = dict(mocap_pos=torch.zeros(2, 1, 3), mocap_quat=torch.ones(2, 1, 4))
    with mjarchive.Recorder(tmp_path / "i", mocap_xml, output_fps=100) as rec:
        with torch.inference_mode():
            rec.record(qpos=torch.ones(2, 7), **z, time=0.0)
        rec.record(qpos=torch.full((2, 7), 2.0, requires_grad=True), **z, time=0.01)
    with mjarchive.open(tmp_path / "i") as archive:
        assert_array_equal(archive.select().qpos[:, 0, 0], [1.0, 2.0])


@pytest.mark.parametrize("device", warp_devices())
def test_a_refused_frame_costs_only_itself_on_the_warp_ring(tmp_path, mocap_xml, device):
    """The Warp gatherer hands its blocks to the same sink: the same frame-by-frame recovery."""
    wp = pytest.importorskip("warp")
    wp.config.quiet = True
    with wp.ScopedDevice(device):
        rec = mjarchive.Recorder(tmp_path / "wnan", mocap_xml, block_frames=4, ring_buffers=2, output_fps=100)
        for n in range(14):
            q = np.full((3, 7), float(n), np.float32)
            if n == 9:
                q[1, 0] = np.nan
            rec.record(qpos=wp.array(q), mocap_pos=wp.zeros((3, 1), dtype=wp.vec3),
                       mocap_quat=wp.array(np.ones((3, 1, 4), np.float32), dtype=wp.quat), time=n * 0.01)
        with pytest.raises(mjarchive.AppendError, match="not finite at frame 9, world 1"):
            rec.close()
    with mjarchive.open(tmp_path / "wnan") as archive:
        assert_array_equal(archive.select().qpos[:, 0, 0], [n for n in range(14) if n != 9])


def test_torch_cuda_side_stream_loses_no_frame(tmp_path, humanoid_xml):
    """Tensors written and recorded on a side stream (torch.cuda.stream), the last block sealed by
    close() outside it: each block's copy waits for its gathers."""
    conv = _convert("torch-cuda")  # skips without CUDA
    import torch

    nq = mujoco.MjModel.from_xml_path(str(humanoid_xml)).nq
    qpos, side, n = conv(np.zeros((NWORLD, nq), np.float32)), torch.cuda.Stream(), 11
    rec = mjarchive.Recorder(tmp_path / "s", humanoid_xml, worlds=SEL, output_fps=1, block_frames=4, ring_buffers=2)
    for f in range(n):
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)  # the writes below land late
            qpos.fill_(float(f))
            assert rec.record(qpos=qpos, time=float(f))
    rec.close()  # on the default stream
    with mjarchive.open(tmp_path / "s") as archive:
        assert_array_equal(archive.select().qpos, np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None],
                                                                  (n, len(SEL), nq)))


def test_jax_traced_values_are_refused(tmp_path, mocap_xml):
    """record() or record_rollout() inside jax.jit or vmap sees tracers: refused, first call or later,
    and for a traced reset; nothing is recorded for them and the concrete calls around them are kept."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = jax.numpy
    z = dict(mocap_pos=jnp.zeros((4, 1, 3)), mocap_quat=jnp.ones((4, 1, 4)))
    rec = mjarchive.Recorder(tmp_path / "j", mocap_xml, output_fps=100)

    def inside(time, reset=False):
        def step(q):
            rec.record(qpos=q, **z, time=time, reset=(q[:, 0] > 0) if reset else None)
            return q
        return step

    q = jnp.ones((4, 7))
    for traced, time in ((jax.jit(inside(0.0)), 0.0), (jax.vmap(inside(0.0), in_axes=1, out_axes=1), 0.0)):
        with pytest.raises(mjarchive.AppendError, match="traced JAX values for qpos"):
            traced(q)
    assert rec.record(qpos=q, **z, time=0.0)
    with pytest.raises(mjarchive.AppendError, match="traced JAX values for qpos"):
        jax.jit(inside(0.01))(q)
    with pytest.raises(mjarchive.AppendError, match="traced JAX values for reset"):
        jax.jit(lambda r: rec.record(qpos=q, **z, time=0.02, reset=r))(jnp.ones(4, bool))
    assert rec.record(qpos=q * 3, **z, time=0.03)
    steps = dict(qpos=jnp.stack([q * 4, q * 5]), mocap_pos=jnp.stack([z["mocap_pos"]] * 2),
                 mocap_quat=jnp.stack([z["mocap_quat"]] * 2))
    with pytest.raises(mjarchive.AppendError, match="traced JAX values for mocap_pos, mocap_quat, qpos, time"):
        jax.jit(lambda s, t: rec.record_rollout(**s, time=t))(steps, jnp.float32([0.04, 0.05]))
    assert rec.record_rollout(**steps, time=np.array([0.04, 0.05])) == 2
    rec.close()
    with mjarchive.open(tmp_path / "j") as archive:
        assert_array_equal(archive.select().qpos[:, 0, 0], [1.0, 3.0, 4.0, 5.0])
        assert archive.episodes(0)[0].start == 0 and len(archive.episodes(0)) == 1  # the traced reset is not kept


@contextlib.contextmanager
def _graph_capture(library, launches):
    """A CUDA graph capture of torch's or CuPy's on a side stream; appends the graph's launch."""
    if library == "torch-cuda":
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yield
        launches.append(graph.replay)
        return
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            yield
        finally:
            launches.append(stream.end_capture().launch)


@pytest.mark.parametrize("library", ["torch-cuda", "cupy-cuda"])
def test_graph_capture_is_refused(tmp_path, mocap_xml, library):
    """Inside a CUDA graph capture (torch.cuda.graph, a CuPy stream capture) the gathers would run only
    at replays: refused before anything is allocated or queued (a first call, a later one, a reset),
    and the recording goes on after the graph is launched."""
    conv = _convert(library)  # skips without that library's GPU
    z = dict(mocap_pos=conv(np.zeros((4, 1, 3))), mocap_quat=conv(np.ones((4, 1, 4))))
    q, all_reset = conv(np.ones((4, 7))), conv(np.ones(4, bool))  # no host→device copy inside the capture
    q *= 2.0  # the kernel the capture records, loaded before it
    q *= 0.5
    fresh = mjarchive.Recorder(tmp_path / "first", mocap_xml, output_fps=1)
    rec = mjarchive.Recorder(tmp_path / "g", mocap_xml, output_fps=1, block_frames=2)
    assert rec.record(qpos=q, **z, time=0.0)
    launches = []
    with _graph_capture(library, launches):
        q *= 2.0  # something to capture
        for recorder in (fresh, rec):
            with pytest.raises(mjarchive.AppendError, match="inside a CUDA graph capture"):
                recorder.record(qpos=q, **z, time=1.0)
        with pytest.raises(mjarchive.AppendError, match="inside a CUDA graph capture"):
            rec.record(qpos=q, **z, time=1.5, reset=all_reset)
    launches[0]()
    assert rec.record(qpos=q, **z, time=2.0)
    rec.close()
    fresh.close()
    with mjarchive.open(tmp_path / "g") as archive:
        assert_array_equal(archive.select().qpos[:, 0, 0], [1.0, 2.0])
        assert len(archive.episodes(0)) == 1
