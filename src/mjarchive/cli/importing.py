"""`mjarchive import SOURCE ...`: another tool's recordings into one archive (flygym's `.npz` folders)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = ["add_import_sources"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the half-written archive is removed on the way out


def cmd_import_flygym(args: argparse.Namespace) -> int:
    from ..record.flygym import import_flygym

    options = args.storage_options_parser(args)
    # `kill`, a batch scheduler's time limit: SIGTERM would end the process where it stands
    here = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if here else None
    try:
        result = import_flygym(args.dir, args.model, args.out, overwrite=args.overwrite,
                               progress=not args.no_progress, storage_options=options, world_ids=args.world_ids,
                               shortest=args.shortest)
    finally:
        if here:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if args.world_ids == "order":
        for name, world in zip(result.files, result.world_ids):
            # a name that is not UTF-8 (a surrogate escape) shown as \xNN rather than failing to print
            print(f"{os.fsencode(name).decode('utf-8', 'backslashreplace')} -> world {world}")
    print(f"wrote {args.out}: {len(result.world_ids)} worlds, {result.n_frames} frames (verified)", file=sys.stderr)
    return 0


def add_import_sources(p: argparse.ArgumentParser, parser_class: type, add_storage: Callable,
                       storage_options: Callable) -> None:
    """The `import` command's sources as its subcommands (`storage_options(args)` parses --storage-options)."""
    sub = p.add_subparsers(dest="source", metavar="SOURCE", parser_class=parser_class, required=True)
    help = ("a folder of flygym 2.x RecordedTrajectory files (.npz, one per world) into one archive with the model; "
            "every file checked before anything is written, the archive verified")
    f = sub.add_parser("flygym", help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  mjarchive import flygym trajectories/ --model nmf/flat_ground_world.xml "
                              "-o run.mjarchive\n  (write the model with flygym: world.save_xml_with_assets('nmf'))")
    f.add_argument("dir", metavar="DIR", help="the folder of .npz files (other names are skipped)")
    f.add_argument("--model", required=True, metavar="XML",
                   help="the MJCF file of the model the trajectories were recorded with")
    f.add_argument("-o", "--out", required=True, metavar="ARCHIVE", help="the new archive's path or URL")
    f.add_argument("--world-ids", choices=("file", "order"), default="file",
                   help="file: each file's world_id (default; they must differ); order: 0..N-1 in file name order "
                        "(for CPU runs, which all save world_id 0)")
    f.add_argument("--shortest", action="store_true",
                   help="take the frames common to all files when their lengths differ (default: refuse)")
    f.add_argument("--overwrite", action="store_true", help="replace an existing archive at --out")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_storage(f)
    f.set_defaults(func=cmd_import_flygym, storage_options_parser=storage_options)
