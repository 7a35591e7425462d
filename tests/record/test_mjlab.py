"""mjarchive.mjlab: a real mjlab task (Mjlab-Cartpole-Balance, a few envs on the CPU) recorded and replayed."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("mjlab", reason="mjlab is not installed (CI's oldest run installs mjlab 1.6 with mujoco 3.11)")
import mujoco  # noqa: E402
import torch  # noqa: E402
from mjlab.envs import ManagerBasedRlEnv  # noqa: E402

import mjarchive  # noqa: E402
from mjarchive.mjlab import RecordTrajectory, default_env_ids  # noqa: E402

TASK = "Mjlab-Cartpole-Balance"
N_ENVS = 4
EPISODE_S = 0.5  # 10 env steps of 0.05 s: every env times out (and some fall) within a test
STEPS = 24


def make_env(seed: int = 0, n_envs: int = N_ENVS) -> ManagerBasedRlEnv:
    importlib.import_module("mjlab.tasks")  # registers the tasks
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(TASK)
    cfg.scene.num_envs = n_envs
    cfg.episode_length_s = EPISODE_S
    cfg.seed = seed
    return ManagerBasedRlEnv(cfg=cfg, device="cpu")


def actions(env, n: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dim = env.unwrapped.action_manager.total_action_dim
    return [torch.rand(env.unwrapped.num_envs, dim, generator=gen) * 2 - 1 for _ in range(n)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run of STEPS steps recording envs 0 and 2 (float64), with what the env itself reported."""
    path = tmp_path_factory.mktemp("mjlab") / "cartpole.mjarchive"
    env = RecordTrajectory(make_env(), path, env_ids=[0, 2], actions=True, rewards=True, dtype="float64")
    env.reset()
    base = env.unwrapped
    states = [base.sim.data.qpos[:].clone()]
    mocap = [base.sim.data.mocap_pos[:].clone()]
    resets, rewards, acts = [], [], []
    for a in actions(env, STEPS):
        _, reward, terminated, truncated, _ = env.step(a)
        resets.append((terminated | truncated).clone())
        rewards.append(reward.clone())
        acts.append(base.action_manager.action.clone())
        states.append(base.sim.data.qpos[:].clone())
        mocap.append(base.sim.data.mocap_pos[:].clone())
    model = base.sim.mj_model
    step_dt = base.step_dt
    env.close()
    return {"path": path, "states": torch.stack(states).numpy(), "mocap": torch.stack(mocap).numpy(),
            "resets": torch.stack(resets).numpy(), "rewards": torch.stack(rewards).numpy(),
            "actions": torch.stack(acts).numpy(), "model": model, "step_dt": step_dt}


def test_records_the_selected_envs_every_step_with_the_envs_resets(recorded):
    with mjarchive.open(recorded["path"]) as archive:
        assert list(archive.world_ids) == [0, 2]
        assert archive.n_frames == STEPS + 1  # the state after reset(), then one frame per step
        np.testing.assert_allclose(archive.time[:], np.arange(STEPS + 1) * recorded["step_dt"])
        sel = archive.select()
        np.testing.assert_array_equal(sel.qpos, recorded["states"][:, [0, 2]])
        np.testing.assert_array_equal(sel.mocap_pos, recorded["mocap"][:, [0, 2]])
        np.testing.assert_array_equal(sel.track("action")[1:], recorded["actions"][:, [0, 2]])
        np.testing.assert_array_equal(sel.track("reward")[1:], recorded["rewards"][:, [0, 2]])
        for col, wid in enumerate([0, 2]):
            # An env reset inside step k: frame k + 1 (its state after that step) starts an episode.
            want = [0] + [int(k) + 1 for k in np.flatnonzero(recorded["resets"][:, wid])]
            assert [ep.start for ep in archive.episodes(wid)] == want
        assert len(want) >= 3  # the test saw resets
        assert archive.manifest.producer["model_xml"] in ("spec", "compiled")


def test_replay_equals_a_direct_render_of_the_envs_model(recorded, tmp_path):
    model = recorded["model"]
    size = (48, 64)
    frames = [0, 5, 11, STEPS]
    got = {(w, f): rgb for w, f, rgb in mjarchive.iter_frames(recorded["path"], worlds=[2], frames=frames,
                                                                camera=0, size=size, quality="full")}
    renderer = mujoco.Renderer(model, *size)
    data = mujoco.MjData(model)
    renderer.update_scene(data, camera=0)
    renderer.render()  # a fresh renderer's first frame differs from steady state
    with mjarchive.open(recorded["path"]) as archive:
        exact = archive.manifest.producer["model_xml"] != "compiled"
    for f in frames:
        data.qpos[:] = recorded["states"][f, 2]
        data.mocap_pos[:] = recorded["mocap"][f, 2]
        mujoco.mj_forward(model, data)
        renderer.update_scene(data, camera=0)
        want = renderer.render()
        diff = np.abs(got[2, f].astype(int) - want.astype(int))
        if exact:
            assert diff.max() == 0, (f, diff.max())
        else:  # MuJoCo before 3.16 bundles compiled values (6 significant digits): a pixel may flip
            assert diff.mean() < 0.5, (f, diff.mean())
    renderer.close()


def test_recording_does_not_change_what_the_env_computes(tmp_path):
    def run(wrap: bool) -> list:
        # One env at a time: mjlab seeds torch's global generator when it makes an env.
        env = make_env(seed=3)
        if wrap:
            env = RecordTrajectory(env, tmp_path / "same.mjarchive", actions=True, rewards=True)
        try:
            out = [env.reset()[0]]
            for a in actions(env, 12, seed=5):
                out.append(env.step(a)[:4])
            if wrap:
                assert env.recorder.frames_recorded == 13
            return out
        finally:
            env.close()

    plain, wrapped = run(False), run(True)
    torch.testing.assert_close(wrapped, plain, rtol=0, atol=0)


def test_fps_keeps_every_kth_step_and_defaults_follow_the_video_option(tmp_path):
    env = make_env(n_envs=3)
    step_dt = env.step_dt
    rec = RecordTrajectory(env, tmp_path / "k.mjarchive", fps=1 / (3 * step_dt) + 1e-9)
    try:
        assert rec.steps_per_frame == 3 and rec.env_ids == default_env_ids(env) == [0, 1, 2]
        rec.reset()
        for a in actions(rec, 9):
            rec.step(a)
    finally:
        rec.close()
    with mjarchive.open(tmp_path / "k.mjarchive") as archive:
        np.testing.assert_allclose(archive.time[:], np.arange(0, 10, 3) * step_dt)
        assert archive.output_fps == pytest.approx(1 / (3 * step_dt))


def test_bad_requests_are_clear_errors(tmp_path):
    env = make_env(n_envs=2)
    try:
        with pytest.raises(mjarchive.MjArchiveError, match="env_ids must be distinct envs of 0..1"):
            RecordTrajectory(env, tmp_path / "a.mjarchive", env_ids=[0, 5])
        with pytest.raises(mjarchive.MjArchiveError, match="no command term 'nope'"):
            RecordTrajectory(env, tmp_path / "b.mjarchive", commands=["nope"])
        with pytest.raises(mjarchive.MjArchiveError, match="fps must be a positive number"):
            RecordTrajectory(env, tmp_path / "c.mjarchive", fps=0)
        from mjlab.rl import RslRlVecEnvWrapper

        with pytest.raises(mjarchive.MjArchiveError, match=r"RslRlVecEnvWrapper\(RecordTrajectory\(env, path\)\)"):
            RecordTrajectory(RslRlVecEnvWrapper(env), tmp_path / "d.mjarchive")
        assert not any(tmp_path.iterdir())  # nothing was created for a refused request
    finally:
        env.close()


def test_resets_between_sparse_frames_and_resets_by_others_start_episodes(tmp_path):
    """Frames every 3rd step: a reset inside a step (auto-reset), through the wrapper's reset() or
    behind its back (mjlab's viewer resets the unwrapped env) starts an episode at the next frame."""
    env = make_env(n_envs=3)
    k = 3
    rec = RecordTrajectory(env, tmp_path / "sparse.mjarchive", env_ids=[0, 1, 2], fps=1 / (k * env.step_dt) + 1e-9)
    rec.reset()
    restarts = {w: set() for w in range(3)}  # env steps whose recorded state (or the next) is an episode's first
    for step, a in enumerate(actions(rec, 24), start=1):
        _, _, terminated, truncated, _ = rec.step(a)
        for w in np.flatnonzero((terminated | truncated).numpy()):
            restarts[int(w)].add(step)
        if step == 7:
            rec.unwrapped.reset(env_ids=torch.tensor([1]))  # behind the wrapper's back
            restarts[1].add(step + 1)
        if step == 14:
            rec.reset(env_ids=[2])
            restarts[2].add(step + 1)
    rec.close()
    with mjarchive.open(tmp_path / "sparse.mjarchive") as archive:
        assert archive.n_frames == 24 // k + 1
        for w in range(3):
            want = sorted({0} | {-(-s // k) for s in restarts[w] if -(-s // k) < archive.n_frames})
            assert [ep.start for ep in archive.episodes(w)] == want, (w, sorted(restarts[w]))


def test_scene_bundle_reads_an_attached_robots_meshes():
    """mjlab's Go1 scene: the robot's meshes lie beside its own XML, not the scene's."""
    from types import SimpleNamespace

    from mjlab.scene import Scene
    from mjlab.tasks.registry import load_env_cfg

    from mjarchive.mjlab import scene_bundle

    importlib.import_module("mjlab.tasks")
    cfg = load_env_cfg("Mjlab-Velocity-Flat-Unitree-Go1")
    cfg.scene.num_envs = 1
    scene = Scene(cfg.scene, device="cpu")
    bundle = scene_bundle(SimpleNamespace(scene=scene))
    got, want = mjarchive.ModelBundle(bundle.xml, bundle.assets).compile(), scene.spec.compile()
    assert bundle.assets and got.nmesh == want.nmesh > 0
    assert (got.nq, got.nbody, got.ngeom, got.nmocap) == (want.nq, want.nbody, want.ngeom, want.nmocap)
    np.testing.assert_allclose(got.mesh_vert, want.mesh_vert, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.geom_size, want.geom_size, rtol=1e-5, atol=1e-7)
