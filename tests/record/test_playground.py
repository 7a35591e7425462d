"""mjarchive.playground: a real MuJoCo Playground env (dm_control suite, no download), jitted and
scanned on JAX's CPU, recorded with PlaygroundRecorder.

The oracles are the rollout itself (its stacked states, `done` flags), the cadence computed from
`output_fps` and the env step, Playground's own `env.render` of the same states, and `env.mj_model`.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from numpy.testing import assert_array_equal

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX starts: the CPU here, whatever is installed
pytest.importorskip("mujoco_playground", reason="MuJoCo Playground is not installed (pip install playground)")

import jax  # noqa: E402
from mujoco_playground import registry, wrapper  # noqa: E402

import mjarchive  # noqa: E402
from mjarchive.playground import PlaygroundRecorder, env_bundle, model_differences  # noqa: E402

ENV = "CartpoleBalance"  # dm_control suite: its XML and assets ship with the package
NWORLD = 4
SEL = [1, 3]
CHUNK = 125  # steps per scanned chunk; two chunks, one jit
EPISODE = 70
FIRST_STEPS = [0, 10, 25, 45]  # each world's EpisodeWrapper step count at reset: staggered auto-resets
FPS = 30.0


def _setup(impl: str, nworld: int, chunk: int, episode: int, first_steps):
    env = registry.load(ENV, config_overrides={"impl": impl})
    wenv = wrapper.wrap_for_brax_training(env, episode_length=episode)

    @jax.jit
    def rollout(state, key):
        def step(s, k):
            s = wenv.step(s, jax.random.uniform(k, (nworld, env.action_size), minval=-1, maxval=1))
            return s, s
        return jax.lax.scan(step, state, jax.random.split(key, chunk))

    state = jax.jit(wenv.reset)(jax.random.split(jax.random.PRNGKey(0), nworld))
    state.info["steps"] = jax.numpy.asarray(first_steps, state.info["steps"].dtype)
    return env, wenv, rollout, state


def _record(path, wenv, rollout, state, chunks: int, **kwargs):
    """Record the reset state and `chunks` scanned chunks; the chunks' stacked states, concatenated
    on the host (index s - 1 is the state after step s)."""
    states = []
    with PlaygroundRecorder(path, wenv, worlds=SEL, output_fps=FPS, **kwargs) as rec:
        assert rec.record_state(state)
        for i in range(chunks):
            state, chunk = rollout(state, jax.random.PRNGKey(i + 1))
            rec.record_rollout(chunk)
            states.append(chunk)
        counts = rec.frames_recorded, rec.bytes_copied, rec.row_bytes, rec.steps
    host = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *states)
    return state, host, counts


def _expected_steps(dt: float, last: int) -> list[int]:
    """Frame k shows the first state at or after time k / fps: step ceil(k / (fps · dt))."""
    per_frame = Fraction(1) / (Fraction(FPS) * Fraction(dt).limit_denominator(10**6))
    steps, k = [], 0
    while math.ceil(k * per_frame) <= last:
        steps.append(math.ceil(k * per_frame))
        k += 1
    return steps


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    env, wenv, rollout, state = _setup("jax", NWORLD, CHUNK, EPISODE, FIRST_STEPS)
    path = tmp_path_factory.mktemp("playground") / "cartpole.mjarchive"
    reset_state = jax.tree.map(np.asarray, state)
    _, states, counts = _record(path, wenv, rollout, state, chunks=2)
    return {"env": env, "wenv": wenv, "path": path, "reset": reset_state, "states": states, "counts": counts,
            "rollout": rollout, "state0": state}


def _state_qpos(run, step: int) -> np.ndarray:
    """qpos (nworld, nq) of the state after `step` env steps (0: the reset state)."""
    return run["reset"].data.qpos if step == 0 else run["states"].data.qpos[step - 1]


def test_archive_holds_the_cadence_frames_bit_exact(run):
    dt = run["env"].dt
    expected = _expected_steps(dt, 2 * CHUNK)
    frames, copied, row_bytes, steps = run["counts"]
    assert steps == 2 * CHUNK and frames == len(expected)
    with mjarchive.open(run["path"]) as archive:
        assert archive.world_ids == tuple(SEL) and archive.n_frames == len(expected)
        assert archive.timestep == dt
        assert_array_equal(archive.time, np.asarray(expected) * dt)
        qpos = archive.select().qpos
    want = np.stack([_state_qpos(run, s)[SEL] for s in expected]).astype(np.float32)
    assert_array_equal(qpos, want)
    # Only the selected worlds' frame rows reached the host.
    assert copied == len(SEL) * frames * row_bytes


def test_auto_resets_are_episode_starts(run):
    expected = _expected_steps(run["env"].dt, 2 * CHUNK)
    done = np.concatenate([np.zeros((1, NWORLD)), run["states"].done]) != 0  # row s: the state after step s
    assert done.any(axis=0)[SEL].all(), "each recorded world must reset inside the rollout"
    with mjarchive.open(run["path"]) as archive:
        for w in SEL:
            # A frame starts an episode when its world reset at a step since the previous frame.
            starts = [0] + [j for j in range(1, len(expected)) if done[expected[j - 1] + 1: expected[j] + 1, w].any()]
            assert [r.start for r in archive.episodes(w)] == starts
            assert len(starts) >= 3
    # Playground's wrapper returns the reset state in the step that is done: its time restarts.
    data_time = run["states"].data.time
    assert (data_time[done[1:]] == 0).all() and (data_time[~done[1:]] > 0).all()


def test_replay_matches_playground_render(run):
    """Replayed frames equal Playground's env.render of the same states pixel for pixel (tolerance 0):
    both draw with MuJoCo's Renderer, in this process, from bit-equal models and the same float32
    qpos (stored as recorded), so any difference is a wrong pose, camera, model or scene option."""
    expected = _expected_steps(run["env"].dt, 2 * CHUNK)
    frames = [0, 1, 30, len(expected) - 1]
    size = (48, 64)
    for w in SEL:
        ours = [rgb for _, _, rgb in mjarchive.iter_frames(run["path"], worlds=[w], frames=frames, camera="fixed",
                                                           size=size, backend="cpu")]
        trajectory = []
        for f in frames:
            s = expected[f]
            source = run["reset"] if s == 0 else jax.tree.map(lambda x, s=s: x[s - 1], run["states"])
            trajectory.append(jax.tree.map(lambda x, w=w: x[w], source))
        theirs = run["env"].render(trajectory, height=size[0], width=size[1], camera="fixed")
        assert len(ours) == len(theirs) == len(frames)
        for f, a, b in zip(frames, ours, theirs):
            assert_array_equal(a, b, err_msg=f"world {w}, frame {f}")
        assert np.abs(ours[0].astype(int) - ours[-1].astype(int)).max() > 10  # the frames show motion


def test_model_bundle_equals_env_model(run):
    with mjarchive.open(run["path"]) as archive:
        assert model_differences(archive.model(), run["env"].mj_model) == ([], [])
    for name in ("CheetahRun", "HopperHop", "WalkerWalk"):
        env = registry.load(name, config_overrides={"impl": "jax"})
        assert model_differences(env_bundle(env).compile(), env.mj_model) == ([], []), name
    # Walker's XML has another timestep than the env's sim_dt (set after compiling): the env's is kept.
    assert model_differences(mjarchive.ModelBundle.from_file(env.xml_path).compile(), env.mj_model) == (
        [], ["opt.timestep"])


def test_models_edited_in_code_are_named():
    spin = registry.load("FingerSpin", config_overrides={"impl": "jax"})  # edits site_rgba, dof_damping
    with pytest.warns(UserWarning, match="dof_damping, site_rgba"):
        env_bundle(spin)
    swimmer = registry.load("SwimmerSwimmer6", config_overrides={"impl": "jax"})  # XML generated in code
    with pytest.raises(mjarchive.BundleError, match="model="):
        env_bundle(swimmer)


def test_bare_env_done_is_no_reset_and_mistakes_are_refused(run, tmp_path):
    env = run["env"]
    states = jax.tree.map(lambda x: x[:20], run["states"])  # a wrapped env's states, some not done
    with PlaygroundRecorder(tmp_path / "bare.mjarchive", env, worlds=SEL) as rec:  # no auto-reset wrapper
        assert rec.step_dt == env.dt
        rec.record_rollout(jax.tree.map(jax.numpy.asarray, states))
        with pytest.raises(mjarchive.AppendError, match="record_state"):
            rec.record_rollout(run["state0"])
        with pytest.raises(mjarchive.MjArchiveError, match="clock"):
            rec.record_rollout(states, time=np.zeros(20))
    with mjarchive.open(tmp_path / "bare.mjarchive") as archive:
        assert [len(archive.episodes(w)) for w in SEL] == [1, 1]
    with pytest.raises(mjarchive.MjArchiveError, match="timestep"):
        PlaygroundRecorder(tmp_path / "x.mjarchive", env, timestep=0.5)


def test_warp_impl_records_the_same_way(tmp_path):
    """Playground 0.2.0's default backend: MJX with impl="warp" (mujoco_warp kernels; here on Warp's
    CPU device). Its Data holds JAX arrays too, so the same recorder takes it."""
    pytest.importorskip("mujoco_warp", reason="mujoco_warp is not installed")
    env, wenv, rollout, state = _setup("warp", NWORLD, 40, 15, [0, 4, 8, 12])
    _, states, (frames, copied, row_bytes, _) = _record(tmp_path / "warp.mjarchive", wenv, rollout, state, chunks=1)
    expected = _expected_steps(env.dt, 40)
    with mjarchive.open(tmp_path / "warp.mjarchive") as archive:
        assert archive.manifest.producer["backend"] == "mjx-warp"
        assert_array_equal(archive.select(frames=slice(1, None)).qpos,
                           states.data.qpos[np.asarray(expected[1:]) - 1][:, SEL].astype(np.float32))
        assert len(archive.episodes(SEL[1])) >= 3
    assert copied == len(SEL) * frames * row_bytes


def test_a_refused_frame_leaves_the_clock_and_step_count_right(run, tmp_path):
    """A NaN the writer refuses costs that frame only: `steps` still counts the chunk, and a later
    `record_state` (here with a reset mask) lands one env step after the last chunk."""
    dt = run["env"].dt
    first = jax.tree.map(lambda x: x[:40], run["states"])
    expected = _expected_steps(dt, 2 * CHUNK)
    qpos = np.array(first.data.qpos)
    qpos[expected[1] - 1, SEL[0], 0] = np.nan  # row s - 1: the state after step s
    bad = first.replace(data=first.data.replace(qpos=qpos))
    last = next(s for s in expected if s > 41) - 1  # a second chunk ends the step before a frame
    mask = np.arange(NWORLD) == SEL[1]
    with PlaygroundRecorder(tmp_path / "nan.mjarchive", run["wenv"], worlds=SEL) as rec:
        rec.record_state(run["reset"])
        with pytest.raises(mjarchive.AppendError, match="not finite"):
            rec.record_rollout(bad)
        assert rec.steps == 40
        rec.record_rollout(jax.tree.map(lambda x: x[40:last], run["states"]))
        assert rec.steps == last
        assert rec.record_state(run["reset"], reset=mask)
        with pytest.raises(mjarchive.AppendError, match="reset has shape"):
            rec.record_state(run["reset"], reset=mask[:2])
    kept = [s for s in expected if s <= last + 1 and s != expected[1]]
    with mjarchive.open(tmp_path / "nan.mjarchive") as archive:
        assert_array_equal(np.rint(np.asarray(archive.time) / dt), kept)
        assert archive.select(frames=[-1]).reset[0].tolist() == [False, True]


def test_a_brax_mjx_state_records_like_per_step_calls(tmp_path):
    """Brax's own MJX envs scan a State whose `.pipeline_state` is the MJX Data (Brax comes with
    Playground): its auto-resets' `done` are the episode starts, as per-step `record()` calls see."""
    from pathlib import Path

    import brax
    from brax import envs

    env = envs.training.wrap(envs.get_environment("inverted_pendulum", backend="mjx"), episode_length=30)

    @jax.jit
    def rollout(state):
        def step(s, _):
            s = env.step(s, jax.numpy.zeros((NWORLD, env.action_size)))
            return s, s
        return jax.lax.scan(step, state, None, length=50)[1]

    states = rollout(jax.jit(env.reset)(jax.random.split(jax.random.PRNGKey(0), NWORLD)))
    xml = Path(brax.__file__).parent / "envs" / "assets" / "inverted_pendulum.xml"
    with mjarchive.Recorder(tmp_path / "scan", xml, worlds=SEL, output_fps=10) as rec:
        n = rec.record_rollout(states)
    ps = jax.tree.map(np.asarray, states.pipeline_state)
    done = np.asarray(states.done)
    assert done[:, SEL].any(axis=0).all() and (np.diff(ps.time[:, 0]) < 0).any()  # resets; world 0's too
    with mjarchive.Recorder(tmp_path / "steps", xml, worlds=SEL, output_fps=10) as rec:
        for i in range(50):
            rec.record(qpos=ps.qpos[i], time=ps.time[i], reset=done[i] != 0)
    with mjarchive.open(tmp_path / "scan") as got, mjarchive.open(tmp_path / "steps") as want:
        assert got.n_frames == want.n_frames == n > 3 and got.manifest.producer["backend"] == "mjx"
        assert_array_equal(got.time, want.time)
        assert_array_equal(got.select().qpos, want.select().qpos)
        assert_array_equal(got.select().reset, want.select().reset)
        assert [got.episodes(w) for w in SEL] == [want.episodes(w) for w in SEL]
        assert all(len(got.episodes(w)) >= 2 for w in SEL)
