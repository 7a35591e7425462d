"""A writer joining a multi-part archive (spec/README.md, "Parts"): the root document and the model
bundle are created once, by whichever writer comes first, with create-if-absent writes; every writer
then checks the root against its own recording and writes only inside its own part's folder."""

from __future__ import annotations

import json
from typing import Any

import zarr
import zarr.storage
from zarr.core.sync import sync

from .._errors import ArchiveExistsError, FormatError, MjArchiveError
from .bundle.model_bundle import ModelBundle
from .format import BUNDLE_GROUP, ROOT_ATTR, version_at_least
from .manifest import Manifest, commit_record, parse_root_attributes
from .parts import (PARTS_GROUP, PartsBudget, PartsRoot, any_part_folder, check_part_name, in_part, part_differences,
                    is_parts_root, list_parts, part_document)
from .storage.checked import CheckedStore
from .storage.shared import create_if_absent

__all__ = ["join_parts_root", "open_parts_root", "read_part"]

_GROUP_DOC = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


def _describe(location: Any) -> str:
    return repr(location if isinstance(location, str) else str(location))


def _root_document(store: CheckedStore) -> dict | None:
    try:
        found = store.read_json_now("zarr.json")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        raise FormatError("the archive's zarr.json is a folder; the location holds no archive") from None
    return None if found is None else found[1]


def open_parts_root(location: Any, store: CheckedStore) -> PartsRoot:
    """The root of the multi-part archive at `location` (ArchiveExistsError for a single archive)."""
    doc = _root_document(store)
    if doc is None:
        raise MjArchiveError(f"no archive at {_describe(location)} (no zarr.json there); create a part with "
                             "mjarchive.create(location, model, part=..., world_ids=...)")
    attrs = doc.get("attributes")
    if doc.get("node_type") != "group" or not is_parts_root(attrs):
        raise ArchiveExistsError(
            f"{_describe(location)} holds a single-part archive; parts join only a multi-part archive: record the "
            "parts into a new location (mjarchive compact merges archives into one)")
    return PartsRoot.parse(attrs[ROOT_ATTR])


def join_parts_root(location: Any, store: CheckedStore, bundle: ModelBundle, manifest: Manifest,
                    part: str) -> PartsRoot:
    """Create the multi-part archive at `location` unless it exists (first writer wins), check that part
    `part` may join it, and make sure its model bundle is there; writes nothing anyone else wrote."""
    check_part_name(part)
    if _root_document(store) is None:
        doc = {"zarr_format": 3, "node_type": "group",
               "attributes": {ROOT_ATTR: PartsRoot.document(manifest, created_by=part)}}
        # (a writer's temporary file: another writer creating the root this very moment)
        leftovers = [n for n in _names(store) if n not in ("zarr.json", BUNDLE_GROUP, PARTS_GROUP)
                     and not n.endswith(".partial")]
        if leftovers and _root_document(store) is None:
            raise ArchiveExistsError(f"{_describe(location)} holds other data ({sorted(leftovers)[:5]}) but no "
                                     "archive; choose an empty location")
        create_if_absent(store, "zarr.json", json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())
    root = open_parts_root(location, store)
    diff = root.differences(manifest)
    if manifest.cameras != tuple(root.doc.get("cameras", ())):
        diff.append("cameras")
    if diff:
        raise FormatError(f"part {part!r} cannot join {_describe(location)}, created by part {root.created_by!r}: "
                          f"{'; '.join(diff)}; every part must record the same model at the same cadence")
    _write_bundle_once(store, bundle)
    create_if_absent(store, f"{PARTS_GROUP}/zarr.json", _GROUP_DOC)
    return root


def refuse_replacing_parts(location: Any, store: CheckedStore) -> None:
    """A single archive's overwrite=True must not delete a multi-part archive: its parts' writers hold
    leases of their own, which the single writer's lease does not cover."""
    store = store.fresh()
    try:
        doc = _root_document(store)
        parted = doc is not None and is_parts_root(doc.get("attributes"))
    except MjArchiveError:
        parted = False
    # Whatever the root says (damaged, or of a newer version): folders in parts/ may have writers.
    if parted or any_part_folder(store):
        raise ArchiveExistsError(
            f"{_describe(location)} holds a multi-part archive, whose parts may still be written by their own "
            "writers: overwrite=True does not replace it; choose another location, or delete it once no writer "
            "records into it")


def check_joining(location: Any, store: CheckedStore, part: str, manifest: Manifest) -> None:
    """Refuse early what readers would refuse: a part that records otherwise than the parts already
    there, or claims one of their worlds (best effort: parts created at the same moment are caught by
    readers, which check every part)."""
    mine = set(manifest.world_ids)
    budget = PartsBudget()  # what readers would refuse to open, refused here before it is joined
    budget.worlds(part, len(mine))
    for other in list_parts(store):
        if other == part:
            continue
        found = read_part(store, other, budget)
        if found is None:
            continue
        theirs, _ = found
        diff = part_differences(manifest, theirs)
        if diff:
            raise FormatError(f"part {part!r} records otherwise than part {other!r} of {_describe(location)}: "
                              f"{'; '.join(diff)}")
        shared = mine.intersection(theirs.world_ids)
        if shared:
            more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
            raise MjArchiveError(f"part {part!r} claims world {min(shared)}{more} of part "
                                 f"{other!r} of {_describe(location)}; each world belongs to one part: pass "
                                 "world_ids= with the global IDs of this writer's worlds only")


def read_part(store: CheckedStore, name: str, budget: PartsBudget) -> tuple[Manifest, int] | None:
    """(manifest, committed frames) of part `name`, None while it has no document yet."""
    try:
        found = part_document(store, name, budget)
        if found is None:
            return None
        sub, _, doc = found
        (manifest, n_frames, _, _), _ = commit_record(parse_root_attributes(doc["attributes"]), sub)
        if not version_at_least(manifest.format_version, (1, 2)):
            raise FormatError(f"it is format {manifest.format_version}; parts are format 1.2 or later")
        budget.worlds(name, len(manifest.world_ids))
        return manifest, n_frames
    except MjArchiveError as exc:
        raise in_part(exc, name) from exc


def _names(store: CheckedStore) -> list[str]:
    async def collect() -> list[str]:
        out = []
        async for name in store.list_dir(""):
            out.append(name.rstrip("/"))
            if len(out) > 64:
                break
        return out

    try:
        return sync(collect())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _write_bundle_once(store: CheckedStore, bundle: ModelBundle) -> None:
    """Every object of the bundle group, created where absent (its group document last, so that a
    bundle with its document is whole), then read back and checked against its hash."""
    if _bundle_there(store, bundle.sha256):
        return  # (every joining writer after the first: nothing to send)
    staged = zarr.storage.MemoryStore()
    bundle.to_zarr(zarr.open_group(store=staged, mode="w", zarr_format=3))
    objects = {key: value.to_bytes() for key, value in staged._store_dict.items() if key.startswith(BUNDLE_GROUP + "/")}
    last = f"{BUNDLE_GROUP}/zarr.json"
    for key in sorted(objects, key=lambda k: (k == last, k)):
        create_if_absent(store, key, objects[key])
    try:
        found = ModelBundle.from_zarr(_read_only_root(store))
    except MjArchiveError as exc:
        raise FormatError(f"the archive's model bundle is damaged ({exc}); the parts cannot be written") from None
    if found.sha256 != bundle.sha256:
        raise FormatError("the archive's model bundle differs from its root document's model.sha256; it is damaged")


def _read_only_root(store: CheckedStore) -> zarr.Group:
    return zarr.open_group(store=store.with_read_only(True), mode="r", zarr_format=3, use_consolidated=False)


def _bundle_there(store: CheckedStore, sha256: str) -> bool:
    """Whether the archive already holds the whole bundle of hash `sha256` (read and checked)."""
    if store.read_json_now(f"{BUNDLE_GROUP}/zarr.json") is None:
        return False
    try:
        return ModelBundle.from_zarr(_read_only_root(store)).sha256 == sha256
    except MjArchiveError:
        return False  # incomplete (its creator stopped half-way) or damaged: the writes below say which
