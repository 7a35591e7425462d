"""A new archive's layout: `create()`'s settings checked into a manifest, then the arrays (codecs,
chunking, sharding) and root attributes written on disk, ready for the writer to append to."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import math
import os
from typing import Any

import mujoco
import numpy as np
import zarr
import zarr.codecs
import zarr.storage
from zarr.core.array import AsyncArray
from zarr.core.group import AsyncGroup
from zarr.core.sync import sync
from zarr.storage import StorePath

from .bundle.model_bundle import ModelBundle, QposLayout
from .._errors import FormatError, MjArchiveError
from .episode_index import INDEX_ROWS, has_index, index_array_spec
from .format import (
    FORMAT_VERSION,
    MAX_CHUNK_BYTES,
    MAX_DECODED_CHUNK_BYTES,
    MAX_CHUNK_FRAMES,
    MAX_RATE,
    MAX_WORLD_ID,
    MAX_WORLDS,
    MIN_RATE,
    RESET_COUNT,
    ROOT_ATTR,
    STORAGE_DTYPES,
    check_track_name,
    quantize,
)
from .events import create_event_arrays, variant_specs
from .manifest import Manifest, TrackSpec
from .overlays import overlay_specs
from .storage.chunk_writer import ChunkWriter
from .storage.locations import clear_root
from .storage.shard_writer import enabled as enabled_fast_writes

__all__ = ["as_bundle", "plan_archive", "build_archive", "write_root"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mjarchive")
    except PackageNotFoundError:
        return "0+unknown"


def as_bundle(model: Any) -> ModelBundle:
    """Accept a ModelBundle, an MJCF path or an MjSpec."""
    if isinstance(model, ModelBundle):
        return model
    if isinstance(model, mujoco.MjSpec):
        return ModelBundle.from_spec(model)
    if isinstance(model, (str, os.PathLike)):
        return ModelBundle.from_file(model)
    if isinstance(model, mujoco.MjModel):
        raise MjArchiveError(
            "an MjModel cannot be bundled (it no longer knows its XML and files); pass the MJCF path, "
            "the MjSpec or a ModelBundle instead"
        )
    raise MjArchiveError(f"cannot build a model bundle from {type(model).__name__}")


def plan_archive(bundle: ModelBundle, *, world_ids: Any, n_worlds: int | None, timestep: float | None,
                 output_fps: float | None, playback_speed: float, dtype: str, precision: float | None,
                 tracks: dict | None, chunk_frames: int, shard_worlds: int, backend: str, variant_fields: Any,
                 overlays: dict[str, Any] | None) -> tuple[Manifest, mujoco.MjModel]:
    """Check `create()`'s settings and build the new archive's manifest; nothing is written yet."""
    if world_ids is None:
        if n_worlds is None:
            raise MjArchiveError("pass world_ids=[...] (original world IDs) or n_worlds=N")
        world_ids = range(n_worlds)
    world_ids = tuple(int(w) for w in np.asarray(list(world_ids)).ravel())
    if (not world_ids or len(world_ids) > MAX_WORLDS or len(set(world_ids)) != len(world_ids) or min(world_ids) < 0
            or max(world_ids) > MAX_WORLD_ID):
        raise MjArchiveError(f"world_ids must be 1 to {MAX_WORLDS} distinct integers in [0, 2**63 - 1] (int64)")
    if dtype not in STORAGE_DTYPES:
        raise MjArchiveError(f"dtype must be one of {sorted(STORAGE_DTYPES)}, got {dtype!r}")
    if precision is not None and not (precision > 0 and math.isfinite(precision)):
        raise MjArchiveError("precision is an absolute error bound and must be > 0 (or None for lossless)")
    if output_fps is not None and not MIN_RATE <= output_fps <= MAX_RATE or not MIN_RATE <= playback_speed <= MAX_RATE:
        raise MjArchiveError(f"output_fps and playback_speed must be finite, in [{MIN_RATE:g}, {MAX_RATE:g}]")
    if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, (int, np.integer)) or not 1 <= chunk_frames <= MAX_CHUNK_FRAMES:
        raise MjArchiveError(f"chunk_frames must be an integer in [1, {MAX_CHUNK_FRAMES}]")
    if isinstance(shard_worlds, bool) or not isinstance(shard_worlds, (int, np.integer)) or not 1 <= shard_worlds:
        raise MjArchiveError("shard_worlds must be an integer >= 1")
    chunk_frames, shard_worlds = int(chunk_frames), int(shard_worlds)
    track_specs = {check_track_name(n): TrackSpec.parse(t) for n, t in (tracks or {}).items()}
    overlay_decls = overlay_specs(overlays)
    mj_model = bundle.compile()  # a copy of the model the bundle compiled when it was made: no compile here
    layout = QposLayout.from_model(mj_model)
    variant_decls = variant_specs(variant_fields, mj_model)
    W = len(world_ids)
    manifest = Manifest(
        world_ids=world_ids, layout=layout, model_sha256=bundle.sha256,
        timestep=float(timestep if timestep is not None else mj_model.opt.timestep),
        output_fps=None if output_fps is None else float(output_fps), playback_speed=float(playback_speed),
        dtype=dtype, abs_error=None if precision is None else quantize(np.zeros(1), precision)[1],
        chunk_frames=chunk_frames, chunk_worlds=1, shard_worlds=shard_worlds, tracks=track_specs,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        producer={"name": "mjarchive", "version": _version(), "backend": backend,
                  **({"model_xml": bundle.written_as} if bundle.written_as else {})},
        mujoco_version=mujoco.__version__,
        format_version=FORMAT_VERSION,
        variants=variant_decls, overlays=overlay_decls,
    )
    shard_worlds = min(W, _fit_shard_worlds(shard_worlds, chunk_frames, manifest.per_frame_arrays()))
    manifest = dataclasses.replace(manifest, shard_worlds=shard_worlds)
    try:  # never write what readers refuse (a camera name with a newline, a timestep of 1e-300, ...)
        Manifest.from_dict(manifest.to_dict(0, "live"))
    except FormatError as exc:
        raise MjArchiveError(f"cannot record this model or these settings: {exc}") from None
    return manifest, mj_model


def build_archive(location: Any, store: Any, bundle: ModelBundle | None, manifest: Manifest, *,
                  overwrite: bool) -> tuple[zarr.Group, dict[str, zarr.Array]]:
    """Write a new, empty archive for `manifest` into `store` (from `new_store`, its writer lease held):
    the model bundle, every array and the root attributes. Returns the root group and the arrays a writer
    appends to, by name, bound to `store` (opening them again would read back the metadata just written).

    zarr builds the archive in memory first (the documents and chunks it would write, byte for byte), which
    is then written to `store` in one batch with the root document last: through zarr straight to the
    store, each node cost event-loop round trips and reads checking what exists (~25 ms for a new archive,
    a request each on object storage), and a crash part way left a root document without its arrays."""
    world_ids, W = manifest.world_ids, len(manifest.world_ids)
    chunk_frames, shard_worlds, overlay_decls = manifest.chunk_frames, manifest.shard_worlds, manifest.overlays
    clear_root(location, store, overwrite=overwrite)  # refuses existing data unless overwrite: ArchiveExistsError
    drafted: dict[str, Any] = {}
    draft = zarr.open_group(store=zarr.storage.MemoryStore(drafted), mode="w", zarr_format=3)
    if bundle is not None:  # a part of a multi-part archive shares the root's bundle
        bundle.to_zarr(draft)
    for group in ("overlays", *(f"overlays/{n}" for n in overlay_decls)) if overlay_decls else ():
        draft.create_group(group)
    # write_empty_chunks: world_ids == [0] equals the fill value and would otherwise not be stored.
    specs = {"world_id": dict(shape=(W,), chunks=(W,), dtype="int64", dimension_names=("world",),
                              compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0,
                              config={"write_empty_chunks": True}),
             "time": dict(shape=(0,), chunks=(chunk_frames,), dtype="float64", dimension_names=("frame",),
                          compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0.0)}
    for name, (tail, dt) in manifest.per_frame_arrays().items():
        specs[name] = _frame_world_array(W, tail, _dimension_names(name, tail), dt, chunk_frames, shard_worlds)
    if has_index(manifest):
        specs[RESET_COUNT] = index_array_spec(W, shard_worlds)
    arrays = _create_arrays(draft, specs)
    _write_whole(arrays.pop("world_id"), np.asarray(world_ids, dtype=np.int64))
    create_event_arrays(draft, manifest)
    drafted.pop("zarr.json")  # the root document goes last, with the archive's attributes
    store.write_all_now((key, drafted.pop(key).as_buffer_like()) for key in list(drafted))  # each let go once written
    write_root(store, draft.metadata.to_dict(), manifest.to_dict(0, "live"))
    root = zarr.Group(AsyncGroup(metadata=draft.metadata, store_path=StorePath(store)))
    return root, {name: zarr.Array(AsyncArray(metadata=a.metadata, store_path=StorePath(store, a.path),
                                              config=a.async_array.config)) for name, a in arrays.items()}


def _dimension_names(name: str, tail: tuple[int, ...]) -> tuple[str, ...]:
    """Names of the trailing dimensions (after frame and world), as the spec lists them."""
    fixed = {"qpos": ("q",), "mocap_pos": ("mocap", "xyz"), "mocap_quat": ("mocap", "wxyz")}
    if name in fixed:
        return fixed[name]
    if name.startswith("overlays/"):
        return (("item", "byte") if name.endswith("/text") else ("item", "coord"))[:len(tail)]
    return tuple(f"{name}_{i}" for i in range(len(tail)))


def _fit_shard_worlds(shard_worlds: int, chunk_frames: int, per_frame: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """Shrink shards so no array's shard exceeds the spec's MAX_CHUNK_BYTES (readers refuse larger)."""
    tails = {n: (max(1, math.prod(tail)), np.dtype(dt).itemsize) for n, (tail, dt) in per_frame.items()}
    name, (values, itemsize) = max(tails.items(), key=lambda kv: kv[1][0] * kv[1][1])
    per_world = chunk_frames * values * itemsize
    if per_world > MAX_DECODED_CHUNK_BYTES:
        raise MjArchiveError(
            f"one world's chunk of {name!r} would be {per_world} bytes, above the spec's limit of "
            f"{MAX_DECODED_CHUNK_BYTES}; use a smaller chunk_frames "
            f"(at most {max(1, MAX_DECODED_CHUNK_BYTES // (values * itemsize))})"
        )
    # The episode index is chunked (INDEX_ROWS, shard_worlds) of int64: its chunks too stay readable.
    return max(1, min(shard_worlds, MAX_CHUNK_BYTES // per_world, MAX_DECODED_CHUNK_BYTES // (INDEX_ROWS * 8)))


def _frame_world_array(W, tail, dims, dtype, chunk_frames, shard_worlds) -> dict[str, Any]:
    """`create_array`'s arguments for a (frame, world, ...) array: inner chunks hold one world, shards
    group worlds, never time."""
    itemsize = np.dtype(dtype).itemsize
    # Zarr chunk extents must be >= 1: a zero-length trailing axis (qpos of a model with nq = 0)
    # gets extent 1 (spec: "Zero-length axes"); such an array has no chunks at all.
    tail_chunks = tuple(max(1, t) for t in tail)
    # Frames innermost (transpose), then byte shuffle: each value's high bytes, which change slowly
    # in time, form long runs. On simulated motion that is 1.04-1.42x smaller than 0.1's bitshuffle
    # in frame order, and blosc clevel 2 (zstd 3) compresses faster than clevel 3 for 1% more
    # (benchmarks/bench_compression.py). A chunk without a trailing axis is a time series already.
    filters = [zarr.codecs.TransposeCodec(order=(*range(1, 2 + len(tail)), 0))] if tail and itemsize > 1 else None
    compressor = zarr.codecs.BloscCodec(cname="zstd", clevel=2, shuffle="shuffle" if itemsize > 1 else "noshuffle",
                                        typesize=itemsize)
    return dict(shape=(0, W, *tail), chunks=(chunk_frames, 1, *tail_chunks), shards=(chunk_frames, shard_worlds, *tail_chunks),
                dtype=dtype, filters=filters, compressors=compressor, dimension_names=("frame", "world", *dims), fill_value=0)


def _create_arrays(root: zarr.Group, specs: dict[str, dict[str, Any]]) -> dict[str, zarr.Array]:
    """The arrays `name -> create_array's arguments` under `root`, created in one trip to zarr's event
    loop (through `Group.create_array`, each is a trip of its own, a hand-off between threads). All are
    waited for before a failure is raised: nothing is written after create() gives up."""
    async def create_all() -> list:
        return await asyncio.gather(*(root._async_group.create_array(name, **kwargs) for name, kwargs in specs.items()),
                                    return_exceptions=True)

    created = sync(create_all())
    for result in created:
        if isinstance(result, BaseException):
            raise result
    return {name: zarr.Array(array) for name, array in zip(specs, created)}


def _write_whole(array: zarr.Array, data: np.ndarray) -> None:
    """`array[:] = data` for an array of one chunk, encoded here as zarr would (`ChunkWriter`), without
    a trip through zarr-python's event loop and codec pipeline (~4 ms)."""
    direct = ChunkWriter.for_array(array) if enabled_fast_writes() else None
    if direct is None or not direct.write(0, data):
        array[:] = data


def write_root(store: Any, group_doc: dict, attrs: dict) -> None:
    """Replace the root group's `zarr.json` in `store` (the document `group_doc`, its archive attributes
    `attrs`) in one atomic store write, as compact JSON (zarr's indented JSON is 2-5 times larger: 345 KB
    instead of 69 KB for a flex model's joint list)."""
    doc = {**group_doc, "attributes": {**group_doc.get("attributes", {}), ROOT_ATTR: attrs}}
    store.write_now("zarr.json", json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())
