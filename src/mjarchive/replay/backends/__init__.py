"""Backends: the renderers, each behind the small contract of `base.Backend`.

`registry.py` names every backend and imports one only when it is chosen, so CPU-only work never
imports Warp; a new backend is one new module plus one line there. `cpu.py` renders with MuJoCo's
OpenGL renderer, `warp.py` with MuJoCo Warp's batch ray tracer. A backend may import `base`, the
views, `replay.worker` and the archive wing; backends never import each other, nor planning or
orchestration (`plan`, `unit`, `render`).
"""
