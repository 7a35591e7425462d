"""On-disk constants and validators shared by the bundle, writer and reader (see spec/)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .._errors import FormatError

FORMAT_NAME = "mjarchive"
FORMAT_VERSION = "1.3"  # the newest this implements, and what new archives are written as
FORMAT_MAJOR = 1
ROOT_ATTR = "mjarchive"
#: MAJOR.MINOR: decimal integers of 1-4 ASCII digits without leading zeros ("0" itself excepted), so that
#: "1.01" is refused rather than read as 1.1 or as 1.01. Always fullmatch: `$` would accept a final "\n".
VERSION_RE = re.compile(r"(?:0|[1-9][0-9]{0,3})\.(?:0|[1-9][0-9]{0,3})")
#: Format 1.1 commit record of a live archive: a group no track name can take (TRACK_NAME_RE), whose
#: attribute COMMIT_ATTR holds the counts; the root attributes are written at creation and at finalize.
COMMIT_GROUP = "_commit"
COMMIT_ATTR = "mjarchive_commit"
COMMIT_KEY = f"{COMMIT_GROUP}/zarr.json"
MAX_COMMIT_BYTES = 64 * 2**10  # checked before the commit document is parsed
#: Format 1.2 writer lease (spec "Writer lease"): a group no track name can take, whose attribute
#: LEASE_ATTR names the one writer allowed to append; readers never read it.
LEASE_GROUP = "_writer"
LEASE_ATTR = "mjarchive_writer"
MAX_LEASE_BYTES = 64 * 2**10  # checked before a lease document is parsed
#: Format 1.1 `required_features` this implementation understands (readers refuse any other).
KNOWN_FEATURES = frozenset({"variants", "overlays", "parts"})
BUNDLE_GROUP = "model"

#: Track names become store keys, so they are validated before any use. Every pattern of the spec
#: is a full-string match: use `fullmatch` (with `re.match`, `$` also matches before a final "\n").
TRACK_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
RESERVED_ARRAYS = frozenset({"time", "qpos", "mocap_pos", "mocap_quat", "reset", "world_id", BUNDLE_GROUP})
#: Groups of format 1.1 features: writers refuse them as track names; readers only where the feature is used
#: (a 1.0 archive may have a track named so).
FEATURE_GROUPS = frozenset({"variants", "overlays"})
#: Format 1.3 episode index (spec "Episode index"): reserved as a track name from 1.3 on.
RESET_COUNT = "reset_count"

STORAGE_DTYPES = frozenset({"float32", "float64"})
TRACK_DTYPES = frozenset({"float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"})
ALLOWED_CODECS = frozenset({"bytes", "blosc", "zstd", "gzip", "crc32c", "transpose", "sharding_indexed"})
#: The blosc compressors readers decode (`cname`, and the code in bits 5-7 of each chunk header's flags:
#: blosclz 0, lz4 and lz4hc 1, zlib 3, zstd 4). Not snappy (code 2): numcodecs' c-blosc lacks it.
BLOSC_CNAMES = frozenset({"blosclz", "lz4", "lz4hc", "zlib", "zstd"})
BLOSC_COMPRESSOR_CODES = frozenset({0, 1, 3, 4})

# Bounds checked before anything is allocated, so a tiny hostile chunk cannot expand to gigabytes.
MAX_CHUNK_BYTES = 256 * 2**20  # a shard (the unit written)
#: A chunk or inner chunk (the unit decoded by every read, however small): readers hold a few at once.
MAX_DECODED_CHUNK_BYTES = 64 * 2**20
MAX_WORLDS = 1 << 20
MAX_FRAMES = 1 << 40
MAX_TRACK_ELEMENTS = 1 << 16  # per (frame, world)
# Every JSON document read from an archive (each zarr.json: root and bundle attributes included) is
# checked against these before it is parsed; 64 MiB holds the root attributes of MAX_WORLDS worlds.
MAX_JSON_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 32  # spec: "nesting depth of one JSON document"
# Reads of more frame chunks than this go block by block, so a hostile frame count fails at its first
# missing chunk instead of first building per-chunk work lists of its length.
MAX_READ_CHUNKS = 256
# An appending writer pre-grows arrays by 16 chunks; longer ones are refused (trimming them at close
# would enumerate every declared chunk).
MAX_UNCOMMITTED_CHUNKS = 64

# Manifest limits (spec/README.md, "Root attributes"); the writer refuses to record beyond them.
MAX_CHUNK_FRAMES = 1 << 16
MAX_NQ = 1 << 24  # nq and nv
MAX_MOCAP = 1 << 20
MAX_WORLD_ID = 2**63 - 1  # world IDs are stored as int64
MAX_TRACKS = 256
MAX_JOINTS = 1 << 20
MAX_CAMERAS = 1 << 16
MAX_NAME_CHARS = 1024  # joint, mocap body and camera names
MIN_RATE, MAX_RATE = 1e-6, 1e6  # output_fps and playback_speed; timestep lies in [MIN_TIMESTEP, MAX_RATE] s
MIN_TIMESTEP = 1e-12
ABS_ERROR_EXPONENTS = range(-64, 33)  # precision.abs_error is 2**k for k in this range


# A JSON string; the closing quote is optional so an unterminated string also matches once, to the
# end, instead of being retried from every later quote (which is quadratic).
_JSON_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in JSON text (brackets inside strings do not count):
    linear time, bounded memory, no recursion, so hostile text can be vetted before parsing."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return data.count(b"[") + data.count(b"{")
    brackets = np.frombuffer(_JSON_STRING_RE.sub(b'""', data).translate(None, _NOT_BRACKETS), np.uint8)
    deepest = depth = 0
    for lo in range(0, len(brackets), 1 << 20):
        part = brackets[lo:lo + (1 << 20)]
        levels = depth + np.cumsum(np.where((part == ord("[")) | (part == ord("{")), 1, -1), dtype=np.int64)
        if levels.size:
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def check_track_name(name: str, reserved: frozenset[str] = RESERVED_ARRAYS | FEATURE_GROUPS | {RESET_COUNT}, what: str = "track") -> str:
    """Validate a user-chosen track (or overlay) name; it becomes a store key."""
    if not isinstance(name, str) or not TRACK_NAME_RE.fullmatch(name) or name in reserved:
        raise FormatError(
            f"invalid {what} name {name!r:.80}: use 1-64 lowercase letters, digits or '_', starting with a "
            f"letter, and none of {sorted(reserved)}"
        )
    return name


def _codec_entries(codecs: Any) -> list[str | dict]:
    """Every entry of a Zarr v3 codec list, including those nested inside sharding."""
    entries: list[str | dict] = []
    if codecs is not None and not isinstance(codecs, (list, tuple)):
        raise FormatError(f"malformed codec list {str(codecs)[:80]}")
    for codec in codecs or ():
        if isinstance(codec, str):
            entries.append(codec)
            continue
        if not isinstance(codec, dict):
            raise FormatError(f"malformed codec entry {codec!r}")
        entries.append(codec)
        config = codec.get("configuration") or {}
        if isinstance(config, dict):
            entries += _codec_entries(config.get("codecs")) + _codec_entries(config.get("index_codecs"))
    return entries


def codec_names(codecs: Any) -> list[str]:
    """Every codec name in a Zarr v3 codec list, including those nested inside sharding."""
    return [c if isinstance(c, str) else str(c.get("name")) for c in _codec_entries(codecs)]


def check_array(array: Any, path: str, *, dtypes: frozenset[str] | set[str], ndim: int) -> None:
    """Check a Zarr array's metadata against the spec before reading any chunk of it.

    Raises FormatError naming the array and the problem.
    """
    try:
        meta = array.metadata.to_dict()
        dtype = str(np.dtype(array.dtype))
        fill_ok = np.ndim(array.metadata.fill_value) == 0
    except Exception as exc:  # zarr accepts some metadata it cannot use (e.g. a list as fill_value)
        raise FormatError(f"array {path!r} has malformed metadata: {exc}") from None
    if not fill_ok:
        raise FormatError(f"array {path!r} has a fill_value that is not a scalar")
    if meta.get("storage_transformers"):
        raise FormatError(f"array {path!r} declares storage transformers, which the mjarchive spec refuses")
    if dtype not in dtypes:
        raise FormatError(f"array {path!r} has dtype {dtype}; the spec allows {sorted(dtypes)}")
    if len(array.shape) != ndim:
        raise FormatError(f"array {path!r} has {len(array.shape)} dimensions, expected {ndim}")
    bad = [n for n in codec_names(meta.get("codecs")) if n not in ALLOWED_CODECS]
    if bad:
        raise FormatError(
            f"array {path!r} uses codec(s) {bad} not allowed by the mjarchive spec "
            f"(allowed: {sorted(ALLOWED_CODECS)}); refusing to decode it"
        )
    try:  # zarr 3.4 opens some irregular chunk grids, whose .chunks and .shards then raise
        chunk_bytes = math.prod(array.chunks) * np.dtype(dtype).itemsize
        shard_shape = getattr(array, "shards", None) or array.chunks
    except (NotImplementedError, TypeError, ValueError) as exc:
        raise FormatError(f"array {path!r} has a chunk grid the mjarchive spec does not allow (regular only): "
                          f"{exc}") from None
    shard_bytes = math.prod(shard_shape) * np.dtype(dtype).itemsize
    if max(chunk_bytes, shard_bytes) > MAX_CHUNK_BYTES or chunk_bytes > MAX_DECODED_CHUNK_BYTES:
        raise FormatError(
            f"array {path!r} declares chunks of {chunk_bytes} bytes in shards of {shard_bytes}, above the "
            f"spec's limits of {MAX_DECODED_CHUNK_BYTES} and {MAX_CHUNK_BYTES}"
        )


def quantize(values: np.ndarray, abs_error: float) -> tuple[np.ndarray, float]:
    """Round to a power-of-two step no larger than 2*abs_error; returns (values, achieved bound).

    Rounding to a multiple of a power of two zeroes low mantissa bits, which compresses well,
    and is exact in float32 while |x| < step * 2**24 (checked by the caller via the bound).
    """
    step = 2.0 ** math.floor(math.log2(2.0 * abs_error))
    return np.round(values / step) * step, step / 2.0


def as_int(value: Any, what: str, *, lo: int = 0, hi: int = MAX_FRAMES) -> int:
    """Parse an integer read from storage; bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FormatError(f"{what} must be an integer in [{lo}, {hi}], found {value!r}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise FormatError(f"key {twice[:64]!r} appears twice in one JSON object (JSON parsers disagree which one "
                          "counts); refusing the document")
    return found


def parse_json_bytes(data: bytes, what: str) -> Any:
    """A metadata document as every reader must see it: strict UTF-8 without a byte-order mark (json
    would also guess UTF-16/32), no key twice in an object. Raises ValueError if it is not JSON."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise FormatError(f"{what} starts with a byte-order mark; metadata documents are plain UTF-8")
    value = json.loads(text)
    # A document that is written back to exactly its own text (compact JSON, as mjarchive writes it)
    # holds no key twice: a repeated key would be missing from the copy. Others are parsed again,
    # each object's keys checked (a Python callback per object: ~10x slower).
    if json.dumps(value, separators=(",", ":")) == text:
        return value
    return json.loads(text, object_pairs_hook=_unique_keys)


def version_at_least(version: Any, minimum: tuple[int, int]) -> bool:
    """Whether `version` ("MAJOR.MINOR", untrusted) is a well-formed version at or above `minimum`."""
    if type(version) is not str or not VERSION_RE.fullmatch(version):
        return False
    return tuple(int(p) for p in version.split(".")) >= minimum


def check_codec_settings(meta: dict, path: str) -> None:
    """The codec settings a generic Zarr library reads loosely, checked on the document as stored:
    `transpose` orders are permutations of the array's axes written as plain integers (zarr takes
    `true` for 1), `bytes` is little-endian, as the spec writes it, and a `blosc` cname is one the
    spec lists (zarr also takes "snappy", which numcodecs cannot decode)."""
    codecs = meta.get("codecs")
    if not isinstance(codecs, list):
        return  # zarr refuses the document
    ndim = len(meta.get("shape") or ())
    for codec in _codec_entries(codecs):
        if isinstance(codec, str):
            continue
        name, config = codec.get("name"), codec.get("configuration") or {}
        if name == "transpose":
            order = config.get("order") if isinstance(config, dict) else None
            if (type(order) is not list or any(type(i) is not int for i in order)
                    or sorted(order) != list(range(ndim))):
                raise FormatError(f"array {path!r} has a transpose order {str(order)[:80]} that is not a permutation "
                                  f"of its {ndim} axes written as integers")
        elif name == "blosc" and (not isinstance(config, dict) or config.get("cname") not in BLOSC_CNAMES):
            cname = config.get("cname") if isinstance(config, dict) else None
            raise FormatError(f"array {path!r} declares blosc cname {str(cname)[:40]!r}; the spec allows "
                              f"{sorted(BLOSC_CNAMES)}")
        elif name == "bytes" and isinstance(config, dict) and config.get("endian", "little") != "little":
            raise FormatError(f"array {path!r} stores {config.get('endian')!r:.20}-endian bytes; the spec's arrays "
                              "are little-endian")

