"""Multi-part archives (format 1.2 "parts"): many writers, one archive. Parts written here one after
another in one process; tests/archive/test_parts_concurrency.py runs writers in parallel processes."""

from __future__ import annotations

import json
import os
import shutil

import mujoco
import numpy as np
import pytest

import mjarchive
from mjarchive import (ArchiveExistsError, ArchiveNotFoundError, FormatError, FormatVersionError, MjArchiveError,
                       SelectionError, WriterLockedError)
from mjarchive.archive.parted_reader import open_part
from mjarchive.archive.parts import MAX_PARTS


def qpos_of(world: int, frames: np.ndarray, nq: int) -> np.ndarray:
    """Deterministic qpos of one world: distinct per world and frame, exact in float32."""
    return (world * 1000 + frames[:, None] + np.arange(nq) / 64).astype(np.float32)


def write_part(loc, xml, part, world_ids, n_frames, *, t0=0.0, nq=28, close=True, **kw):
    kw.setdefault("chunk_frames", 4)
    w = mjarchive.create(loc, xml, part=part, world_ids=world_ids, tracks={"reward": ()}, **kw)
    frames = np.arange(n_frames)
    qpos = np.stack([qpos_of(wid, frames, nq) for wid in world_ids], axis=1)
    reset = np.zeros((n_frames, len(world_ids)), bool)
    reset[n_frames // 2, 0] = True
    w.append(t0 + frames / 30.0, qpos, reset=reset, reward=qpos[..., 0] * 2)
    if close:
        w.close()
    return w


@pytest.fixture
def three_parts(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "rank1", [7, 3], 9)
    write_part(loc, humanoid_xml, "rank0", [0, 1, 2], 12)
    write_part(loc, humanoid_xml, "rank2", [42], 6, t0=0.1)
    return loc


def test_union_of_parts_reads_each_world_from_its_part(three_parts):
    a = mjarchive.open(three_parts)
    assert a.parts == ("rank0", "rank1", "rank2")
    assert a.world_ids == (0, 1, 2, 7, 3, 42)  # parts by name, each in its storage order
    assert a.n_frames == 6 and a.status == "finalized"
    assert [a.frames_of(w) for w in (0, 7, 42)] == [12, 9, 6]
    assert a.frames_of([0, 7]) == 9
    assert a.part_of(3) == "rank1" and a.part(a.part_of(3)).world_ids == (7, 3)
    sel = a.select()
    assert sel.shape == (6, 6)
    for j, wid in enumerate(sel.world_ids):
        np.testing.assert_array_equal(sel.qpos[:, j], qpos_of(wid, np.arange(6), a.nq))
        np.testing.assert_array_equal(sel.track("reward")[:, j], qpos_of(wid, np.arange(6), a.nq)[:, 0] * 2)
    # A selection reaches as far as the parts it involves: world 0 alone has all 12 of its frames.
    np.testing.assert_array_equal(a.select([0]).qpos[:, 0], qpos_of(0, np.arange(12), a.nq))
    np.testing.assert_array_equal(a.select([3, 1], frames=slice(5, 9)).qpos[:, 0], qpos_of(3, np.arange(5, 9), a.nq))
    with pytest.raises(SelectionError, match="past the 9 committed frames"):
        a.select([3, 1], frames=slice(5, 10))
    with pytest.raises(SelectionError, match="out of range"):
        a.select([42], frames=[6])
    # Episodes, time and the model come from the world's own part.
    assert a.episodes(7) == [range(0, 4), range(4, 9)] and a.episodes(0) == [range(0, 6), range(6, 12)]
    np.testing.assert_allclose(a.select([42]).time, 0.1 + np.arange(6) / 30)
    np.testing.assert_allclose(a.select([0]).time, np.arange(12) / 30)
    assert a.model().nq == a.nq
    report = a.verify()
    assert report.ok, str(report)
    assert any("part rank2" in line for line in report.checked)


def test_time_selection_across_parts_with_different_frames(three_parts):
    a = mjarchive.open(three_parts)
    # rank2 starts at t = 0.1 (its frame 0 is rank0's frame 3): the same time range, other indices.
    sel = a.select([0, 42], time=(0.1 - 1e-9, 0.2 - 1e-9))
    assert sel.shape == (3, 2)
    np.testing.assert_array_equal(sel.qpos[:, 0], qpos_of(0, np.arange(3, 6), a.nq))
    np.testing.assert_array_equal(sel.qpos[:, 1], qpos_of(42, np.arange(0, 3), a.nq))
    np.testing.assert_allclose(sel.time, np.arange(3, 6) / 30)
    with pytest.raises(SelectionError, match="different numbers of frames"):
        a.select([0, 42], time=(0.0, 1.0))  # 12 frames of rank0's, 6 of rank2's
    with pytest.raises(SelectionError, match="frames= or time="):
        a.select([0], frames=slice(0, 2), time=(0, 1))
    single = a.part("rank0")
    np.testing.assert_array_equal(single.select(time=(0.05, 0.1)).frame_indices, [2])


def test_refresh_sees_new_parts_and_frames_and_never_uncommitted(tmp_path, humanoid_xml):
    loc = tmp_path / "live.mjarchive"
    w0 = write_part(loc, humanoid_xml, "a", [0], 4, close=False)
    w0.flush()
    a = mjarchive.open(loc)
    assert a.parts == ("a",) and a.n_frames == 4 and a.status == "live"
    w1 = mjarchive.create(loc, humanoid_xml, part="b", world_ids=[1], tracks={"reward": ()}, chunk_frames=4)
    a.refresh()
    assert a.parts == ("a",) and a.pending_parts == ("b",)  # joined at its first commit
    w1.append(np.arange(3) / 30, qpos_of(1, np.arange(3), a.nq)[:, None], reward=np.zeros((3, 1)))  # not committed
    a.refresh()
    assert a.parts == ("a",)
    w1.flush()
    a.refresh()
    assert a.parts == ("a", "b") and a.world_ids == (0, 1) and a.frames_of(1) == 3 and a.n_frames == 3
    w0.close()
    w1.close()


def test_writers_are_refused_what_readers_would_refuse(tmp_path, humanoid_xml, mug_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "rank0", [0, 1], 4)
    for name in ("Rank1", "rank.1", "..", "", "a/b", "-a", "x" * 65, 3):
        with pytest.raises(MjArchiveError, match="part name"):
            mjarchive.create(loc, humanoid_xml, part=name, world_ids=[9])
    with pytest.raises(FormatError, match="created by part 'rank0'.*model bundle"):
        mjarchive.create(loc, mug_xml, part="rank1", world_ids=[9])
    with pytest.raises(FormatError, match="created by part 'rank0'.*timestep"):
        mjarchive.create(loc, humanoid_xml, part="rank1", world_ids=[9], timestep=0.5)
    with pytest.raises(FormatError, match="created by part 'rank0'.*output_fps"):
        mjarchive.create(loc, humanoid_xml, part="rank1", world_ids=[9], output_fps=60)
    with pytest.raises(MjArchiveError, match="claims world 1 of part 'rank0'"):
        mjarchive.create(loc, humanoid_xml, part="rank1", world_ids=[1, 5], tracks={"reward": ()}, chunk_frames=4)
    with pytest.raises(FormatError, match="records otherwise than part 'rank0'.*tracks"):
        mjarchive.create(loc, humanoid_xml, part="rank1", world_ids=[5], chunk_frames=4)
    with pytest.raises(ArchiveExistsError, match="mode='a', part='rank0'"):
        mjarchive.create(loc, humanoid_xml, part="rank0", world_ids=[5])
    with pytest.raises(MjArchiveError, match="multi-part archive: pass part="):
        mjarchive.open(loc, mode="a")
    with pytest.raises(ArchiveNotFoundError, match="no part 'rank9'"):
        mjarchive.open(loc, mode="a", part="rank9")
    # The refused attempts left nothing behind: still one part, whole.
    assert mjarchive.open(loc).parts == ("rank0",) and mjarchive.open(loc).verify().ok
    single = tmp_path / "single.mjarchive"
    mjarchive.create(single, humanoid_xml, n_worlds=1).close()
    with pytest.raises(ArchiveExistsError, match="single-part archive"):
        mjarchive.create(single, humanoid_xml, part="rank0", world_ids=[0])


def test_one_writer_per_part_and_resume_per_part(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    w0 = write_part(loc, humanoid_xml, "rank0", [0], 5, close=False)
    w0.flush()
    with pytest.raises(WriterLockedError, match="part 'rank0'"):
        mjarchive.open(loc, mode="a", part="rank0")
    write_part(loc, humanoid_xml, "rank1", [1], 3)  # another part: its own lease
    w0.close()
    w = mjarchive.open(loc, mode="a", part="rank1")
    assert w.part == "rank1" and w.n_frames == 3 and w.world_ids == (1,)
    w.append(3 / 30, qpos_of(1, np.array([3]), 28), reward=np.zeros(1))
    w.close()
    a = mjarchive.open(loc)
    assert (a.frames_of(0), a.frames_of(1)) == (5, 4)
    np.testing.assert_array_equal(a.select([1]).qpos[:, 0], qpos_of(1, np.arange(4), 28))
    # overwrite=True replaces that part only.
    write_part(loc, humanoid_xml, "rank1", [8, 9], 2, overwrite=True)
    a = mjarchive.open(loc)
    assert a.world_ids == (0, 8, 9) and a.frames_of(0) == 5 and a.frames_of(9) == 2


def test_recorder_records_a_part_under_global_ids(tmp_path, humanoid_xml):
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    loc = tmp_path / "rec.mjarchive"
    for rank in range(2):
        batch = [mujoco.MjData(model) for _ in range(3)]
        with mjarchive.Recorder(loc, humanoid_xml, part=f"rank{rank}", worlds=[0, 2],
                                world_ids=[10 * rank, 10 * rank + 1], output_fps=100) as rec:
            for step in range(30):
                for k, d in enumerate(batch):
                    d.qpos[2] = rank + k / 10 + step / 100
                    mujoco.mj_kinematics(model, d)
                    d.time = step * model.opt.timestep * 5
                rec.record(batch)
    a = mjarchive.open(loc)
    assert a.parts == ("rank0", "rank1") and a.world_ids == (0, 1, 10, 11)
    assert a.n_frames > 1
    z = a.select().qpos[-1, :, 2]
    assert z[0] == pytest.approx(z[2] - 1) and z[1] == pytest.approx(z[0] + 0.2)  # worlds 0 and 2 of each batch
    with pytest.raises(MjArchiveError, match="one ID per recorded world"):
        with mjarchive.Recorder(tmp_path / "bad.mjarchive", humanoid_xml, part="x", worlds=[0, 2], world_ids=[5],
                                n_worlds=3):
            pass


def test_memory_store_parts(humanoid_xml):
    loc = "memory://parts-test"
    write_part(loc, humanoid_xml, "a", [0], 3)
    write_part(loc, humanoid_xml, "b", [1], 3)
    a = mjarchive.open(loc)
    assert a.parts == ("a", "b")
    np.testing.assert_array_equal(a.select([1]).qpos[:, 0], qpos_of(1, np.arange(3), a.nq))


def test_variants_and_overlays_come_from_each_worlds_part(tmp_path, humanoid_xml):
    loc = tmp_path / "v.mjarchive"
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    for name, ids, shade in (("a", [0, 1], 0.25), ("b", [5], 0.75)):
        w = mjarchive.create(loc, humanoid_xml, part=name, world_ids=ids, chunk_frames=4, variant_fields=("geom_rgba",),
                             overlays={"dot": mjarchive.Overlay.points(max_count=2)})
        rgba = np.full((model.ngeom, 4), shade, np.float32)
        w.set_variant(ids[-1], 2, geom_rgba=rgba)
        dots = np.zeros((4, len(ids), 1, 3), np.float32) + shade
        w.append(np.arange(4) / 30, np.zeros((4, len(ids), model.nq), np.float32), overlays={"dot": dots})
        w.close()
    a = mjarchive.open(loc)
    assert a.variant(5, 1)["geom_rgba"][0, 0] == pytest.approx(model.geom_rgba[0, 0])
    assert a.variant(5, 2)["geom_rgba"][0, 0] == 0.75 and a.variant(1, 3)["geom_rgba"][0, 0] == 0.25
    assert a.variant(0, 3)["geom_rgba"][0, 0] == pytest.approx(model.geom_rgba[0, 0])
    events = a.variant_events("geom_rgba")
    assert events["frame"].tolist() == [2, 2] and [a.world_ids[w] for w in events["world"]] == [1, 5]
    window = a.variant_window([1, 5], np.arange(4))
    assert window.values(5, 3)["geom_rgba"][0, 0] == 0.75 and window.changes(1).tolist() == [2]
    assert a.variant_event_counts == {"geom_rgba": 2}
    ov = a.select([0, 5]).overlay("dot")
    np.testing.assert_allclose(np.asarray(ov.items(3, 1)), [[0.75] * 3])
    np.testing.assert_allclose(np.asarray(ov.items(3, 0)), [[0.25] * 3])
    assert a.model(world=5, frame=3).geom_rgba[0, 0] == 0.75


# -- hostile archives ---------------------------------------------------------------------------------------

def _graft(src, dest, name):
    """Copy part `name` of archive `src` into archive `dest` (what a buggy or hostile writer could leave)."""
    shutil.copytree(src / "parts" / name, dest / "parts" / name)


def test_parts_that_claim_each_others_worlds_or_differ_are_refused(tmp_path, humanoid_xml, mug_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0, 1], 4)
    other = tmp_path / "other.mjarchive"
    write_part(other, humanoid_xml, "b", [1, 2], 4)
    _graft(other, loc, "b")
    with pytest.raises(FormatError, match="world 1 is claimed by both part 'a' and part 'b'"):
        mjarchive.open(loc)
    shutil.rmtree(loc / "parts" / "b")
    mug = tmp_path / "mug.mjarchive"
    mjarchive.create(mug, mug_xml, part="c", world_ids=[9]).close()
    w = mjarchive.open(mug, mode="a", part="c")
    w.append(0.0, np.zeros((1, mujoco.MjModel.from_xml_path(str(mug_xml)).nq)))
    w.close()
    _graft(mug, loc, "c")
    with pytest.raises(FormatError, match="part 'c' differs from the archive created by part 'a'"):
        mjarchive.open(loc)
    shutil.rmtree(loc / "parts" / "c")
    slow = tmp_path / "slow.mjarchive"
    write_part(slow, humanoid_xml, "d", [5], 4, chunk_frames=2)
    _graft(slow, loc, "d")
    with pytest.raises(FormatError, match="parts 'a' and 'd' record differently: chunk_frames"):
        mjarchive.open(loc)


@pytest.mark.parametrize("entry", ["Rank0", "a.b", "x" * 65, "-a"])
def test_bad_part_folder_names_are_refused(tmp_path, humanoid_xml, entry):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    shutil.copytree(loc / "parts" / "a", loc / "parts" / entry)
    with pytest.raises(FormatError, match="not a part name"):
        mjarchive.open(loc)


def test_links_in_parts_are_refused(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    outside = tmp_path / "outside.mjarchive"
    write_part(outside, humanoid_xml, "b", [1], 2)
    os.symlink(outside / "parts" / "b", loc / "parts" / "b")
    with pytest.raises(FormatError, match="link, FIFO or device"):
        mjarchive.open(loc)
    os.unlink(loc / "parts" / "b")
    os.rename(loc / "parts", tmp_path / "real-parts")
    os.symlink(tmp_path / "real-parts", loc / "parts")
    with pytest.raises(FormatError, match="'parts' .* is a symbolic link"):
        mjarchive.open(loc)


def test_thousands_of_parts_are_bounded(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    for k in range(MAX_PARTS + 1):
        os.mkdir(loc / "parts" / f"p{k}")
    with pytest.raises(FormatError, match=f"more than {MAX_PARTS} parts"):
        mjarchive.open(loc)


def test_parts_without_documents_are_pending_not_errors(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    os.mkdir(loc / "parts" / "b")  # a writer that has only just begun
    (loc / "parts" / "c").mkdir()
    (loc / "parts" / "c" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    a = mjarchive.open(loc)
    assert a.parts == ("a",) and a.pending_parts == ("b", "c")


def _edit_root(loc, change):
    doc = json.loads((loc / "zarr.json").read_text())
    change(doc["attributes"]["mjarchive"])
    (loc / "zarr.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(world_ids=[0]), "must not hold \\['world_ids'\\]"),
    (lambda d: d.update(required_features=["parts", "variants"]), "exactly \\['parts'\\]"),
    (lambda d: d["parts"].update(created_by="A/../b"), "parts.created_by"),
    (lambda d: d.pop("parts"), r"missing required key\(s\) \['parts'\]"),
    (lambda d: d.update(format_version="1.1"), "parts need format 1.2"),
    (lambda d: d.update(timestep=float("nan")), "timestep"),
])
def test_hostile_parts_roots_are_refused(tmp_path, humanoid_xml, change, match):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    _edit_root(loc, change)
    with pytest.raises(FormatError, match=match):
        mjarchive.open(loc)


def test_a_reader_without_parts_refuses_a_multi_part_archive(tmp_path, humanoid_xml, monkeypatch):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    import mjarchive.archive.manifest as manifest

    monkeypatch.setattr(manifest, "KNOWN_FEATURES", frozenset({"variants", "overlays"}))  # a 1.1 reader
    with pytest.raises(FormatVersionError, match=r"requires feature\(s\) \['parts'\]"):
        mjarchive.open(loc)


def test_a_part_deleted_while_open_fails_clearly_then_drops_out(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 6)
    write_part(loc, humanoid_xml, "b", [1], 6)
    a = mjarchive.open(loc)
    shutil.rmtree(loc / "parts" / "b")
    with pytest.raises(FormatError):
        a.select([1]).qpos
    assert a.refresh() == 6 and a.parts == ("a",) and a.world_ids == (0,)
    shutil.rmtree(loc / "parts" / "a")
    with pytest.raises(MjArchiveError, match="no part with committed frames"):
        a.refresh()
    assert a.parts == ("a",)  # a refused refresh leaves the last accepted state


def test_render_units_of_one_world_open_only_its_part(three_parts, tmp_path):
    from mjarchive.replay import worker

    a = mjarchive.open(three_parts)
    part = open_part(three_parts, "rank1")
    assert part.parts == ("rank1",) and part.world_ids == (7, 3)
    with pytest.raises(SelectionError):
        open_part(three_parts, "../x")
    unit_archive = worker._open(str(three_parts), None, "s1", "rank2")
    assert unit_archive.parts == ("rank2",)
    out = mjarchive.render(a, tmp_path / "videos", worlds=[3, 42], cameras=[0], size=(16, 16), progress=False,
                           hud="time")
    assert sorted(p.name.split("_")[0] for p in out) == ["world-0003", "world-0042"]
    assert all(p.stat().st_size > 0 for p in out)


def test_what_opening_all_parts_costs_is_bounded(three_parts, monkeypatch):
    from mjarchive.archive import parts

    monkeypatch.setattr(parts, "MAX_WORLDS", 5)  # the union of 6 worlds is one too many
    with pytest.raises(FormatError, match="more than 5 worlds together"):
        mjarchive.open(three_parts)
    monkeypatch.setattr(parts, "MAX_WORLDS", 6)
    assert mjarchive.open(three_parts).n_worlds == 6
    size = (three_parts / "parts" / "rank0" / "zarr.json").stat().st_size
    monkeypatch.setattr(parts, "MAX_PART_DOCUMENT_BYTES", 2 * size)
    with pytest.raises(FormatError, match="documents hold more than"):
        mjarchive.open(three_parts)


def test_a_single_archive_never_overwrites_a_multi_part_one(three_parts, humanoid_xml):
    with pytest.raises(ArchiveExistsError, match="multi-part archive"):
        mjarchive.create(three_parts, humanoid_xml, n_worlds=1, overwrite=True)
    assert mjarchive.open(three_parts).parts == ("rank0", "rank1", "rank2")


def test_a_damaged_root_does_not_let_a_single_archive_delete_the_parts(three_parts, humanoid_xml):
    _edit_root(three_parts, lambda d: d.update(required_features=["parts", "from-the-future"]))
    with pytest.raises(ArchiveExistsError, match="multi-part archive"):
        mjarchive.create(three_parts, humanoid_xml, n_worlds=1, overwrite=True)
    assert sorted(os.listdir(three_parts / "parts")) == ["rank0", "rank1", "rank2", "zarr.json"]


def test_a_selection_keeps_its_worlds_when_parts_join_later(tmp_path, humanoid_xml):
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "m", [5], 4)
    a = mjarchive.open(loc)
    by_frames, by_time = a.select([5]), a.select([5], time=(0, 1))
    write_part(loc, humanoid_xml, "a", [9], 4)  # sorts first: every position moves
    a.refresh()
    assert a.world_ids == (9, 5)
    for sel in (by_frames, by_time):
        assert sel.world_ids == (5,)
        np.testing.assert_array_equal(sel.qpos[:, 0], qpos_of(5, np.arange(4), a.nq))
    empty = a.select([])
    assert empty.shape == (4, 0) and empty.qpos.shape == (4, 0, a.nq) and a.frames_of([]) == a.n_frames


def test_a_part_belongs_to_its_archive_and_errors_name_their_part(three_parts):
    a = mjarchive.open(three_parts)
    part = a.part("rank1")
    with pytest.raises(MjArchiveError, match="refresh the archive"):
        part.refresh()
    with part:  # closing a part leaves its archive open
        assert part.n_frames == 9
    np.testing.assert_array_equal(a.select([3]).qpos[:, 0], qpos_of(3, np.arange(9), a.nq))
    (three_parts / "parts" / "rank1" / "qpos" / "c" / "0" / "0" / "0").unlink()
    with pytest.raises(FormatError, match=r"part 'rank1' \(parts/rank1/\): .*missing"):
        a.select([7]).qpos
    (three_parts / "parts" / "rank1" / "reset" / "c" / "0" / "0").unlink()
    with pytest.raises(FormatError, match=r"part 'rank1' \(parts/rank1/\): .*missing"):
        a.episodes(7)
    with pytest.raises(ArchiveNotFoundError, match="no part 'nope'"):
        open_part(three_parts, "nope")


def test_writers_meet_what_is_not_an_archive_with_clear_errors(tmp_path, humanoid_xml):
    afile = tmp_path / "file.mjarchive"
    afile.write_text("not an archive")
    with pytest.raises(ArchiveExistsError, match="is a file"):
        mjarchive.create(afile, humanoid_xml, part="a", world_ids=[0])
    loc = tmp_path / "run.mjarchive"
    write_part(loc, humanoid_xml, "a", [0], 2)
    shutil.rmtree(loc / "parts")
    (loc / "parts").write_text("a file where the parts folder belongs")
    with pytest.raises(FormatError, match="a file stands where a folder belongs"):
        mjarchive.create(loc, humanoid_xml, part="b", world_ids=[1])


def test_resuming_a_part_checks_it_against_the_root_and_the_other_parts(three_parts, tmp_path, humanoid_xml):
    other = tmp_path / "other.mjarchive"
    write_part(other, humanoid_xml, "rank9", [42, 43], 3)  # claims rank2's world 42
    _graft(other, three_parts, "rank9")
    with pytest.raises(MjArchiveError, match="part 'rank9' claims world 42 of part 'rank2'"):
        mjarchive.open(three_parts, mode="a", part="rank9")
    shutil.rmtree(three_parts / "parts" / "rank9")
    _edit_root(three_parts, lambda d: d.update(timestep=0.5))
    with pytest.raises(FormatError, match="part 'rank1' differs from the archive created by part 'rank1'"):
        mjarchive.open(three_parts, mode="a", part="rank1")


@pytest.mark.parametrize("change, match", [
    (lambda doc: doc.update(node_type="array"), "not a Zarr v3 group document"),
    (lambda doc: doc.update(attributes=[1]), "not a Zarr v3 group document"),
    (lambda doc: doc["attributes"]["mjarchive"].update(format_version="1.1"), "parts are format 1.2 or later"),
])
def test_hostile_part_documents_are_refused_naming_the_part(three_parts, change, match):
    path = three_parts / "parts" / "rank2" / "zarr.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=rf"part 'rank2' \(parts/rank2/\): .*{match}"):
        mjarchive.open(three_parts)


def test_an_object_named_like_a_part_does_not_hide_it(humanoid_xml):
    import zarr.core.buffer
    from zarr.core.sync import sync

    from mjarchive.archive.storage.locations import _memory_store

    loc = "memory://parts-hidden"
    write_part(loc, humanoid_xml, "a", [0], 2)
    write_part(loc, humanoid_xml, "b", [1], 2)
    store = _memory_store(loc, read_only=False)
    sync(store.set("parts/b", zarr.core.buffer.default_buffer_prototype().buffer.from_bytes(b"x")))
    assert mjarchive.open(loc).parts == ("a", "b")


def test_a_pending_part_keeps_the_archive_live_and_empty_selections_are_empty(three_parts, humanoid_xml):
    assert mjarchive.open(three_parts).status == "finalized"
    w = mjarchive.create(three_parts, humanoid_xml, part="rank3", world_ids=[99], tracks={"reward": ()},
                         chunk_frames=4)
    a = mjarchive.open(three_parts)
    assert a.status == "live" and a.pending_parts == ("rank3",)
    w.close()
    empty = a.select([])  # the parts have 12, 9 and 6 frames: an empty selection has the common 6
    assert empty.shape == (6, 0) and empty.qpos.shape == (6, 0, a.nq)
    with pytest.raises(SelectionError):
        a.select([], frames=slice(0, 8))
