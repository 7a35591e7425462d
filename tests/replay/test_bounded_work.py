"""Work and memory bounded by what a render shows, not by what the archive stores (issue 25).

Each hostile archive is small (KB to MB) but declares sizes that multiply: overlay slots × worlds,
variant events, geoms × sampled poses, a committed frame count. Each runs through the hostile
harness (a forked child under an address-space limit and a timeout) next to a benign archive of the
same shape (the same worlds, frames and primitives drawn), and must be served within a small margin
of the benign run's peak memory and time, or refused clearly before the work starts.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import requires_warp_replay

import mjarchive
from mjarchive import Overlay
from mjarchive.replay.views.camera import AUTO_SAMPLE_POINTS, auto_geoms
from mjarchive.replay.views.overlay_draw import drawn_counts
from mjarchive.testing import OpenWatcher, decode_video

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hostile  # noqa: E402  (tests/hostile.py)

pytestmark = pytest.mark.skipif(not OpenWatcher.available(), reason="needs Linux inotify")

#: What a hostile run may cost beyond the benign run of the same shape.
EXTRA_MEMORY = 64 * 2**20
MEMORY = 3 << 30  # address space above the harness helper's (a GL context reserves much of it)
TIMEOUT = 60


def _within(bad: hostile.Outcome, good: hostile.Outcome) -> None:
    assert bad.peak_rss is not None and good.peak_rss is not None, (bad, good)
    assert bad.peak_rss <= good.peak_rss + EXTRA_MEMORY, (
        f"{bad.peak_rss / 2**20:.0f} MiB against {good.peak_rss / 2**20:.0f} MiB for the benign archive")
    assert bad.seconds <= 2 * good.seconds + 2, (bad.seconds, good.seconds)


def _run(entry: str, archive: Path, out: Path) -> hostile.Outcome:
    return hostile.run(entry, archive, out, watch=[], memory=MEMORY, timeout=TIMEOUT)


BALL = '<mujoco><worldbody><light pos="0 0 3"/><body><freejoint/><geom size=".1"/></body></worldbody></mujoco>'


def _qpos(n: int) -> np.ndarray:
    q = np.zeros((n, 7))
    q[:, 3] = 1
    return q


# -- overlays: decoded for every world of a scene ------------------------------------------------------
OVERLAYS, SCENE_WORLDS, OVERLAY_FRAMES = 8, 64, 8


def _overlay_archive(path: Path, max_count: int) -> Path:
    """64 worlds, 8 arrow tracks of `max_count` slots, one arrow per world, track and frame."""
    overlays = {f"o{k}": Overlay.arrows(width=0.02, max_count=max_count) for k in range(OVERLAYS)}
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(BALL), n_worlds=SCENE_WORLDS, overlays=overlays,
                          chunk_frames=OVERLAY_FRAMES) as w:
        for f in range(OVERLAY_FRAMES):
            arrow = [np.array([[0, 0, 0, 0.3, 0, 0.1 * k]]) for k in range(SCENE_WORLDS)]
            w.append(0.1 * f, _qpos(SCENE_WORLDS), overlays={name: arrow for name in overlays})
    return path


def test_scene_overlays_cost_what_they_draw_not_what_they_declare(tmp_path):
    # Declaring 4096 slots per world and track made a 64-world scene decode 64 × 4096 × 8 tracks
    # per frame (1.6 GB for 32 frames of this 1.3 MB archive); now only the slots drawn are kept,
    # one stored chunk of one world at a time.
    good = _run("render_scene", _overlay_archive(tmp_path / "good.mjarchive", 1), tmp_path / "good")
    bad = _run("render_scene", _overlay_archive(tmp_path / "bad.mjarchive", 4096), tmp_path / "bad")
    assert good.status == bad.status == "ok", (good, bad)
    _within(bad, good)
    # ... and draws the same: every arrow of both archives.
    video = "scene_cam-auto.mp4"
    np.testing.assert_array_equal(decode_video(tmp_path / "bad" / video)[0], decode_video(tmp_path / "good" / video)[0])


def test_primitives_past_the_scene_capacity_are_not_read():
    counts = [np.array([[3, 4], [0, 1]]), np.array([[5, 5], [2, 0]])]  # (frames, worlds) per track
    take = drawn_counts(counts, 10)
    np.testing.assert_array_equal(take[0], [[3, 4], [0, 1]])
    np.testing.assert_array_equal(take[1], [[3, 0], [2, 0]])  # frame 0: 7 drawn before, 3 more fit
    assert drawn_counts([], 10) == []


# -- variant events: read whole to draw one frame --------------------------------------------------------
EVENTS = 1 << 22
EVENT_CHUNK = 1 << 16


def _events_archive(path: Path, n: int) -> Path:
    """One world whose geom_rgba has n events, all at frame 0 (valid: sorted by frame); the last wins."""
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(BALL), n_worlds=1, variant_fields=("geom_rgba",)) as w:
        w.set_variant(0, geom_rgba=[[0, 1, 0, 1]])
        for f in range(4):
            w.append(0.1 * f, _qpos(1))
    if n == 1:
        return path
    for column in ("frame", "world", "value"):  # fewer, larger chunks: quicker to write
        doc_path = path / "variants" / "geom_rgba" / column / "zarr.json"
        doc = json.loads(doc_path.read_text())
        doc["chunk_grid"]["configuration"]["chunk_shape"][0] = EVENT_CHUNK
        doc_path.write_text(json.dumps(doc))
        shutil.rmtree(path / "variants" / "geom_rgba" / column / "c", ignore_errors=True)
    root = json.loads((path / "zarr.json").read_text())
    root["attributes"]["mjarchive"]["variants"]["geom_rgba"].update(n_events=n, chunk_events=EVENT_CHUNK)
    (path / "zarr.json").write_text(json.dumps(root))
    commit = path / "_commit" / "zarr.json"
    if commit.exists():
        doc = json.loads(commit.read_text())
        doc["attributes"]["mjarchive_commit"]["n_events"]["geom_rgba"] = n
        commit.write_text(json.dumps(doc))
    with zarr.config.set({"array.write_empty_chunks": True}):  # the fill value is a committed event too
        group = zarr.open_group(str(path), mode="r+")
        for column in ("frame", "world", "value"):
            a = group[f"variants/geom_rgba/{column}"]
            a.resize((n, *a.shape[1:]))
            for lo in range(0, n, 1 << 21):
                hi = min(n, lo + (1 << 21))
                a[lo:hi] = np.full((hi - lo, *a.shape[1:]), 0.5 if column == "value" else 0, a.dtype)
        group["variants/geom_rgba/value"][n - 1] = np.array([[0, 0, 1, 1]], np.float32)
    return path


def test_variant_events_are_read_only_as_far_as_the_drawn_frames_need(tmp_path):
    # 2**22 events at frame 0: drawing frame 0 read every frame and world column whole, and sorted
    # them (2**24 events: a 512 MiB allocation, 1 GB peak, 16 s); now they are read backwards from
    # the last drawn frame until each drawn world's value is known, a block at a time.
    good_path = _events_archive(tmp_path / "good.mjarchive", 1)
    bad_path = _events_archive(tmp_path / "bad.mjarchive", EVENTS)
    good = _run("render", good_path, tmp_path / "good")
    bad = _run("render", bad_path, tmp_path / "bad")
    assert good.status == bad.status == "ok", (good, bad)
    _within(bad, good)
    with mjarchive.open(bad_path) as a:
        window = a.variant_window([0], [0, 3])
        for f in (0, 3):  # the last event at frame 0 is in force
            np.testing.assert_array_equal(window.values(0, f)["geom_rgba"], [[0, 0, 1, 1]])
        assert window.changes(0).tolist() == []


# -- the auto camera: frames × worlds × geoms ------------------------------------------------------------
AUTO_WORLDS, AUTO_FRAMES = 16, 32


def _geoms_archive(path: Path, n_geoms: int) -> Path:
    """16 worlds, 32 frames of a body with `n_geoms` geoms in group 3: framed by Camera.auto, not drawn."""
    geoms = "".join(f'<geom size=".01" group="3" pos="{(i % 100) * 0.01} {(i // 100) * 0.01} 0"/>'
                    for i in range(n_geoms))
    xml = f'<mujoco><worldbody><light pos="0 0 3"/><body><freejoint/><geom size=".1"/>{geoms}</body></worldbody></mujoco>'
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(xml), n_worlds=AUTO_WORLDS) as w:
        q = _qpos(AUTO_WORLDS)
        for f in range(AUTO_FRAMES):
            q[:, 0] = 0.01 * f
            w.append(0.1 * f, q)
    return path


def test_the_auto_camera_samples_a_bounded_number_of_geoms(tmp_path):
    # 16 worlds × 32 frames × 10000 geoms were posed into one array and copied five times to bound
    # it (0.6 GB; a 64-world scene of 20000 geoms took 5 GB and 90 s). Now at most
    # AUTO_SAMPLE_POINTS positions: the auto camera costs what a fixed camera does.
    path = _geoms_archive(tmp_path / "a.mjarchive", 10000)
    good = _run("first_frame_free", path, tmp_path / "good")
    bad = _run("first_frame_auto", path, tmp_path / "bad")
    assert good.status == bad.status == "ok", (good, bad)
    _within(bad, good)


def test_auto_geoms_keeps_the_first_and_last_within_the_budget():
    geoms = np.arange(8000)
    kept = auto_geoms(geoms, 512)
    assert len(kept) * 512 <= AUTO_SAMPLE_POINTS and kept[0] == 0 and kept[-1] == 7999
    np.testing.assert_array_equal(auto_geoms(geoms[:20], 512), geoms[:20])  # small models: every geom


# -- a committed frame count no chunk backs ------------------------------------------------------------

def _long_archive(path: Path, n_frames: int) -> Path:
    """4 frames written, then n_frames committed (the arrays declared that long, no chunk behind them)."""
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(BALL), n_worlds=1) as w:
        for f in range(4):
            w.append(0.1 * f, _qpos(1))
    for doc_path in path.rglob("zarr.json"):
        doc = json.loads(doc_path.read_text())
        if doc.get("node_type") == "array" and (doc.get("dimension_names") or [None])[0] == "frame":
            doc["shape"][0] = n_frames
            doc_path.write_text(json.dumps(doc))
    root = json.loads((path / "zarr.json").read_text())
    root["attributes"]["mjarchive"]["n_frames"] = n_frames
    (path / "zarr.json").write_text(json.dumps(root))
    commit = path / "_commit" / "zarr.json"
    if commit.exists():
        doc = json.loads(commit.read_text())
        doc["attributes"]["mjarchive_commit"]["n_frames"] = n_frames
        commit.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("n_frames, match", [(1 << 31, "draws at most"), ((1 << 22) - 10, "missing")])
def test_render_refuses_a_frame_count_before_building_its_index(tmp_path, n_frames, match):
    # `mjarchive render` of 2**31 committed frames built a 16 GiB index (100 s) before a missing chunk
    # was noticed; now the selection's size is checked, and its last chunk read, before any plan.
    good = _run("cli_render_all", _long_archive(tmp_path / "good.mjarchive", 4), tmp_path / "good")
    bad = _run("cli_render_all", _long_archive(tmp_path / "bad.mjarchive", n_frames), tmp_path / "bad")
    assert good.status == "ok", good
    assert bad.status == "error" and match in bad.message, bad
    _within(bad, good)


# -- a model that names its elements like the replay's own -------------------------------------------------
NAMED_LIKE_REPLAY = """<mujoco><worldbody><light pos="0 0 3"/>
<body name="a"><freejoint/><geom size=".1" rgba="1 0 0 1"/></body>
<body name="mjarchive-replay" pos=".5 0 0"><geom size=".1" rgba="0 1 0 1"/>
<camera name="mjarchive-replay-0" pos="0 -2 .5" xyaxes="1 0 0 0 .3 1"/></body></worldbody></mujoco>"""


@pytest.fixture(scope="module")
def named_like_replay(tmp_path_factory) -> Path:
    """A body and a camera named as the replay names its own, last in the model; variants of bodies,
    cameras and geoms (what the replay's element count matters to)."""
    path = tmp_path_factory.mktemp("names") / "a.mjarchive"
    with mjarchive.create(path, mjarchive.ModelBundle.from_xml(NAMED_LIKE_REPLAY), n_worlds=2,
                          variant_fields=("geom_rgba", "cam_fovy", "body_pos")) as w:
        w.set_variant([0, 1], geom_rgba=np.tile(np.float32([[0, 0, 1, 1], [1, 1, 0, 1]]), (2, 1, 1)))
        for f in range(3):
            w.append(0.1 * f, _qpos(2))
    return path


@pytest.mark.parametrize("layout", ["per-world", "scene"])
def test_a_model_may_use_the_replays_names(named_like_replay, tmp_path, layout):
    # Accepted by create() and verify(), but render() refused it (the body was taken for the replay's
    # own): the replay's names and elements never collide with a valid model's.
    with mjarchive.open(named_like_replay) as a:
        assert a.verify().ok
    paths = mjarchive.render(named_like_replay, tmp_path, layout=layout, size=(64, 64), quality="fast", workers=1,
                             progress=False)
    assert len(paths) == (2 if layout == "per-world" else 1)
    for p in paths:
        r, g, b = np.moveaxis(decode_video(p)[0].astype(int), -1, 0)
        assert r.shape[0] == 3
        # The model's red ball draws in each world's blue (its variant), nothing in red.
        assert ((b > r + 40) & (b > g + 40)).sum() > 50 and not ((r > g + 40) & (r > b + 40)).any()


def test_the_replays_cameras_take_free_names_and_are_found_by_place(named_like_replay):
    from mjarchive.replay.views.scene import ScenePlan, derived_model, replay_elements
    from mjarchive.replay.views.variant_map import VariantLayout

    with mjarchive.open(named_like_replay) as a:
        bundle, base = a.bundle, a.model()
        shapes = {name: tuple(spec.shape) for name, spec in a.manifest.variants.items()}
    one = derived_model(bundle, {"cameras": [45.0, 60.0]}, trusted=False)  # in the sandbox, as Warp builds it
    assert one.body(one.nbody - 1).name == "mjarchive-replay~1"
    assert [one.camera(one.ncam - 2 + j).name for j in range(2)] == ["mjarchive-replay~1-0", "mjarchive-replay~1-1"]
    assert one.camera("mjarchive-replay-0").id == 0  # the model's own camera keeps its name and id
    assert (replay_elements(one, "body"), replay_elements(one, "cam")) == (1, 2)
    for model in (base, one):  # the model's own last body and camera belong to the world
        layout = VariantLayout(model, shapes)
        assert [len(layout._rows[k][0].src) for k in ("body", "cam", "geom")] == [3, 1, 2]
    plan = ScenePlan.grid([0, 1], 2.0)
    scene = derived_model(bundle, plan.recipe([45.0]), trusted=False)  # copies prefixed: the plain name is free
    assert scene.body(scene.nbody - 1).name == "mjarchive-replay"
    assert plan.bodies_per_copy(scene) == 2
    VariantLayout(scene, shapes, plan)  # maps every copy's elements


def test_a_model_may_use_the_replays_names_on_warp(named_like_replay, tmp_path):
    # Warp renders a Camera through a camera the replay adds: it took the model's own name before.
    requires_warp_replay()
    for layout in ("per-world", "scene"):
        for p in mjarchive.render(named_like_replay, tmp_path / layout, layout=layout, backend="warp:cpu",
                                  cameras="auto", size=(64, 64), quality="fast", progress=False):
            r, g, b = np.moveaxis(decode_video(p)[0].astype(int), -1, 0)
            assert ((b > r + 40) & (b > g + 40)).sum() > 50 and not ((r > g + 40) & (r > b + 40)).any()
