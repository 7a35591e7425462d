"""Multi-part archives (format 1.2, feature "parts"): the rules both the writers and the reader of
one apply. Many writers, one archive: each writer owns one part, `parts/<name>/`, laid out exactly as a
single archive's root without its model; the root holds the shared model bundle and a root document
that names what every part must share (spec/README.md, "Parts")."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import threading
from importlib import resources
from typing import Any

import zarr.storage
from zarr.core.sync import sync

from .._errors import FormatError, MjArchiveError
from .bundle.model_bundle import QposLayout
from .format import FORMAT_NAME, MAX_WORLDS, ROOT_ATTR
from .manifest import Manifest, _check_format, _check_manifest, _fail, _obj
from .storage.checked import CheckedStore
from .storage.local import SafeLocalStore, key_parts, walk_dir
from .storage.prefixed import unprefixed
from .storage.shared import is_s3

__all__ = ["MAX_LISTED", "MAX_PARTS", "MAX_PART_DOCUMENT_BYTES", "PARTS_FEATURE", "PARTS_GROUP", "PART_NAME_RE",
           "PartsBudget", "PartsRoot", "any_part_folder", "check_part_name", "check_parts_schema",
           "in_part", "is_parts_root", "list_parts", "part_differences", "part_document", "part_prefix"]

PARTS_FEATURE = "parts"
PARTS_GROUP = "parts"
MAX_PARTS = 4096
MAX_LISTED = 2 * MAX_PARTS  # entries of any kind a reader looks at in parts/
MAX_PART_DOCUMENT_BYTES = 256 * 2**20  # the parts' documents together (each is bounded on its own)
PART_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Keys of a part's own document: a root that carries one would say two things about the same worlds.
_PER_PART_KEYS = ("world_ids", "storage", "tracks", "status", "n_frames", "variants", "overlays")
_ROOT_KEYS = ("format", "format_version", "required_features", "created", "producer", "mujoco_version",
              "timestep", "output_fps", "playback_speed", "cameras", "model", "parts")


class PartsBudget:
    """What opening all parts may cost at most: their documents' bytes (each is bounded on its own,
    4096 of them would not be) and the worlds of their union (as many as one archive may hold)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = self._worlds = 0

    def document(self, name: str, n: int) -> None:
        with self._lock:
            self._bytes += n
            if self._bytes > MAX_PART_DOCUMENT_BYTES:
                raise FormatError(f"the parts' documents hold more than {MAX_PART_DOCUMENT_BYTES} bytes together "
                                  f"(at part {name!r}); a reader opens no more: move parts into separate archives")

    def worlds(self, name: str, n: int) -> None:
        with self._lock:
            self._worlds += n
            if self._worlds > MAX_WORLDS:
                raise FormatError(f"the parts hold more than {MAX_WORLDS} worlds together (at part {name!r}), more "
                                  "than one archive may hold")


def part_document(store: CheckedStore, name: str, budget: PartsBudget) -> tuple[CheckedStore, bytes, dict] | None:
    """Part `name`'s own store and its group document (bytes, parsed) once that carries `mjarchive`
    attributes; None while the part has no such document yet (its writer is creating it)."""
    sub = store.sub(part_prefix(name))
    try:
        found = sub.read_json_now("zarr.json", lambda n: budget.document(name, n))
    except (FileNotFoundError, NotADirectoryError):
        found = None
    if found is None:
        return None
    raw, doc = found
    attrs = doc.get("attributes", {})
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "group" or not isinstance(attrs, dict):
        raise FormatError("its zarr.json is not a Zarr v3 group document")
    if ROOT_ATTR not in attrs:
        return None
    if is_parts_root(attrs):
        raise FormatError("it is itself a multi-part archive; parts do not nest")
    return sub, raw, doc


def in_part(exc: MjArchiveError, name: str) -> MjArchiveError:
    """`exc` (raised reading part `name`) with a message that names the part."""
    prefix = f"part {name!r} ({part_prefix(name)}): "
    return exc if str(exc).startswith(prefix) else type(exc)(prefix + str(exc))


def check_part_name(name: Any) -> str:
    """A writer's part name, refused (never rewritten) unless it is a valid part name."""
    if not isinstance(name, str) or not PART_NAME_RE.fullmatch(name):
        example = re.sub(r"[^a-z0-9_-]", "-", name.lower()).strip("-_")[:64] if isinstance(name, str) else ""
        hint = f"; for example {example!r}" if example else ""
        raise MjArchiveError(f"part name {name!r:.80} is not 1-64 lowercase ASCII letters, digits, '_' and '-' "
                             f"starting with a letter or digit{hint}")
    return name


def part_prefix(name: str) -> str:
    return f"{PARTS_GROUP}/{name}/"


def is_parts_root(attrs: Any) -> bool:
    """Whether root attributes describe a multi-part archive (format and version checked first: an
    unknown feature or a newer major version is refused here, before anything else is read)."""
    d = attrs.get(ROOT_ATTR) if type(attrs) is dict else None
    if type(d) is not dict or d.get("format") != FORMAT_NAME:
        return False
    _check_format(d)
    features = d.get("required_features")
    return type(features) is list and PARTS_FEATURE in features


@dataclasses.dataclass(frozen=True)
class PartsRoot:
    """The root document of a multi-part archive: what every part shares."""

    format_version: str
    model_sha256: str
    layout: QposLayout
    timestep: float
    output_fps: float | None
    playback_speed: float
    created_by: str
    doc: dict

    @classmethod
    def parse(cls, d: Any) -> PartsRoot:
        """Validate the root attribute `mjarchive` of a multi-part archive (untrusted)."""
        version = _check_format(d)
        if d.get("required_features") != [PARTS_FEATURE]:
            _fail("required_features", f"of a multi-part root must be exactly [{PARTS_FEATURE!r}] (each part lists "
                                       "its own features)")
        if tuple(int(p) for p in version.split(".")) < (1, 2):
            _fail("format_version", f"is {version}, but parts need format 1.2 or later")
        stray = [k for k in _PER_PART_KEYS if k in d]
        if stray:
            _fail("(root)", f"of a multi-part archive must not hold {stray}: each part's document says that "
                            "for its own worlds")
        _obj(d, "(root)", _ROOT_KEYS, closed=False)
        parts = _obj(d["parts"], "parts", ("created_by",))
        if type(parts["created_by"]) is not str or not PART_NAME_RE.fullmatch(parts["created_by"]):
            _fail("parts.created_by", "must be a part name (1-64 lowercase ASCII letters, digits, '_', '-')")
        # The shared keys follow the rules of a single archive's root: checked as one with placeholders.
        _check_manifest({**d, "world_ids": [0], "tracks": {}, "status": "live", "n_frames": 0,
                         "storage": {"dtype": "float32", "precision": None, "chunk_frames": 1, "chunk_worlds": 1,
                                     "shard_worlds": 1}})
        return cls(version, d["model"]["sha256"], QposLayout.from_dict(d["model"]["layout"]), float(d["timestep"]),
                   None if d["output_fps"] is None else float(d["output_fps"]), float(d["playback_speed"]),
                   parts["created_by"], d)

    @staticmethod
    def document(manifest: Manifest, created_by: str) -> dict:
        """The root attribute `mjarchive` a writer of part `created_by` creates the archive with."""
        single = manifest.to_dict(0, "live")
        d = {k: single[k] for k in _ROOT_KEYS if k in single}
        d["required_features"] = [PARTS_FEATURE]
        d["parts"] = {"created_by": created_by}
        return d

    def differences(self, manifest: Manifest) -> list[str]:
        """What a part's manifest says otherwise than this root (empty: it may join)."""
        out = []
        if manifest.model_sha256 != self.model_sha256:
            out.append(f"model bundle {manifest.model_sha256[:12]}… vs {self.model_sha256[:12]}…")
        elif manifest.layout != self.layout:
            out.append("qpos layout")
        for what, mine, theirs in (("timestep", manifest.timestep, self.timestep),
                                   ("output_fps", manifest.output_fps, self.output_fps),
                                   ("playback_speed", manifest.playback_speed, self.playback_speed)):
            if mine != theirs:
                out.append(f"{what} {mine} vs {theirs}")
        return out

    def check_part(self, name: str, manifest: Manifest) -> None:
        """Refuse part `name` unless its manifest agrees with this root (FormatError naming both)."""
        diff = self.differences(manifest)
        if diff:
            raise FormatError(f"part {name!r} differs from the archive created by part {self.created_by!r}: "
                              f"{'; '.join(diff)}; every part must record the same model at the same cadence")


def part_differences(a: Manifest, b: Manifest) -> list[str]:
    """How two parts' recordings differ in what a reader of their union needs equal (empty: none)."""
    out = []
    if (a.dtype, a.abs_error) != (b.dtype, b.abs_error):
        out.append(f"storage dtype/precision {a.dtype}/{a.abs_error} vs {b.dtype}/{b.abs_error}")
    if a.chunk_frames != b.chunk_frames:
        out.append(f"chunk_frames {a.chunk_frames} vs {b.chunk_frames}")
    if a.tracks != b.tracks:
        out.append(f"tracks {sorted(a.tracks)} vs {sorted(b.tracks)}")
    if {k: (v.shape, v.dtype) for k, v in a.variants.items()} != {k: (v.shape, v.dtype) for k, v in b.variants.items()}:
        out.append(f"variant fields {sorted(a.variants)} vs {sorted(b.variants)}")
    if a.overlays != b.overlays:
        out.append(f"overlays {sorted(a.overlays)} vs {sorted(b.overlays)}")
    return out


def list_parts(store: CheckedStore) -> list[str]:
    """Names of the folders in `parts/`, sorted: the one listing a reader makes, bounded (MAX_PARTS
    folders, MAX_LISTED entries of any kind). Every folder must be named like a part; plain objects
    there (the group's document, a writer's temporary files, anything else) are ignored."""
    plain, prefix = unprefixed(store)
    names: list[str] = []
    for seen, (name, folder) in enumerate(_children(plain, prefix + PARTS_GROUP, store)):
        if seen >= MAX_LISTED:
            raise FormatError(f"{PARTS_GROUP}/ holds more than {MAX_LISTED} entries; a multi-part archive has at most "
                              f"{MAX_PARTS} parts: move parts into separate archives, or remove what else is there")
        if not folder:
            continue
        if not PART_NAME_RE.fullmatch(name):
            raise FormatError(f"{PARTS_GROUP}/ holds the folder {ascii(name[:80])}, which is not a part name (1-64 "
                              "lowercase ASCII letters, digits, '_', '-'); the archive is damaged or was written by "
                              "other software")
        names.append(name)
        if len(names) > MAX_PARTS:
            raise FormatError(f"{PARTS_GROUP}/ holds more than {MAX_PARTS} parts, the most a reader opens; move parts "
                              "into separate archives (each folder parts/<name>/ with a copy of the root's zarr.json "
                              "and model/ is one), then compact those")
    return sorted(names)


def any_part_folder(store: CheckedStore) -> bool:
    """Whether `parts/` holds any folder (a part, or one being created), whatever its name."""
    plain, prefix = unprefixed(store)
    try:
        return any(folder for _, folder in _children(plain, prefix + PARTS_GROUP, store))
    except FormatError:
        return True  # a link or device there: not ours to delete either


def _children(plain: Any, folder: str, store: CheckedStore) -> Any:
    """(name, is a folder) of each entry directly in `folder` of a store, lazily (so a hostile listing
    stops at the bound)."""
    if isinstance(plain, SafeLocalStore):
        try:
            fd = walk_dir(plain.root, key_parts(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # gone since listed: a writer's temporary file, renamed into place
                    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                        raise FormatError(f"{folder}/{ascii(entry.name[:80])[1:-1]} is a link, FIFO or device; "
                                          "mjarchive reads archives made of plain files only")
                    yield entry.name, stat.S_ISDIR(st.st_mode)
        finally:
            os.close(fd)
        return
    if isinstance(plain, zarr.storage.FsspecStore) and is_s3(plain):
        yield from _s3_children(plain, folder, store)
        return

    async def collect() -> list[tuple[str, bool]]:  # memory and other stores: a name is a folder if no object
        out = []
        async for name in store._listing(folder, plain.list_dir(folder)):
            name = name.rstrip("/")
            # A folder has keys below it (an object of the same name must not hide it).
            out.append((name, not await plain.is_empty(f"{folder}/{name}/")))
            if len(out) > MAX_LISTED:
                break
        return out

    yield from sync(collect())


def _s3_children(plain: Any, folder: str, store: CheckedStore) -> Any:
    """One level of an S3 prefix, a page (1000 names) at a time, each page bounded in time: common
    prefixes are the folders."""
    bucket, key = plain.fs.split_path(f"{plain.path.rstrip('/')}/{folder}/")[:2]
    token = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": key, "Delimiter": "/", "MaxKeys": 1000}
        if token:
            kwargs["ContinuationToken"] = token
        page = sync(store._io("listing", folder, plain.fs._call_s3("list_objects_v2", **kwargs)))
        for entry in page.get("CommonPrefixes", []):
            yield entry["Prefix"][len(key):].rstrip("/"), True
        for entry in page.get("Contents", []):
            yield entry["Key"][len(key):], False
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return


def check_parts_schema(d: Any) -> None:
    """Validate a multi-part root's `mjarchive` attribute against spec/parts-root-attributes.schema.json
    alone (for `verify()`: `PartsRoot.parse` checks all of it by hand); FormatError explains a failure."""
    import jsonschema

    schema = json.loads(resources.files(__package__).joinpath("parts-root-attributes.schema.json").read_text())
    exc = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(d))
    if exc is not None:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise FormatError(f"the parts root fails the mjarchive parts schema at {where}: {exc.message}")
