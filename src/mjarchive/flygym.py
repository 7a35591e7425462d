"""Bring flygym 2.x runs into mjarchive: recorders with flygym's call shape, and an importer of its files.

`TrajectoryRecorder` and `WarpTrajectoryRecorder` take the place of flygym's own recorders in a
`Simulation` or `GPUSimulation` (the same frames, streamed to an archive that carries the model);
`import_flygym` turns a folder of flygym `RecordedTrajectory` `.npz` files into one archive. None of
them imports flygym (the Warp recorder imports Warp when it first records).

Example (in a flygym loop, in place of `sim.set_trajectory_recorder()`)::

    import mjarchive.flygym

    sim.recorder = mjarchive.flygym.TrajectoryRecorder("run.mjarchive", sim)
    ...  # sim.step(); sim.record_as_needed()
    sim.recorder.close()
"""

from .record.flygym import FrameClock, ImportResult, TrajectoryRecorder, WarpTrajectoryRecorder, import_flygym

__all__ = ["FrameClock", "ImportResult", "TrajectoryRecorder", "WarpTrajectoryRecorder", "import_flygym"]
