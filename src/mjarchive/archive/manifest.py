"""The archive manifest (root attributes): one place that builds, parses and validates it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from importlib import resources
from typing import Any, NoReturn

from .bundle.model_bundle import QposLayout
from .._errors import FormatError, FormatVersionError
from .overlays import Overlay, check_overlays
from .variants import MAX_FIELD_COUNT, MAX_VARIANT_EVENTS, VARIANT_FIELDS, VariantSpec, check_field_name
from .format import (
    ABS_ERROR_EXPONENTS,
    COMMIT_ATTR,
    COMMIT_KEY,
    MAX_COMMIT_BYTES,
    FEATURE_GROUPS,
    KNOWN_FEATURES,
    RESERVED_ARRAYS,
    RESET_COUNT,
    MAX_DECODED_CHUNK_BYTES,
    FORMAT_MAJOR,
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_CAMERAS,
    MAX_CHUNK_FRAMES,
    MAX_FRAMES,
    MAX_JOINTS,
    MAX_MOCAP,
    MAX_NAME_CHARS,
    MAX_NQ,
    MAX_RATE,
    MAX_TRACK_ELEMENTS,
    MAX_TRACKS,
    MAX_WORLD_ID,
    MAX_WORLDS,
    MIN_RATE,
    MIN_TIMESTEP,
    ROOT_ATTR,
    STORAGE_DTYPES,
    TRACK_DTYPES,
    VERSION_RE,
    as_int,
    check_array,
    check_track_name,
    parse_json_bytes,
    version_at_least,
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
    format_version: str = "1.0"
    #: Format 1.1: model fields that vary per world (events under `variants/`), and overlay tracks.
    variants: dict[str, VariantSpec] = dataclasses.field(default_factory=dict)
    overlays: dict[str, Overlay] = dataclasses.field(default_factory=dict)

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.layout.cameras

    @property
    def required_features(self) -> tuple[str, ...]:
        """Features a reader must implement to read this archive with its meaning (sorted)."""
        return tuple(sorted(({"variants"} if self.variants else set()) | ({"overlays"} if self.overlays else set())))

    def per_frame_arrays(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each (frame, world, ...) array, in storage order: its shape after (frame, world) and dtype."""
        lay = self.layout
        out = {"qpos": ((lay.nq,), self.dtype), "reset": ((), "bool")}
        if lay.nmocap:
            out["mocap_pos"] = ((lay.nmocap, 3), self.dtype)
            out["mocap_quat"] = ((lay.nmocap, 4), self.dtype)
        out.update({name: (t.shape, t.dtype) for name, t in self.tracks.items()})
        for name, overlay in self.overlays.items():
            out.update(overlay.arrays(name))
        return out

    def event_arrays(self, field: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """Store key → (shape after the event axis, dtype) of one variant field's event arrays."""
        spec = self.variants[field]
        return {f"variants/{field}/frame": ((), "int64"), f"variants/{field}/world": ((), "int32"),
                f"variants/{field}/value": (tuple(spec.shape), spec.dtype)}

    def check_chunking(self, name: str, array: Any) -> None:
        """Refuse a stored array whose chunk or shard shape is not the one the spec derives from this
        manifest: `time` (C,), `world_id` (W,), per-frame arrays inner chunks (C, 1, *tail) in shards
        (C, shard_worlds, *tail), zero-length axes with extent 1. A bigger chunk than declared would
        make every small read decode far more than it asks for."""
        cf = self.chunk_frames
        if name == "time":
            expected = ((cf,), None)
        elif name == "world_id":
            expected = ((len(self.world_ids),), None)
        else:
            tail = tuple(max(1, n) for n in self.per_frame_arrays()[name][0])
            expected = ((cf, 1, *tail), (cf, self.shard_worlds, *tail))
        shards = getattr(array, "shards", None)
        found = (tuple(array.chunks), None if shards is None else tuple(shards))
        if found != expected:
            raise FormatError(
                f"array {name!r} is chunked {found[0]} in shards {found[1]}; the manifest "
                f"({cf} frames per chunk, {self.shard_worlds} worlds per shard) requires chunks {expected[0]} "
                f"and shards {expected[1]}"
            )

    def check_event_arrays(self, field: str, arrays: dict[str, Any], n_events: int) -> None:
        """Refuse stored event arrays of one variant field whose metadata differs from what the spec
        derives from this manifest (dtype, shape, chunks (chunk_events, *shape), unsharded) or that
        are shorter than the committed count. Longer is no damage: one commit may add any number of
        events, and a writer that crashed before that commit leaves them uncommitted (resume shrinks
        such arrays, see `writer._check_resumed_arrays`)."""
        spec = self.variants[field]
        ce = spec.chunk_events
        for key, (tail, dtype) in self.event_arrays(field).items():
            arr = arrays[key]
            check_array(arr, key, dtypes={dtype}, ndim=1 + len(tail))
            if tuple(arr.shape[1:]) != tail:
                raise FormatError(f"array {key!r} has shape {arr.shape}; the manifest declares (events, "
                                  f"{', '.join(map(str, tail))})")
            shards = getattr(arr, "shards", None)
            if tuple(arr.chunks) != (ce, *tail) or shards is not None:
                raise FormatError(f"array {key!r} is chunked {tuple(arr.chunks)} in shards {shards}; the manifest "
                                  f"requires unsharded chunks {(ce, *tail)}")
            if arr.shape[0] < n_events:
                raise FormatError(f"array {key!r} holds {arr.shape[0]} events, but {n_events} are committed; "
                                  "the archive's commit record or arrays are corrupt")

    def to_dict(self, n_frames: int, status: str, n_events: dict[str, int] | None = None) -> dict[str, Any]:
        """The root attribute `mjarchive`: this manifest plus the commit record (`n_frames`, `status`
        and, with variants, each field's committed event count)."""
        version = self.format_version
        if self.required_features and version == "1.0":
            version = FORMAT_VERSION
        d = {
            "format": FORMAT_NAME,
            "format_version": version,
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
        }
        if self.required_features:
            d["required_features"] = list(self.required_features)
        if self.variants:
            n_events = n_events or {}
            d["variants"] = {name: spec.to_dict(n_events.get(name, 0)) for name, spec in self.variants.items()}
        if self.overlays:
            d["overlays"] = {name: o.to_dict() for name, o in self.overlays.items()}
        d["status"], d["n_frames"] = status, n_frames
        return d

    @classmethod
    def from_dict(cls, d: Any) -> tuple[Manifest, int, str]:
        """Parse and validate root attributes; returns (manifest, committed frame count, status).

        Raises FormatError naming the key and the rule (FormatVersionError for an unsupported
        major version). The checks are hand-written and cover everything the JSON Schema says
        plus the rules a schema cannot express; `check_schema()` runs the schema itself.
        """
        manifest, n_frames, status, _ = cls.parse(d)
        return manifest, n_frames, status

    @classmethod
    def parse(cls, d: Any) -> tuple[Manifest, int, str, dict[str, int]]:
        """`from_dict`, also returning the committed event count of each variant field."""
        version = _check_format(d)
        _check_manifest(d)
        variants, n_events = _check_variants(d["variants"], d["n_frames"]) if "variants" in d else ({}, {})
        overlays = check_overlays(d["overlays"]) if "overlays" in d else {}
        _check_features(d, version, variants, overlays)
        storage, model = d["storage"], d["model"]
        precision = storage["precision"]
        manifest = cls(
            world_ids=tuple(d["world_ids"]),
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
            tracks={n: TrackSpec.parse(t) for n, t in d["tracks"].items()},
            created=d["created"],
            producer=dict(d["producer"]),
            mujoco_version=d["mujoco_version"],
            format_version=version,
            variants=variants,
            overlays=overlays,
        )
        return manifest, d["n_frames"], d["status"], n_events


def read_manifest(root: Any) -> tuple[Manifest, int, str]:
    """Parse a root group's attributes (untrusted) into (manifest, committed frames, status)."""
    return read_commit(root)[:3]


def read_commit(root: Any) -> tuple[Manifest, int, str, dict[str, int]]:
    """Parse a root group's attributes and, where the reader rule says so, its commit document
    (untrusted): (manifest, committed frames, status, committed variant events per field)."""
    return commit_record(parse_root_attributes(root.attrs.asdict()), root.store_path.store)[0]


def parse_root_attributes(attrs: Any) -> tuple[Manifest, int, str, dict[str, int]]:
    """`Manifest.parse` of the root group's attributes (untrusted)."""
    if type(attrs) is not dict or ROOT_ATTR not in attrs:
        raise FormatError("this Zarr group is not an mjarchive archive (no 'mjarchive' root attribute)")
    return Manifest.parse(attrs[ROOT_ATTR])


def uses_commit_document(manifest: Manifest) -> bool:
    """Format 1.1 and later commit live frames in the commit document; 1.0 in the root attributes."""
    return version_at_least(manifest.format_version, (1, 1))


def commit_record(parsed: tuple[Manifest, int, str, dict[str, int]], store: Any) -> tuple[tuple, str]:
    """The reader rule: `parsed` (the root attributes' manifest, n_frames, status, n_events) is the
    commit record of a finalized root or a 1.0 archive; a live 1.1 root's counts are overridden by
    the commit document when there is one. Returns the record and where it came from."""
    if parsed[2] != "live" or not uses_commit_document(parsed[0]):
        return parsed, "root attributes"
    buf = store.read_now(COMMIT_KEY)
    if buf is None:
        return parsed, "root attributes (no commit document)"
    return _apply_commit_document(parsed, buf.to_bytes()), "commit document"


def _apply_commit_document(parsed: tuple[Manifest, int, str, dict[str, int]],
                           data: bytes) -> tuple[Manifest, int, str, dict[str, int]]:
    """`parsed` with the counts of the commit document `data` (the bytes of `_commit/zarr.json`),
    once checked against it."""
    manifest, root_frames, status, root_events = parsed
    if len(data) > MAX_COMMIT_BYTES:
        _commit_fail("(document)", f"is {len(data)} bytes, above the limit of {MAX_COMMIT_BYTES}")
    try:
        doc = parse_json_bytes(data, f"the commit document {COMMIT_KEY!r}")
    except FormatError:
        raise
    except (ValueError, RecursionError) as exc:
        _commit_fail("(document)", f"is not JSON ({exc.__class__.__name__})")
    if type(doc) is not dict or doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        _commit_fail("(document)", "must be a Zarr v3 group document")
    attrs = doc.get("attributes")
    if type(attrs) is not dict or COMMIT_ATTR not in attrs:
        _commit_fail("attributes", f"must hold the key {COMMIT_ATTR!r}")
    record = attrs[COMMIT_ATTR]
    if type(record) is not dict or set(record) != {"n_frames", "n_events"}:
        _commit_fail(COMMIT_ATTR, "must be an object of exactly 'n_frames' and 'n_events'")
    n_frames = record["n_frames"]
    if type(n_frames) is not int or not root_frames <= n_frames <= MAX_FRAMES:
        _commit_fail(f"{COMMIT_ATTR}.n_frames", f"must be an integer in [{root_frames} (the root's n_frames), "
                                                f"{MAX_FRAMES}], found {n_frames!r:.80}")
    events = record["n_events"]
    if type(events) is not dict or set(events) != set(manifest.variants):
        _commit_fail(f"{COMMIT_ATTR}.n_events", f"must be an object whose keys are exactly the variant fields "
                                                f"{sorted(manifest.variants)}")
    for name, n in events.items():
        lo = root_events.get(name, 0)
        if type(n) is not int or not lo <= n <= MAX_VARIANT_EVENTS:
            _commit_fail(f"{COMMIT_ATTR}.n_events.{name}", f"must be an integer in [{lo} (the root's n_events), "
                                                           f"{MAX_VARIANT_EVENTS}], found {n!r:.80}")
        if n and not n_frames:
            _commit_fail(f"{COMMIT_ATTR}.n_events.{name}", "must be 0 while no frame is committed")
    return manifest, n_frames, status, dict(events)


def commit_document(n_frames: int, n_events: dict[str, int]) -> bytes:
    """The bytes of `_commit/zarr.json` for these counts (compact: tens of bytes per variant field)."""
    record = {"n_frames": n_frames, "n_events": dict(n_events)}
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {COMMIT_ATTR: record}},
                      separators=(",", ":")).encode()


def _commit_fail(where: str, problem: str) -> NoReturn:
    raise FormatError(f"invalid commit document {COMMIT_KEY!r} at {where}: {problem}; the archive's commit record "
                      "is corrupt (see spec/README.md, Commit protocol)")


# -- validation of untrusted root attributes (spec/README.md, "Root attributes") ---------------------
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PRODUCER_KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: No name or informational string may contain these: C0 and C1 controls and DEL, the line and
#: paragraph separators, bidirectional embedding/override/isolate controls, lone surrogates.
_UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_JOINT_SIZES = {"free": (7, 6), "ball": (4, 3), "slide": (1, 1), "hinge": (1, 1)}  # (qpos, dof)
_ABS_ERRORS = frozenset(2.0**k for k in ABS_ERROR_EXPONENTS)
_ROOT_KEYS = ("format", "format_version", "created", "producer", "mujoco_version", "timestep", "output_fps",
              "playback_speed", "world_ids", "cameras", "model", "storage", "tracks", "status", "n_frames")
_LAYOUT_KEYS = ("nq", "nv", "nmocap", "joints", "mocap_bodies", "cameras")
_STORAGE_KEYS = ("dtype", "precision", "chunk_frames", "chunk_worlds", "shard_worlds")
_MAX_PRODUCER_KEYS = 64


def _fail(where: str, problem: str) -> NoReturn:
    raise FormatError(f"invalid archive metadata at {where}: {problem}; this is not a valid mjarchive 1.x "
                      "archive (see spec/README.md, Root attributes)")


def _obj(value: Any, where: str, keys: tuple[str, ...], *, closed: bool = True) -> dict:
    if type(value) is not dict:
        _fail(where, f"expected an object, found {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    if missing:
        _fail(where, f"missing required key(s) {missing}")
    if closed and len(value) != len(keys):
        _fail(where, f"unknown key(s) {sorted(set(value) - set(keys))[:5]} (this object is closed in format 1.x)")
    return value


def _list(value: Any, where: str, hi: int, *, lo: int = 0) -> list:
    if type(value) is not list:
        _fail(where, f"expected an array, found {type(value).__name__}")
    if not lo <= len(value) <= hi:
        _fail(where, f"has {len(value)} items; between {lo} and {hi} are allowed")
    return value


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    # type() rather than isinstance(): JSON true is not 1, and 5.0 is not an integer.
    if type(value) is not int or not lo <= value <= hi:
        _fail(where, f"must be an integer (no fraction or exponent) in [{lo}, {hi}], found {value!r}")
    return value


def _number(value: Any, where: str, lo: float, hi: float) -> float:
    if type(value) not in (int, float) or not lo <= value <= hi:  # also refuses NaN
        _fail(where, f"must be a finite number in [{lo:g}, {hi:g}], found {value!r}")
    return value


def _string(value: Any, where: str, max_chars: int) -> str:
    if type(value) is not str or len(value) > max_chars or _UNSAFE_CHARS.search(value):
        _fail(where, f"must be a string of at most {max_chars} characters without control characters, "
                     f"found {value!r:.80}")
    return value


def _names(values: list, where: str) -> None:
    """Joint, mocap body or camera names: bounded, no control characters; non-empty ones distinct."""
    for i, name in enumerate(values):
        _string(name, f"{where}[{i}]", MAX_NAME_CHARS)
    named = [n for n in values if n]
    if len(set(named)) != len(named):
        _fail(where, "repeats a name (MuJoCo names are unique per kind; only unnamed entries \"\" may repeat)")


def _check_format(d: Any) -> str:
    """Check `format` and `format_version`, first of all; returns the version."""
    if type(d) is not dict or d.get("format") != FORMAT_NAME:
        raise FormatError("this Zarr group is not an mjarchive archive (no 'mjarchive' root attribute)")
    version = d.get("format_version")
    if type(version) is not str or not VERSION_RE.fullmatch(version):
        _fail("format_version", "must be MAJOR.MINOR, 1-4 ASCII digits each without leading zeros ('1.1', not '1.01') "
                             f"and nothing else, found {version!r:.40}")
    major = int(version.split(".")[0])
    if major > FORMAT_MAJOR:
        raise FormatVersionError(
            f"archive format {version} is newer than this mjarchive supports ({FORMAT_VERSION}); "
            "upgrade mjarchive (pip install -U mjarchive)"
        )
    if major < FORMAT_MAJOR:
        raise FormatVersionError(f"archive format {version} predates format 1.0 and cannot be read")
    if "required_features" in d:  # before anything else: an unknown feature changes what the rest means
        features = d["required_features"]
        if type(features) is not list or len(features) > 64 or not all(type(f) is str for f in features) or len(
                set(features)) != len(features):
            _fail("required_features", "must be a list of at most 64 distinct strings")
        unknown = [f for f in features if f not in KNOWN_FEATURES]
        if unknown:
            raise FormatVersionError(
                f"this archive requires feature(s) {[f[:64] for f in unknown[:5]]} that this mjarchive (format "
                f"{FORMAT_VERSION}: {sorted(KNOWN_FEATURES)}) does not implement; upgrade mjarchive "
                "(pip install -U mjarchive) to read it")
    return version


def _check_manifest(d: dict) -> None:
    """Every rule of the root attributes after the version, cheapest and size-bounding checks first."""
    _obj(d, "(root)", _ROOT_KEYS, closed=False)
    # Lengths first, so that a hostile list of millions of items is refused before anything walks it.
    world_ids = _list(d["world_ids"], "world_ids", MAX_WORLDS, lo=1)
    model = _obj(d["model"], "model", ("sha256", "layout"))
    layout = _obj(model["layout"], "model.layout", _LAYOUT_KEYS)
    joints = _list(layout["joints"], "model.layout.joints", MAX_JOINTS)
    mocap = _list(layout["mocap_bodies"], "model.layout.mocap_bodies", MAX_MOCAP)
    cameras = _list(layout["cameras"], "model.layout.cameras", MAX_CAMERAS)
    _list(d["cameras"], "cameras", MAX_CAMERAS)
    producer = d["producer"]
    _obj(producer, "producer", ("name", "version", "backend"), closed=False)
    if len(producer) > _MAX_PRODUCER_KEYS:
        _fail("producer", f"has {len(producer)} keys (at most {_MAX_PRODUCER_KEYS})")
    tracks = d["tracks"]
    if type(tracks) is not dict or len(tracks) > MAX_TRACKS:
        _fail("tracks", f"must be an object of at most {MAX_TRACKS} tracks")
    storage = _obj(d["storage"], "storage", _STORAGE_KEYS)

    # Scalars.
    _string(d["created"], "created", 64)
    _string(d["mujoco_version"], "mujoco_version", 64)
    for key, value in producer.items():
        if key in ("name", "version", "backend"):
            _string(value, f"producer.{key}", 256)
        elif type(key) is not str or not _PRODUCER_KEY_RE.fullmatch(key):
            _fail("producer", f"key {key!r:.80} is not 1-64 characters of letters, digits, '_', '.', '-'")
        else:
            _string(value, f"producer.{key}", 4096)
    _number(d["timestep"], "timestep", MIN_TIMESTEP, MAX_RATE)
    if d["output_fps"] is not None:
        _number(d["output_fps"], "output_fps", MIN_RATE, MAX_RATE)
    _number(d["playback_speed"], "playback_speed", MIN_RATE, MAX_RATE)
    status = d["status"]
    if type(status) is not str or status not in ("live", "finalized"):
        _fail("status", f"must be \"live\" or \"finalized\", found {status!r:.80}")
    _int(d["n_frames"], "n_frames", 0, MAX_FRAMES)

    # World IDs: int64, non-negative (as writers require), distinct.
    if not all(type(w) is int for w in world_ids):
        bad = next(w for w in world_ids if type(w) is not int)
        _fail("world_ids", f"must hold integers (no fraction or exponent), found {bad!r:.80}")
    if min(world_ids) < 0 or max(world_ids) > MAX_WORLD_ID:
        _fail("world_ids", f"must lie in [0, 2**63 - 1], found {min(world_ids)} .. {max(world_ids)}")
    if len(set(world_ids)) != len(world_ids):
        _fail("world_ids", "contains duplicates")

    # The model: hash, layout sizes, then each joint; the layout must be internally consistent.
    if type(model["sha256"]) is not str or not _SHA256_RE.fullmatch(model["sha256"]):
        _fail("model.sha256", "must be 64 lowercase hexadecimal digits")
    nq = _int(layout["nq"], "model.layout.nq", 0, MAX_NQ)
    nv = _int(layout["nv"], "model.layout.nv", 0, MAX_NQ)
    nmocap = _int(layout["nmocap"], "model.layout.nmocap", 0, MAX_MOCAP)
    if len(mocap) != nmocap:
        _fail("model.layout.mocap_bodies", f"has {len(mocap)} names but nmocap = {nmocap}")
    adr = dofs = 0
    for i, joint in enumerate(joints):
        where = f"model.layout.joints[{i}]"
        if type(joint) is not list or len(joint) != 3:
            _fail(where, "must be [name, type, qpos address]")
        kind = joint[1]
        if type(kind) is not str or kind not in _JOINT_SIZES:
            _fail(where, f"joint type must be one of {sorted(_JOINT_SIZES)}, found {kind!r:.40}")
        if _int(joint[2], where + "[2]", 0, MAX_NQ) != adr:
            _fail(where, f"qpos address {joint[2]} is not {adr}: joints occupy qpos contiguously in model order")
        adr, dofs = adr + _JOINT_SIZES[kind][0], dofs + _JOINT_SIZES[kind][1]
    if (adr, dofs) != (nq, nv):
        _fail("model.layout", f"joints occupy nq = {adr} and nv = {dofs}, but the layout says nq = {nq}, nv = {nv}")
    _names([j[0] for j in joints], "model.layout.joints (names)")
    _names(mocap, "model.layout.mocap_bodies")
    _names(cameras, "model.layout.cameras")
    if d["cameras"] != cameras:
        _fail("cameras", "must equal model.layout.cameras")

    # Storage.
    if type(storage["dtype"]) is not str or storage["dtype"] not in STORAGE_DTYPES:
        _fail("storage.dtype", f"must be one of {sorted(STORAGE_DTYPES)}, found {storage['dtype']!r:.40}")
    precision = storage["precision"]
    if precision is not None:
        _obj(precision, "storage.precision", ("mode", "abs_error"))
        if precision["mode"] != "quantize":
            _fail("storage.precision.mode", f"must be \"quantize\", found {precision['mode']!r:.40}")
        e = precision["abs_error"]
        if type(e) not in (int, float) or e not in _ABS_ERRORS:
            _fail("storage.precision.abs_error", f"must be a power of two 2**k, k in [{ABS_ERROR_EXPONENTS.start}, "
                                                 f"{ABS_ERROR_EXPONENTS.stop - 1}] (as writers produce it), found {e!r}")
    _int(storage["chunk_frames"], "storage.chunk_frames", 1, MAX_CHUNK_FRAMES)
    _int(storage["chunk_worlds"], "storage.chunk_worlds", 1, 1)
    _int(storage["shard_worlds"], "storage.shard_worlds", 1, len(world_ids))

    # Tracks: names are store keys (a 1.0 archive may name a track like a 1.1 feature it does not use).
    reserved = RESERVED_ARRAYS | {g for g in FEATURE_GROUPS if g in d}
    if version_at_least(d["format_version"], (1, 3)):
        reserved |= {RESET_COUNT}  # the episode index (a 1.2 archive may have a track named so)
    for name, entry in tracks.items():
        check_track_name(name, reserved)
        entry = _obj(entry, f"tracks.{name}", ("shape", "dtype"))
        shape = _list(entry["shape"], f"tracks.{name}.shape", 4)
        for i, n in enumerate(shape):
            _int(n, f"tracks.{name}.shape[{i}]", 1, MAX_TRACK_ELEMENTS)
        if math.prod(shape) > MAX_TRACK_ELEMENTS:
            _fail(f"tracks.{name}.shape", f"has {math.prod(shape)} elements (at most {MAX_TRACK_ELEMENTS})")
        if type(entry["dtype"]) is not str or entry["dtype"] not in TRACK_DTYPES:
            _fail(f"tracks.{name}.dtype", f"must be one of {sorted(TRACK_DTYPES)}, found {entry['dtype']!r:.40}")


def _check_features(d: dict, version: str, variants: dict, overlays: dict) -> None:
    """`required_features` lists exactly the 1.1 features the archive uses (checked for unknown ones
    before anything else, in `_check_format`)."""
    declared = d.get("required_features", [])
    used = sorted(({"variants"} if variants else set()) | ({"overlays"} if overlays else set()))
    if sorted(declared) != used:
        _fail("required_features", f"lists {sorted(declared)}, but the archive uses {used}: each of 'variants' and "
                                   "'overlays' is listed exactly when that key is present")
    if used and tuple(int(p) for p in version.split(".")) < (1, 1):
        _fail("format_version", f"is {version}, but variants and overlays need format 1.1 or later")


def _check_variants(value: Any, n_frames: int) -> tuple[dict[str, VariantSpec], dict[str, int]]:
    if type(value) is not dict or not 1 <= len(value) <= len(VARIANT_FIELDS):
        _fail("variants", f"must be an object of 1 to {len(VARIANT_FIELDS)} allowed fields")
    specs, counts = {}, {}
    for name, entry in value.items():
        try:
            rule = check_field_name(name)
        except FormatError as exc:
            _fail("variants", str(exc))
        where = f"variants.{name}"
        entry = _obj(entry, where, ("shape", "dtype", "chunk_events", "n_events"))
        shape = _list(entry["shape"], f"{where}.shape", 1 + len(rule.tail), lo=1 + len(rule.tail))
        _int(shape[0], f"{where}.shape[0]", 1, MAX_FIELD_COUNT)
        for i, n in enumerate(shape[1:]):
            _int(n, f"{where}.shape[{i + 1}]", rule.tail[i], rule.tail[i])
        if entry["dtype"] != rule.dtype:
            _fail(f"{where}.dtype", f"must be {rule.dtype!r} (MuJoCo's type of {name}), found {entry['dtype']!r:.40}")
        spec = VariantSpec(tuple(shape), rule.dtype, _int(entry["chunk_events"], f"{where}.chunk_events", 1, 1 << 16))
        if spec.chunk_events * spec.row_bytes > MAX_DECODED_CHUNK_BYTES:
            _fail(f"{where}.chunk_events", f"makes chunks of {spec.chunk_events * spec.row_bytes} bytes, above the "
                                           f"{MAX_DECODED_CHUNK_BYTES}-byte chunk limit")
        counts[name] = _int(entry["n_events"], f"{where}.n_events", 0, MAX_VARIANT_EVENTS)
        if counts[name] and not n_frames:
            _fail(f"{where}.n_events", "must be 0 while no frame is committed (events start at committed frames)")
        specs[name] = spec
    return specs, counts


# -- the JSON Schema (spec/root-attributes.schema.json) ------------------------------------------------
_SCHEMA: dict | None = None
_VALIDATOR = None


def root_schema() -> dict:
    """The JSON Schema of the root attribute `mjarchive` (spec/root-attributes.schema.json)."""
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads(resources.files(__package__).joinpath("root-attributes.schema.json").read_text())
    return _SCHEMA


def check_schema(d: Any) -> None:
    """Validate root attributes against the JSON Schema alone; raises FormatError explaining the failure.

    `Manifest.from_dict` does not call this: its hand-written checks enforce everything the schema
    does (and what a schema cannot: integers written as 5.0, powers of two, ...) at a fraction of
    the cost. Use this to explain a document with a generic tool's eyes, and in conformance tests.
    """
    import jsonschema

    if type(d) is dict and type(d.get("world_ids")) is list and len(d["world_ids"]) > MAX_WORLDS:
        raise FormatError(f"archive declares {len(d['world_ids'])} worlds (limit {MAX_WORLDS})")  # before walking it
    global _VALIDATOR
    if _VALIDATOR is None:  # jsonschema.validate() re-checks the schema itself on every call (~0.1 s)
        _VALIDATOR = jsonschema.validators.validator_for(root_schema())(root_schema())
    exc = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(d))
    if exc is not None:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise FormatError(f"archive metadata fails the mjarchive schema at {where}: {exc.message}") from None
