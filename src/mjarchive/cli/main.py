"""The `mjarchive` command line: inspect, verify, compact, import, export, render, preview and view archives; demo.

Every command is a thin layer over the Python API. Expected failures (an MjArchiveError, bad
input, a missing file) print one line on stderr and exit non-zero; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from .._errors import MjArchiveError, SelectionError
from ..archive.reader import parse_selection
from ..replay.backends.registry import BACKENDS
from .importing import add_import_sources
from .info import archive_info, format_info

__all__ = ["main", "parse_range", "parse_size"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# -- argument parsing helpers --------------------------------------------------------------------


def parse_range(text: str) -> int | slice | list[int]:
    """Parse a selection written like Python: `7`, `7,42`, `100:500`, `::10`, `-100:`.

    Returns an int, a list of ints, or a slice. Raises SelectionError with a hint otherwise.
    """
    return parse_selection(text)


def parse_size(text: str) -> tuple[int, int]:
    """Parse `HEIGHTxWIDTH` (pixels), e.g. `480x640` → (480, 640)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", str(text))
    if not m or not all(0 < int(v) <= 16384 for v in m.groups()):
        raise SelectionError(f"bad size {text!r}; write HEIGHTxWIDTH in pixels, e.g. 480x640")
    return int(m.group(1)), int(m.group(2))


def _arg_type(parser_fn):
    """Wrap a parser so argparse reports its SelectionError message as a usage error."""

    def convert(text: str):
        try:
            return parser_fn(text)
        except SelectionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parser_fn.__name__.replace("parse_", "")
    return convert


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (plus a pointer to --help)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        if message.endswith("expected one argument"):
            message += "; a value starting with '-' needs '=', e.g. --frames=-300:"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _open(location: str, storage_options: dict | None = None):
    from ..archive.opening import open as open_archive

    return open_archive(location, storage_options=storage_options)


def _storage_options(args: argparse.Namespace) -> dict | None:
    raw = getattr(args, "storage_options", None)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MjArchiveError(f"--storage-options must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise MjArchiveError("--storage-options must be a JSON object, e.g. '{\"anon\": true}'")
    return value


def cmd_info(args: argparse.Namespace) -> int:
    with _open(args.archive, _storage_options(args)) as archive:
        info = archive_info(archive, sizes=args.sizes)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return EXIT_OK


# -- verify ---------------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    try:
        archive = _open(args.archive, _storage_options(args))
    except MjArchiveError as exc:
        print(f"FAIL {args.archive}: cannot be opened: {_one_line(exc)}")
        print(f"{args.archive}: INVALID (cannot be opened)")
        print(f"mjarchive verify: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the video extra; verifying works without it
        tqdm = None
    bar = None if args.quiet or args.no_progress or tqdm is None else tqdm(
        desc="verify", unit="chunk", file=sys.stderr, disable=None)  # None: shown on a terminal only

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    with archive:
        try:
            report = archive.verify(progress)
        finally:
            if bar is not None:
                bar.close()
    if not args.quiet:
        print(report)
    n = len(report.problems)
    print(f"{args.archive}: " + ("valid" if report.ok else f"INVALID ({n} problem{'s' if n != 1 else ''})"))
    return EXIT_OK if report.ok else EXIT_ERROR


# -- export-model -----------------------------------------------------------------------------------
def cmd_export_model(args: argparse.Namespace) -> int:
    with _open(args.archive, _storage_options(args)) as archive:
        bundle = archive.bundle
        out = Path(args.dir)
        if out.exists() and any(out.iterdir()) and not args.force:
            raise MjArchiveError(f"{str(out)!r} is not empty; choose an empty directory or pass --force")
        xml = bundle.export(out)
    print(f"wrote {xml} and {len(bundle.assets)} asset file(s); view it with: python -m mujoco.viewer --mjcf={xml}")
    return EXIT_OK


# -- render -----------------------------------------------------------------------------------------
def cmd_render(args: argparse.Namespace) -> int:
    import contextlib

    import mjarchive

    if args.scheduler and args.cluster:
        raise MjArchiveError("choose one of --scheduler (an existing Dask scheduler) and --cluster local")
    with contextlib.ExitStack() as stack:
        archive = stack.enter_context(_open(args.archive, _storage_options(args)))
        if archive.select(worlds=args.worlds, frames=args.frames).shape[0] == 0:
            raise SelectionError(f"no frames selected: the archive has {archive.n_frames} committed frames; "
                                 "choose a non-empty --frames range (or wait for frames to be committed)")
        executor = None
        if args.scheduler or args.cluster:  # distributed rendering on Dask (units run on its workers)
            from ..replay.cluster import dask_executor

            executor = stack.enter_context(dask_executor(args.scheduler, n_workers=args.workers))
        paths = mjarchive.render(
            archive, args.out, worlds=args.worlds, frames=args.frames, cameras=args.camera, size=args.size,
            backend=args.backend, workers=None if args.scheduler else args.workers, quality=args.quality,
            layout=args.layout, fps=args.fps, executor=executor, progress=not args.no_progress,
            split_episodes=args.split_episodes, resume=not args.no_resume, warp_batch=args.warp_batch,
            spacing=args.spacing, hud=None if args.no_hud else (args.hud or "default"), scene=args.scene,
            overlays=args.overlays,
        )
    for p in paths:
        print(p)
    print(f"wrote {len(paths)} video(s) to {args.out}", file=sys.stderr)
    return EXIT_OK


# -- preview ------------------------------------------------------------------------------------------
def cmd_preview(args: argparse.Namespace) -> int:
    from .preview import contact_sheet

    with _open(args.archive, _storage_options(args)) as archive:
        out = contact_sheet(archive, args.out, worlds=args.worlds, frames=args.frames, camera=args.camera,
                            size=args.size, backend=args.backend, quality=args.quality, overlays=args.overlays)
    print(out)
    return EXIT_OK


# -- view ---------------------------------------------------------------------------------------------
def cmd_view(args: argparse.Namespace) -> int:
    from ..viewer.app import view

    with _open(args.archive, _storage_options(args)) as archive:
        view(archive, worlds=args.worlds, frame=args.frame, port=args.port, host=args.host, spacing=args.spacing,
             max_worlds=args.max_worlds, block=True)
    return EXIT_OK


# -- compact --------------------------------------------------------------------------------------------
def cmd_compact(args: argparse.Namespace) -> int:
    from ..archive.compact import compact

    frames = args.frames
    if frames is not None and not (isinstance(frames, slice) and frames.step in (None, 1)):
        raise SelectionError(f"--frames takes a range START:STOP of consecutive frames (e.g. :500), got {frames!r}")
    bars = []  # the bar starts with the first block, once the sources are checked

    def progress(done: int, total: int) -> None:
        if not bars:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # tqdm comes with the video extra; compacting works without it
                tqdm = None
            bars.append(None if args.no_progress or tqdm is None else
                        tqdm(total=total, unit="frame", desc="mjarchive compact"))
        if bars[0] is not None:
            bars[0].update(done - bars[0].n)

    try:
        result = compact(args.sources, args.dest, renumber=args.renumber, frames=frames, progress=progress,
                         overwrite=args.overwrite, storage_options=_storage_options(args))
    finally:
        if bars and bars[0] is not None:
            bars[0].close()
    if args.renumber:
        for m in result.worlds:
            print(f"{m.source}{'' if m.part is None else f' part {m.part}'} world {m.old_id} -> {m.new_id}")
    print(f"wrote {args.dest}: {result.n_worlds} worlds, {result.n_frames} frames (verified)", file=sys.stderr)
    return EXIT_OK


# -- demo -----------------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out, model=args.model, n_worlds=args.worlds, seconds=args.seconds, backend=args.backend,
             size=args.size, quality=args.quality, workers=args.workers, progress=not args.no_progress)
    return EXIT_OK


# -- parser -----------------------------------------------------------------------------------------------
def _add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-options", metavar="JSON",
                   help="fsspec storage options for URLs such as s3://bucket/run.mjarchive, as a JSON object")


def _add_selection(p: argparse.ArgumentParser, *, worlds_help: str, frames_help: str) -> None:
    p.add_argument("--worlds", type=_arg_type(parse_range), metavar="IDS", help=worlds_help)
    p.add_argument("--frames", type=_arg_type(parse_range), metavar="RANGE", help=frames_help)


def _add_render_look(p: argparse.ArgumentParser, *, size_default: tuple[int, int], quality_default: str) -> None:
    p.add_argument("--size", type=_arg_type(parse_size), default=size_default, metavar="HxW",
                   help=f"frame size in pixels, height x width (default {size_default[0]}x{size_default[1]})")
    p.add_argument("--backend", choices=tuple(BACKENDS), default="cpu",
                   help="cpu: mujoco.Renderer in worker processes; warp: MuJoCo Warp's batch renderer (default cpu)")
    p.add_argument("--quality", choices=("full", "fast"), default=quality_default,
                   help="full: the model's visual settings; fast: no shadows, reflections, skybox or "
                        f"multisampling, much faster on software GL (default {quality_default})")


def _overlay_names(text: str) -> tuple[str, ...]:
    """--overlays: 'none' or comma-separated overlay track names."""
    if text.strip() == "none":
        return ()
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give overlay names separated by commas, or 'none'")
    return names


_WORLDS_HELP = "original world IDs: a list (7,42), a single ID, or a slice over IDs (0:16); default all"
_FRAMES_HELP = "frames, Python slice syntax over committed frames (100:500, ::10; last 300: --frames=-300:) or a list; default all"


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="mjarchive", formatter_class=raw,
        description="Record, inspect, verify and render MuJoCo trajectory archives (chunked Zarr v3).",
        epilog="examples:\n"
               "  mjarchive demo                                  # simulate, record, render (about 2 min on a CPU)\n"
               "  mjarchive info run.mjarchive                    # what is in an archive\n"
               "  mjarchive render run.mjarchive --out videos --worlds 7,42 --frames 100:500\n"
               "  mjarchive view run.mjarchive --worlds 0:8       # browse worlds in a browser\n"
               "run 'mjarchive COMMAND --help' for the options and an example of each command.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help: str, example: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=raw,
                              epilog=f"example:\n  {example}")

    p = add("demo", "simulate a real model in many worlds, record an archive, render two worlds and a contact sheet",
            "MUJOCO_GL=egl mjarchive demo demo-out --model aloha --worlds 16 --seconds 8")
    p.add_argument("out", nargs="?", default="mjarchive-demo", help="output directory (default ./mjarchive-demo)")
    p.add_argument("--model", choices=("humanoid", "aloha"), default="humanoid",
                   help="humanoid: random controls, reset when its torso falls below 0.75 m; aloha: scripted arm motions, "
                        "reset every 4 s (default humanoid)")
    p.add_argument("--worlds", type=int, default=64, help="number of parallel worlds (default 64)")
    p.add_argument("--seconds", type=float, default=10.0, help="simulated seconds per world (default 10)")
    p.add_argument("--workers", type=int, default=None, help="render worker processes (default one per core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_render_look(p, size_default=(240, 320), quality_default="fast")
    p.set_defaults(func=cmd_demo)

    p = add("info", "show an archive's worlds, frames, cadence, episodes, tracks, cameras, model and size",
            "mjarchive info run.mjarchive --json")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("--json", action="store_true", help="print JSON (keys documented in README.md)")
    p.add_argument("--sizes", action="store_true",
                   help="also measure stored bytes and the compression ratio (lists every object of the archive: "
                        "slow for long archives on object storage)")
    _add_storage(p)
    p.set_defaults(func=cmd_info)

    p = add("verify", "check metadata, model bundle hashes, every committed chunk and time order; "
                      "exit 0 when valid, 1 otherwise",
            "mjarchive verify run.mjarchive && echo ok")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (on stderr, shown on a terminal)")
    _add_storage(p)
    p.set_defaults(func=cmd_verify)

    p = add("render", "render selected worlds and frames to mp4 videos (exactly mjarchive.render)",
            "mjarchive render run.mjarchive --out videos --worlds 7,42 --frames 100:500 --camera side "
            "--size 240x320 --quality fast")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory for the videos")
    _add_selection(p, worlds_help=_WORLDS_HELP, frames_help=_FRAMES_HELP)
    p.add_argument("--camera", nargs="+", action="extend", metavar="CAM",
                   help="camera(s): a model camera's name or id (side), free[:lookat=0,0,1,distance=4,azimuth=90,"
                        "elevation=-20,fovy=45], track:BODY[,distance=3,azimuth=90,elevation=-20,fovy=45,yaw,"
                        "smoothing=0.2,world=42], auto[:elevation=-30] (default: all named cameras, else auto)")
    _add_render_look(p, size_default=(480, 640), quality_default="full")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes, of the local pool or of --cluster local (default one per core)")
    p.add_argument("--layout", choices=("per-world", "grid", "scene"), default="per-world",
                   help="per-world: one file per (world, camera); grid: worlds tiled into one video per camera; "
                        "scene: the worlds side by side in one 3D scene (at most 64)")
    p.add_argument("--spacing", type=float, default=2.0, metavar="M",
                   help="--layout scene: metres between neighbouring worlds on the grid (default 2.0)")
    p.add_argument("--hud", metavar="FIELDS",
                   help="values burned into each frame: world,episode,frame,time and track names, optionally a "
                        "corner (top-left, top-right, bottom-left, bottom-right), e.g. world,time,reward,bottom-left "
                        "(default: world IDs in grid and scene layouts, nothing per world)")
    p.add_argument("--no-hud", action="store_true", help="burn nothing into the frames")
    p.add_argument("--scene", metavar="OPTIONS",
                   help="what is drawn: geom/site groups, frames, MuJoCo's visual and render flags by name, e.g. "
                        "sites,frames=body,geomgroup=110,transparent,shadow=0")
    p.add_argument("--overlays", type=_overlay_names, metavar="NAMES",
                   help="recorded overlay tracks to draw: names (target,velocity) or 'none' (default: all the "
                        "archive's; --backend warp draws none, so pass --overlays none there)")
    p.add_argument("--split-episodes", action="store_true", help="one file per episode (split at reset markers)")
    p.add_argument("--fps", type=float, default=None, help="video frame rate (default: the archive's output_fps)")
    p.add_argument("--warp-batch", type=int, default=None, metavar="N",
                   help="--backend warp: (world, frame) states per launch, packed across worlds "
                        "(default: from the device's memory budget)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-resume", action="store_true",
                   help="render every video again, even those a previous run of the same request finished "
                        "(recorded in DIR/.mjarchive-render.json)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="render on an existing dask.distributed scheduler's workers (they open the archive "
                        "by its path or URL themselves)")
    p.add_argument("--cluster", choices=("local",),
                   help="local: start a Dask cluster on this machine (--workers processes, one thread each, "
                        "on 127.0.0.1) and render on it")
    _add_storage(p)
    p.set_defaults(func=cmd_render)

    p = add("preview", "write a labelled contact sheet PNG: frames as columns, worlds as rows",
            "mjarchive preview run.mjarchive --out sheet.png --worlds 0:4 --frames ::60 --size 120x160")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("--out", required=True, metavar="PNG", help="output PNG file")
    _add_selection(p, worlds_help="original world IDs, one row each (default: the first 4 worlds)",
                   frames_help="frames, one column each (default: 6 evenly spaced frames)")
    p.add_argument("--camera", metavar="CAM", help="a camera, as in render (default: the first named camera, else auto)")
    p.add_argument("--overlays", type=_overlay_names, metavar="NAMES",
                   help="recorded overlay tracks to draw, as in render (default: all; 'none' with --backend warp)")
    _add_render_look(p, size_default=(120, 160), quality_default="fast")
    _add_storage(p)
    p.set_defaults(func=cmd_preview)

    p = add("view", "serve a browser viewer: the selected worlds side by side in 3D, a timeline with play, "
                    "speed, loop and episode resets, and a camera that can follow a body",
            "mjarchive view run.mjarchive --worlds 7,42  # from another machine: ssh -L 8080:localhost:8080 HOST")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("--worlds", type=_arg_type(parse_range), metavar="IDS",
                   help="original world IDs shown at first: a list (7,42), an ID or a slice over IDs (0:8); "
                        "default the first --max-worlds; the page can switch")
    p.add_argument("--frame", type=int, default=0, metavar="N",
                   help="frame shown first (negative: from the end; default 0)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port; default 8080)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only); the viewer has no "
                        "authentication, so for another machine prefer an SSH tunnel to choosing another host")
    p.add_argument("--max-worlds", type=int, default=16, metavar="N",
                   help="the most worlds shown at once (default 16, at most 64)")
    p.add_argument("--spacing", type=float, default=2.0, metavar="M",
                   help="metres between neighbouring worlds on the grid, as render --layout scene (default 2.0)")
    _add_storage(p)
    p.set_defaults(func=cmd_view)

    p = add("compact", "rewrite a multi-part archive, or several archives of one model (e.g. seeds), into one "
                       "archive: every world, frame, track, overlay and variant as stored; verified when written",
            "mjarchive compact seed0.mjarchive seed1.mjarchive seeds.mjarchive --renumber")
    p.add_argument("sources", nargs="+", metavar="SRC", help="source archive paths or URLs, joined in this order")
    p.add_argument("dest", metavar="DEST", help="the new archive's path or URL")
    p.add_argument("--renumber", action="store_true",
                   help="number the worlds 0..N-1 in output order and print where each came from "
                        "(needed when sources share world IDs, as seeds do)")
    p.add_argument("--frames", type=_arg_type(parse_range), metavar="RANGE",
                   help="START:STOP, the same frames of every source (needed when their frame counts differ, "
                        "e.g. :500); default all, which must be equal")
    p.add_argument("--overwrite", action="store_true", help="replace an existing archive at DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_storage(p)
    p.set_defaults(func=cmd_compact)

    p = add("import", "turn another tool's recordings into one archive (a folder of flygym .npz files)",
            "mjarchive import flygym trajectories/ --model nmf/flat_ground_world.xml -o run.mjarchive")
    add_import_sources(p, _Parser, _add_storage, _storage_options)

    p = add("export-model", "write the bundled model (model.xml and its assets) to a directory",
            "mjarchive export-model run.mjarchive model/ && python -m mujoco.viewer --mjcf=model/model.xml")
    p.add_argument("archive", help="archive path or URL")
    p.add_argument("dir", help="output directory (created; must be empty unless --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory")
    _add_storage(p)
    p.set_defaults(func=cmd_export_model)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mjarchive` console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"mjarchive {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `mjarchive info run.mjarchive | head`: the reader left, stay quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except ImportError as exc:
        if args.debug:
            raise
        print(f"{prog}: error: {_one_line(exc)}; install the optional parts with: "
              "pip install 'mjarchive[all]'", file=sys.stderr)
        return EXIT_ERROR
    except (MjArchiveError, OSError) as exc:
        if args.debug:
            raise
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug, not bad input: still one line, with a way to see more
        if args.debug:
            raise
        print(f"{prog}: unexpected error: {type(exc).__name__}: {_one_line(exc)} (rerun with "
              "'mjarchive --debug ...' for the traceback)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
