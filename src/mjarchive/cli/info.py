"""What `mjarchive info` (and the demo) report about an archive: the facts as a dict, and as text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from zarr.core.sync import sync

from .._errors import MjArchiveError
from ..archive.bundle.model_bundle import WRITTEN_AS
from ..archive.format import BUNDLE_GROUP

__all__ = ["INFO_KEYS", "archive_info", "format_info"]

#: The keys of `mjarchive info --json` (documented in README.md, "CLI reference").
INFO_KEYS = (
    "location", "format_version", "status", "n_frames", "n_worlds", "world_ids", "duration_s",
    "time_start", "time_end", "n_episodes", "nq", "nv", "nmocap", "output_fps", "playback_speed",
    "timestep", "dtype", "precision", "chunk_frames", "cameras", "tracks", "required_features", "variants",
    "overlays", "model_sha256",
    "mujoco_version", "model", "created", "producer", "size_bytes", "data_bytes", "raw_bytes",
    "compression_ratio", "parts",
)



def _store_bytes(archive: Any) -> tuple[int | None, dict[str, int]]:
    """Total stored bytes, and chunk bytes (metadata excluded) per top-level node (a multi-part
    archive's per `parts/<name>/<node>`), by listing the store's objects."""
    store = archive._root.store
    path = getattr(archive._root, "path", "") or ""
    prefix = f"{path}/" if path else ""

    async def walk() -> dict[str, int]:
        sizes: dict[str, int] = {}
        async for key in store.list_prefix(prefix):
            rel = key[len(prefix):]
            top = "/".join(rel.split("/", 3)[:3]) if rel.startswith("parts/") else rel.split("/", 1)[0]
            size = await store.getsize(key)
            sizes[""] = sizes.get("", 0) + size
            if not key.endswith("zarr.json"):
                sizes[top] = sizes.get(top, 0) + size
        return sizes

    try:
        per_node = sync(walk())
    except Exception:  # a store that cannot list (e.g. some HTTP stores): sizes are unknown
        return None, {}
    return per_node.pop("", 0), per_node


def archive_info(archive: Any, *, sizes: bool = False) -> dict[str, Any]:
    """Everything `mjarchive info` reports, as a JSON-serializable dict with the keys INFO_KEYS. Its cost
    does not grow with the archive's length (episodes come from the episode index), except with `sizes`:
    `size_bytes`, `data_bytes` and `compression_ratio` list every stored object (else they are None)."""
    man = archive.manifest
    n, W = archive.n_frames, archive.n_worlds
    time = archive.select(frames=[0, n - 1]).time if n else np.zeros(0)
    # A multi-part archive: each part's own frames count (a part may have recorded more than the others).
    readers = [archive.part(name) for name in archive.parts] or [archive]
    n_episodes = int(archive.episode_counts().sum())  # each world in its own part's frames
    raw = 0
    for reader in readers:
        raw += reader.n_frames * sum(math.prod(arr.shape[1:]) * arr.dtype.itemsize for arr in reader._arrays.values())
        raw += reader.n_worlds * 8  # world_id
    size_total, per_node = _store_bytes(archive) if sizes else (None, {})
    data_stored = None
    if size_total is not None:
        nodes = {*archive._arrays, "world_id"}  # the trajectory arrays (of the joined parts)
        joined = {f"parts/{name}/{node}" for name in archive.parts for node in nodes}
        data_stored = sum(v for k, v in per_node.items() if k in (joined if archive.parts else nodes))
    model: dict[str, Any] = {"sha256": man.model_sha256}
    try:
        bundle = archive.bundle
        mj = archive.model()
        model.update(nbody=int(mj.nbody), njnt=int(mj.njnt), ngeom=int(mj.ngeom), nmesh=int(mj.nmesh),
                     ntex=int(mj.ntex), nu=int(mj.nu), n_assets=len(bundle.assets),
                     bundle_bytes=len(bundle.xml.encode()) + sum(len(a) for a in bundle.assets.values()),
                     stored_bytes=per_node.get(BUNDLE_GROUP))
    except MjArchiveError as exc:
        model["error"] = str(exc)
    duration = float(time[-1] - time[0]) if n else 0.0
    info = {
        "location": str(archive.location),
        "format_version": archive.format_version,
        "status": archive.status,
        "n_frames": n,
        "n_worlds": W,
        "world_ids": list(archive.world_ids),
        "duration_s": duration,
        "time_start": float(time[0]) if n else None,
        "time_end": float(time[-1]) if n else None,
        "n_episodes": n_episodes,
        "nq": archive.nq,
        "nv": man.layout.nv,
        "nmocap": archive.nmocap,
        "output_fps": archive.output_fps,
        "playback_speed": archive.playback_speed,
        "timestep": archive.timestep,
        "dtype": man.dtype,
        "precision": man.abs_error,
        "chunk_frames": man.chunk_frames,
        "cameras": list(archive.cameras),
        "tracks": {k: t.to_dict() for k, t in man.tracks.items()},
        "required_features": sorted({*man.required_features, *(("parts",) if archive.parts else ())}),
        "variants": {k: v.to_dict(archive.variant_event_counts[k]) for k, v in man.variants.items()},
        "overlays": {k: o.to_dict() for k, o in man.overlays.items()},
        "model_sha256": man.model_sha256,
        "mujoco_version": man.mujoco_version,
        "model": model,
        "created": man.created,
        "producer": dict(man.producer),
        "size_bytes": size_total,
        "data_bytes": data_stored,
        "raw_bytes": raw,
        "compression_ratio": (raw / data_stored) if data_stored else None,
        "parts": [{"name": name, "n_frames": r.n_frames, "n_worlds": r.n_worlds, "status": r.status,
                   "world_ids": list(r.world_ids)} for name, r in zip(archive.parts, readers)] or None,
    }
    assert tuple(info) == INFO_KEYS
    return info


def _written_as(value: str) -> str:
    """How the recorder made the bundle's XML (producer key `model_xml`; any string from a hostile archive)."""
    return WRITTEN_AS.get(value) or f"unknown ({value[:64]!r})"


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _short_ids(ids: Sequence[int]) -> str:
    ids = list(ids)
    if ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) > 3:
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids)) if len(ids) <= 12 else f"{', '.join(map(str, ids[:8]))}, … {ids[-1]}"


def _stored_precision(dtype: str, abs_error: float | None) -> str:
    """What was stored and what was lost: "lossless" only where it is."""
    if abs_error is not None:
        return f"stored as {dtype}, quantized to ±{abs_error:g} (lossy by choice)"
    if dtype == "float64":
        return "stored as float64, lossless"
    # The archive does not know its input's type: MuJoCo's MjData holds float64, Warp float32.
    return ("stored as float32: float64 input (MuJoCo's MjData) rounded to float32, relative error ≤ 6e-8 "
            "per value; float32 input (MuJoCo Warp) stored exactly")


def format_info(info: dict[str, Any]) -> str:
    m = info["model"]
    fps = info["output_fps"]
    cadence = (f"{fps:g} fps output at {info['playback_speed']:g}× playback "
               f"(a frame every {info['playback_speed'] / fps:g} s of simulated time)" if fps else "no fixed cadence")
    tracks = ", ".join(f"{k} {tuple(t['shape'])} {t['dtype']}" for k, t in info["tracks"].items()) or "none"
    if "error" in m:
        model = f"UNREADABLE: {m['error']}"
    else:
        model = (f"{m['nbody']} bodies, {m['njnt']} joints, {m['ngeom']} geoms, {m['nmesh']} meshes, "
                 f"{m['ntex']} textures, {m['nu']} actuators; bundle {m['n_assets']} assets, "
                 f"{_human_bytes(m['bundle_bytes'])}")
    ratio = info["compression_ratio"]
    precision = _stored_precision(info["dtype"], info["precision"])
    rows = [
        ("archive", f"{info['location']} ({info['status']})"),
        ("format", info["format_version"]),
        ("worlds", f"{info['n_worlds']} (IDs {_short_ids(info['world_ids'])})"),
        *([("parts", f"{len(info['parts'])}: " + "; ".join(
            f"{p['name']} {p['n_worlds']} worlds × {p['n_frames']} frames ({p['status']})" for p in info["parts"][:8])
            + ("; …" if len(info["parts"]) > 8 else ""))] if info["parts"] else []),
        ("frames", f"{info['n_frames']}, simulated time {info['time_start'] or 0:g}..{info['time_end'] or 0:g} s "
                   f"({info['duration_s']:g} s)"),
        ("cadence", f"{cadence}; timestep {info['timestep']:g} s"),
        ("episodes", f"{info['n_episodes']} (split at reset markers)"),
        ("qpos", f"nq={info['nq']} nv={info['nv']} nmocap={info['nmocap']}, {precision}"),
        ("tracks", tracks),
        *([("variants", ", ".join(f"{k} {tuple(v['shape'])} ({v['n_events']} events)"
                                  for k, v in info["variants"].items()))] if info["variants"] else []),
        *([("overlays", ", ".join(f"{k} ({o['kind']}, up to {o['max_count']})" for k, o in info["overlays"].items()))]
          if info["overlays"] else []),
        ("cameras", ", ".join(info["cameras"]) or "none (renders use auto, free or track cameras)"),
        ("model", model),
        ("model sha256", info["model_sha256"]),
        *([("model XML", _written_as(info["producer"]["model_xml"]))] if "model_xml" in info["producer"] else []),
        ("MuJoCo", f"{info['mujoco_version']} (recorded with), producer {info['producer'].get('name', '?')} "
                   f"{info['producer'].get('version', '?')} backend={info['producer'].get('backend', '?')}"),
        ("size", f"{_human_bytes(info['size_bytes'])} in total; trajectories {_human_bytes(info['data_bytes'])} "
                 f"stored for {_human_bytes(info['raw_bytes'])} raw"
                 + (f" (compression {ratio:.2f}×)" if ratio else "") if info["size_bytes"] is not None else
                 f"{_human_bytes(info['raw_bytes'])} of trajectories raw; stored size not measured "
                 "(mjarchive info --sizes lists every object)"),
        ("created", info["created"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
