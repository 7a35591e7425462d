"""Record Gymnasium MuJoCo envs into mjarchive archives.

`RecordTrajectory` wraps one env (like `gymnasium.wrappers.RecordVideo`, it records the state after
each reset and each step); `RecordVectorTrajectory` wraps a `SyncVectorEnv` and records its
sub-envs as worlds. Needs `pip install 'mjarchive[gymnasium]'`; `import mjarchive` alone does not
import Gymnasium.

Example::

    import gymnasium
    from mjarchive.gymnasium import RecordTrajectory

    env = RecordTrajectory(gymnasium.make("Ant-v5"), "ant.mjarchive")
"""

try:
    from .record.gymnasium import RecordTrajectory, RecordVectorTrajectory
except ModuleNotFoundError as exc:
    if exc.name != "gymnasium":
        raise
    raise ModuleNotFoundError("mjarchive.gymnasium needs Gymnasium: pip install 'mjarchive[gymnasium]'",
                              name="gymnasium") from exc

__all__ = ["RecordTrajectory", "RecordVectorTrajectory"]
