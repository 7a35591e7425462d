"""`mjarchive.compact`: several archives of one model (seeds) or a multi-part archive rewritten into one
single-part archive, bit for bit as stored, or refused with a message that says what to do."""

from __future__ import annotations


import numpy as np
import pytest

import mjarchive
from mjarchive import MjArchiveError, Overlay, SelectionError
from mjarchive.archive import compact as compact_module
from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

OVERLAYS = {"target": Overlay.points(radius=0.03, max_count=3), "label": Overlay.text(max_count=2, max_chars=8)}


@pytest.fixture(scope="session")
def pendula_xml(test_data):
    """41 qpos, 2 mocap bodies, 20 geoms, 7 cameras."""
    return test_data / "pendula.xml"


def record(path, xml, world_ids, n_frames=10, seed=0, *, dt=0.05, chunk_frames=4, variants=True, overlays=True,
           **create_options):
    """An archive of random but valid frames: resets, tracks, overlays and variant changes at resets."""
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(xml))
    rng = np.random.default_rng(seed)
    W = len(world_ids)
    options = dict(world_ids=world_ids, chunk_frames=chunk_frames, output_fps=20.0, playback_speed=0.5,
                   tracks={"qvel": (model.nv,), "shape": ()}, **create_options)
    if variants:
        options["variant_fields"] = ("geom_rgba",)
    if overlays:
        options["overlays"] = OVERLAYS
    with mjarchive.create(path, xml, **options) as w:
        if variants:
            w.set_variant(world_ids, frame=0, geom_rgba=rng.uniform(0, 1, (W, model.ngeom, 4)))
        for f in range(n_frames):
            reset = rng.random(W) < 0.3
            if variants and reset.any():
                ids = [i for i, r in zip(world_ids, reset) if r]
                w.set_variant(ids, geom_rgba=rng.uniform(0, 1, (len(ids), model.ngeom, 4)))
            frame_overlays = None
            if overlays:
                frame_overlays = {
                    "target": [rng.normal(size=(int(rng.integers(0, 4)), 3)) for _ in world_ids],
                    "label": [[("a" * int(rng.integers(1, 8)))] if rng.random() < 0.5 else
                              [(rng.normal(size=3), "pos")] for _ in world_ids],
                }
            mocap = {}
            if model.nmocap:
                mocap = dict(mocap_pos=rng.normal(size=(W, model.nmocap, 3)),
                             mocap_quat=rng.normal(size=(W, model.nmocap, 4)))
            w.append(dt * (f + 1), rng.normal(size=(W, model.nq)), reset=reset, qvel=rng.normal(size=(W, model.nv)),
                     shape=rng.normal(size=W), overlays=frame_overlays, **mocap)
    return path


def assert_copied(out, src, new_ids, out_frames=None, src_frames=None):
    """Every stored value of `src` (all worlds, `src_frames`) equals `out`'s at `new_ids`, `out_frames`."""
    a = out.select(worlds=list(new_ids), frames=out_frames)
    b = src.select(frames=src_frames)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.time, b.time)
    for name in ("qpos", "reset", *(("mocap_pos", "mocap_quat") if src.nmocap else ())):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name  # bit for bit
    for name in src.tracks:
        assert a.track(name).tobytes() == b.track(name).tobytes(), name
    for name in src.overlays:
        x, y = a.overlay(name), b.overlay(name)
        np.testing.assert_array_equal(x.count, y.count)
        assert x.data.tobytes() == y.data.tobytes(), name  # NaN text anchors too
        assert x.text == y.text
    for field in src.variant_fields:
        for f_out, f_src in zip(a.frame_indices.tolist(), b.frame_indices.tolist()):
            for new, old in zip(new_ids, src.world_ids):
                np.testing.assert_array_equal(out.variant(new, f_out)[field], src.variant(old, f_src)[field])


@pytest.mark.parametrize("storage", [{}, {"dtype": "float64"}, {"precision": 1e-3}])
def test_seeds_share_ids_refused_then_renumbered(tmp_path, pendula_xml, storage):
    seeds = [record(tmp_path / f"seed{s}.mjarchive", pendula_xml, [0, 1, 2], seed=s, **storage) for s in range(2)]
    dest = tmp_path / "all.mjarchive"
    with pytest.raises(MjArchiveError, match=r"world ID 0 is in both .*seed0.* and .*seed1.*renumber"):
        mjarchive.compact(seeds, dest)
    assert not dest.exists()

    calls = []
    result = mjarchive.compact(seeds, dest, renumber=True, progress=lambda done, total: calls.append((done, total)))
    assert [(m.source, m.part, m.old_id, m.new_id) for m in result.worlds] == [
        (str(seeds[s]), None, old, 3 * s + old) for s in range(2) for old in range(3)]
    assert (result.n_worlds, result.n_frames) == (6, 10)
    assert calls == [(4, 10), (8, 10), (10, 10)]  # one block per chunk of 4 frames
    with mjarchive.open(dest) as out:
        assert out.verify().ok and out.status == "finalized" and out.world_ids == tuple(range(6))
        for s, path in enumerate(seeds):
            with mjarchive.open(path) as src:
                assert assert_copied(out, src, range(3 * s, 3 * s + 3)) is None
                for key in ("dtype", "abs_error", "chunk_frames", "tracks", "output_fps", "playback_speed",
                            "timestep", "model_sha256", "layout", "variants", "overlays"):
                    assert getattr(out.manifest, key) == getattr(src.manifest, key), key


def test_distinct_ids_are_kept_and_blocks_smaller_than_a_chunk(tmp_path, humanoid_xml, monkeypatch):
    a = record(tmp_path / "a.mjarchive", humanoid_xml, [3, 7], seed=1)
    b = record(tmp_path / "b.mjarchive", humanoid_xml, [5], seed=2)
    # One frame per block: blocks that split the writer's chunks still copy every value.
    monkeypatch.setattr(compact_module, "BLOCK_BYTES", 1)
    calls = []
    result = mjarchive.compact([a, b], tmp_path / "ab.mjarchive", progress=lambda d, t: calls.append(d))
    assert calls == list(range(1, 11))
    assert [m.new_id for m in result.worlds] == [3, 7, 5]
    with mjarchive.open(tmp_path / "ab.mjarchive") as out, mjarchive.open(a) as sa, mjarchive.open(b) as sb:
        assert out.world_ids == (3, 7, 5) and out.verify().ok
        assert_copied(out, sa, [3, 7])
        assert_copied(out, sb, [5])
        assert out.episodes(7) == sa.episodes(7)


def test_other_model_or_settings_refused_naming_both(tmp_path, humanoid_xml, pendula_xml):
    a = record(tmp_path / "a.mjarchive", humanoid_xml, [0], variants=False, overlays=False)
    cases = {
        "model bundle": dict(xml=pendula_xml),
        "storage dtype": dict(dtype="float64"),
        "precision": dict(precision=1e-3),
        "tracks": dict(tracks_off=True),
        "variant fields": dict(variants=True),
        "overlays": dict(overlays=True),
    }
    for what, change in cases.items():
        path = tmp_path / f"b-{what.replace(' ', '-')}.mjarchive"
        options = dict(variants=False, overlays=False)
        options.update({k: v for k, v in change.items() if k not in ("xml", "tracks_off")})
        if change.get("tracks_off"):
            import mujoco

            with mjarchive.create(path, humanoid_xml, world_ids=[1], chunk_frames=4, output_fps=20.0,
                                  playback_speed=0.5) as w:
                for f in range(10):
                    w.append(0.05 * (f + 1), np.zeros((1, mujoco.MjModel.from_xml_path(str(humanoid_xml)).nq)))
        else:
            record(path, change.get("xml", humanoid_xml), [1], **options)
        with pytest.raises(MjArchiveError, match=rf"a\.mjarchive and .*b-.* differ in {what}"):
            mjarchive.compact([a, path], tmp_path / "out.mjarchive")
        assert not (tmp_path / "out.mjarchive").exists()


def test_frame_counts_differ_refused_then_a_common_range(tmp_path, pendula_xml):
    a = record(tmp_path / "a.mjarchive", pendula_xml, [0, 1], n_frames=10, seed=1)
    b = record(tmp_path / "b.mjarchive", pendula_xml, [2], n_frames=7, seed=2)
    dest = tmp_path / "out.mjarchive"
    with pytest.raises(SelectionError, match=r"a\.mjarchive: 10, .*b\.mjarchive: 7\).*--frames :7"):
        mjarchive.compact([a, b], dest)
    with pytest.raises(SelectionError, match=r"past the 7 committed frames of .*b\.mjarchive"):
        mjarchive.compact([a, b], dest, frames=slice(0, 9))
    with pytest.raises(SelectionError, match="different frames in inputs of different lengths"):
        mjarchive.compact([a, b], dest, frames=slice(-3, None))
    with pytest.raises(SelectionError, match="consecutive frames"):
        mjarchive.compact([a, b], dest, frames=slice(0, 6, 2))
    assert not dest.exists()

    assert mjarchive.compact([a, b], dest, frames=slice(None, 7)).n_frames == 7
    with mjarchive.open(dest) as out, mjarchive.open(a) as sa, mjarchive.open(b) as sb:
        assert out.verify().ok and out.n_frames == 7
        assert_copied(out, sa, [0, 1], src_frames=slice(0, 7))
        assert_copied(out, sb, [2])

    # A range that starts later: the variant values in force at its first frame carry over to frame 0.
    mjarchive.compact([a, b], dest, frames=slice(3, 7), overwrite=True)
    with mjarchive.open(dest) as out, mjarchive.open(a) as sa, mjarchive.open(b) as sb:
        assert out.verify().ok and out.n_frames == 4
        assert_copied(out, sa, [0, 1], src_frames=slice(3, 7))
        assert_copied(out, sb, [2], src_frames=slice(3, 7))


def test_other_times_refused(tmp_path, humanoid_xml):
    a = record(tmp_path / "a.mjarchive", humanoid_xml, [0], dt=0.05)
    b = record(tmp_path / "b.mjarchive", humanoid_xml, [1], dt=0.04)
    with pytest.raises(SelectionError, match=r"differ in time at frame 0 .*share one time axis"):
        mjarchive.compact([a, b], tmp_path / "out.mjarchive")


def test_destination_must_be_new(tmp_path, humanoid_xml):
    a = record(tmp_path / "a.mjarchive", humanoid_xml, [0], variants=False, overlays=False)
    b = record(tmp_path / "b.mjarchive", humanoid_xml, [1], variants=False, overlays=False)
    with pytest.raises(MjArchiveError, match="is one of the sources"):
        mjarchive.compact([a, b], str(b), overwrite=True)
    with pytest.raises(mjarchive.ArchiveExistsError):
        mjarchive.compact([a], b)
    with mjarchive.open(b) as kept:
        assert kept.world_ids == (1,) and kept.verify().ok


def test_on_s3(s3_server, s3_url, pendula_xml):
    so = s3_server.storage_options()
    base = s3_url.rsplit("/", 1)[0]
    seeds = [record(f"{base}/seed{s}.mjarchive", pendula_xml, [0, 1], seed=s, storage_options=so) for s in range(2)]
    with pytest.raises(MjArchiveError, match="is one of the sources"):
        mjarchive.compact(seeds, seeds[1] + "/", renumber=True, overwrite=True, storage_options=so)
    result = mjarchive.compact(seeds, f"{base}/all.mjarchive", renumber=True, storage_options=so)
    assert result.n_worlds == 4
    with mjarchive.open(f"{base}/all.mjarchive", storage_options=so) as out:
        assert out.verify().ok
        for s, url in enumerate(seeds):
            with mjarchive.open(url, storage_options=so) as src:
                assert_copied(out, src, [2 * s, 2 * s + 1])


def test_multi_part_archive_becomes_one(tmp_path, pendula_xml):
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(pendula_xml))
    path = tmp_path / "parts.mjarchive"
    rng = np.random.default_rng(0)
    expected = {}
    for part, ids in (("rank1", [4, 5]), ("rank0", [0, 9])):  # written out of name order
        with mjarchive.create(path, pendula_xml, part=part, world_ids=ids, chunk_frames=4,
                              variant_fields=("geom_rgba",), overlays=OVERLAYS) as w:
            w.set_variant(ids, frame=0, geom_rgba=rng.uniform(0, 1, (2, model.ngeom, 4)))
            for f in range(6):
                q = rng.normal(size=(2, model.nq))
                expected.update({(i, f): q[j] for j, i in enumerate(ids)})
                w.append(0.05 * (f + 1), q, mocap_pos=rng.normal(size=(2, 2, 3)),
                         mocap_quat=rng.normal(size=(2, 2, 4)),
                         overlays={"target": [rng.normal(size=(1, 3)), None]})
    dest = tmp_path / "one.mjarchive"
    result = mjarchive.compact(path, dest)
    assert [(m.part, m.old_id) for m in result.worlds] == [("rank0", 0), ("rank0", 9), ("rank1", 4), ("rank1", 5)]
    with mjarchive.open(dest) as out, mjarchive.open(path) as src:
        assert out.parts == () and out.world_ids == (0, 9, 4, 5) and out.verify().ok
        for name in src.parts:
            part = src.part(name)
            assert_copied(out, part, list(part.world_ids))
        for (i, f), q in expected.items():
            np.testing.assert_array_equal(out.select(worlds=[i], frames=[f]).qpos[0, 0], q.astype(np.float32))

    # A part that recorded fewer frames: refused with the counts per part, then a common range.
    with mjarchive.create(path, pendula_xml, part="rank2", world_ids=[7], chunk_frames=4,
                          variant_fields=("geom_rgba",), overlays=OVERLAYS) as w:
        for f in range(3):
            w.append(0.05 * (f + 1), rng.normal(size=(1, model.nq)), mocap_pos=np.zeros((1, 2, 3)),
                     mocap_quat=np.ones((1, 2, 4)))
    with pytest.raises(SelectionError, match=r"part 'rank1'\): 6, .*part 'rank2'\): 3\).*--frames :3"):
        mjarchive.compact(path, dest, overwrite=True)
    assert mjarchive.compact(path, dest, frames=slice(0, 3), overwrite=True).n_worlds == 5
    with mjarchive.open(dest) as out, mjarchive.open(path) as src:
        assert out.world_ids == (0, 9, 4, 5, 7) and out.n_frames == 3 and out.verify().ok
        for name in src.parts:
            part = src.part(name)
            assert_copied(out, part, list(part.world_ids), src_frames=slice(0, 3))
