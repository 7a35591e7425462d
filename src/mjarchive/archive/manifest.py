"""The archive manifest (root attributes): one place that builds, parses and validates it."""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from typing import Any

from .bundle import QposLayout
from .._errors import FormatError, FormatVersionError
from .format import (
    FORMAT_MAJOR,
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_TRACK_ELEMENTS,
    MAX_WORLDS,
    ROOT_ATTR,
    STORAGE_DTYPES,
    TRACK_DTYPES,
    as_int,
    check_track_name,
)


@dataclasses.dataclass(frozen=True)
class TrackSpec:
    """An optional per-(frame, world) track: its trailing shape and stored dtype."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def parse(cls, value: Any) -> TrackSpec:
        """Accept a TrackSpec, a dict, `(shape, dtype)`, a shape tuple or an int length."""
        if isinstance(value, TrackSpec):
            spec = value
        elif isinstance(value, dict):
            spec = cls(tuple(value.get("shape", ())), str(value.get("dtype", "float32")))
        elif isinstance(value, int):
            spec = cls((value,) if value else ())
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
            spec = cls(tuple((value[0],) if isinstance(value[0], int) else value[0]), value[1])
        else:
            spec = cls(tuple(value))
        shape = tuple(as_int(s, "track dimension", lo=1, hi=MAX_TRACK_ELEMENTS) for s in spec.shape)
        if math.prod(shape) > MAX_TRACK_ELEMENTS or len(shape) > 4:
            raise FormatError(f"track shape {shape} is too large (at most 4 dims, {MAX_TRACK_ELEMENTS} elements)")
        if spec.dtype not in TRACK_DTYPES:
            raise FormatError(f"track dtype {spec.dtype!r} is not allowed; use one of {sorted(TRACK_DTYPES)}")
        return cls(shape, spec.dtype)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything the root attributes say about an archive, except the committed frame count."""

    world_ids: tuple[int, ...]
    layout: QposLayout
    model_sha256: str
    timestep: float
    output_fps: float | None
    playback_speed: float
    dtype: str
    abs_error: float | None
    chunk_frames: int
    chunk_worlds: int
    shard_worlds: int
    tracks: dict[str, TrackSpec]
    created: str
    producer: dict[str, str]
    mujoco_version: str
    format_version: str = FORMAT_VERSION

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.layout.cameras

    def to_dict(self, n_frames: int, status: str) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "created": self.created,
            "producer": dict(self.producer),
            "mujoco_version": self.mujoco_version,
            "timestep": self.timestep,
            "output_fps": self.output_fps,
            "playback_speed": self.playback_speed,
            "world_ids": list(self.world_ids),
            "cameras": list(self.cameras),
            "model": {"sha256": self.model_sha256, "layout": self.layout.to_dict()},
            "storage": {
                "dtype": self.dtype,
                "precision": None if self.abs_error is None else {"mode": "quantize", "abs_error": self.abs_error},
                "chunk_frames": self.chunk_frames,
                "chunk_worlds": self.chunk_worlds,
                "shard_worlds": self.shard_worlds,
            },
            "tracks": {name: t.to_dict() for name, t in self.tracks.items()},
            "status": status,
            "n_frames": n_frames,
        }

    @classmethod
    def from_dict(cls, d: Any) -> tuple[Manifest, int, str]:
        """Parse and validate root attributes; returns (manifest, committed frame count, status)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise FormatError("this Zarr group is not an mjarchive archive (no 'mjarchive' root attribute)")
        version = d.get("format_version")
        if not isinstance(version, str) or not version.count(".") == 1 or not all(p.isdigit() for p in version.split(".")):
            raise FormatError(f"malformed format_version {version!r}")
        if int(version.split(".")[0]) > FORMAT_MAJOR:
            raise FormatVersionError(
                f"archive format {version} is newer than this mjarchive supports ({FORMAT_VERSION}); "
                "upgrade mjarchive (pip install -U mjarchive)"
            )
        if int(version.split(".")[0]) < FORMAT_MAJOR:
            raise FormatVersionError(f"archive format {version} predates format 1.0 and cannot be read")
        _validate_schema(d)
        storage, model = d["storage"], d["model"]
        world_ids = tuple(d["world_ids"])
        if len(set(world_ids)) != len(world_ids):
            raise FormatError("world_ids contains duplicates")
        tracks = {check_track_name(n): TrackSpec.parse(t) for n, t in d["tracks"].items()}
        precision = storage["precision"]
        manifest = cls(
            world_ids=world_ids,
            layout=QposLayout.from_dict(model["layout"]),
            model_sha256=model["sha256"],
            timestep=float(d["timestep"]),
            output_fps=None if d["output_fps"] is None else float(d["output_fps"]),
            playback_speed=float(d["playback_speed"]),
            dtype=storage["dtype"],
            abs_error=None if precision is None else float(precision["abs_error"]),
            chunk_frames=storage["chunk_frames"],
            chunk_worlds=storage["chunk_worlds"],
            shard_worlds=storage["shard_worlds"],
            tracks=tracks,
            created=d["created"],
            producer=dict(d["producer"]),
            mujoco_version=d["mujoco_version"],
            format_version=version,
        )
        if tuple(manifest.cameras) != tuple(d["cameras"]):
            raise FormatError("cameras do not match the model layout's cameras")
        return manifest, as_int(d["n_frames"], "committed frame count n_frames"), d["status"]


def read_manifest(root: Any) -> tuple[Manifest, int, str]:
    """Parse a root group's attributes (untrusted) into (manifest, committed frames, status)."""
    attrs = root.attrs.asdict()
    if ROOT_ATTR not in attrs:
        raise FormatError("this Zarr group is not an mjarchive archive (no 'mjarchive' root attribute)")
    return Manifest.from_dict(attrs[ROOT_ATTR])


_SCHEMA: dict | None = None
_VALIDATOR = None


def root_schema() -> dict:
    """The JSON Schema of the root attribute `mjarchive` (spec/root-attributes.schema.json)."""
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads(resources.files(__package__).joinpath("root-attributes.schema.json").read_text())
    return _SCHEMA


def _validate_schema(d: dict) -> None:
    import jsonschema

    # Cap list lengths before the schema walks every item (a hostile 2M-entry list takes ~40 s).
    if isinstance(d.get("world_ids"), list) and len(d["world_ids"]) > MAX_WORLDS:
        raise FormatError(f"archive declares {len(d['world_ids'])} worlds (limit {MAX_WORLDS})")
    global _VALIDATOR
    if _VALIDATOR is None:  # jsonschema.validate() re-checks the schema itself on every call (~0.1 s)
        _VALIDATOR = jsonschema.validators.validator_for(root_schema())(root_schema())
    exc = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(d))
    if exc is not None:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise FormatError(f"archive metadata fails the mjarchive schema at {where}: {exc.message}") from None
    if len(d["world_ids"]) > MAX_WORLDS:
        raise FormatError(f"archive declares {len(d['world_ids'])} worlds (limit {MAX_WORLDS})")
    if d["storage"]["dtype"] not in STORAGE_DTYPES:
        raise FormatError(f"storage dtype {d['storage']['dtype']!r} is not allowed")
