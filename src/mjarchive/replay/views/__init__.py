"""Views: what a rendered frame shows beyond the archived state.

Cameras (`camera.py`: free, tracking, auto views and file labels), the burned-in HUD (`hud.py`) and
per-world labels in a scene (`labels.py`), many worlds in one scene (`scene.py`), what is drawn (`options.py`), recorded overlays
(`overlay_draw.py`) and per-world model variants on the rendered model (`variant_map.py`). Views
describe; they never render. May import the archive wing and each other, nothing else of
`replay/` (no backend, worker, plan or render).
"""
