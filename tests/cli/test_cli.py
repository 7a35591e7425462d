"""End-to-end tests of the `mjarchive` command line, run as subprocesses on real archives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive.testing import decode_video
from mjarchive.cli.info import INFO_KEYS, archive_info, format_info
from mjarchive.cli.main import main, parse_range, parse_size
from mjarchive.cli.preview import sheet_geometry

WORLDS = (3, 7, 42)
N_FRAMES = 40
RESETS = {10: 7, 30: 7, 25: 42}  # frame -> world reset at that frame
DOCUMENTED_KEYS = {"format_version", "n_frames", "n_worlds", "world_ids", "nq", "nmocap", "output_fps",
                   "playback_speed", "timestep", "cameras", "tracks", "model_sha256", "mujoco_version"}


def run_cli(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    proc = subprocess.run([sys.executable, "-m", "mjarchive", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"mjarchive {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def _write_archive(path: Path, xml: Path) -> None:
    model = mujoco.MjModel.from_xml_path(str(xml))
    datas = [mujoco.MjData(model) for _ in WORLDS]
    rng = np.random.default_rng(1)
    with mjarchive.create(path, xml, world_ids=WORLDS, chunk_frames=16, output_fps=20.0, playback_speed=0.5,
                          tracks={"qvel": (model.nv,)}) as writer:
        for f in range(N_FRAMES):
            for d in datas:
                d.ctrl[:] = rng.uniform(-0.3, 0.3, model.nu)
                for _ in range(5):
                    mujoco.mj_step(model, d)
            reset = np.array([RESETS.get(f) == w for w in WORLDS])
            writer.append(datas[0].time, np.stack([d.qpos for d in datas]), reset=reset,
                          qvel=np.stack([d.qvel for d in datas]))


@pytest.fixture(scope="module")
def archive(tmp_path_factory, humanoid_xml) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run.mjarchive"
    _write_archive(path, humanoid_xml)
    return path


@pytest.fixture
def damaged(archive, tmp_path) -> Path:
    copy = tmp_path / "damaged.mjarchive"
    shutil.copytree(archive, copy)
    return copy


# -- argument parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("7", 7), ("-3", -3), ("7,42", [7, 42]), ("7,", None), ("100:500", slice(100, 500)), ("::10", slice(None, None, 10)),
    ("-100:", slice(-100, None)), (" 1 : 9 : 2 ", slice(1, 9, 2)), ("0:16", slice(0, 16)),
])
def test_parse_range(text, expected):
    if expected is None:
        with pytest.raises(mjarchive.SelectionError):
            parse_range(text)
    else:
        assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["", "a", "1:2:3:4", "::0", "::-1", "1.5", "1;2", "1:x"])
def test_parse_range_rejects(text):
    with pytest.raises(mjarchive.SelectionError, match="range"):
        parse_range(text)


def test_parse_size():
    assert parse_size("480x640") == (480, 640)
    for bad in ("480", "0x10", "10x-1", "axb"):
        with pytest.raises(mjarchive.SelectionError, match="HEIGHTxWIDTH"):
            parse_size(bad)


def test_help_shows_an_example_per_command(capsys):
    top = run_cli("--help", check=True)
    for name in ["demo", "info", "verify", "render", "preview", "export-model"]:
        assert name in top.stdout
        with pytest.raises(SystemExit) as exit_info:  # in-process: one interpreter start is enough
            main([name, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert "example:" in text and f"mjarchive {name}" in text.split("example:")[1]
    assert run_cli().returncode == 2  # no command: usage on stderr


# -- info ---------------------------------------------------------------------------------------------
def test_info_json(archive):
    info = json.loads(run_cli("info", archive, "--json", "--sizes", check=True).stdout)
    assert DOCUMENTED_KEYS <= set(info) and tuple(info) == INFO_KEYS
    with mjarchive.open(archive) as a:
        time, bundle = a.time, a.bundle
    model = mujoco.MjModel.from_xml_path(str(bundle.export(archive.parent / "info_model")))
    assert info["format_version"] == "1.3"  # every new archive: the 1.3 episode index
    assert (info["required_features"], info["variants"], info["overlays"]) == ([], {}, {})
    assert info["status"] == "finalized"
    assert (info["n_frames"], info["n_worlds"], info["world_ids"]) == (N_FRAMES, 3, list(WORLDS))
    assert (info["nq"], info["nv"], info["nmocap"]) == (model.nq, model.nv, model.nmocap)
    assert (info["output_fps"], info["playback_speed"], info["timestep"]) == (20.0, 0.5, model.opt.timestep)
    assert info["cameras"] == [model.camera(i).name for i in range(model.ncam)]
    assert info["tracks"] == {"qvel": {"shape": [model.nv], "dtype": "float32"}}
    assert info["model_sha256"] == bundle.sha256 and info["mujoco_version"] == mujoco.__version__
    assert info["n_episodes"] == len(WORLDS) + len(RESETS)
    assert info["duration_s"] == pytest.approx(time[-1] - time[0])
    assert info["model"]["nbody"] == model.nbody and info["model"]["nmesh"] == model.nmesh
    on_disk = sum(p.stat().st_size for p in archive.rglob("*") if p.is_file())
    assert info["size_bytes"] == on_disk
    raw = N_FRAMES * (8 + len(WORLDS) * (4 * model.nq + 4 * model.nv + 1)) + 8 * len(WORLDS)
    assert info["raw_bytes"] == raw
    assert info["compression_ratio"] == pytest.approx(raw / info["data_bytes"])
    assert 0 < info["data_bytes"] < info["size_bytes"]

    text = run_cli("info", archive, "--sizes", check=True).stdout
    assert "finalized" in text and "3, 7, 42" in text and bundle.sha256 in text and "compression" in text
    # Without --sizes nothing is listed: the cost does not grow with the archive (sizes are null).
    plain = json.loads(run_cli("info", archive, "--json", check=True).stdout)
    assert plain == {**info, "size_bytes": None, "data_bytes": None, "compression_ratio": None,
                     "model": {**info["model"], "stored_bytes": None}}
    assert "not measured (mjarchive info --sizes" in run_cli("info", archive, check=True).stdout


def test_info_live_archive(tmp_path, humanoid_xml):
    path = tmp_path / "live.mjarchive"
    writer = mjarchive.create(path, humanoid_xml, n_worlds=2, chunk_frames=4)
    try:
        qpos = np.zeros((2, 28))
        qpos[:, 3] = 1
        for f in range(6):
            writer.append(0.1 * f, qpos)
        writer.flush()
        info = json.loads(run_cli("info", path, "--json", check=True).stdout)
        assert info["status"] == "live" and info["n_frames"] == 6
    finally:
        writer.close()
    assert json.loads(run_cli("info", path, "--json", check=True).stdout)["status"] == "finalized"


@pytest.mark.parametrize("dtype, precision, says, never", [
    ("float32", None, "float64 input (MuJoCo's MjData) rounded to float32", "lossless"),
    ("float64", None, "stored as float64, lossless", "rounded"),
    ("float32", 1e-3, "quantized to ±0.0009765", "lossless"),
])
def test_info_says_what_was_stored(tmp_path, humanoid_xml, dtype, precision, says, never):
    path = tmp_path / "p.mjarchive"
    with mjarchive.create(path, humanoid_xml, n_worlds=1, dtype=dtype, precision=precision) as writer:
        writer.append(0.0, mujoco.MjData(mujoco.MjModel.from_xml_path(str(humanoid_xml))).qpos[None])
    with mjarchive.open(path) as archive:
        info = format_info(archive_info(archive))
    qpos_row = next(line for line in info.splitlines() if line.startswith("qpos"))
    assert says in qpos_row and never not in qpos_row


# -- verify ---------------------------------------------------------------------------------------------
def test_verify_good(archive):
    proc = run_cli("verify", archive)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout and "FAIL" not in proc.stdout


def _delete_chunk(root: Path):
    (root / "qpos" / "c" / "1" / "0" / "0").unlink()
    return "missing"


def _truncate_chunk(root: Path):
    chunk = root / "qvel" / "c" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:20])
    return "qvel"


def _tamper_bundle(root: Path):
    xml = zarr.open_array(root / "model" / "xml", mode="r+")
    data = xml[:]
    data[200] ^= 1
    xml[:] = data
    return "model bundle"


@pytest.mark.parametrize("damage", [_delete_chunk, _truncate_chunk, _tamper_bundle])
def test_verify_reports_each_problem(damaged, damage):
    expected = damage(damaged)
    proc = run_cli("verify", damaged)
    assert proc.returncode == 1
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert fails and any(expected in line for line in fails), proc.stdout
    assert "INVALID" in proc.stdout and "Traceback" not in proc.stderr


def test_verify_unopenable_archive(damaged):
    (damaged / "zarr.json").write_text("{not json")
    proc = run_cli("verify", damaged)
    assert proc.returncode == 1 and "cannot be opened" in proc.stdout and "Traceback" not in proc.stderr


# -- export-model ------------------------------------------------------------------------------------
def test_export_model_compiles_with_plain_mujoco(archive, tmp_path, humanoid_xml):
    run_cli("export-model", archive, tmp_path / "model", check=True)
    model = mujoco.MjModel.from_xml_path(str(tmp_path / "model" / "model.xml"))
    original = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    assert (model.nq, model.nbody, model.ngeom) == (original.nq, original.nbody, original.ngeom)
    proc = run_cli("export-model", archive, tmp_path / "model")  # not empty: refused without --force
    assert proc.returncode == 1 and "--force" in proc.stderr


# -- render and preview ------------------------------------------------------------------------------
def test_render_writes_exactly_the_selection(archive, tmp_path):
    out = tmp_path / "videos"
    proc = run_cli("render", archive, "--out", out, "--worlds", "7,42", "--frames", "5:25", "--camera", "side",
                   "--size", "48x64", "--quality", "fast", "--workers", "1", "--no-progress", check=True)
    expected = {"world-0007_cam-side.mp4", "world-0042_cam-side.mp4"}
    assert {p.name for p in out.iterdir()} == expected | {".mjarchive-render.json"}  # + the resume ledger
    assert {Path(line).name for line in proc.stdout.split()} == expected
    for name in expected:
        frames = decode_video(out / name)[0]
        assert frames.shape == (20, 48, 64, 3)
        assert frames.std() > 1  # not blank


def test_render_takes_camera_specs_scene_options_and_hud(archive, tmp_path):
    out = tmp_path / "views"
    proc = run_cli("render", archive, "--out", out, "--worlds", "7", "--frames", "0:3", "--size", "48x64",
                   "--quality", "fast", "--workers", "1", "--no-progress",
                   "--camera", "side", "track:torso,distance=3,azimuth=90", "free:lookat=0,0,1,distance=4", "auto",
                   "--scene", "frames=body,geomgroup=111", "--hud", "world,frame,time,bottom-left", check=True)
    names = [Path(line).name for line in proc.stdout.split()]
    assert names == ["world-0007_cam-side.mp4", "world-0007_cam-track-torso.mp4", "world-0007_cam-free.mp4",
                     "world-0007_cam-auto.mp4"]
    for name in names:
        assert decode_video(out / name)[0].shape == (3, 48, 64, 3)


def test_preview_png_size(archive, tmp_path):
    from PIL import Image

    out = tmp_path / "sheet.png"
    run_cli("preview", archive, "--out", out, "--worlds", "3,42", "--frames", "::10", "--size", "48x64", check=True)
    h, w, _, _ = sheet_geometry(2, 4, (48, 64))  # frames 0, 10, 20, 30
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (w, h)
        pixels = np.asarray(img)
    assert pixels.std() > 5


# -- bad input ---------------------------------------------------------------------------------------
def _newer_version(root: Path) -> None:
    meta = json.loads((root / "zarr.json").read_text())
    meta["attributes"]["mjarchive"]["format_version"] = "2.0"
    (root / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("args, message, code", [
    (["render", "{a}", "--out", "{t}/v", "--worlds", "5"], "world 5 is not in this archive", 1),
    (["render", "{a}", "--out", "{t}/v", "--frames", "1:2:3:4"], "bad range '1:2:3:4'", 2),
    (["render", "{a}", "--out", "{t}/v", "--frames", "30:99"], "ends past the 40 committed frames", 1),
    (["render", "{a}", "--out", "{t}/v", "--camera", "nope"], "no camera 'nope'", 1),
    (["render", "{a}", "--out", "{t}/v", "--frames", "5:5"], "no frames selected", 1),
    (["render", "{a}", "--out", "{t}/v", "--camera", "track:tail"], "no body 'tail'", 1),
    (["render", "{a}", "--out", "{t}/v", "--camera", "free:zoom=2"], "free takes ['lookat'", 1),
    (["render", "{a}", "--out", "{t}/v", "--scene", "sites,contactforce"], "contactforce", 1),
    (["render", "{a}", "--out", "{t}/v", "--hud", "world,score"], "score", 1),
    (["render", "{a}", "--out", "{t}/v", "--backend", "warp", "--warp-batch", "0"],
     "warp_batch must be a positive number", 1),
    (["preview", "{a}", "--out", "{t}/s.png", "--size", "big"], "HEIGHTxWIDTH", 2),
    (["info", "{t}"], "no archive at", 1),
    (["verify", "{t}/missing"], "no archive at", 1),
    (["info", "{d}"], "newer than this mjarchive supports", 1),
    (["export-model", "{d}", "{t}/m"], "newer than this mjarchive supports", 1),
])
def test_bad_input_is_one_clear_line(archive, damaged, tmp_path, args, message, code):
    _newer_version(damaged)
    args = [a.format(a=archive, t=tmp_path, d=damaged) for a in args]
    proc = run_cli(*args)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- demo --------------------------------------------------------------------------------------------
def test_tiny_demo(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", out, "--worlds", "3", "--seconds", "0.5", "--size", "48x64", "--workers", "1",
                   "--no-progress", check=True)
    archive = out / "demo.mjarchive"
    videos = sorted((out / "videos").glob("*.mp4"))
    assert len(videos) == 2 and (out / "contact_sheet.png").is_file() and (out / "model" / "model.xml").is_file()
    for path in [archive, *videos, out / "contact_sheet.png"]:
        assert str(path) in proc.stdout
    with mjarchive.open(archive) as a:
        assert a.n_worlds == 3 and a.n_frames == 16 and a.verify().ok  # 0.5 s at 30 fps, both ends
        assert "ctrl" in a.tracks
    assert decode_video(videos[0])[0].shape[0] == 16


def test_info_says_how_the_model_xml_was_written(tmp_path, humanoid_xml):
    import mujoco

    from mjarchive.archive.bundle.model_bundle import WRITTEN_AS

    spec = mujoco.MjSpec.from_file(str(humanoid_xml))
    spec.worldbody.add_body(name="added", pos=[1 / 3, 0, 0]).add_geom(size=[0.1, 0, 0])
    for name, bundle in (("file", mjarchive.ModelBundle.from_file(humanoid_xml)),
                         ("spec", mjarchive.ModelBundle.from_spec(spec))):
        with mjarchive.create(tmp_path / name, bundle, n_worlds=1) as w:
            w.append([0.0], np.zeros((1, 1, bundle.compile().nq)))
        with mjarchive.open(tmp_path / name) as archive:
            info = archive_info(archive)
            assert info["producer"]["model_xml"] == bundle.written_as
            row = next(line for line in format_info(info).splitlines() if line.startswith("model XML"))
            assert row.split(None, 2)[2] == WRITTEN_AS[bundle.written_as]
    assert mjarchive.ModelBundle.from_file(humanoid_xml).written_as == "source"
    # Someone else's archive may say anything there: shown bounded, never trusted.
    info["producer"]["model_xml"] = "x" * 4000
    row = next(line for line in format_info(info).splitlines() if line.startswith("model XML"))
    assert row.split(None, 2)[2] == "unknown (" + repr("x" * 64) + ")"
