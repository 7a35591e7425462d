"""Record mjlab training runs and plays into mjarchive archives.

`RecordTrajectory` wraps an mjlab `ManagerBasedRlEnv` like mjlab's own `VideoRecorder` (so the
`RslRlVecEnvWrapper` goes around it) and records a few envs at the video cadence, with their
resets, from the env's device. Needs mjlab (`pip install mjlab`); `import mjarchive` alone does not
import it.

Example (in mjlab's train script, before `RslRlVecEnvWrapper`)::

    from mjarchive.mjlab import RecordTrajectory

    env = RecordTrajectory(env, Path(log_dir) / "train.mjarchive")
"""

try:
    from .record.mjlab import RecordTrajectory, default_env_ids, scene_bundle
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.partition(".")[0] not in ("mjlab", "torch"):
        raise
    raise ModuleNotFoundError(f"mjarchive.mjlab needs mjlab ({exc.name} is missing): pip install mjlab",
                              name=exc.name) from exc

__all__ = ["RecordTrajectory", "default_env_ids", "scene_bundle"]
