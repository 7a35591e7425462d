"""mjlab recording overhead (issue 24): `mjarchive.mjlab.RecordTrajectory` around an mjlab env vs the
env's own `step()`, per step.

Workload: mjlab's Mjlab-Cartpole-Balance task, 64 envs on the CPU (Warp's "cpu" device), 4 recorded
every env step (the default cadence: every step, as mjlab's video), float32, random actions. Two
envs are built once (same seed); each timed run steps one of them `--steps` times, the runs
interleaved (plain, wrapped, plain, ...), best of `--repeats`. Goal: wrapped ≤ 1.05× plain.
On a GPU: `--device cuda:0 --envs 4096`.

Prints `name: value` lines: `plain.step_ms`, `wrapped.step_ms`, `ratio.wrapped_vs_plain`,
`wrapped.frames`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--recorded", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="8 envs, 10 steps, 2 repeats")
    p.add_argument("--tmp", help="scratch directory (default: a fresh temporary one)")
    a = p.parse_args()
    if a.quick:
        a.envs, a.steps, a.repeats = 8, 10, 2
    try:
        importlib.import_module("mjlab.tasks")  # registers the tasks
        import torch
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import load_env_cfg
    except ImportError as exc:
        print(f"mjlab.skipped: {exc}")
        return
    from mjarchive.mjlab import RecordTrajectory

    def make():
        cfg = load_env_cfg("Mjlab-Cartpole-Balance")
        cfg.scene.num_envs = a.envs
        cfg.seed = 0
        return ManagerBasedRlEnv(cfg=cfg, device=a.device)

    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        plain = make()
        wrapped = RecordTrajectory(make(), Path(tmp) / "bench.mjarchive", env_ids=range(a.recorded))
        plain.reset()
        wrapped.reset()
        dim = plain.action_manager.total_action_dim
        acts = [torch.rand(a.envs, dim, device=a.device) * 2 - 1 for _ in range(a.steps)]
        for env in (plain, wrapped):  # warm-up: kernels, first gathers
            for act in acts[:3]:
                env.step(act)
        best = {"plain": float("inf"), "wrapped": float("inf")}
        for _ in range(a.repeats):
            for name, env in (("plain", plain), ("wrapped", wrapped)):
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t = time.perf_counter()
                for act in acts:
                    env.step(act)
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                best[name] = min(best[name], (time.perf_counter() - t) / a.steps)
        frames = wrapped.recorder.frames_recorded
        wrapped.close()
        plain.close()
    print(f"workload: cartpole, {a.envs} envs, {a.recorded} recorded, device {a.device}, {a.steps} steps, "
          f"best of {a.repeats}")
    print(f"plain.step_ms: {best['plain'] * 1e3:.3f}")
    print(f"wrapped.step_ms: {best['wrapped'] * 1e3:.3f}")
    print(f"ratio.wrapped_vs_plain: {best['wrapped'] / best['plain']:.3f}")
    print(f"wrapped.frames: {frames}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
