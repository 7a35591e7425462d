"""Record MuJoCo Playground rollouts into mjarchive archives.

`PlaygroundRecorder` is a `mjarchive.Recorder` set up from a Playground env (its model, its env
step as the timestep, its auto-resets as episode starts) that records the stacked states of a
`jax.lax.scan` rollout. Needs MuJoCo Playground (`pip install playground`); `import mjarchive`
alone does not import it.

Example::

    from mjarchive.playground import PlaygroundRecorder

    rec = PlaygroundRecorder("run.mjarchive", env, worlds=[0, 1])
    rec.record_state(state)          # after env.reset
    rec.record_rollout(states)       # after each jitted scan over env.step
    rec.close()
"""

try:
    from .record.playground import PlaygroundRecorder, env_bundle, env_step_dt, model_differences
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.partition(".")[0] not in ("mujoco_playground", "jax", "brax"):
        raise
    raise ModuleNotFoundError(f"mjarchive.playground needs MuJoCo Playground ({exc.name} is missing): "
                              "pip install playground", name=exc.name) from exc

__all__ = ["PlaygroundRecorder", "env_bundle", "env_step_dt", "model_differences"]
