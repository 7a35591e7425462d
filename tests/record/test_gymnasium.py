"""mjarchive.gymnasium: record real Gymnasium MuJoCo envs, single and vector, and replay them.

Pixel tests compare the env's own `render()` (same camera, same size) with `mjarchive.iter_frames`
at the same states. After `mj_step`, MuJoCo's derived positions (xpos, cam_xpos, ...) still belong
to the state before the last integration, so `env.render()` right after `step()` draws the previous
substep's pose; the tests run `mj_forward` on the env's data before rendering (and check, against
an untouched twin env, that this does not change the trajectory).
"""

from __future__ import annotations

import subprocess
import sys

import mujoco
import numpy as np
import pytest
from numpy.testing import assert_array_equal

gym = pytest.importorskip("gymnasium")

import mjarchive  # noqa: E402
from mjarchive.gymnasium import RecordTrajectory, RecordVectorTrajectory  # noqa: E402

H, W = 32, 40  # tiny renders: the comparison is exact, so size does not matter for rigour
HAS_MODES = hasattr(gym.vector, "AutoresetMode")  # autoreset modes and reset_mask: gymnasium >= 1.1


def make(name: str, **kwargs):
    return gym.make(name, render_mode="rgb_array", width=W, height=H, camera_name="track", **kwargs)


def snapshot(env) -> tuple[np.ndarray, np.ndarray]:
    """(qpos, rgb) of an env's current state, rendered by the env itself from the "track" camera."""
    u = env.unwrapped
    qpos, qvel = u.data.qpos.copy(), u.data.qvel.copy()
    mujoco.mj_forward(u.model, u.data)  # derived positions of the current qpos (see the module docstring)
    assert_array_equal(u.data.qpos, qpos)
    assert_array_equal(u.data.qvel, qvel)
    # Each sub-env of a vector env has its own GL context, but Gymnasium makes a viewer's context
    # current only when it creates it: make it current, or this env draws in the last-made one.
    viewer = u.mujoco_renderer._viewers.get("rgb_array")
    if viewer is not None:
        viewer.make_context_current()
    return qpos, env.render().copy()


def replay(archive, world: int) -> list[np.ndarray]:
    return [rgb for _, _, rgb in mjarchive.iter_frames(archive, worlds=[world], camera="track", size=(H, W))]


def episode_ranges(starts: list[bool]) -> list[range]:
    idx = [i for i, s in enumerate(starts) if s or i == 0]
    return [range(a, b) for a, b in zip(idx, idx[1:] + [len(starts)])]


class ResetLog(gym.Wrapper):
    """Counts a sub-env's resets: the ground truth for where its episodes start."""

    def __init__(self, env):
        super().__init__(env)
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        return super().reset(**kwargs)


# -- single env -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Ant-v5", "Humanoid-v5"])
def test_single_env_records_episodes_and_replays_pixel_identically(tmp_path, name):
    path = tmp_path / "run.mjarchive"
    env = RecordTrajectory(make(name, max_episode_steps=4), path, dtype="float64")
    twin = gym.make(name, max_episode_steps=4)  # same seeds and actions, never rendered nor forwarded
    env.action_space.seed(0)
    states, frames, starts, twin_qpos = [], [], [], []

    def capture(start: bool) -> None:
        q, rgb = snapshot(env)
        states.append(q)
        frames.append(rgb)
        starts.append(start)
        twin_qpos.append(twin.unwrapped.data.qpos.copy())

    env.reset(seed=1)
    twin.reset(seed=1)
    capture(True)
    for _ in range(10):
        action = env.action_space.sample()
        _, _, terminated, truncated, _ = env.step(action)
        t_out = twin.step(action)
        capture(False)
        assert (terminated, truncated) == t_out[2:4]
        if terminated or truncated:
            env.reset()
            twin.reset()
            capture(True)
    env.close()
    twin.close()
    assert_array_equal(np.array(states), np.array(twin_qpos))  # forward + render left the env alone
    assert sum(starts) >= 3  # the TimeLimit of 4 steps made several episodes

    with mjarchive.open(path) as archive:
        assert archive.status == "finalized"
        assert archive.world_ids == (0,)
        assert archive.manifest.producer["backend"] == "gymnasium"
        assert archive.output_fps == env.unwrapped.metadata["render_fps"]
        assert archive.timestep == env.unwrapped.model.opt.timestep
        sel = archive.select(worlds=[0])
        assert_array_equal(sel.qpos[:, 0], np.array(states))  # one frame per reset and per step
        assert_array_equal(sel.reset[:, 0], starts)
        assert archive.episodes(0) == episode_ranges(starts)
        # The frame clock: one env dt per reset and per step, strictly increasing across episodes.
        np.testing.assert_allclose(archive.time, np.arange(len(states)) * env.unwrapped.dt, rtol=0, atol=1e-9)
        got = replay(archive, 0)
    assert len(got) == len(frames)
    for k, (want, have) in enumerate(zip(frames, got)):
        assert_array_equal(have, want, err_msg=f"{name} frame {k}")


def test_episode_trigger_lower_fps_and_model_timestep(tmp_path):
    """episode_trigger picks episodes; at output_fps below render_fps every episode still starts
    with its reset state; the archive takes the env model's actual timestep."""
    env = gym.make("Ant-v5", max_episode_steps=5)
    env.unwrapped.model.opt.timestep = 0.005  # changed after loading: the file says 0.01
    # 10 fps: a frame every 20 timesteps, every 4th step (frame_skip 5); resets still get a frame.
    rec = RecordTrajectory(env, tmp_path / "a.mjarchive", output_fps=10, episode_trigger=lambda e: e % 2 == 0)
    rec.action_space.seed(0)
    first_states = []
    for episode in range(5):
        rec.reset(seed=episode)
        if episode % 2 == 0:
            first_states.append(rec.unwrapped.data.qpos.copy())
        for _ in range(5):
            rec.step(rec.action_space.sample())
    rec.close()
    with mjarchive.open(tmp_path / "a.mjarchive") as archive:
        assert archive.timestep == 0.005
        assert archive.output_fps == 10
        episodes = archive.episodes(0)
        assert len(episodes) == 3  # episodes 0, 2 and 4
        assert all(1 < len(ep) < 6 for ep in episodes)  # subsampled: fewer frames than reset + 5 steps
        qpos = archive.select().qpos[:, 0]
        for ep, q in zip(episodes, first_states):
            np.testing.assert_allclose(qpos[ep.start], q, rtol=0, atol=1e-6)  # float32 storage
        time = archive.time
        assert np.all(np.diff(time) > 0)
    assert rec.recorder.frames_recorded == len(time)


def test_check_env_passes_on_the_wrapper(tmp_path):
    from gymnasium.envs.mujoco.ant_v5 import AntEnv
    from gymnasium.utils.env_checker import check_env

    # A directly built env has no spec, so check_env runs its render check on this env itself.
    env = RecordTrajectory(AntEnv(render_mode="rgb_array", width=W, height=H), tmp_path / "a.mjarchive")
    check_env(env)
    n_resets = env.episode_id + 1
    env.close()
    env.close()
    with mjarchive.open(tmp_path / "a.mjarchive") as archive:
        assert archive.status == "finalized"
        assert len(archive.episodes(0)) == n_resets
    # Made through gymnasium.make, the wrapper is part of the spec: check_env re-creates it from the
    # spec for its close check. (Its render check would open a "human" window: skipped headless.)
    made = RecordTrajectory(gym.make("Ant-v5"), tmp_path / "b.mjarchive")
    check_env(made, skip_render_check=True)
    assert made.spec.additional_wrappers[-1].name == "RecordTrajectory"
    made.close()


def test_close_finalizes_and_use_after_close_raises(tmp_path):
    env = RecordTrajectory(gym.make("Humanoid-v5"), tmp_path / "h.mjarchive")
    env.reset(seed=0)
    env.step(env.action_space.sample())
    assert env.recorder.writer is not None
    env.close()
    with mjarchive.open(tmp_path / "h.mjarchive") as archive:
        assert archive.status == "finalized"
        assert archive.n_frames == 2
        assert archive.verify().ok
    with pytest.raises(mjarchive.ClosedError):
        env.step(env.action_space.sample())


# -- vector envs ------------------------------------------------------------------------------------
def _vector(name: str, mode: str, limits: list[int]):
    fns = [lambda k=k: ResetLog(make(name, max_episode_steps=k)) for k in limits]
    if mode == "NextStep" and not HAS_MODES:
        return gym.vector.SyncVectorEnv(fns)
    if not HAS_MODES:
        pytest.skip(f"autoreset mode {mode} needs gymnasium >= 1.1")
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


@pytest.mark.parametrize("name, mode, worlds", [
    ("Ant-v5", "NextStep", None),
    ("Humanoid-v5", "NextStep", [0, 2]),
    ("Ant-v5", "SameStep", [0, 2]),
    ("Humanoid-v5", "Disabled", [1, 2]),
])
def test_vector_env_marks_each_sub_env_reset_and_replays_pixel_identically(tmp_path, name, mode, worlds):
    limits = [2, 3, 4]  # staggered episode boundaries
    envs = _vector(name, mode, limits)
    subs = envs.envs
    path = tmp_path / "v.mjarchive"
    rec = RecordVectorTrajectory(envs, path, worlds=worlds, dtype="float64")
    sel = list(range(len(subs))) if worlds is None else worlds
    rec.action_space.seed(0)
    states, frames, starts = [], [], []
    last_resets = [0] * len(subs)

    def capture() -> None:
        shots = [snapshot(subs[i]) for i in sel]
        resets = [s.resets for s in subs]
        states.append([q for q, _ in shots])
        frames.append([rgb for _, rgb in shots])
        starts.append([resets[i] != last_resets[i] for i in sel])
        last_resets[:] = resets

    rec.reset(seed=3)
    capture()
    for _ in range(9):
        _, _, term, trunc, _ = rec.step(rec.action_space.sample())
        capture()
        done = np.logical_or(term, trunc)
        if mode == "Disabled" and done.any():
            rec.reset(options={"reset_mask": done})
            if done[sel].any():
                capture()
            else:
                last_resets[:] = [s.resets for s in subs]
    rec.close()
    starts_arr = np.array(starts)
    assert starts_arr[1:].sum(axis=0).min() >= 1  # every recorded sub-env had an autoreset

    with mjarchive.open(path) as archive:
        assert archive.status == "finalized"
        assert archive.world_ids == tuple(sel)
        all_sel = archive.select()
        assert_array_equal(all_sel.qpos, np.array(states))
        assert_array_equal(all_sel.reset, starts_arr)
        assert np.all(np.diff(archive.time) > 0)
        for j, w in enumerate(sel):
            assert archive.episodes(w) == episode_ranges(starts_arr[:, j].tolist())
            got = replay(archive, w)
            assert len(got) == len(frames)
            for k, have in enumerate(got):
                assert_array_equal(have, frames[k][j], err_msg=f"{name} {mode} world {w} frame {k}")


def test_make_vec_sync(tmp_path):
    envs = gym.make_vec("Ant-v5", num_envs=2, vectorization_mode="sync", max_episode_steps=3)
    rec = RecordVectorTrajectory(envs, tmp_path / "m.mjarchive")
    rec.reset(seed=0)
    for _ in range(7):
        rec.step(rec.action_space.sample())
    rec.close()
    rec.close()
    with mjarchive.open(tmp_path / "m.mjarchive") as archive:
        assert archive.world_ids == (0, 1)
        assert archive.n_frames == 8
        # NEXT_STEP: steps 1-3 truncate at 3, step 4 resets (its frame starts episode 2), ...
        assert archive.episodes(0) == [range(0, 4), range(4, 8)]
        assert archive.manifest.producer["backend"] == "gymnasium"


# -- refusals ---------------------------------------------------------------------------------------
def test_refuses_what_it_cannot_record(tmp_path):
    path = tmp_path / "x.mjarchive"
    with pytest.raises(mjarchive.MjArchiveError, match="MujocoEnv.*CartPole-v1.*mjarchive.Recorder"):
        RecordTrajectory(gym.make("CartPole-v1"), path)
    vec = gym.make_vec("Ant-v5", num_envs=2, vectorization_mode="sync")
    with pytest.raises(mjarchive.MjArchiveError, match="RecordVectorTrajectory"):
        RecordTrajectory(vec, path)
    with pytest.raises(mjarchive.MjArchiveError, match=r"sub-env indices in \[0, 2\)"):
        RecordVectorTrajectory(vec, path, worlds=[2])
    vec.close()
    with pytest.raises(mjarchive.MjArchiveError, match="RecordTrajectory for a single env"):
        RecordVectorTrajectory(gym.make("Ant-v5"), path)
    with pytest.raises(mjarchive.MjArchiveError, match="world with ID 0"):
        RecordTrajectory(gym.make("Ant-v5"), path, worlds=[1])
    with pytest.raises(mjarchive.MjArchiveError, match="timestep"):
        RecordTrajectory(gym.make("Ant-v5"), path, timestep=0.01)
    # A bundled model that is not the env's model: named, with the fix.
    humanoid_xml = gym.make("Humanoid-v5").unwrapped.fullpath
    with pytest.raises(mjarchive.LayoutMismatchError, match="nq=.*pass model="):
        RecordTrajectory(gym.make("Ant-v5"), path, model=humanoid_xml)
    async_envs = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, context="fork")
    try:
        with pytest.raises(mjarchive.MjArchiveError, match="AsyncVectorEnv.*SyncVectorEnv.*vectorization_mode='sync'"):
            RecordVectorTrajectory(async_envs, path)
    finally:
        async_envs.close()
    assert not path.exists()


def test_import_mjarchive_does_not_import_gymnasium():
    code = "import mjarchive, sys; assert 'gymnasium' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
