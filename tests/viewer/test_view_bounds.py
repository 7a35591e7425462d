"""The viewer's work is bounded by what it draws, checked before the work starts (issue 25).

Hostile archives are built with the public API and shown by the viewer's own frame and model
building functions in a child process, whose peak memory and time are measured and compared with
a benign archive of the same shape: text labels past what a page shows are never decoded, a model
(or its per-world shapes) with too many vertices is refused from the compiled model's sizes before
a mesh is built or sent.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import textwrap
import time

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive.testing import hinge_chain_xml
from mjarchive.viewer.chunks import MAX_LABELS

pytest.importorskip("viser", reason="the viewer needs viser (pip install 'mjarchive[view]')")

from test_view_browser import _open, _wait_status, browser  # noqa: E402,F401  (Debian's Chromium, headless)

W = 64  # worlds shown at once (frames.MAX_VIEW_WORLDS)
CF = 16


def _label_archive(path, max_count: int, max_chars: int, frames: int = CF):
    """W worlds, every frame full: `max_count` labels of `max_chars` ASCII bytes per world, each naming
    its world, frame and slot; world w's label i is anchored at (0, 0, i) (slot 0: at body 1)."""
    overlays = {"note": mjarchive.Overlay.text(max_count=max_count, max_chars=max_chars)}
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=list(range(100, 100 + W)),
                          overlays=overlays, chunk_frames=CF) as writer:
        for f in range(frames):
            text = [[f"w{w} f{f} l{i} ".ljust(max_chars, "x")[:max_chars] for i in range(max_count)] for w in range(W)]
            labels = [[t[0], *(((0.0, 0.0, float(i)), t[i]) for i in range(1, max_count))] for t in text]
            writer.append(0.01 * (f + 1), np.zeros((W, 2)), overlays={"note": labels})


_SHOW_LABELS = textwrap.dedent("""
    import json, sys, time
    import mjarchive
    from mjarchive.viewer.frames import PoseWindow
    archive = mjarchive.open(sys.argv[1])
    model = archive.model()
    worlds = list(archive.world_ids)[::-1]  # the page's order: the labels shown are its first worlds'
    def hwm():  # peak resident set (KiB) since the last reset
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
    rss = lambda: int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak to the resident set now
    base = rss()
    t = time.monotonic()
    with PoseWindow(archive, model, worlds, [], prefetch=False) as window:
        rows = window.overlays(3)["note"]
        hidden = window.hidden_primitives(3)["note"]
        held = window.memory_bytes
        bound = window.max_memory_bytes
    seconds = time.monotonic() - t
    peak = hwm() - base
    print(json.dumps({"seconds": seconds, "peak_kb": peak, "labels": list(rows.labels), "world": rows.world.tolist(),
                      "z": rows.data[:, 2].tolist(), "hidden": hidden, "held": held, "bound": bound}))
""")


def _show_labels(path) -> dict:
    out = subprocess.run([sys.executable, "-c", _SHOW_LABELS, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_labels_past_what_a_page_shows_are_never_decoded(tmp_path):
    """64 worlds × 64 labels of 1 KiB per frame (4 MiB a frame, 64 MiB a chunk, 4096 labels a frame
    of which a page shows 128) cost about what one label per world costs: before issue 25 the window
    decoded every label of its chunk (10 s and 626 MB to a viewer's first frame, 0.8 s and 91 MB benign)."""
    _label_archive(tmp_path / "hostile.mjarchive", max_count=64, max_chars=1024)
    _label_archive(tmp_path / "benign.mjarchive", max_count=1, max_chars=8)
    hostile, benign = _show_labels(tmp_path / "hostile.mjarchive"), _show_labels(tmp_path / "benign.mjarchive")
    # The first 128 labels in the page's world order: all 64 of its first world, then of its second.
    want = [f"w{w} f3 l{i} ".ljust(1024, "x") for w in (W - 1, W - 2) for i in range(64)]
    assert hostile["labels"] == want
    assert hostile["world"] == [0] * 64 + [1] * 64
    assert hostile["z"][1:64] == list(map(float, range(1, 64)))  # anchored; slot 0 stands at body 1 (NaN kept)
    assert hostile["hidden"] == W * 64 - MAX_LABELS and benign["hidden"] == 0
    assert len(benign["labels"]) == W
    assert hostile["held"] <= hostile["bound"]
    # Memory: one world's stored chunk (16 × 64 KiB) at a time and the labels shown, not 64 MiB of text
    # and 65536 strings; time: 64 small reads and 2048 decodes.
    assert hostile["peak_kb"] <= 2 * benign["peak_kb"] + 16 * 1024, (hostile, benign)
    assert hostile["seconds"] <= 2 * benign["seconds"] + 1.5, (hostile["seconds"], benign["seconds"])


def _capsule_archive(path, n_geoms: int, n_worlds: int, differ: bool):
    """n_geoms capsules; with `differ`, world w's capsules have radius 0.01 + 0.001 w (a shape of their
    own: the viewer builds a mesh per distinct capsule size)."""
    geoms = "".join(f'<geom type="capsule" size=".01 .02" pos="{i * 0.01} 0 0"/>' for i in range(n_geoms))
    xml = f'<mujoco><worldbody><body><joint type="slide"/>{geoms}</body></worldbody></mujoco>'
    model = mujoco.MjModel.from_xml_string(xml)
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(xml), world_ids=list(range(n_worlds)), chunk_frames=4,
                          variant_fields=["geom_size"]) as writer:
        for w in range(n_worlds):
            size = np.array(model.geom_size)
            size[:, 0] += 0.001 * w * differ
            writer.set_variant(w, geom_size=size)
        writer.append(0.01, np.zeros((n_worlds, 1)))


_VIEW = textwrap.dedent("""
    import json, sys, time
    import mjarchive, viser  # imported before the peak is reset
    def status(key):
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set to the resident set now
    base, t = status("VmRSS:"), time.monotonic()
    out = {"status": "ok"}
    try:
        with mjarchive.view(sys.argv[1], worlds=sys.argv[2], max_worlds=64, port=0, block=False) as v:
            out["meshes"] = len(v._drawn)
    except mjarchive.MjArchiveError as exc:
        out = {"status": type(exc).__name__, "message": str(exc)}
    out.update(seconds=time.monotonic() - t, peak_kb=status("VmHWM:") - base)
    print(json.dumps(out))
""")


def _view(path, worlds: str) -> dict:
    """`mjarchive.view` of `worlds` in a child process: outcome, seconds and peak memory to the first frame."""
    out = subprocess.run([sys.executable, "-c", _VIEW, str(path), worlds], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_per_world_shapes_past_the_limits_are_refused_before_a_mesh_is_built(tmp_path):
    """64 worlds × 100 capsules of per-world sizes need 6400 batched meshes: refused from the model's
    sizes before one is built or sent (before issue 25 the viewer built and sent every one, then counted
    vertices: 2000 capsules took 571 s and 3.5 GB to refuse); a few worlds of the same archive are shown."""
    from mjarchive.viewer import geometry

    _capsule_archive(tmp_path / "a.mjarchive", 100, W, differ=True)
    _capsule_archive(tmp_path / "same.mjarchive", 100, W, differ=False)
    refused, benign = _view(tmp_path / "a.mjarchive", "0:64"), _view(tmp_path / "same.mjarchive", "0:64")
    assert refused["status"] == "MjArchiveError", refused
    assert re.search(r"64 worlds' differing geom shapes need more than 4,096 meshes \(MAX_VIEW_MESHES\).*show fewer "
                     r"worlds", refused["message"]), refused["message"]
    assert benign["status"] == "ok" and benign["meshes"] == 100, benign
    assert refused["seconds"] <= 2 * benign["seconds"] + 1.0, (refused, benign)
    assert refused["peak_kb"] <= 2 * benign["peak_kb"] + 32 * 1024, (refused, benign)
    with mjarchive.view(tmp_path / "a.mjarchive", worlds="0:4", max_worlds=64, port=0, block=False) as v:
        parts = v._drawn
        assert len(parts) == 4 * 100 <= geometry.MAX_VIEW_MESHES  # a capsule mesh per world and geom
        radii = sorted({round(float(np.abs(p.mesh.vertices[:, 0]).max()), 4) for p in parts})
        assert radii == [0.01, 0.011, 0.012, 0.013]
        with pytest.raises(mjarchive.MjArchiveError, match="MAX_VIEW_MESHES"):  # as the page's "Show worlds" asks
            v.show_worlds("0:64")
        assert v.world_ids == (0, 1, 2, 3) and len(v._drawn) == 400  # the worlds shown before stay


def test_a_model_past_the_limits_is_refused_from_its_sizes(monkeypatch):
    """Counted from the compiled model's sizes (mesh_vertnum, mesh_facenum, the primitives'), before a
    mesh is built: more drawn geoms than MAX_VIEW_MESHES, or triangles past MAX_VIEW_FACES."""
    from mjarchive.viewer import geometry

    def boxes(n):
        geoms = "".join(f'<geom type="box" size=".01 .01 .01" pos="{i * 0.03} 0 0"/>' for i in range(n))
        return mujoco.MjModel.from_xml_string(f"<mujoco><worldbody>{geoms}</worldbody></mujoco>")

    model = boxes(5000)
    t = time.monotonic()
    with pytest.raises(mjarchive.MjArchiveError, match=r"drawn geoms need more than 4,096 meshes \(MAX_VIEW_MESHES\)"):
        geometry.geom_meshes(model)
    assert time.monotonic() - t < 1.0
    assert len(geometry.geom_meshes(model, groups=(1,))) == 0  # hidden groups are not counted
    monkeypatch.setattr(geometry, "MAX_VIEW_FACES", 12 * 100 - 1)
    with pytest.raises(mjarchive.MjArchiveError, match=r"more than 1,199 triangles \(MAX_VIEW_FACES\)"):
        geometry.geom_meshes(boxes(100))
    assert len(geometry.geom_meshes(boxes(99))) == 99


# -- follow live: the committed count drops --------------------------------------------------------------------

_LIVE_WRITER = """
import sys, time
import numpy as np
import mjarchive
from mjarchive.testing import hinge_chain_xml
w = mjarchive.create(sys.argv[1], mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=[0, 1], chunk_frames=4)
for f in range(6):
    w.append(0.01 * (f + 1), np.full((2, 2), 0.1 * f))
w.flush()
print("committed 6", flush=True)
time.sleep(120)  # killed by the test: the archive stays live
"""


@contextlib.contextmanager
def _dropping_archive(tmp_path):
    """A live archive of 6 frames whose writer is killed; `drop()` rewrites it (overwrite=True) with 1 frame,
    as a user might while a viewer follows it."""
    path = tmp_path / "live.mjarchive"
    writer = subprocess.Popen([sys.executable, "-c", _LIVE_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "committed 6"
        writers = []

        def drop():
            writer.kill()
            writer.wait()
            w = mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=[0, 1],
                                 chunk_frames=4, overwrite=True)
            w.append(0.01, np.zeros((2, 2)))
            w.flush()
            writers.append(w)

        yield path, drop
        for w in writers:
            w.close()
    finally:
        writer.kill()
        writer.wait()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_follow_live_clamps_the_playhead_when_the_committed_count_drops(tmp_path, caplog):
    with _dropping_archive(tmp_path) as (path, drop), \
            mjarchive.view(path, port=0, block=False) as v:
        v.seek(4)
        assert (v.frame, v.n_frames) == (4, 6)
        drop()
        _wait(lambda: v.n_frames == 1 and v.frame == 0)
        status = v._status.content
        assert status.startswith("**frame 0 / 1**"), status
        # "to 0" when a poll falls between the rewrite's creation and its first commit
        assert re.search("committed frames dropped from 6 to [01]", status) and "showing frame 0" in status
        assert v._slider.max == 0 and v._slider.value == 0
        assert any(re.search("dropped from 6 to [01]", r.getMessage()) and r.levelname == "WARNING"
                   for r in caplog.records)
        v.seek(0)  # the viewer keeps serving the frames committed now
        with pytest.raises(mjarchive.SelectionError, match="1 committed frames"):
            v.seek(1)


def test_the_page_says_the_playhead_was_clamped(tmp_path, browser):  # noqa: F811
    with _dropping_archive(tmp_path) as (path, drop), \
            mjarchive.view(path, port=0, block=False) as v:
        v.seek(4)
        page = _open(browser, v.url)
        _wait_status(page, 4, 6)
        drop()
        _wait_status(page, 0, 1)
        # "to 0" when a poll falls between the rewrite's creation and its first commit
        page.get_by_text("committed frames dropped from 6 to", exact=False).first.wait_for(timeout=10_000)
        assert page.get_by_role("slider").get_attribute("aria-valuemax") == "0"
        page.close()


# -- what a window reads and holds -------------------------------------------------------------------------

def test_episode_starts_are_kept_bounded_and_read_on_as_frames_are_committed(tmp_path, monkeypatch):
    from mjarchive.viewer import frames
    from mjarchive.viewer.frames import PoseWindow

    monkeypatch.setattr(frames, "MAX_EPISODE_STARTS", 5)
    path = tmp_path / "resets.mjarchive"
    bundle = mjarchive.ModelBundle.from_xml(hinge_chain_xml(2))
    writer = mjarchive.create(path, bundle, world_ids=[7, 8], chunk_frames=4)
    reset = np.zeros((20, 2), bool)
    reset[:, 0] = True  # world 7: a reset at every frame
    reset[[3, 15], 1] = True
    writer.append(0.01 * np.arange(1, 11), np.zeros((10, 2, 2)), reset=reset[:10])
    writer.flush()
    try:
        with mjarchive.open(path) as archive, \
                PoseWindow(archive, archive.model(), [7, 8], [], prefetch=False) as window:
            assert window.episode_starts(7) == [0, 1, 2, 3, 4] and window.episode_count(7) == 10
            assert window.episode_starts(8) == [0, 3] and window.episode_count(8) == 2
            writer.append(0.01 * np.arange(11, 21), np.zeros((10, 2, 2)), reset=reset[10:])
            writer.flush()
            assert window.episode_count(7) == 10  # as of the frames the window knows
            assert window.refresh() == 20
            assert window.episode_starts(7) == [0, 1, 2, 3, 4] and window.episode_count(7) == 20
            assert window.episode_starts(8) == [0, 3, 15] and window.episode_count(8) == 3
            with pytest.raises(mjarchive.SelectionError, match="recorded world IDs"):
                window.episode_starts(9)
    finally:
        writer.close()


def _reset_archive(path, n: int = 40):
    """Worlds 7 and 8 over n frames: world 7 resets at every frame below 12, world 8 at 20, 25 and 33."""
    reset = np.zeros((n, 2), bool)
    reset[:12, 0] = True
    reset[[20, 25, 33], 1] = True
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=[7, 8],
                          chunk_frames=4) as writer:
        writer.append(0.01 * np.arange(1, n + 1), np.zeros((n, 2, 2)), reset=reset)
    return sorted({f for f in np.flatnonzero(reset.any(axis=1)).tolist() if f > 0})


def test_the_slider_marks_are_the_first_starts_of_any_shown_world(tmp_path):
    from mjarchive.viewer.frames import PoseWindow

    starts = _reset_archive(tmp_path / "r.mjarchive")
    with mjarchive.open(tmp_path / "r.mjarchive") as archive:
        with PoseWindow(archive, archive.model(), [7, 8], [], prefetch=False) as window:
            assert window.episode_marks(100) == starts == window.episode_marks(len(starts))  # frame 0 is no mark
            assert window.episode_marks(len(starts) - 1) is None  # too many to mark
            assert window.episode_marks(5) is None  # world 7 alone has 11 (decided from its count)
        with PoseWindow(archive, archive.model(), [8], [], prefetch=False) as window:
            assert window.episode_marks(3) == [20, 25, 33] and window.episode_count(8) == 4
            assert window.episode_marks(2) is None


@pytest.mark.parametrize("cap", [3, 10_000])
def test_episode_navigation_reads_past_the_kept_starts(tmp_path, monkeypatch, cap):
    from mjarchive.viewer import frames
    from mjarchive.viewer.frames import PoseWindow

    monkeypatch.setattr(frames, "MAX_EPISODE_STARTS", cap)
    starts = _reset_archive(tmp_path / "r.mjarchive")
    with mjarchive.open(tmp_path / "r.mjarchive") as archive:
        for worlds in ([7, 8], [7], [8]):
            mine = sorted({f for w in worlds for f in (range(1, 12) if w == 7 else (20, 25, 33))})
            assert set(mine) <= set(starts)
            with PoseWindow(archive, archive.model(), worlds, [], prefetch=False) as window:
                for k in range(40):
                    after = [s for s in mine if s > k]
                    before = [s for s in mine if s < k]
                    assert window.episode_start_near(k, 1) == (after[0] if after else None), (worlds, k)
                    assert window.episode_start_near(k, -1) == (before[-1] if before else None), (worlds, k)


def test_the_reset_buttons_step_past_the_kept_starts(tmp_path, monkeypatch):
    from mjarchive.viewer import frames

    monkeypatch.setattr(frames, "MAX_EPISODE_STARTS", 3)
    _reset_archive(tmp_path / "r.mjarchive")
    with mjarchive.view(tmp_path / "r.mjarchive", port=0, block=False) as v:
        assert v._window.episode_starts(7) == [0, 1, 2]  # the rest are past the cap
        v.seek(12)
        seen = []
        for _ in range(4):
            v._on_reset_nav(1)
            _wait(lambda: v.frame == v._target)
            seen.append(v.frame)
        assert seen == [20, 25, 33, 33]  # no start after 33: the playhead stays
        v._on_reset_nav(-1)
        _wait(lambda: v.frame == 25)
        v.seek(20)
        for expected in (11, 10):
            v._on_reset_nav(-1)
            _wait(lambda: v.frame == expected)


def test_a_window_holds_fewer_chunks_or_refuses_past_its_memory_bound(tmp_path, monkeypatch):
    from mjarchive.viewer import frames
    from mjarchive.viewer.frames import PoseWindow

    _label_archive(tmp_path / "a.mjarchive", max_count=4, max_chars=64, frames=2 * CF)
    with mjarchive.open(tmp_path / "a.mjarchive") as archive:
        model, worlds = archive.model(), list(archive.world_ids)
        with PoseWindow(archive, model, worlds, [], prefetch=False) as window:
            one = window.chunk_bytes
            assert window.max_chunks == 7
        monkeypatch.setattr(frames, "MAX_WINDOW_BYTES", 3 * one)
        with PoseWindow(archive, model, worlds, [], prefetch=False) as window:
            assert window.max_chunks == 3 and window.max_memory_bytes - 3 * one < one
        monkeypatch.setattr(frames, "MAX_WINDOW_BYTES", 2 * one)
        with PoseWindow(archive, model, worlds, [], prefetch=False) as window:
            assert window.max_chunks == 1  # the window is symmetric: 2k + 1 chunks
            for frame in (0, 20, 5, 31):
                assert len(window.overlays(frame)["note"].labels) == MAX_LABELS
                assert len(window.cached_chunks) == 1
        monkeypatch.setattr(frames, "MAX_WINDOW_BYTES", one - 1)
        with pytest.raises(mjarchive.SelectionError, match=r"MAX_WINDOW_BYTES.*show fewer worlds at once \(about 63\)"):
            PoseWindow(archive, model, worlds, [], prefetch=False)
        with PoseWindow(archive, model, worlds[:32], [], prefetch=False) as window:
            assert window.max_chunks == 1


def test_points_past_what_a_track_draws_are_counted_not_read(tmp_path):
    from mjarchive.viewer.chunks import VIEW_PRIMITIVES_PER_TRACK
    from mjarchive.viewer.frames import PoseWindow

    n = 2048  # 64 worlds × 2048 points: twice what one track draws per frame
    path = tmp_path / "points.mjarchive"
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=list(range(W)),
                          overlays={"dots": mjarchive.Overlay.points(max_count=n)}, chunk_frames=CF) as writer:
        points = np.zeros((W, n, 3))
        points[..., 0] = np.arange(W)[:, None]
        points[..., 1] = np.arange(n)
        writer.append(0.01, np.zeros((W, 2)), overlays={"dots": points})
    with mjarchive.open(path) as archive, PoseWindow(archive, archive.model(), list(range(W)), [], prefetch=False) as w:
        rows = w.overlays(0)["dots"]
        assert len(rows.world) == VIEW_PRIMITIVES_PER_TRACK == 32 * n
        assert w.hidden_primitives(0) == {"dots": W * n - VIEW_PRIMITIVES_PER_TRACK}
        np.testing.assert_array_equal(rows.data[:, 0], np.repeat(np.arange(32), n))  # the first 32 worlds'
        np.testing.assert_array_equal(rows.data[:, 1], np.tile(np.arange(n), 32))
        assert w.memory_bytes <= w.max_memory_bytes
