"""Archive.verify(): every check a reader can make, collected into one report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._errors import MjArchiveError
from ._manifest import root_schema

if TYPE_CHECKING:
    from ._reader import Archive, VerifyReport


def verify_archive(archive: Archive) -> VerifyReport:
    from ._reader import VerifyReport

    problems: list[str] = []
    checked: list[str] = []
    n = archive.n_frames
    checked.append(f"metadata valid against the format {archive.format_version} schema "
                   f"({root_schema()['title']}); {n} committed frames")
    try:
        bundle = archive.bundle
        archive.model()
        checked.append(f"model bundle: {len(bundle.assets)} assets, sha256 {bundle.sha256[:16]}…, layout matches")
    except MjArchiveError as exc:
        problems.append(f"model bundle: {exc}")
    stored_ids = archive._wid_array[:]
    if tuple(int(w) for w in stored_ids) != archive.world_ids:
        problems.append("world_id array differs from the manifest's world_ids")
    else:
        checked.append(f"world_id array matches the manifest ({archive.n_worlds} worlds)")
    cf = archive.manifest.chunk_frames
    abs_error = archive.manifest.abs_error
    for name in archive._arrays:
        try:
            bad_finite = 0
            for start in range(0, n, cf):
                block = archive._read(name, slice(start, min(n, start + cf)), None)
                if block.dtype.kind == "f":
                    bad_finite += int((~np.isfinite(block)).sum())
                if name == "time" and block.size and np.any(np.diff(block) <= 0):
                    problems.append(f"time is not strictly increasing in frames {start}..{start + block.size}")
                if name == "time" and start and block.size:
                    previous = archive._read("time", slice(start - 1, start), None)
                    if block[0] <= previous[0]:
                        problems.append(f"time is not strictly increasing at frame {start}")
                if abs_error is not None and name in ("qpos", "mocap_pos", "mocap_quat") and block.size:
                    step = 2 * abs_error
                    if not np.allclose(np.round(block / step) * step, block, rtol=0, atol=1e-7 * np.abs(block).max()):
                        problems.append(f"{name} values are not on the declared quantization grid ({abs_error})")
            if bad_finite:
                problems.append(f"{name}: {bad_finite} non-finite values in committed frames")
            else:
                checked.append(f"{name}: every committed chunk decodes" + ("" if name in ("reset",) else ", values finite"))
        except MjArchiveError as exc:
            problems.append(f"{name}: {exc}")
    return VerifyReport(problems=problems, checked=checked)
