"""`import_flygym` attacked: crafted `.npz` files and folders (zip and .npy headers that lie, bombs,
names, more files than may be open), outputs that are not archives or have awkward names, and imports
killed by SIGTERM and SIGKILL. Each must end in an MjArchiveError naming the file, in bounded time and
memory, with nothing left behind and nothing outside the target touched."""

from __future__ import annotations

import fcntl
import io
import os
import resource
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import mjarchive
from mjarchive.cli.main import main
from mjarchive.flygym import import_flygym
from mjarchive.record.flygym_npz import MAX_FRAMES

from test_flygym import NQ, leftovers, model_xml  # noqa: E402, F401  (model_xml: a fixture)

def arrays(n: int = 40, world_id: int = 0, **extra) -> dict:
    """The arrays flygym's `RecordedTrajectory.save` writes for a run of `n` frames."""
    qpos = np.tile([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5], (n, 1))
    return {"time": 0.0001 + 0.008 * np.arange(n), "qpos": qpos, "output_fps": np.asarray(25),
            "playback_speed": np.asarray(0.2), "world_id": np.asarray(world_id),
            "mocap_pos": np.tile([1.0, 0.0, 1.0], (n, 1, 1)), "mocap_quat": np.tile([1.0, 0, 0, 0], (n, 1, 1)),
            **extra}


def save(path: Path, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays(**kw))
    return path


def refused(src: Path, model_xml: Path, error: type, match: str, **kw) -> None:
    out = src.parent / "run.mjarchive"
    with pytest.raises(error, match=match):
        import_flygym(src, model_xml, out, progress=False, **kw)
    assert not out.exists() and leftovers(src.parent) == []


def test_zip_directory_bomb_is_refused_before_it_is_parsed(tmp_path, model_xml):
    """A zip whose central directory lists 200,000 entries (9 MB): zipfile would build an object for each
    (hundreds of MB from a file of a few, seconds each), whatever the entries are."""
    src = tmp_path / "trajs"
    save(src / "good.npz", world_id=1)
    entry = b"PK\x01\x02" + bytes(42)  # an empty central directory record: 46 bytes
    directory = entry * 200_000
    end = b"PK\x05\x06" + bytes(8) + len(directory).to_bytes(4, "little") + bytes(6)
    (src / "evil.npz").write_bytes(directory + end)
    started = time.perf_counter()
    refused(src, model_xml, mjarchive.FormatError, r"evil\.npz: its zip directory is 9200000 bytes")
    assert time.perf_counter() - started < 2


def test_time_bomb_is_refused_before_it_is_read(tmp_path, model_xml):
    """A 300 KB file whose time (all zeros, deflated) decodes to 268 MB, with qpos and mocap headers that
    claim as many frames: every size agrees with its header, so only a bound on frames stops the time
    array (read into memory, whole) from being allocated."""
    src = tmp_path / "trajs"
    save(src / "good.npz", world_id=1)
    frames = MAX_FRAMES + 1
    with zipfile.ZipFile(src / "evil.npz", "w", zipfile.ZIP_DEFLATED) as z:
        for key, value in arrays(world_id=2).items():
            if value.ndim == 0:
                buf = io.BytesIO()
                np.lib.format.write_array(buf, value)
                z.writestr(f"{key}.npy", buf.getvalue())
                continue
            shape = (frames, *value.shape[1:])
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
            with z.open(f"{key}.npy", "w", force_zip64=True) as member:
                member.write(header.getvalue())
                if key == "time":
                    for _ in range(frames * 8 >> 24):
                        member.write(bytes(1 << 24))
            z.filelist[-1].file_size = len(header.getvalue()) + 8 * int(np.prod(shape))  # as the header says
    assert (src / "evil.npz").stat().st_size < 1 << 20
    refused(src, model_xml, mjarchive.MjArchiveError, rf"evil\.npz holds {frames} frames, more than the {MAX_FRAMES}")


def test_a_member_shorter_than_its_zip_entry_says_is_refused(tmp_path, model_xml):
    """The zip directory (and the .npy header) say 40 frames of time; the deflated data holds 20, with a
    CRC that matches them: zipfile just stops early."""
    src = tmp_path / "trajs"
    save(src / "good.npz", world_id=1)
    with zipfile.ZipFile(src / "evil.npz", "w", zipfile.ZIP_DEFLATED) as z:
        for key, value in arrays(world_id=2).items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, value)
            data = buf.getvalue()
            z.writestr(f"{key}.npy", data[:-160] if key == "time" else data)
            if key == "time":
                z.filelist[-1].file_size = len(data)
    refused(src, model_xml, mjarchive.FormatError, r"evil\.npz: its member 'time' ends early")


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here")
def test_wider_floats_than_flygyms_are_refused(tmp_path, model_xml):
    """float128 qpos holds values no archive dtype can: 1e4000 would be stored as infinity."""
    src = tmp_path / "trajs"
    save(src / "good.npz", world_id=1)
    save(src / "evil.npz", world_id=2, qpos=np.full((40, NQ), np.longdouble("1e4000")))
    refused(src, model_xml, mjarchive.FormatError, r"evil\.npz: qpos is float128 .* float32 or float64")


def test_rates_the_archive_cannot_hold_are_refused_naming_the_file(tmp_path, model_xml):
    src = tmp_path / "trajs"
    save(src / "a.npz", world_id=1, output_fps=np.asarray(1e308))
    save(src / "b.npz", world_id=2, output_fps=np.asarray(1e308))
    refused(src, model_xml, mjarchive.FormatError, r"a\.npz: output_fps is 1e\+308; it must be finite and in \[1e-06")


def test_a_folder_listing_cut_short_is_refused(tmp_path, model_xml):
    """Past 100 * max_files + 1000 entries the listing stops; a file it did not reach must not be left
    out of the archive unseen (the order of a listing is the file system's)."""
    src = tmp_path / "trajs"
    save(src / "good.npz")
    for i in range(1101):
        (src / f"notes{i}.txt").touch()
    refused(src, model_xml, mjarchive.MjArchiveError, r"holds more than 1100 entries", max_files=1)


def test_a_name_with_a_control_character_is_refused_naming_it(tmp_path, model_xml):
    src = tmp_path / "trajs"
    save(src / "good.npz")
    save(src / "ev\nil.npz", world_id=1)
    refused(src, model_xml, mjarchive.FormatError, r"'ev\\nil\.npz' in .* has a control character in its name; rename")


def test_shortest_compares_times_up_to_the_common_frames_only(tmp_path, model_xml):
    """Only the first file's times are kept: the others are compared with it as they are opened."""
    src = tmp_path / "trajs"
    save(src / "a.npz", world_id=1)
    save(src / "b.npz", world_id=2, n=30)
    late = arrays()["time"]
    late[35] += 0.001  # after b's end: not among the frames taken
    save(src / "c.npz", world_id=3, time=late)
    result = import_flygym(src, model_xml, tmp_path / "ok.mjarchive", progress=False, shortest=True)
    assert result.n_frames == 30
    early = arrays()["time"]
    early[20] += 0.001
    save(src / "c.npz", world_id=3, time=early)
    refused(src, model_xml, mjarchive.SelectionError, r"a\.npz and c\.npz differ in time at frame 20", shortest=True)


@pytest.mark.parametrize("where", ["user_folder", "input_folder", "above_input"])
def test_overwrite_never_deletes_what_is_not_an_archive(tmp_path, model_xml, where):
    src = tmp_path / "trajs"
    save(src / "good.npz")
    mine = tmp_path / "thesis"
    (mine / "chapter1.txt").parent.mkdir()
    (mine / "chapter1.txt").write_text("precious")
    out = {"user_folder": mine, "input_folder": src, "above_input": tmp_path}[where]
    with pytest.raises(mjarchive.ArchiveExistsError, match="holds no archive|holds the folder of .npz files"):
        import_flygym(src, model_xml, out, progress=False, overwrite=True)
    assert (mine / "chapter1.txt").read_text() == "precious" and (src / "good.npz").is_file()
    assert model_xml.is_file() and leftovers(tmp_path) == []
    (tmp_path / "empty").mkdir()  # an empty folder is no one's data: it takes the archive
    import_flygym(src, model_xml, tmp_path / "empty", progress=False, overwrite=True)
    assert mjarchive.open(tmp_path / "empty").n_frames == 40


def test_output_names_near_the_limit_and_dot(tmp_path, model_xml, monkeypatch):
    """The temporary folder's name is derived from the output's: it must stay a valid name."""
    src = tmp_path / "trajs"
    save(src / "good.npz")
    out = tmp_path / ("é" * 125)  # 250 bytes: a valid name
    import_flygym(src, model_xml, out, progress=False)
    assert mjarchive.open(out).n_frames == 40 and leftovers(tmp_path) == []
    monkeypatch.chdir(out)  # `mjarchive import flygym ... -o . --overwrite` from inside the archive
    import_flygym(src, model_xml, ".", progress=False, overwrite=True, world_ids="order")
    assert mjarchive.open(out).n_frames == 40 and leftovers(tmp_path) == []


def test_cli_prints_names_that_are_not_utf8(tmp_path, model_xml, capsys):
    src = tmp_path / "trajs"
    save(src / "a.npz")
    try:
        save(Path(os.fsdecode(os.fsencode(src) + b"/\xff.npz")))
    except OSError:
        pytest.skip("this file system takes UTF-8 names only")
    out = tmp_path / "cli.mjarchive"
    assert main(["import", "flygym", str(src), "--model", str(model_xml), "-o", str(out), "--no-progress",
                 "--world-ids", "order"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a.npz -> world 0", "\\xff.npz -> world 1"]


def test_cli_import_killed_by_sigterm_leaves_nothing(tmp_path, model_xml):
    src = tmp_path / "trajs"
    for w in range(4):
        save(src / f"w{w}.npz", world_id=w, n=100_000)
    out = tmp_path / "run.mjarchive"
    proc = subprocess.Popen([sys.executable, "-m", "mjarchive", "import", "flygym", str(src), "--model",
                             str(model_xml), "-o", str(out), "--no-progress"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not leftovers(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert leftovers(tmp_path), "the import ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_killed_imports_folder_is_swept_by_the_next_a_live_ones_kept(tmp_path, model_xml):
    """SIGKILL leaves the temporary folder; the next import to the same output deletes it once it is
    stale (unlocked, untouched for STALE_S), never one a live import holds, nor anything else: a folder
    of that name holding more than an import's `archive`, or another name."""
    src = tmp_path / "trajs"
    for w in range(4):
        save(src / f"w{w}.npz", world_id=w, n=100_000)
    out = tmp_path / "run.mjarchive"
    proc = subprocess.Popen([sys.executable, "-m", "mjarchive", "import", "flygym", str(src), "--model",
                             str(model_xml), "-o", str(out), "--no-progress"], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not leftovers(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    [killed] = leftovers(tmp_path)
    live = tmp_path / ".run.mjarchive.importing-live"
    other = tmp_path / ".run.mjarchive.replaced-kept"  # an old archive a killed swap left: never swept
    mine = tmp_path / ".run.mjarchive.importing-mine"
    for folder in (live, other, mine):
        (folder / "archive").mkdir(parents=True)
    (mine / "notes.txt").write_text("not an import's")
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a running import holds its own
    try:
        old = time.time() - 3600
        for folder in (killed, live.name, other.name, mine.name):
            os.utime(tmp_path / folder, (old, old))
        import_flygym(src, model_xml, out, progress=False)
    finally:
        os.close(held)
    assert leftovers(tmp_path) == sorted([live.name, mine.name, other.name])
    assert mjarchive.open(out).n_frames == 100_000


def test_many_files_fit_the_open_file_limit_or_are_refused_clearly(tmp_path, model_xml):
    """Every file stays open until the archive is written: max_files (1024) exceeds the usual soft
    limit of 1024 open files, which is raised up to the hard one; past the hard one, a clear refusal."""
    src = tmp_path / "trajs"
    save(src / "w0.npz")
    for w in range(1, 60):
        os.link(src / "w0.npz", src / f"w{w}.npz")
    out = tmp_path / "run.mjarchive"
    args = [sys.executable, "-m", "mjarchive", "import", "flygym", str(src), "--model", str(model_xml), "-o", str(out),
            "--no-progress", "--world-ids", "order"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 400:
        pytest.skip("the hard limit on open files is too low here")

    def run(soft: int, hard: int) -> subprocess.CompletedProcess:
        limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # noqa: E731
        return subprocess.run(args, preexec_fn=limit, capture_output=True, text=True, timeout=60)

    refusal = run(64, 64)
    assert refusal.returncode == 1 and "importing 60 files keeps them all open" in refusal.stderr
    assert not out.exists() and leftovers(tmp_path) == []
    assert run(64, hard).returncode == 0 and mjarchive.open(out).n_worlds == 60
