"""Run mjarchive's public entry points on an untrusted archive in a child process, with limits.

Each call forks a child from one helper process (`mjarchive.testing.ForkServer`) that has already
imported mjarchive (a start costs milliseconds), caps the child's address space at `memory` bytes above what the helper already
uses, kills it after `timeout` seconds, and watches directories outside the archive and the output
folder with inotify: any open, read or write there is reported. The outcome says whether the entry
point worked (`ok`), refused with an MjArchiveError (`error`, with the class and message), or
failed any other way (`crash`: another exception, a traceback from the CLI, a signal such as a
segfault, or `timeout`). Commands and replies are JSON lines: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import resource
import time
import traceback
from pathlib import Path

import numpy as np

import mjarchive
import mjarchive.cli.main  # noqa: F401  (loaded once in the server, not in every child)
import mjarchive.replay.render  # noqa: F401
from mjarchive.testing import ForkServer, OpenWatcher

#: Every public way to read an archive or write next to it; each takes (archive, out_dir).
ENTRY_POINTS = ("open", "select", "refresh", "verify", "model", "render", "iter_frames", "append",
                "cli_info", "cli_verify", "cli_render", "cli_preview", "cli_export_model")
MEMORY = 1 << 30
#: Entry points that open an OpenGL context get more: Mesa reserves address space per raster thread.
RENDER_MEMORY = 3 << 30
_RENDERING = ("render", "iter_frames", "cli_render", "cli_preview")
TIMEOUT = 60.0

# -- the child side (runs in a process forked from the server) ----------------------------------------

def vm_size() -> int:
    """This process's address space in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_entry(name: str, archive: str, out: str) -> dict:
    """Run one entry point; returns the outcome as a JSON-able dict."""
    from mjarchive.cli.main import main

    cli = {"cli_info": ["info", archive], "cli_verify": ["verify", archive],
           "cli_render": ["render", archive, "--out", out, "--size", "16x16", "--quality", "fast", "--workers", "1",
                          "--frames", "0:2", "--worlds", "{first}"],
           "cli_preview": ["preview", archive, "--out", os.path.join(out, "sheet.png"), "--size", "16x16"],
           "cli_export_model": ["export-model", archive, out],
           # not in ENTRY_POINTS: the CLI's default selection, every world and frame
           "cli_render_all": ["render", archive, "--out", out, "--size", "16x16", "--quality", "fast", "--workers", "1"]}
    if name in cli:
        argv = cli[name]
        if "{first}" in argv:
            try:
                with mjarchive.open(archive) as a:
                    first = str(a.world_ids[0])
            except mjarchive.MjArchiveError:
                first = "0"
            argv = [first if x == "{first}" else x for x in argv]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        text = err.getvalue()
        if "Traceback" in text:
            return {"status": "crash", "message": text[-2000:]}
        if rc == 0:
            return {"status": "ok"}
        lines = [l for l in text.strip().splitlines() if l.strip()]
        return {"status": "error", "class": "cli", "message": lines[-1] if lines else "", "rc": rc}
    if name == "append":
        with mjarchive.open(archive, mode="a") as w:
            n = len(w.world_ids)
            nq = w.manifest.layout.nq
            nm = w.manifest.layout.nmocap
            extra = {k: np.zeros((n, *t.shape), t.dtype) for k, t in w.manifest.tracks.items()}
            if nm:
                extra["mocap_pos"] = np.zeros((n, nm, 3))
                extra["mocap_quat"] = np.tile([1.0, 0, 0, 0], (n, nm, 1))
            w.append(1e9, np.zeros((n, nq)), **extra)
        return {"status": "ok"}
    a = mjarchive.open(archive)
    if name == "open":
        a.time
    elif name == "select":
        w = a.world_ids[0]
        sel = a.select(worlds=[w], frames=slice(0, min(a.n_frames, 4)))
        sel.qpos, sel.reset, sel.time
        a.episodes(w)
    elif name == "refresh":
        a.refresh()
    elif name == "verify":
        report = a.verify()
        return {"status": "ok", "verify_ok": bool(report.ok), "message": "; ".join(report.problems)[:2000]}
    elif name == "model":
        a.model()
    elif name == "render":
        mjarchive.render(a, out, worlds=[a.world_ids[0]], frames=slice(0, min(a.n_frames, 2)), size=(16, 16),
                         quality="fast", workers=1, progress=False)
    elif name == "iter_frames":
        for _ in mjarchive.iter_frames(a, worlds=[a.world_ids[0]], frames=slice(0, min(a.n_frames, 2)),
                                       size=(16, 16), quality="fast"):
            pass
    # Entries of their own (not in ENTRY_POINTS), for work that multiplies what is shown:
    elif name == "render_scene":  # the first 64 worlds in one scene, up to 32 frames
        mjarchive.render(a, out, worlds=list(a.world_ids[:64]), frames=slice(0, min(a.n_frames, 32)), size=(16, 16),
                         quality="fast", workers=1, progress=False, layout="scene")
    elif name in ("first_frame_auto", "first_frame_free"):  # every world and frame selected, one frame drawn
        next(iter(mjarchive.iter_frames(a, camera=name.rsplit("_", 1)[1], size=(16, 16), quality="fast")))
    return {"status": "ok"}


def child(cmd: dict) -> None:
    """A forked child: limit its address space, run the entry point, write the outcome file."""
    limit = vm_size() + cmd["memory"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.chdir(cmd["cwd"])
    try:
        result = run_entry(cmd["entry"], cmd["archive"], cmd["out"])
    except mjarchive.MjArchiveError as exc:
        result = {"status": "error", "class": type(exc).__name__,
                  "classes": [c.__name__ for c in type(exc).__mro__], "message": str(exc)[:2000]}
    except BaseException as exc:
        result = {"status": "crash", "class": type(exc).__name__, "message": traceback.format_exc()[-3000:]}
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
    with open(cmd["result"], "w") as f:
        json.dump(result, f)


_SERVER = ForkServer("hostile:child", path=[str(Path(__file__).resolve().parent)])


@dataclasses.dataclass
class Outcome:
    entry: str
    status: str  # "ok", "error" (MjArchiveError or a clean CLI error), "crash", "timeout"
    error_class: str = ""
    classes: tuple[str, ...] = ()
    message: str = ""
    exitcode: int | None = None
    seconds: float = 0.0
    touched_outside: tuple[str, ...] = ()  # opened, read or written outside archive and output
    verify_ok: bool | None = None
    #: The child's peak resident memory in bytes (from the fork on, so it includes what it shares
    #: with the helper: compare it with a benign run's); None when the child left no result.
    peak_rss: int | None = None

    @property
    def clean(self) -> bool:
        """Worked or refused cleanly, and touched nothing outside."""
        return self.status in ("ok", "error") and not self.touched_outside


def run(entry: str, archive: str | os.PathLike, out: str | os.PathLike, *, watch: list[str | os.PathLike],
        memory: int | None = None, timeout: float = TIMEOUT, cwd: str | os.PathLike | None = None) -> Outcome:
    """Run one entry point in a limited child; `watch` lists directories that must stay untouched.
    `memory`: address space above the helper's (default MEMORY, RENDER_MEMORY for rendering)."""
    if memory is None:
        memory = RENDER_MEMORY if entry in _RENDERING else MEMORY
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = out.parent / f".result-{entry}-{os.getpid()}-{time.monotonic_ns()}.json"
    start = time.monotonic()
    with OpenWatcher(watch, writes=True) as watcher:
        pid = _SERVER.start({"entry": entry, "archive": str(archive), "out": str(out), "memory": memory,
                             "result": str(result), "cwd": str(cwd or out)})
        exitcode = None
        while exitcode is None:
            exitcode = _SERVER.poll(pid)
            if exitcode is None:
                if time.monotonic() - start > timeout:
                    os.kill(pid, 9)
                    while _SERVER.poll(pid) is None:
                        time.sleep(0.01)
                    return Outcome(entry, "timeout", seconds=time.monotonic() - start,
                                   touched_outside=tuple(watcher.events()))
                time.sleep(0.01)
        touched = tuple(watcher.events())
    seconds = time.monotonic() - start
    try:
        data = json.loads(result.read_text())
        result.unlink()
    except (OSError, ValueError):
        return Outcome(entry, "crash", message=f"child died with exit code {exitcode}", exitcode=exitcode,
                       seconds=seconds, touched_outside=touched)
    return Outcome(entry, data["status"], data.get("class", ""), tuple(data.get("classes", ())),
                   data.get("message", ""), exitcode, seconds, touched, data.get("verify_ok"), data.get("peak_rss"))
