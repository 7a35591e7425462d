"""Rendering on a Dask cluster (real scheduler over TCP on 127.0.0.1, worker processes) from an
archive on a real S3-compatible server, and resuming an interrupted render.

Videos rendered on Dask are compared with the in-process render of the same request: the same
frames through the same encoder settings must decode to identical pixels.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import mjarchive
from mjarchive.testing import decode_video
from mjarchive.cli.main import main
from mjarchive.replay.render import RenderUnit, render_unit
from mjarchive.replay.resume import LEDGER_NAME
from s3_server import s3_server  # noqa: F401  (pytest fixture)

distributed = pytest.importorskip("distributed")

SIZE = (48, 64)
WORLDS = [3, 8]
N_FRAMES = 12
CHUNK = 4  # each video spans 3 stored chunks, so 3 units (tasks) per video
NQ = 28  # the humanoid


def _qpos(n_frames: int, n_worlds: int) -> np.ndarray:
    """A standing humanoid whose joints swing with frame and world: (n_frames, n_worlds, NQ)."""
    q = np.zeros((n_frames, n_worlds, NQ))
    q[..., 2] = 1.3
    q[..., 3] = 1.0
    f = np.arange(n_frames)[:, None, None]
    w = np.arange(n_worlds)[None, :, None]
    q[..., 7:] = 0.6 * np.sin(0.4 * f + 1.3 * w + 0.5 * np.arange(NQ - 7)[None, None, :])
    q[..., 0] = 0.05 * f[..., 0]  # drift, so the free camera would see it move
    return q.astype(np.float32)


def _write(location: str, xml: Path, world_ids: list[int], n_frames: int, storage_options=None) -> None:
    with mjarchive.create(location, xml, world_ids=world_ids, chunk_frames=CHUNK,
                          storage_options=storage_options) as w:
        w.append(0.02 * np.arange(1, n_frames + 1), _qpos(n_frames, len(world_ids)))


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each, and a scheduler on a free TCP port of 127.0.0.1."""
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                                  scheduler_port=0, dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as c:
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        yield c


@pytest.fixture(scope="module")
def s3_archive(s3_server, humanoid_xml):
    """(url, storage_options) of a small humanoid archive on the S3 server."""
    bucket = f"mjarchive-cluster-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    url, so = f"s3://{bucket}/run.mjarchive", s3_server.storage_options()
    _write(url, humanoid_xml, WORLDS, N_FRAMES, so)
    return url, so


@pytest.fixture(scope="module")
def reference(s3_archive, tmp_path_factory):
    """Decoded videos of the in-process render (no executor), by file name."""
    url, so = s3_archive
    out = tmp_path_factory.mktemp("local")
    paths = mjarchive.render(url, out, cameras=["back"], size=SIZE, quality="fast", workers=1, progress=False,
                             storage_options=so)
    return {p.name: decode_video(p)[0] for p in paths}


def test_dask_cluster_renders_s3_archive_like_local(cluster, s3_archive, reference, tmp_path):
    url, so = s3_archive
    assert sorted(reference) == ["world-0003_cam-back.mp4", "world-0008_cam-back.mp4"]
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        with distributed.get_task_stream(client) as tasks:
            paths = mjarchive.render(url, tmp_path, cameras=["back"], size=SIZE, quality="fast",
                                     executor=client.get_executor(), progress=False, storage_options=so)
    ran = [t for t in tasks.data if "render_unit" in t["key"]]
    assert len(ran) == len(WORLDS) * N_FRAMES // CHUNK  # one task per (world, chunk)
    assert len({t["worker"] for t in ran}) == 2, "both worker processes should have rendered"
    assert [p.name for p in paths] == sorted(reference)
    for p in paths:
        frames = decode_video(p)[0]
        assert frames.shape == (N_FRAMES, *SIZE, 3)  # one video, joined from 3 tasks
        np.testing.assert_array_equal(frames, reference[p.name])
    # Not a constant video: the joints move from frame to frame.
    assert np.abs(frames[0].astype(int) - frames[-1]).max() > 50


def test_dask_renders_a_multi_part_archive_part_by_part_like_one(cluster, s3_server, s3_archive, reference,
                                                                   humanoid_xml, tmp_path):
    """The same worlds recorded as two parts (two writers) render to the same pixels; each per-world
    task names its part, and a worker opens only that part."""
    bucket = f"mjarchive-parts-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    url, so = f"s3://{bucket}/parts.mjarchive", s3_server.storage_options()
    q = _qpos(N_FRAMES, len(WORLDS))
    for j, (wid, name) in enumerate(zip(WORLDS, ("rank1", "rank0"))):
        with mjarchive.create(url, humanoid_xml, part=name, world_ids=[wid], chunk_frames=CHUNK,
                              storage_options=so) as w:
            w.append(0.02 * np.arange(1, N_FRAMES + 1), q[:, j:j + 1])
    assert mjarchive.open(url, storage_options=so).parts == ("rank0", "rank1")
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        with distributed.get_task_stream(client) as tasks:
            paths = mjarchive.render(url, tmp_path, cameras=["back"], size=SIZE, quality="fast",
                                     executor=client.get_executor(), progress=False, storage_options=so)
    assert len([t for t in tasks.data if "render_unit" in t["key"]]) == len(WORLDS) * N_FRAMES // CHUNK
    assert sorted(p.name for p in paths) == sorted(reference)  # worlds in storage order: rank0's 8 first
    for p in paths:
        np.testing.assert_array_equal(decode_video(p)[0], reference[p.name])
    unit = RenderUnit(url, so, 8, 0, (0, 1, 2, 3), SIZE, "fast", "cpu", archive_part="rank0")
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        result = client.get_executor(pure=False).submit(render_unit, unit).result(timeout=120)
    np.testing.assert_array_equal(result.rgb, np.stack([rgb for _, _, rgb in mjarchive.iter_frames(
        url, worlds=[8], frames=slice(0, 4), camera="back", size=SIZE, quality="fast", storage_options=so)]))


def test_dask_worker_pixels_equal_iter_frames_before_encoding(cluster, s3_archive):
    url, so = s3_archive
    expected = np.stack([rgb for _, _, rgb in mjarchive.iter_frames(
        url, worlds=[8], frames=slice(4, 8), camera="back", size=SIZE, quality="fast", storage_options=so)])
    unit = RenderUnit(url, so, 8, 0, (4, 5, 6, 7), SIZE, "fast", "cpu")
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        result = client.get_executor(pure=False).submit(render_unit, unit).result(timeout=120)
    assert (result.world_id, result.frames) == (8, (4, 5, 6, 7))
    np.testing.assert_array_equal(result.rgb, expected)


def test_cli_scheduler_renders_on_existing_cluster(cluster, s3_archive, reference, tmp_path, capsys):
    url, so = s3_archive
    rc = main(["render", url, "--storage-options", json.dumps(so), "--scheduler", cluster.scheduler_address,
               "--out", str(tmp_path), "--camera", "back", "--size", "48x64", "--quality", "fast", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == sorted(reference)
    for name, frames in reference.items():
        np.testing.assert_array_equal(decode_video(tmp_path / name)[0], frames)


def test_cli_local_cluster(s3_archive, reference, tmp_path, capsys):
    url, so = s3_archive
    rc = main(["render", url, "--storage-options", json.dumps(so), "--cluster", "local", "--workers", "2",
               "--worlds", "8", "--out", str(tmp_path), "--camera", "back", "--size", "48x64", "--quality", "fast",
               "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert sorted(_mtimes(tmp_path)) == ["world-0008_cam-back.mp4"]
    np.testing.assert_array_equal(decode_video(tmp_path / "world-0008_cam-back.mp4")[0], reference["world-0008_cam-back.mp4"])


def test_cli_refuses_scheduler_and_cluster_together(s3_archive, tmp_path, capsys):
    url, so = s3_archive
    rc = main(["render", url, "--storage-options", json.dumps(so), "--cluster", "local",
               "--scheduler", "tcp://127.0.0.1:1", "--out", str(tmp_path)])
    assert rc == 1 and "choose one of --scheduler" in capsys.readouterr().err


def test_dask_is_imported_only_when_asked_for():
    code = ("import sys, mjarchive, mjarchive.replay.render, mjarchive.cli.main, mjarchive.replay.cluster; "
            "assert not {'dask', 'distributed'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- resume -------------------------------------------------------------------------------------------
RESUME_WORLDS = [0, 1, 2]
RESUME_FRAMES = 60


def _ledger_outputs(out: Path) -> set[str]:
    data = json.loads((out / LEDGER_NAME).read_text())
    return {name for entry in data["renders"].values() for name in entry["outputs"]}


def _mtimes(out: Path) -> dict[str, int]:
    """Finished-looking videos (not hidden: pathlib's glob would match `.x.partial.mp4` too)."""
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix == ".mp4" and not p.name.startswith(".")}


def test_killed_render_resumes_with_only_the_missing_videos(humanoid_xml, tmp_path):
    archive = tmp_path / "run.mjarchive"
    _write(str(archive), humanoid_xml, RESUME_WORLDS, RESUME_FRAMES)
    out = tmp_path / "videos"
    args = [str(archive), "--out", str(out), "--camera", "back", "side", "--size", "48x64", "--quality", "fast",
            "--workers", "1", "--no-progress"]
    expected = {f"world-{w:04d}_cam-{c}.mp4" for w in RESUME_WORLDS for c in ("back", "side")}
    proc = subprocess.Popen([sys.executable, "-m", "mjarchive", "render", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        # Kill while a video is being encoded, after at least one has finished.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                done = _ledger_outputs(out)
                if done and [p for p in out.iterdir() if p.suffix == ".mp4" and p.name not in done]:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    done = _ledger_outputs(out)
    assert done and done < expected, f"the kill should land mid-render, finished: {sorted(done)}"
    finals = set(_mtimes(out))
    assert done <= finals
    for name in finals - done:  # renamed after the ledger's last write: complete (it is rendered again)
        assert decode_video(out / name)[0].shape == (RESUME_FRAMES, *SIZE, 3)
    # The video being encoded has no final name ...
    leftovers = [p.name for p in out.iterdir() if p.suffix == ".mp4" and p.name not in done]
    assert leftovers and all(n.startswith(".") and ".partial" in n for n in leftovers)  # ... but a temporary one
    before = _mtimes(out)

    proc = subprocess.run([sys.executable, "-m", "mjarchive", "render", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"skipped {len(done)} of {len(expected)} outputs already rendered" in proc.stderr
    assert {Path(p).name for p in proc.stdout.split()} == expected  # all paths, skipped ones too
    after = _mtimes(out)
    assert set(after) == expected
    assert {n for n in done if after[n] == before[n]} == done  # finished videos untouched
    assert not [p for p in out.iterdir() if ".partial" in p.name]
    assert _ledger_outputs(out) == expected
    for name in expected:
        assert decode_video(out / name)[0].shape == (RESUME_FRAMES, *SIZE, 3)


def test_resume_reuses_only_what_this_request_finished(humanoid_xml, tmp_path, capfd):
    archive = tmp_path / "run.mjarchive"
    _write(str(archive), humanoid_xml, RESUME_WORLDS, 8)
    out = tmp_path / "videos"
    kw = dict(cameras=["back"], size=SIZE, quality="fast", workers=1, progress=False)
    first = mjarchive.render(archive, out, **kw)
    assert "skipped" not in capfd.readouterr().err
    names = [p.name for p in first]

    # A leftover partial video (from a killed run) and a deleted one: only the deleted is rendered.
    (out / f".{Path(names[0]).stem}.partial.mp4").write_bytes(b"not a video")
    (out / names[1]).unlink()
    before = _mtimes(out)
    assert mjarchive.render(archive, out, **kw) == first
    assert "skipped 2 of 3 outputs already rendered" in capfd.readouterr().err
    after = _mtimes(out)
    assert after[names[0]] == before[names[0]] and after[names[2]] == before[names[2]]
    assert decode_video(out / names[1])[0].shape == (8, *SIZE, 3)

    # A video changed on disk since it was recorded is not trusted.
    with open(out / names[2], "ab") as f:
        f.write(b"\0")
    mjarchive.render(archive, out, **kw)
    assert "skipped 2 of 3" in capfd.readouterr().err
    assert decode_video(out / names[2])[0].shape == (8, *SIZE, 3)

    # Another request (other frames, fps or size) into the same directory reuses nothing.
    for other in (dict(kw, frames=slice(0, 6)), dict(kw, fps=10.0), dict(kw, size=(32, 48))):
        before = _mtimes(out)
        mjarchive.render(archive, out, **other)
        assert "skipped" not in capfd.readouterr().err
        assert all(t != before[n] for n, t in _mtimes(out).items())
    # ... and it overwrote the first request's files, so those no longer count as finished.
    mjarchive.render(archive, out, **kw)
    assert "skipped" not in capfd.readouterr().err
    mjarchive.render(archive, out, **kw, resume=False)
    assert "skipped" not in capfd.readouterr().err

    # The same archive identity, appended to: another request.
    with mjarchive.open(archive, mode="a") as w:
        w.append(0.02 * 9, _qpos(9, 3)[-1])
    mjarchive.render(archive, out, **kw, frames=slice(0, 8))
    assert "skipped" not in capfd.readouterr().err
    assert not [p for p in out.iterdir() if ".partial" in p.name]
