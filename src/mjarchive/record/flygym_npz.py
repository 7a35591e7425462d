"""flygym `RecordedTrajectory` files (`.npz`, one per world) read as untrusted input, for
`mjarchive.record.flygym.import_flygym`: members and `.npy` headers checked before anything is
decompressed, small arrays read at once, qpos and mocap streamed in blocks of frames. Needs NumPy only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import stat
import zipfile

import numpy as np

from .._errors import FormatError, LayoutMismatchError, MjArchiveError, SelectionError
from .._fs import OutputDir
from ..archive.format import MAX_RATE, MIN_RATE

__all__ = ["Trajectory", "Stream", "open_npz", "list_npz", "reserve_files", "check_against", "common_frames",
           "world_ids_of"]

_MEMBERS = {"time", "qpos", "output_fps", "playback_speed", "world_id", "mocap_pos", "mocap_quat"}
_SCALARS = {"output_fps": "iuf", "playback_speed": "iuf", "world_id": "iu"}
#: The most frames one file may hold: its times are read into memory (the first file's are kept).
MAX_FRAMES = 1 << 25
#: The largest zip directory read: zipfile parses all of it into objects (7 members take under 1 KiB).
_MAX_DIRECTORY = 1 << 16


@dataclasses.dataclass
class _Npy:
    """One `.npy` member of an npz: its zip entry and its checked header."""

    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # bytes of the .npy header

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass
class Trajectory:
    """One flygym file, checked: its zip, members, small arrays read, big ones left for streaming."""

    name: str
    zip: zipfile.ZipFile
    members: dict[str, _Npy]
    time: np.ndarray | None  # None once checked against the first file's (`check_against`)
    output_fps: float
    playback_speed: float
    world_id: int
    n_frames: int = 0
    differs: tuple[int, str] | None = None  # (frame, message): where its time first differs from the first file's

    def __post_init__(self) -> None:
        self.n_frames = len(self.time)

    def close(self) -> None:
        file = self.zip.fp
        self.zip.close()
        if file is not None:  # a ZipFile leaves a file object it was given open
            file.close()


def _bad(name: str, problem: str) -> FormatError:
    return FormatError(f"{name}: {problem}; it is not a flygym RecordedTrajectory file (RecordedTrajectory.save): "
                       "replace or remove it")


def _header(name: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Npy:
    """The member's .npy header, read before any of its data is decompressed, checked against its size."""
    key = info.filename[:-4]
    try:
        with zf.open(info) as fp:
            version = np.lib.format.read_magic(fp)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise ValueError(f"npy format version {version}")
            shape, fortran, dtype = read[version](fp, max_header_size=10000)
            offset = fp.tell()
    except FormatError:
        raise
    except Exception as exc:  # zipfile, zlib and numpy's header parser raise many kinds
        raise _bad(name, f"its member {key!r} is unreadable ({exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise _bad(name, f"its member {key!r} holds {dtype} values (pickled objects or records, which are never read)")
    npy = _Npy(info, tuple(int(n) for n in shape), dtype, offset)
    if fortran and len(shape) > 1:
        raise _bad(name, f"its member {key!r} is stored in Fortran order")
    if offset + npy.nbytes != info.file_size:
        raise _bad(name, f"its member {key!r} declares shape {npy.shape} of {dtype} ({npy.nbytes} bytes) but holds "
                         f"{info.file_size - offset}")
    return npy


def _float(m: _Npy) -> bool:
    return m.dtype.kind == "f" and m.dtype.itemsize <= 8  # flygym writes float32 or float64


def _read_small(name: str, zf: zipfile.ZipFile, npy: _Npy) -> np.ndarray:
    key = npy.info.filename[:-4]
    try:
        with zf.open(npy.info) as fp:
            fp.read(npy.offset)
            data = fp.read(npy.nbytes)
    except Exception as exc:
        raise _bad(name, f"its member {key!r} is damaged ({exc})") from None
    if len(data) != npy.nbytes:  # (zipfile stops where the compressed data ends, short of what the zip says)
        raise _bad(name, f"its member {key!r} ends early")
    return np.frombuffer(data, npy.dtype).reshape(npy.shape).astype(npy.dtype.newbyteorder("="))


def open_npz(folder: OutputDir, name: str, nq: int, nmocap: int, budget: int) -> Trajectory:
    """Open and check one flygym file: members, dtypes, shapes against the model, at most `budget`
    decoded bytes (MjArchiveError); read its time and scalars. Nothing of qpos or mocap is decompressed
    here."""
    opened = folder._open_regular(name)  # O_NOFOLLOW: a link swapped in meanwhile is refused too
    if opened is None:
        raise MjArchiveError(f"{name} disappeared from {str(folder.path)!r} while it was read")
    file = os.fdopen(opened[0], "rb")
    try:
        end = zipfile._EndRecData(file)  # the end record ZipFile trusts (private, unchanged since Python 2.6)
        if end is not None and end[zipfile._ECD_SIZE] > _MAX_DIRECTORY:
            raise _bad(name, f"its zip directory is {end[zipfile._ECD_SIZE]} bytes (flygym's take under 1 KiB)")
        zf = zipfile.ZipFile(file)
    except FormatError:
        file.close()
        raise
    except Exception as exc:
        file.close()
        raise _bad(name, f"it is not an npz (zip) file ({type(exc).__name__})") from None
    try:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        keys = {n[:-4] for n in names if n.endswith(".npy")}
        if (len(infos) > len(_MEMBERS) or len(set(names)) != len(names) or not keys <= _MEMBERS
                or len(keys) != len(names)):
            raise _bad(name, f"it holds the members {sorted(names)[:10]}; flygym writes {sorted(_MEMBERS)} (.npy)")
        if missing := {"time", "qpos", "output_fps", "playback_speed", "world_id"} - keys:
            raise _bad(name, f"it lacks {sorted(missing)}")
        members = {i.filename[:-4]: _header(name, zf, i) for i in infos}
        if (size := sum(m.nbytes for m in members.values())) > budget:
            raise MjArchiveError(f"{name} holds {size} decoded bytes, past the {budget} left of max_bytes; import "
                                 "fewer files at once, or raise max_bytes")
        scalars = {}
        for key, kinds in _SCALARS.items():
            m = members[key]
            if m.shape != () or m.dtype.kind not in kinds:
                raise _bad(name, f"{key} is {m.dtype} of shape {m.shape}, not a scalar")
            scalars[key] = _read_small(name, zf, m).item()
        rates = f"in [{MIN_RATE:g}, {MAX_RATE:g}]"
        for key, kind in (("output_fps", rates), ("playback_speed", rates), ("world_id", ">= 0")):
            value = scalars[key]
            if not (math.isfinite(value) and (0 <= value < 2**63 if kind == ">= 0" else MIN_RATE <= value <= MAX_RATE)):
                raise _bad(name, f"{key} is {scalars[key]!r}; it must be finite and {kind}")
        t, q = members["time"], members["qpos"]
        if not _float(t) or len(t.shape) != 1 or not t.shape[0]:
            raise _bad(name, f"time is {t.dtype} of shape {t.shape}; flygym writes (n_frames,) float32 or float64")
        frames = t.shape[0]
        if frames > MAX_FRAMES:
            raise MjArchiveError(f"{name} holds {frames} frames, more than the {MAX_FRAMES} a file may hold (its times "
                                 "are read into memory); split the run into shorter files")
        if not _float(q) or q.shape[:1] != (frames,) or len(q.shape) != 2:
            raise _bad(name, f"qpos is {q.dtype} of shape {q.shape}; flygym writes ({frames}, nq) float32 or float64")
        if q.shape[1] != nq:
            raise LayoutMismatchError(f"{name}: qpos has nq={q.shape[1]}, the model has nq={nq}; pass the model the "
                                      "trajectory was recorded with")
        has_mocap = {"mocap_pos", "mocap_quat"} & keys
        if has_mocap and has_mocap != {"mocap_pos", "mocap_quat"}:
            raise _bad(name, f"it holds {sorted(has_mocap)[0]} without its pair")
        got = members["mocap_pos"].shape[1:2] if has_mocap else (0,)
        for key, width in (("mocap_pos", 3), ("mocap_quat", 4)) if has_mocap else ():
            m = members[key]
            if not _float(m) or m.shape != (frames, *got, width):
                raise _bad(name, f"{key} is {m.dtype} of shape {m.shape}; flygym writes ({frames}, nmocap, {width}) "
                                 "float32 or float64")
        if got != (nmocap,):
            raise LayoutMismatchError(f"{name}: it holds {got[0] if got else '?'} mocap bodies, the model has "
                                      f"{nmocap}; pass the model the trajectory was recorded with")
        time = _read_small(name, zf, t).astype(np.float64, copy=False)
        if not np.all(np.isfinite(time)) or np.any(time[1:] <= time[:-1]):
            raise _bad(name, "its time is not finite and strictly increasing")
        return Trajectory(name, zf, members, time, float(scalars["output_fps"]), float(scalars["playback_speed"]),
                           int(scalars["world_id"]))
    except BaseException:
        zf.close()
        file.close()
        raise


def list_npz(folder: OutputDir, max_files: int) -> list[str]:
    """The folder's `*.npz` names, sorted; links and other non-files are refused, other names skipped."""
    names, limit = [], 100 * max_files + 1000
    for k, name in enumerate(folder.names(limit=limit + 1)):
        if k == limit:  # refused, not cut short: a file past the cut would be left out unseen
            raise MjArchiveError(f"{str(folder.path)!r} holds more than {limit} entries; put the .npz files in a "
                                 "folder of their own")
        if not name.endswith(".npz"):
            continue
        if any(ord(c) < 32 or ord(c) == 127 for c in name):  # (which OutputDir refuses to open)
            raise FormatError(f"{name!r} in {str(folder.path)!r} has a control character in its name; rename it, "
                              "or remove it")
        st = folder.lstat(name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise FormatError(f"{name} in {str(folder.path)!r} is {kind}; links are never followed: put the file "
                              "itself there, or remove it")
        names.append(name)
        if len(names) > max_files:
            raise MjArchiveError(f"{str(folder.path)!r} holds more than {max_files} .npz files; import them in groups "
                                 "(one folder each), or raise max_files")
    if not names:
        raise MjArchiveError(f"{str(folder.path)!r} holds no .npz files; point it at the folder of flygym trajectories "
                             "(RecordedTrajectory.save)")
    return sorted(names)


def check_against(a: Trajectory, b: Trajectory, shortest: bool) -> None:
    """Check file `b` against the first file `a` as soon as it is opened: the same cadence, the same
    frame count (unless `shortest`); note where their times first differ, then drop b's times (only
    the first file's are kept, whatever the number of files)."""
    for key in ("output_fps", "playback_speed"):
        if getattr(a, key) != getattr(b, key):
            raise MjArchiveError(f"{a.name} and {b.name} differ in {key} ({getattr(a, key)!r} vs "
                                 f"{getattr(b, key)!r}); one archive holds one cadence: import them separately")
    n = min(a.n_frames, b.n_frames)
    if not shortest and b.n_frames != a.n_frames:
        raise SelectionError(f"{a.name} has {a.n_frames} frames and {b.name} {b.n_frames}; the worlds of one "
                             "archive share one time axis: pass shortest=True (command line: --shortest) to take "
                             f"the first {n} of each")
    unequal = a.time[:n] != b.time[:n]
    if unequal.any():
        f = int(unequal.argmax())
        b.differs = (f, f"{a.name} and {b.name} differ in time at frame {f} ({float(a.time[f])!r} vs "
                        f"{float(b.time[f])!r}); the worlds of one archive share one time axis: import them separately")
    b.time = None


def reserve_files(n: int, spare: int = 256) -> None:
    """Let this process hold `n` files open besides `spare` (each file stays open until the archive is
    written): the soft limit is raised when the hard one allows (1024 files exceed the usual 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + spare
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise MjArchiveError(f"importing {n} files keeps them all open (and {spare} more for the archive), and "
                                 f"this process may open {hard} files (ulimit -Hn): raise the limit to {need}, or "
                                 "import fewer files at once")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def common_frames(trajs: list[Trajectory]) -> int:
    """Frames taken from every file (each checked by `check_against`): all of them, or with `shortest`
    the common first ones, whose times must agree."""
    n = min(t.n_frames for t in trajs)
    for b in trajs[1:]:
        if b.differs is not None and b.differs[0] < n:
            raise SelectionError(b.differs[1])
    return n


def world_ids_of(trajs: list[Trajectory], how: str) -> list[int]:
    if how == "order":
        return list(range(len(trajs)))
    if how != "file":
        raise MjArchiveError(f"world_ids must be 'file' or 'order', got {how!r}")
    seen: dict[int, str] = {}
    for t in trajs:
        if t.world_id in seen:
            raise MjArchiveError(f"{seen[t.world_id]} and {t.name} both hold world_id {t.world_id} (flygym's CPU "
                                 "Simulation saves 0 in every file); pass world_ids='order' (command line: "
                                 "--world-ids order) to number the files 0..N-1 in name order")
        seen[t.world_id] = t.name
    return [t.world_id for t in trajs]


class Stream:
    """A member's values, read frame block by frame block (decompressed as they are read)."""

    def __init__(self, t: Trajectory, key: str):
        self.name, self.key, self.npy = t.name, key, t.members[key]
        self.fp = t.zip.open(self.npy.info)
        self.fp.read(self.npy.offset)
        self.row = self.npy.shape[1:]

    def read(self, k: int, first: int) -> np.ndarray:
        """The next `k` frames (archive frames `first`...), finite or refused."""
        n = k * math.prod(self.row) * self.npy.dtype.itemsize
        try:
            data = self.fp.read(n)
        except Exception as exc:
            raise _bad(self.name, f"its member {self.key!r} is damaged ({exc})") from None
        if len(data) != n:
            raise _bad(self.name, f"its member {self.key!r} ends early")
        values = np.frombuffer(data, self.npy.dtype).reshape(k, *self.row)
        if not np.all(np.isfinite(values)):
            frame = first + int(np.flatnonzero(~np.isfinite(values.reshape(k, -1)).all(axis=1))[0])
            raise _bad(self.name, f"its {self.key} holds a non-finite value (NaN or infinity) at frame {frame}")
        return values
