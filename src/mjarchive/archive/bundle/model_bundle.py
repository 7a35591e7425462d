"""A self-contained, hashable MuJoCo model: one flattened MJCF XML plus its asset files."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from ..._errors import BundleError, FormatError, LayoutMismatchError, MjArchiveError, UnsafeBundleError
from .xml_checks import DIR_ATTRS, check_bundle_xml
from .compile_child import Refused, check_spec_files
from ..format import BUNDLE_GROUP, as_int, check_array

__all__ = ["ModelBundle", "QposLayout"]

ASSET_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
MAX_ASSETS = 10_000
MAX_ASSET_BYTES = 512 * 2**20
MAX_XML_BYTES = 64 * 2**20
_BUNDLE_ATTR = "mjarchive_bundle"
_HASH_DOMAIN = b"mjarchive-bundle-v1\0"
_JOINT_TYPES = {0: "free", 1: "ball", 2: "slide", 3: "hinge"}


def check_asset_name(name: Any) -> str:
    """An asset name must be a flat, harmless file name (no separators, no '..', no control chars)."""
    if not isinstance(name, str) or not ASSET_NAME_RE.fullmatch(name) or ".." in name:
        raise UnsafeBundleError(
            f"asset name {name!r} is not a flat file name (allowed: letters, digits, '_', '.', '+', "
            "'-'; no path separators, no '..'); the bundle may be hostile"
        )
    return name


@dataclasses.dataclass(frozen=True)
class QposLayout:
    """The qpos layout signature a replay model must match."""

    nq: int
    nv: int
    nmocap: int
    joints: tuple[tuple[str, str, int], ...]  # (name, type, qpos address)
    mocap_bodies: tuple[str, ...]
    cameras: tuple[str, ...]

    @classmethod
    def from_model(cls, model: mujoco.MjModel) -> QposLayout:
        joints = tuple(
            (model.joint(j).name, _JOINT_TYPES[int(model.jnt_type[j])], int(model.jnt_qposadr[j]))
            for j in range(model.njnt)
        )
        mocap = [""] * model.nmocap
        for b in range(model.nbody):
            if model.body_mocapid[b] >= 0:
                mocap[int(model.body_mocapid[b])] = model.body(b).name
        cams = tuple(model.camera(c).name for c in range(model.ncam))
        return cls(int(model.nq), int(model.nv), int(model.nmocap), joints, tuple(mocap), cams)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nq": self.nq,
            "nv": self.nv,
            "nmocap": self.nmocap,
            "joints": [list(j) for j in self.joints],
            "mocap_bodies": list(self.mocap_bodies),
            "cameras": list(self.cameras),
        }

    @classmethod
    def from_dict(cls, d: Any) -> QposLayout:
        try:
            joints = tuple((str(n), str(t), as_int(a, "joint qpos address", hi=1 << 24)) for n, t, a in d["joints"])
            return cls(
                as_int(d["nq"], "nq", hi=1 << 24),
                as_int(d["nv"], "nv", hi=1 << 24),
                as_int(d["nmocap"], "nmocap", hi=1 << 20),
                joints,
                tuple(str(b) for b in d["mocap_bodies"]),
                tuple(str(c) for c in d["cameras"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"malformed qpos layout in archive metadata: {exc!r}") from None

    def check_compatible(self, model: mujoco.MjModel | QposLayout) -> None:
        """Raise LayoutMismatchError naming the first difference between this layout and `model`'s."""
        other = model if isinstance(model, QposLayout) else QposLayout.from_model(model)
        hint = "replay needs the model the archive was recorded with (use archive.model() or its bundle)"
        for i, (mine, theirs) in enumerate(zip(self.joints, other.joints)):
            if mine != theirs:
                raise LayoutMismatchError(
                    f"joint {i} differs: archive has {mine[0]!r} ({mine[1]}, qpos address {mine[2]}), "
                    f"model has {theirs[0]!r} ({theirs[1]}, qpos address {theirs[2]}); {hint}"
                )
        if len(self.joints) != len(other.joints):
            longer = self.joints if len(self.joints) > len(other.joints) else other.joints
            extra = longer[min(len(self.joints), len(other.joints))][0]
            where = "archive" if longer is self.joints else "model"
            raise LayoutMismatchError(
                f"joint count differs ({len(self.joints)} in archive, {len(other.joints)} in model); "
                f"first extra joint {extra!r} is in the {where}; {hint}"
            )
        # Joints first, so an added or renamed joint is named rather than reported as an nq change.
        for field in ("nq", "nv", "nmocap"):
            if getattr(self, field) != getattr(other, field):
                raise LayoutMismatchError(
                    f"model has {field}={getattr(other, field)} but the archive was recorded with "
                    f"{field}={getattr(self, field)}; {hint}"
                )
        if self.mocap_bodies != other.mocap_bodies:
            raise LayoutMismatchError(
                f"mocap bodies differ: archive {list(self.mocap_bodies)}, model {list(other.mocap_bodies)}; {hint}"
            )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resolve(file: str, directory: str, modeldir: str) -> str:
    if os.path.isabs(file):
        return file
    if directory and os.path.isabs(directory):
        return os.path.join(directory, file)
    return os.path.join(modeldir, directory, file)


class _Collector:
    """Reads each referenced file once and hands out flat, unique, deterministic names."""

    def __init__(self, spec: mujoco.MjSpec, base_dir: str | None):
        self.memory = dict(spec.assets)
        self.modeldir = base_dir if base_dir is not None else (spec.modelfiledir or "")
        self.assets: dict[str, bytes] = {}
        self.by_source: dict[str, str] = {}
        self.by_ref: dict[tuple[str, str], str] = {}  # the spec and the source text name each file
        self.real_dirs: dict[str, str] = {}  # realpath per directory: one lstat per component each

    def take(self, file: str, directory: str) -> str:
        name = self.by_ref.get((file, directory))
        if name is None:
            name = self.by_ref[(file, directory)] = self._take(file, directory)
        return name

    def _real(self, path: str) -> str:
        head, tail = os.path.split(path)
        if head not in self.real_dirs:
            self.real_dirs[head] = os.path.realpath(head)
        return os.path.join(self.real_dirs[head], tail)

    def _take(self, file: str, directory: str) -> str:
        for key in (os.path.join(directory, file) if directory else file, file):
            if key in self.memory:
                source, data = f"memory:{key}", bytes(self.memory[key])
                break
        else:
            source = self._real(_resolve(file, directory, self.modeldir))
            if source in self.by_source:
                return self.by_source[source]
            try:
                data = Path(source).read_bytes()
            except OSError as exc:
                raise BundleError(f"cannot read model asset {file!r} (looked at {source}): {exc.strerror}") from None
        if source in self.by_source:
            return self.by_source[source]
        stem, ext = os.path.splitext(os.path.basename(file.replace("\\", "/")))
        stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", stem).lstrip(".") or "asset"
        ext = re.sub(r"[^A-Za-z0-9]", "", ext)[:16]
        name = f"{stem[:100]}.{ext}" if ext else stem[:100]
        if name in self.assets and self.assets[name] != data:
            name = f"{stem[:90]}-{_sha256(data)[:8]}" + (f".{ext}" if ext else "")
        self.assets[name] = data
        self.by_source[source] = name
        return name


@dataclasses.dataclass(frozen=True, eq=False)
class ModelBundle:
    """One flattened MJCF XML plus every asset it needs, under flat unique names.

    Build one with `from_file`, `from_spec` or `from_xml`; compile it with `compile()`.
    Two bundles are equal when their `sha256` is equal. `written_as` says how the XML was made,
    where this process made it: 'source' (the author's own XML, flattened), 'spec' (MuJoCo's
    writing of an MjSpec as written, every number exact), 'compiled' (MuJoCo's compiled values, 6
    significant digits: not bit-exact; see `WRITTEN_AS`), or None (given as bytes).
    """

    xml: str
    assets: Mapping[str, bytes]
    written_as: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        for name in self.assets:
            check_asset_name(name)
        object.__setattr__(self, "assets", dict(sorted((k, bytes(v)) for k, v in self.assets.items())))

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ModelBundle:
        """Bundle an MJCF file with its includes, meshes, textures, height fields and skins."""
        path = Path(path)
        if not path.is_file():
            raise BundleError(f"model file {str(path)!r} does not exist")
        try:
            spec = mujoco.MjSpec.from_file(str(path))
        except Exception as exc:  # MuJoCo raises plain ValueError/Exception with its parser message
            raise BundleError(f"MuJoCo could not parse {str(path)!r}: {exc}") from None
        return cls._from_parsed_spec(spec, str(path.resolve().parent) + os.sep, source=path.read_bytes())

    @classmethod
    def from_spec(cls, spec: mujoco.MjSpec) -> ModelBundle:
        """Bundle an MjSpec; files are read relative to its model directory, `spec.assets` first.

        With MuJoCo 3.16 or later the XML is MuJoCo's writing of the spec as written, every number
        exact, so the bundle compiles to the same model as `spec.compile()`, bit for bit; before,
        MuJoCo's compiled values with 6 significant digits (`written_as` says which)."""
        return cls._from_parsed_spec(spec.copy(), None)

    @classmethod
    def from_xml(cls, xml: str, assets: Mapping[str, bytes] | None = None) -> ModelBundle:
        """Bundle an XML string whose files are all given in `assets` (name -> bytes)."""
        try:
            spec = mujoco.MjSpec.from_string(xml, assets=dict(assets or {}))
        except Exception as exc:
            raise BundleError(f"MuJoCo could not parse the XML: {exc}") from None
        return cls._from_parsed_spec(spec, "", source=xml.encode() if isinstance(xml, str) else bytes(xml))

    @classmethod
    def _from_parsed_spec(cls, spec: mujoco.MjSpec, base_dir: str | None, source: bytes | None = None) -> ModelBundle:
        collector = _Collector(spec, base_dir)
        meshdir, texdir = spec.meshdir, spec.texturedir
        for element in [*spec.meshes, *spec.hfields, *spec.skins]:
            if element.file:
                element.file = collector.take(element.file, meshdir)
        for texture in spec.textures:
            if texture.file:
                texture.file = collector.take(texture.file, texdir)
            faces = list(texture.cubefiles)
            if any(faces):
                texture.cubefiles = [collector.take(f, texdir) if f else "" for f in faces]
        spec.meshdir = ""
        spec.texturedir = ""
        assets = collector.assets
        # Each path below compiles the bundle once, from its own bytes, and the bundle keeps that
        # model: `compile()` hands out copies, so recording a model compiles it once in all.
        if source is not None:
            # The author's own XML text, flattened, when it compiles from the bundle's bytes alone.
            try:
                text = _flatten_source(source, collector, meshdir, texdir)
                return cls._compiled(text, assets, _compile_bytes(text, assets), "source")
            except Exception:  # saved from the spec instead
                pass
        spec.assets = dict(assets)
        xml = _save_as_written(spec)
        if xml is not None:
            try:
                return cls._compiled(xml, assets, _compile_bytes(xml, assets), "spec")
            except UnsafeBundleError:
                raise
            except BundleError:  # MuJoCo wrote what it cannot read back: its compiled values instead
                pass
        # What MJCF cannot say as written (e.g. attached models with other inertia settings), or a
        # MuJoCo that can only write compiled models (before savecompiled): MuJoCo's compiled values,
        # 6 significant digits, so not bit-exact.
        if _WRITES_SPEC_AS_WRITTEN:
            spec.compiler.savecompiled = spec.compiler.savecanonical = True
        try:
            xml = spec.to_xml()
        except Exception as exc:
            raise BundleError(f"MuJoCo could not compile the model while bundling it: {exc}") from None
        try:
            model = _compile_bytes(xml, assets)
        except UnsafeBundleError:
            raise
        except BundleError:
            repaired = _repair_default_classes(xml)
            if repaired == xml:
                raise
            xml, model = repaired, _compile_bytes(repaired, assets)
        return cls._compiled(xml, assets, model, "compiled")

    @classmethod
    def _compiled(cls, xml: str, assets: Mapping[str, bytes], model: mujoco.MjModel, written_as: str) -> ModelBundle:
        bundle = cls(xml, assets, written_as)
        object.__setattr__(bundle, "_model", model)
        return bundle

    # -- use ------------------------------------------------------------------------------------
    def spec(self) -> mujoco.MjSpec:
        """A fresh MjSpec parsed only from the bundle's bytes (its file references checked twice:
        in the XML text before parsing and in the parsed spec)."""
        return _parse_bytes(self.xml, self.assets)

    def compile(self) -> mujoco.MjModel:
        """An MjModel compiled in this process only from the bundle's bytes: compiled once per
        bundle, each call returns a fresh copy. For a bundle read from someone else's archive use
        `Archive.model()`, which compiles in a limited child."""
        model = self.__dict__.get("_model")
        if model is None:
            model = _compile_bytes(self.xml, self.assets)
            object.__setattr__(self, "_model", model)
        return copy.copy(model)  # mj_copyModel: a memory copy, a small fraction of a compile

    @functools.cached_property  # assets are fixed in __post_init__; hashing them is not free
    def sha256(self) -> str:
        """Content hash over the XML bytes and the sorted asset names and hashes."""
        h = hashlib.sha256(_HASH_DOMAIN)
        h.update(_sha256(self.xml.encode()).encode() + b"\0")
        for name, data in self.assets.items():
            h.update(name.encode() + b"\0" + _sha256(data).encode() + b"\0")
        return h.hexdigest()

    @property
    def layout(self) -> QposLayout:
        return QposLayout.from_model(self.compile())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelBundle) and self.sha256 == other.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"ModelBundle(sha256={self.sha256[:12]}…, assets={len(self.assets)}, xml={len(self.xml)} chars)"

    def export(self, directory: str | os.PathLike) -> Path:
        """Write `model.xml` and the assets into `directory` so MuJoCo's viewer can open it.

        The folder (created if needed) may be shared: each file is written to a fresh temporary
        file and renamed over its name, so a link planted at `model.xml` or an asset's name is
        replaced, never written through; a directory at one of those names is refused up front.
        """
        from ..._fs import OutputDir

        names = [check_asset_name(name) for name in self.assets]
        if "model.xml" in names:
            raise UnsafeBundleError("an asset is named 'model.xml', the name the exported model takes; "
                                    "rename the asset")
        with OutputDir(directory) as out:
            for name in [*names, "model.xml"]:
                out.check_writable(name)
            for name, data in self.assets.items():
                out.write_bytes(name, data)
            return out.write_bytes("model.xml", self.xml.encode())

    # -- Zarr (layout in spec/) -------------------------------------------------------------------
    def to_zarr(self, parent: Any, name: str = BUNDLE_GROUP) -> None:
        """Write the bundle as a Zarr v3 group `name` under the group `parent`."""
        group = parent.create_group(name)
        blobs = [("xml", self.xml.encode())] + [(f"asset_{i:05d}", d) for i, d in enumerate(self.assets.values())]
        _write_members(group, blobs)
        entries = [{"name": asset_name, "key": key, "size": len(data), "sha256": _sha256(data)}
                   for (key, data), asset_name in zip(blobs[1:], self.assets)]
        group.attrs.update(
            {
                _BUNDLE_ATTR: {
                    "sha256": self.sha256,
                    "xml": {"size": len(blobs[0][1]), "sha256": _sha256(blobs[0][1])},
                    "assets": entries,
                }
            }
        )

    @classmethod
    def from_zarr(cls, parent: Any, name: str = BUNDLE_GROUP) -> ModelBundle:
        """Read and fully verify a bundle group written by `to_zarr` (treated as untrusted)."""
        try:
            group = parent[name]
            meta = group.attrs.asdict().get(_BUNDLE_ATTR)
        except KeyError:
            raise FormatError(f"the archive has no model bundle group {name!r}") from None
        except MjArchiveError:
            raise
        except Exception as exc:  # zarr refuses malformed metadata with ValueError, TypeError, ...
            raise FormatError(f"the model bundle group's metadata is unreadable: {exc}") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("assets"), list):
            raise FormatError("the model bundle's attributes are missing or malformed")
        if len(meta["assets"]) > MAX_ASSETS:
            raise FormatError(f"the model bundle declares {len(meta['assets'])} assets (limit {MAX_ASSETS})")
        raw_xml = _read_blob(group, "xml", meta.get("xml"), MAX_XML_BYTES)
        try:
            xml = raw_xml.decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise FormatError(f"the model bundle's XML is not valid UTF-8 (byte {exc.start} of {len(raw_xml)}); "
                              "the archive was modified or corrupted") from None
        assets: dict[str, bytes] = {}
        for i, entry in enumerate(meta["assets"]):
            if not isinstance(entry, dict):
                raise FormatError(f"model bundle asset entry {i} is malformed")
            asset_name = check_asset_name(entry.get("name"))
            if entry.get("key") != f"asset_{i:05d}":  # keys are derived, never taken from the archive
                raise UnsafeBundleError(f"asset {asset_name!r} has unexpected key {entry.get('key')!r}")
            if asset_name in assets:
                raise UnsafeBundleError(f"asset name {asset_name!r} appears twice in the bundle")
            assets[asset_name] = _read_blob(group, f"asset_{i:05d}", entry, MAX_ASSET_BYTES)
        bundle = cls(xml, assets)
        if bundle.sha256 != meta.get("sha256"):
            raise UnsafeBundleError(
                f"model bundle hash mismatch: stored {meta.get('sha256')!r}, content hashes to "
                f"{bundle.sha256!r}; the archive was modified or corrupted"
            )
        check_bundle_xml(xml, assets)
        return bundle


_MEMBER_CHUNK = 8 * 2**20


def _new_member(group: Any, key: str, size: int) -> Any:
    """An empty bundle member of `size` bytes: a 1-D uint8 array (zstd, chunks of up to 8 MiB)."""
    import zarr.codecs

    return group.create_array(key, shape=(size,), chunks=(max(1, min(size, _MEMBER_CHUNK)),), dtype="uint8",
                              compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)


def _write_member(group: Any, key: str, data: bytes) -> Any:
    """One bundle member, written through zarr."""
    arr = _new_member(group, key, len(data))
    if data:
        arr[:] = np.frombuffer(data, dtype=np.uint8)
    return arr


def _write_members(group: Any, blobs: list[tuple[str, bytes]]) -> None:
    """Write members as `_write_member` would, byte for byte (but for the chunk of a member of only zero
    bytes, which zarr leaves out): the first one's array is made by zarr, and its metadata is the template
    of the others'; every single-chunk member's chunk, and the documents of those after the first, go to
    the store in one batch.

    Through zarr, each array costs ~3 ms of CPU in metadata handling and event-loop round trips:
    aloha_pot's 134 meshes took 0.4 s, more than compiling the model.
    """
    import asyncio

    import numcodecs
    import zarr.codecs
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.metadata.v3 import ArrayV3Metadata
    from zarr.core.sync import sync

    (first_key, first_data), *rest = blobs
    template = _new_member(group, first_key, len(first_data))
    meta = template.metadata
    expected = (zarr.codecs.BytesCodec(endian=None), zarr.codecs.ZstdCodec(level=3, checksum=False))
    # Batched: every member of one chunk, even of only zero bytes, whose chunk zarr would leave out (equal
    # to the fill value): stored, it cannot be taken for a missing one.
    batch = [(k, d) for k, d in blobs if 0 < len(d) <= _MEMBER_CHUNK] if tuple(meta.codecs) == expected else []
    batched = {k for k, _ in batch}
    if first_key not in batched and first_data:
        template[:] = np.frombuffer(first_data, dtype=np.uint8)
    for key, data in rest:
        if key not in batched:
            _write_member(group, key, data)
    if not batch:
        return
    prototype, zstd = default_buffer_prototype(), numcodecs.Zstd(level=3)
    chunk_key = meta.chunk_key_encoding.encode_chunk_key((0,))
    prefix = f"{group.path}/" if group.path else ""
    items = []
    template_doc = meta.to_dict()
    for key, data in batch:
        if key != first_key:  # (from a plain document: zarr's chunk-grid classes move between its releases)
            doc = ArrayV3Metadata.from_dict({**template_doc, "shape": [len(data)], "chunk_grid": {
                "name": "regular", "configuration": {"chunk_shape": [len(data)]}}})
            items += [(f"{prefix}{key}/{name}", buf) for name, buf in doc.to_buffer_dict(prototype).items()]
        items.append((f"{prefix}{key}/{chunk_key}", prototype.buffer.from_bytes(zstd.encode(data))))

    async def write_all() -> None:
        await asyncio.gather(*(group.store.set(k, v) for k, v in items))

    sync(write_all())


def _read_blob(group: Any, key: str, entry: Any, limit: int) -> bytes:
    if not isinstance(entry, dict):
        raise FormatError(f"model bundle entry for {key!r} is malformed")
    size = as_int(entry.get("size"), f"size of bundle member {key!r}", hi=limit)
    try:
        arr = group[key]
    except KeyError:
        raise FormatError(f"model bundle member {key!r} is missing") from None
    except MjArchiveError:
        raise
    except Exception as exc:
        raise FormatError(f"the metadata of model bundle member {key!r} is unreadable: {exc}") from None
    if not hasattr(arr, "dtype"):
        raise FormatError(f"model bundle member {key!r} should be an array")
    check_array(arr, f"{BUNDLE_GROUP}/{key}", dtypes={"uint8"}, ndim=1)
    if arr.shape != (size,):
        raise FormatError(f"model bundle member {key!r} has shape {arr.shape}, declared size {size}")
    try:
        data = arr[:].tobytes() if size else b""
    except MjArchiveError:  # refused by the CheckedStore, or the store did not answer (StorageError)
        raise
    except Exception as exc:
        raise FormatError(f"model bundle member {key!r} does not decode: {exc}") from None
    if _sha256(data) != entry.get("sha256"):
        raise UnsafeBundleError(f"model bundle member {key!r} fails its sha256 check; the archive was modified")
    return data


def _parse_bytes(xml: str, assets: Mapping[str, bytes]) -> mujoco.MjSpec:
    check_bundle_xml(xml, assets)
    try:
        spec = mujoco.MjSpec.from_string(xml, assets=dict(assets))
    except Exception as exc:
        raise BundleError(f"the bundled model does not parse: {exc}") from None
    try:
        check_spec_files(spec, assets)
    except Refused as exc:
        raise UnsafeBundleError(str(exc)) from None
    return spec


def _compile_bytes(xml: str, assets: Mapping[str, bytes]) -> mujoco.MjModel:
    """Check, parse and compile bundle bytes: what `ModelBundle.compile()` does once per bundle."""
    spec = _parse_bytes(xml, assets)
    try:
        return spec.compile()
    except Exception as exc:
        raise BundleError(f"the bundled model does not compile: {exc}") from None


#: How a bundle's XML was made (`ModelBundle.written_as`), as `info` explains it.
WRITTEN_AS = {
    "source": "the author's XML, flattened (exact)",
    "spec": "MuJoCo's writing of the MjSpec as written (exact)",
    "compiled": "MuJoCo's compiled values, 6 significant digits (not bit-exact: this MuJoCo cannot write an "
                "MjSpec as written)",
}
#: MuJoCo >= 3.16 writes a spec as written (<compiler savecompiled>); older ones only compiled values.
_WRITES_SPEC_AS_WRITTEN = hasattr(mujoco.MjSpec().compiler, "savecompiled")


def _save_as_written(spec: mujoco.MjSpec) -> str | None:
    """The spec as MJCF with every number exact, in the notation it was written in, or None.

    MjSpec.to_xml() compiles the spec and prints the compiled values with 6 significant digits.
    With <compiler savecompiled="false" savecanonical="false"> (neither is saved) MuJoCo writes
    the spec itself, numbers exactly and angles, orientations and fromto as written, so the text
    compiles to the same model; `encode` does so without compiling (`to_xml` would compile).
    """
    if not _WRITES_SPEC_AS_WRITTEN:
        return None
    spec.compiler.savecompiled = spec.compiler.savecanonical = False
    # encode writes only files; a memory file system where there is one (removing a directory on
    # disk took longer than compiling a small model).
    fd, path = tempfile.mkstemp(suffix=".xml", prefix="mjarchive-bundle-", dir=_SCRATCH_DIR)
    os.close(fd)
    try:
        for attempt in range(2):
            try:
                spec.encode(path)
                return Path(path).read_text(encoding="utf-8")
            except Exception:
                if attempt:
                    return None
            try:  # keyframes of an edited tree are saved once a compilation has assembled them
                spec.compile()
            except Exception as exc:
                raise BundleError(f"MuJoCo could not compile the model while bundling it: {exc}") from None
    finally:
        os.unlink(path)
    return None


def _repair_default_classes(xml: str) -> str:
    """MuJoCo 3.11 writes an attached spec's defaults with an empty, class-less `<default/>` and a
    class nested in itself, which its own parser refuses: drop the empty one and hoist a nested
    same-named class into its parent (its settings then belong to that one class, as compiled)."""
    root = ET.fromstring(xml)
    changed = False
    pending = [d for d in root.iter("default")]
    while pending:
        top = pending.pop()
        for child in list(top):
            if child.tag != "default":
                continue
            if not child.attrib and not len(child):
                top.remove(child)
                changed = True
            elif child.get("class") is not None and child.get("class") == top.get("class"):
                position = list(top).index(child)
                top.remove(child)
                for offset, grandchild in enumerate(list(child)):
                    top.insert(position + offset, grandchild)
                pending.append(top)  # what was hoisted may itself be nested in its own name
                changed = True
                break
    return ET.tostring(root, encoding="unicode") if changed else xml


_SCRATCH_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


_FILE_TAGS = {"mesh": "mesh", "hfield": "mesh", "skin": "mesh", "texture": "texture"}
_MAX_INCLUDES = 1000


def _flatten_source(source: bytes, collector: _Collector, meshdir: str, texdir: str) -> str:
    """The model's XML text with <include> inlined, files renamed to bundle members, dirs cleared."""
    root = ET.fromstring(source)
    for _ in range(_MAX_INCLUDES):
        found = next(((p, c) for p in root.iter() for c in p if c.tag == "include"), None)
        if found is None:
            break
        parent, include = found
        name = include.get("file") or ""
        memory = collector.memory.get(name)
        data = bytes(memory) if memory is not None else Path(_resolve(name, "", collector.modeldir)).read_bytes()
        position = list(parent).index(include)
        parent.remove(include)
        for offset, child in enumerate(list(ET.fromstring(data))):
            parent.insert(position + offset, child)
    else:
        raise BundleError("too many nested <include> elements")
    for element in root.iter():
        if element.tag == "compiler":
            for attr in DIR_ATTRS:
                element.attrib.pop(attr, None)
        kind = _FILE_TAGS.get(element.tag if isinstance(element.tag, str) else "")
        if kind is None:
            continue
        for attr, value in list(element.attrib.items()):
            if attr.startswith("file") and value:
                element.set(attr, collector.take(value, meshdir if kind == "mesh" else texdir))
    return ET.tostring(root, encoding="unicode")
