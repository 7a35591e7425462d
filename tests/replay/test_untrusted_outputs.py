"""Output folders someone else prepared: planted links, FIFOs and directories at the names mjarchive
writes, forged resume records, hostile camera names, plus two hygiene fixes (MuJoCo's log file in
the working directory; scripts without a main guard).

Every case asserts that nothing outside the output folder was opened, read or written (inotify),
that a planted link still points where it did with its target unchanged, and that the result is
either a correct fresh output or a clear MjArchiveError.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mjarchive
from mjarchive import _fs
from mjarchive.cli.main import main
from mjarchive.replay import resume
from mjarchive.replay.resume import LEDGER_NAME, json_depth, parse_ledger
from mjarchive.replay.video import video_name
from mjarchive.replay.views.camera import MAX_LABEL, camera_label
from mjarchive.testing import OpenWatcher, decode_video

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hostile  # noqa: E402  (tests/hostile.py)

pytestmark = pytest.mark.skipif(not OpenWatcher.available(), reason="needs Linux inotify")

SIZE = (16, 16)
KW = dict(size=SIZE, quality="fast", workers=1, progress=False)
VIDEO = "world-0000_cam-cam.mp4"
SECRET = b"outside content that must not change\n"
HOSTILE_CAMERAS = ["../../x", "..", "L" * 1000, "a/b", "a_b", "ünï", ".hidden", "-rf"]


def _xml(cameras: list[str]) -> str:
    cams = "".join(f'<camera name="{c}" pos="0 -1 0.3" xyaxes="1 0 0 0 0.3 1"/>' for c in cameras)
    return (f'<mujoco><worldbody><light pos="0 0 2"/>{cams}<body><joint type="hinge" axis="0 0 1"/>'
            '<geom type="box" size=".1 .1 .1" rgba="1 0 0 1"/></body></worldbody></mujoco>')


def _archive(path: Path, cameras: list[str]) -> Path:
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(_xml(cameras)), world_ids=[0], chunk_frames=4) as w:
        for i in range(3):
            w.append(0.03 * i, np.full((1, 1), 0.3 * i))
    return path


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return _archive(tmp_path_factory.mktemp("arch") / "a.mjarchive", ["cam"])


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory the planted links point into, with one file whose content must not change."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_bytes(SECRET)
    return d


def _plant(path: Path, kind: str, outside: Path) -> None:
    if kind == "link-file":
        path.symlink_to(outside / "secret.txt")
    elif kind == "link-dangling":
        path.symlink_to(outside / "created-through-link")
    elif kind == "link-dir":
        path.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        raise AssertionError(kind)


def _assert_outside_intact(outside: Path, watcher_events: list[str] = ()) -> None:
    assert not watcher_events, watcher_events
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_bytes() == SECRET


def _is_video(path: Path, n: int = 3) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), path
    assert decode_video(path)[0].shape == (n, *SIZE, 3)


# -- the shared helper ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["link-file", "link-dangling", "link-dir", "fifo"])
def test_write_bytes_replaces_what_was_planted(tmp_path, outside, kind):
    out = tmp_path / "out"
    out.mkdir()
    _plant(out / "f.bin", kind, outside)
    with OpenWatcher([outside], writes=True) as watcher, _fs.OutputDir(out) as folder:
        with pytest.raises(mjarchive.MjArchiveError, match="not a regular file|symbolic link|FIFO"):
            folder.read_regular("f.bin", 100)  # never read through, never blocks on the FIFO
        folder.write_bytes("f.bin", b"fresh")
        events = watcher.events()
    assert (out / "f.bin").read_bytes() == b"fresh" and not (out / "f.bin").is_symlink()
    _assert_outside_intact(outside, events)
    assert sorted(p.name for p in out.iterdir()) == ["f.bin"]  # no temporary left


def test_output_dir_helpers_refuse_and_bound(tmp_path):
    out = tmp_path / "out"
    with _fs.OutputDir(out) as folder:
        (out / "d").mkdir()
        with pytest.raises(mjarchive.MjArchiveError, match="is a directory"):
            folder.write_bytes("d", b"x")
        (out / "big").write_bytes(b"x" * 101)
        with pytest.raises(mjarchive.MjArchiveError, match="limit 100"):
            folder.read_regular("big", 100)
        assert folder.read_regular("missing", 100) is None
        assert folder.digest("big", 100) is None  # wrong size: not even read
        a, b = folder.create_temp(".v"), folder.create_temp(".v")
        assert a.name != b.name and a.name.startswith(".v-")
        a.discard(), b.discard()
        for bad in ["", ".", "..", "a/b", "a\0b", "a\nb", "x" * 256]:
            with pytest.raises(mjarchive.MjArchiveError):
                folder.write_bytes(bad, b"x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(mjarchive.MjArchiveError, match="not a directory"):
        _fs.OutputDir(tmp_path / "file")
    assert sorted(p.name for p in out.iterdir()) == ["big", "d"]


# -- render: planted entries -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["link-file", "link-dangling", "link-dir", "fifo"])
def test_render_replaces_planted_entries_at_video_ledger_and_partial_names(archive, tmp_path, outside, kind):
    out = tmp_path / "out"
    out.mkdir()
    planted = {VIDEO: out / VIDEO, LEDGER_NAME: out / LEDGER_NAME,
               "partial": out / ".world-0000_cam-cam.partial.mp4"}  # the fixed name older versions used
    for p in planted.values():
        _plant(p, kind, outside)
    (out / "bystander").symlink_to(outside / "secret.txt")  # not a name mjarchive writes: left alone
    with OpenWatcher([outside], writes=True) as watcher:
        paths = mjarchive.render(archive, out, frames=slice(0, 3), **KW)
        events = watcher.events()
    assert paths == [out / VIDEO]
    _is_video(out / VIDEO)
    assert stat.S_ISREG(os.lstat(out / LEDGER_NAME).st_mode)
    assert not os.path.lexists(out / ".world-0000_cam-cam.partial.mp4")  # leftover removed
    _assert_outside_intact(outside, events)
    assert os.readlink(out / "bystander") == str(outside / "secret.txt")
    # ... and a second run trusts the record it wrote itself.
    with OpenWatcher([outside], writes=True) as watcher:
        mjarchive.render(archive, out, frames=slice(0, 3), **KW)
        _assert_outside_intact(outside, watcher.events())


def test_render_in_a_child_with_planted_fifos_and_links(archive, tmp_path, outside):
    """All at once, in a limited child (a FIFO that were opened would hang it into the timeout)."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / LEDGER_NAME)
    (out / VIDEO).symlink_to(outside / "secret.txt")
    os.mkfifo(out / ".world-0000_cam-cam.partial.mp4")
    for entry in ("render", "cli_render"):
        outcome = hostile.run(entry, archive, out, watch=[outside], timeout=60)
        assert outcome.status == "ok" and not outcome.touched_outside, outcome
        _is_video(out / VIDEO, 2)
        assert stat.S_ISREG(os.lstat(out / LEDGER_NAME).st_mode)
    _assert_outside_intact(outside)


def test_output_folder_itself_may_be_a_link(archive, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert mjarchive.render(archive, tmp_path / "link", frames=slice(0, 3), **KW) == [tmp_path / "link" / VIDEO]
    _is_video(real / VIDEO)


@pytest.mark.parametrize("name", [VIDEO, LEDGER_NAME])
def test_a_directory_at_a_name_is_refused_before_rendering(archive, tmp_path, name):
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    with pytest.raises(mjarchive.MjArchiveError, match="is a directory"):
        mjarchive.render(archive, out, frames=slice(0, 3), **KW)
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing rendered, nothing left behind


def test_output_folder_that_is_a_fifo_is_refused(archive, tmp_path):
    os.mkfifo(tmp_path / "out")
    with pytest.raises(mjarchive.MjArchiveError, match="not a directory"):
        mjarchive.render(archive, tmp_path / "out", frames=slice(0, 3), **KW)


# -- render: the resume record is untrusted -------------------------------------------------------
def _render(archive, out, capfd) -> str:
    mjarchive.render(archive, out, frames=slice(0, 3), **KW)
    return capfd.readouterr().err


def _forge(out: Path, text: str | bytes) -> None:
    (out / LEDGER_NAME).write_bytes(text.encode() if isinstance(text, str) else text)


GARBAGE = {
    "huge": b" " * (resume.MAX_LEDGER_BYTES + 1),
    "deep": b"[" * 200_000 + b"]" * 200_000,
    "deep-object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "not-utf8": b"\xff\xfe{}",
    "not-json": b"{",
    "wrong-top": b"[]",
    "old-version": json.dumps({"format": "mjarchive-render", "version": 1, "renders": {}}).encode(),
    "renders-list": json.dumps({"format": "mjarchive-render", "version": resume._VERSION, "renders": []}).encode(),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_garbage_ledger_is_ignored_with_one_line_and_replaced(archive, tmp_path, capfd, case):
    out = tmp_path / "out"
    out.mkdir()
    _forge(out, GARBAGE[case])
    err = _render(archive, out, capfd)
    lines = [ln for ln in err.splitlines() if "resume record" in ln]
    assert len(lines) == 1 and "ignoring" in lines[0], err
    assert "skipped" not in err and "Traceback" not in err
    _is_video(out / VIDEO)
    ledger, problem = parse_ledger((out / LEDGER_NAME).read_bytes())
    assert problem is None and VIDEO in next(iter(ledger["renders"].values()))["outputs"]
    assert "skipped 1 of 1" in _render(archive, out, capfd)  # the replacement is trusted again


def _key_and_record(out: Path) -> tuple[str, dict]:
    data = json.loads((out / LEDGER_NAME).read_text())
    (key, entry), = data["renders"].items()
    return key, entry["outputs"][VIDEO]


def test_a_planted_video_with_a_forged_record_is_rendered_again(archive, tmp_path, capfd):
    out = tmp_path / "out"
    _render(archive, out, capfd)
    key, rec = _key_and_record(out)
    good = (out / VIDEO).read_bytes()
    fake = b"F" * rec["bytes"]  # same size, other content: the old size+mtime check was fooled by this
    (out / VIDEO).unlink()
    (out / VIDEO).write_bytes(fake)
    st = os.stat(out / VIDEO)
    _forge(out, json.dumps({"format": "mjarchive-render", "version": 2, "renders": {key: {"request": {}, "outputs": {
        VIDEO: {"frames": 3, "bytes": st.st_size, "sha256": rec["sha256"], "mtime_ns": st.st_mtime_ns}}}}}))
    assert "skipped" not in _render(archive, out, capfd)
    assert (out / VIDEO).read_bytes() == good


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to plant another user's file")
def test_a_record_forged_with_the_planted_files_hash_is_not_trusted(archive, tmp_path, capfd):
    """Who can write the folder can hash what they plant; their files are not ours, though."""
    import hashlib

    out = tmp_path / "out"
    _render(archive, out, capfd)
    key, rec = _key_and_record(out)
    fake = b"F" * 1000
    (out / VIDEO).unlink()
    (out / VIDEO).write_bytes(fake)
    os.chown(out / VIDEO, 4242, 4242)
    _forge(out, json.dumps({"format": "mjarchive-render", "version": 2, "renders": {key: {"request": {}, "outputs": {
        VIDEO: {"frames": 3, "bytes": len(fake), "sha256": hashlib.sha256(fake).hexdigest()}}}}}))
    assert "skipped" not in _render(archive, out, capfd)
    _is_video(out / VIDEO)
    # A record that belongs to someone else is ignored as a whole.
    os.chown(out / LEDGER_NAME, 4242, 4242)
    assert "belongs to another user" in _render(archive, out, capfd)


def test_ledger_names_are_never_paths(archive, tmp_path, outside, capfd):
    out = tmp_path / "out"
    _render(archive, out, capfd)
    key, rec = _key_and_record(out)
    data = json.loads((out / LEDGER_NAME).read_text())
    outputs = data["renders"][key]["outputs"]
    for name in ["../outside/secret.txt", str(outside / "secret.txt"), "x" * 300, 7]:
        outputs[str(name)] = dict(rec)
    data["mac"] = resume.ledger_mac(resume.user_key(), data["renders"])  # even a record that verifies
    _forge(out, json.dumps(data))
    with OpenWatcher([outside], writes=True) as watcher:
        err = _render(archive, out, capfd)
        events = watcher.events()
    assert "skipped 1 of 1" in err  # the real entry is still good; the bogus ones are dropped or unused
    _assert_outside_intact(outside, events)


def test_parse_ledger_checks_types_and_bounds():
    assert json_depth(b'{"a": [[1], "[[[[[["], {"b": "\\"{{"}}') == 3
    key = "a" * 64
    good = {"frames": 3, "bytes": 10, "sha256": "0" * 64}
    for bad in [{"frames": "3", "bytes": 10, "sha256": "0" * 64}, {"frames": 3, "bytes": True, "sha256": "0" * 64},
                {"frames": 3, "bytes": -1, "sha256": "0" * 64}, {"frames": 3, "bytes": 10, "sha256": "zz"}, [], None]:
        doc = {"format": "mjarchive-render", "version": resume._VERSION,
               "renders": {key: {"outputs": {"ok.mp4": good, "bad.mp4": bad}}, "notakey": {"outputs": {}}}}
        ledger, problem = parse_ledger(json.dumps(doc).encode())
        assert problem and ledger["renders"][key]["outputs"] == {"ok.mp4": good}
        assert list(ledger["renders"]) == [key]
    many = {f"{i:064x}": {"outputs": {"v.mp4": good}} for i in range(100)}
    ledger, problem = parse_ledger(json.dumps({"format": "mjarchive-render", "version": resume._VERSION,
                                               "renders": many}).encode())
    assert len(ledger["renders"]) == resume._MAX_REQUESTS and "oldest are dropped" in problem


def test_ledger_written_stays_readable(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "MAX_LEDGER_BYTES", 4000)
    ledger = resume.RenderLedger(tmp_path, "b" * 64, {"archive": "x" * 10_000, "size": [1, 2]})
    for i in range(200):
        ledger.mark_done(tmp_path / f"world-{i:04d}_cam-c.mp4", 3, "0" * 64, 10)
    ledger.flush()
    data = (tmp_path / LEDGER_NAME).read_bytes()
    assert len(data) <= 4000
    parsed, problem = parse_ledger(data)
    assert problem is None and "world-0199_cam-c.mp4" in parsed["renders"]["b" * 64]["outputs"]  # newest kept
    assert "archive" not in parsed["renders"]["b" * 64]["request"]  # a long string is not kept


# -- names from the archive ---------------------------------------------------------------------------
def test_camera_labels_are_flat_bounded_and_distinct():
    names = HOSTILE_CAMERAS + ["a\nb", "a\0b", "a\rb", "/", "\\", "x" * 10_000, "é" * 300]
    labels = [camera_label(n, i) for i, n in enumerate(names)]
    assert len(set(labels)) == len(labels)
    for label in labels:
        assert len(label) <= MAX_LABEL and all(c.isascii() and (c.isalnum() or c in "_.+-") for c in label)
        assert _fs.check_name(video_name(123456789012, label, 999)) == video_name(123456789012, label, 999)
    assert camera_label("back", 0) == "back" and camera_label(None, 3) == "cam3" and camera_label("x", -1) == "free"
    assert video_name(7, "../../x") == f"world-0007_cam-{camera_label('../../x', 0)}.mp4"  # raw labels are fixed too


def test_hostile_camera_names_render_inside_the_folder(tmp_path, capfd):
    arch = _archive(tmp_path / "h.mjarchive", HOSTILE_CAMERAS)
    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    with OpenWatcher([tmp_path, tmp_path / "a", tmp_path / "a" / "b"], writes=True) as watcher:
        paths = mjarchive.render(arch, out, frames=slice(0, 2), **KW)
        events = [e for e in watcher.events() if not e.startswith(str(tmp_path / "h.mjarchive"))
                  and Path(e).name not in ("h.mjarchive", "a", "b", "out")]
    assert not events, events
    names = [p.name for p in paths]
    assert len(set(names)) == len(HOSTILE_CAMERAS)
    assert all(p.parent == out and len(p.name.encode()) <= 255 for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted(names + [LEDGER_NAME])
    for p in paths:
        _is_video(p, 2)


# -- preview and export-model -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["link-file", "link-dangling", "fifo"])
def test_preview_replaces_a_planted_entry(archive, tmp_path, outside, kind, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _plant(out / "sheet.png", kind, outside)
    with OpenWatcher([outside], writes=True) as watcher:
        rc = main(["preview", str(archive), "--out", str(out / "sheet.png"), "--size", "16x16"])
        events = watcher.events()
    assert rc == 0, capsys.readouterr().err
    from PIL import Image

    assert not (out / "sheet.png").is_symlink() and Image.open(out / "sheet.png").format == "PNG"
    assert sorted(p.name for p in out.iterdir()) == ["sheet.png"]
    _assert_outside_intact(outside, events)


def test_preview_refuses_a_directory_at_its_name(archive, tmp_path, capsys):
    (tmp_path / "sheet.png").mkdir()
    assert main(["preview", str(archive), "--out", str(tmp_path / "sheet.png"), "--size", "16x16"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a directory" in err[0]


@pytest.mark.parametrize("kind", ["link-file", "link-dangling", "fifo"])
def test_export_model_replaces_planted_entries(archive, tmp_path, outside, kind, capsys):
    out = tmp_path / "model"
    out.mkdir()
    _plant(out / "model.xml", kind, outside)
    with OpenWatcher([outside], writes=True) as watcher:
        assert main(["export-model", str(archive), str(out)]) == 1  # not empty: refused without --force
        assert "not empty" in capsys.readouterr().err
        assert main(["export-model", str(archive), str(out), "--force"]) == 0, capsys.readouterr().err
        events = watcher.events()
    assert not (out / "model.xml").is_symlink()
    import mujoco

    assert mujoco.MjModel.from_xml_path(str(out / "model.xml")).ncam == 1
    _assert_outside_intact(outside, events)
    outcome = hostile.run("cli_export_model", archive, out, watch=[outside], timeout=60)
    assert outcome.clean, outcome


def test_export_model_writes_assets_without_following_links(tmp_path, outside):
    png = _png()
    xml = ('<mujoco><asset><texture name="t" type="2d" file="tex.png"/><material name="m" texture="t"/></asset>'
           '<worldbody><geom type="box" size=".1 .1 .1" material="m"/></worldbody></mujoco>')
    bundle = mjarchive.ModelBundle.from_xml(xml, {"tex.png": png})
    out = tmp_path / "model"
    out.mkdir()
    (out / "tex.png").symlink_to(outside / "secret.txt")
    (out / "model.xml").symlink_to(outside / "secret.txt")
    with OpenWatcher([outside], writes=True) as watcher:
        assert bundle.export(out) == out / "model.xml"
        events = watcher.events()
    assert (out / "tex.png").read_bytes() == png and not (out / "tex.png").is_symlink()
    _assert_outside_intact(outside, events)
    (out / "tex.png").unlink()
    (out / "tex.png").mkdir()
    with pytest.raises(mjarchive.MjArchiveError, match="is a directory"):
        bundle.export(out)


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("entry", ["cli_preview", "cli_render"])
def test_cli_in_a_child_with_planted_links(archive, tmp_path, outside, entry):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sheet.png").symlink_to(outside / "secret.txt")
    (out / "world-0000_cam-cam.mp4").symlink_to(outside / "created-through-link")
    os.mkfifo(out / LEDGER_NAME)
    outcome = hostile.run(entry, archive, out, watch=[outside], timeout=60)
    assert outcome.status == "ok" and not outcome.touched_outside, outcome
    _assert_outside_intact(outside)
    written = "sheet.png" if entry == "cli_preview" else VIDEO
    for name, target in [("sheet.png", "secret.txt"), (VIDEO, "created-through-link")]:
        if name == written:
            assert stat.S_ISREG(os.lstat(out / name).st_mode)
        else:  # the entry this command does not write keeps pointing where it did
            assert os.readlink(out / name) == str(outside / target)


# -- MuJoCo's warnings go to Python, not to MUJOCO_LOG.TXT ------------------------------------------------
_WARN = """
import mujoco, numpy as np
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><body><freejoint/><geom size=".1"/></body></worldbody></mujoco>')
d = mujoco.MjData(m)
d.qpos[0] = np.inf
mujoco.mj_step(m, d)  # MuJoCo warns: Nan, Inf or huge value in QPOS
"""


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "default", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_mujoco_warnings_become_python_warnings_and_no_log_file(tmp_path):
    proc = _python("import mjarchive, warnings\n" + _WARN + textwrap.dedent("""
        warnings.simplefilter("error")  # a warning that raises must not unwind through MuJoCo's C code
        d.qpos[0] = np.inf
        mujoco.mj_step(m, d)
        print("survived")
        """), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning: MuJoCo: Nan, Inf or huge value in QPOS" in proc.stderr
    assert "survived" in proc.stdout
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_a_warning_handler_the_program_installed_is_kept(tmp_path):
    proc = _python("import mujoco\nseen = []\nmujoco.set_mju_user_warning(seen.append)\nimport mjarchive\n"
                   + _WARN + "assert mujoco.get_mju_user_warning() is not None\nprint(len(seen), 'MuJoCo:' in repr(seen))",
                   tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "False"] and "RuntimeWarning" not in proc.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_in_process_warning_reaches_python(tmp_path, monkeypatch):
    import mujoco

    monkeypatch.chdir(tmp_path)
    m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><body><freejoint/><geom size=".1"/></body></worldbody></mujoco>')
    d = mujoco.MjData(m)
    d.qpos[0] = np.inf
    if mujoco.get_mju_user_warning() is not mjarchive._mujoco_warning:
        pytest.skip("another handler is installed in this process")
    with pytest.warns(RuntimeWarning, match="MuJoCo: Nan, Inf or huge value"):
        mujoco.mj_step(m, d)
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


# -- scripts without a main guard ---------------------------------------------------------------------------
@pytest.mark.parametrize("guarded", [False, True])
def test_script_without_main_guard_gets_one_clear_line(tmp_path, guarded):
    archive = _archive(tmp_path / "two.mjarchive", ["cam", "cam2"])  # two units: a pool of two workers
    call = f"mjarchive.render({str(archive)!r}, {str(tmp_path / 'out')!r}, size=(16, 16), quality='fast', " \
           f"workers=2, frames=slice(0, 3), progress=False)"
    body = f"if __name__ == '__main__':\n    {call}\n" if guarded else call + "\n"
    script = tmp_path / "script.py"
    script.write_text("import mjarchive\n" + body)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env=env)
    if guarded:
        assert proc.returncode == 0, proc.stderr
        _is_video(tmp_path / "out" / VIDEO)
        return
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mjarchive._errors.BackendError: worker processes could not start") and \
        "if __name__ == '__main__':" in last and "workers=1" in last, proc.stderr
    assert "BrokenProcessPool" not in proc.stderr and "No frames have been written" not in proc.stderr
    assert proc.stderr.count("Traceback") == 1  # the parent's; the workers leave quietly
    assert not [p for p in (tmp_path / "out").iterdir() if p.suffix == ".mp4"]


def test_a_record_without_this_users_code_is_not_trusted(archive, tmp_path, capfd):
    """What mjarchive itself may write into a shared folder for someone else (export-model of their
    archive: files owned by this user, bytes of theirs) must not pass for a finished render."""
    out = tmp_path / "out"
    _render(archive, out, capfd)
    data = json.loads((out / LEDGER_NAME).read_text())
    (key, entry), = data["renders"].items()
    fake = b"NOT A VIDEO OF THIS ARCHIVE"
    (out / VIDEO).unlink()
    (out / VIDEO).write_bytes(fake)  # owned by this user, one link: like an exported asset
    entry["outputs"][VIDEO].update(bytes=len(fake), sha256=hashlib.sha256(fake).hexdigest())
    for mac in (None, "0" * 64, resume.ledger_mac(b"f" * 64, data["renders"])):
        data["mac"] = mac
        _forge(out, json.dumps(data))
        err = _render(archive, out, capfd)
        assert "skipped" not in err and "does not verify" in err
        _is_video(out / VIDEO)
        (out / VIDEO).unlink()
        (out / VIDEO).write_bytes(fake)


def test_resume_key_is_private_and_a_shared_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = resume.user_key()
    path = tmp_path / "config" / "mjarchive" / "resume.key"
    assert key and len(key) == 64 and resume.user_key() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    assert resume.user_key() is None  # readable by others: not a secret
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    assert resume.user_key() is None and not (tmp_path / "elsewhere").exists()


def test_json_depth_is_linear_on_unterminated_strings():
    """An escaped quote repeated without a closing quote made a naive string regex quadratic
    (17 s at 80 KB); 8 MB must take well under the timeout."""
    code = ("from mjarchive.archive.format import json_depth; "
            "assert json_depth(b'[\"' + b'\\\\\"' * 4_000_000) == 1")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_temporary_swapped_for_a_link_before_ffmpeg_opens_it_is_not_written_through(archive, tmp_path, outside,
                                                                                      monkeypatch):
    """The race an attacker who can write the folder can win: swap our fresh temporary for a link
    between its creation and ffmpeg's open. ffmpeg writes through our descriptor, so the link's
    target is untouched, and the swap is reported instead of renamed into place."""
    real = _fs.OutputDir.create_temp

    def create_and_swap(self, prefix, suffix=".tmp"):
        part = real(self, prefix, suffix)
        if prefix.endswith(".partial"):
            os.unlink(part.path)
            os.symlink(outside / "secret.txt", part.path)
        return part

    monkeypatch.setattr(_fs.OutputDir, "create_temp", create_and_swap)
    with OpenWatcher([outside], writes=True) as watcher:
        with pytest.raises(mjarchive.MjArchiveError, match="replaced or removed"):
            mjarchive.render(archive, tmp_path / "out", size=(16, 16), quality="fast", workers=1, progress=False)
        events = watcher.events()
    _assert_outside_intact(outside, events)


def test_an_output_folder_swapped_for_a_link_while_open_keeps_its_writes(tmp_path, outside):
    """The folder is opened once and every entry is reached through that handle, so swapping the
    folder's path for a link to elsewhere mid-run sends nothing elsewhere."""
    out = tmp_path / "out"
    with _fs.OutputDir(out) as folder:
        folder.write_bytes("first.bin", b"1")
        out.rename(tmp_path / "moved")
        out.symlink_to(outside, target_is_directory=True)
        folder.write_bytes("authorized_keys", b"attacker's")
        part = folder.create_temp(".v.partial", ".mp4")
        Path(part.open_path).write_bytes(b"video")
        part.commit("v.mp4")
    _assert_outside_intact(outside)
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["authorized_keys", "first.bin", "v.mp4"]
    assert (tmp_path / "moved" / "v.mp4").read_bytes() == b"video"
