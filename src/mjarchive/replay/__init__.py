"""Replay: plan work units over a selection, pose and render them, encode videos.

`backends/` holds the renderers (CPU, MuJoCo Warp) behind one contract, `views/` what a frame
shows besides the state (cameras, HUD and labels, scene layout, draw options, overlays, variants). Here:
`plan.py` (videos and work units), `unit.py` (one unit in any process), `worker.py` (what a worker
receives and keeps), `pool.py` (warm worker processes), `render.py` (orchestration), `video.py`
(encoding), `resume.py` (finished outputs), `cluster.py` (Dask).
"""
