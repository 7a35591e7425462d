"""Replay: plan work units over a selection, pose and render them on the CPU or with MuJoCo Warp, encode videos."""
