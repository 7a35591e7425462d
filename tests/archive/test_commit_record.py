"""The format 1.1 commit record: a small commit document per live commit, the root attributes at
creation and finalization only, the reader rule, resume, and the direct (zarr-free) read path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import FormatError, ModelBundle
from mjarchive.testing import deterministic_frames, hinge_chain_xml

W, NQ, CF = 3, 4, 4
SCHEMA = json.loads((Path(__file__).parents[2] / "spec" / "commit-document.schema.json").read_text())


def _create(path: Path, chunk_frames: int = CF):
    return mjarchive.create(path, ModelBundle.from_xml(hinge_chain_xml(NQ)), n_worlds=W, chunk_frames=chunk_frames)


def _append(writer, start: int, stop: int, nq: int = NQ) -> None:
    q = deterministic_frames(start, stop, len(writer.world_ids), nq)
    writer.append((np.arange(start, stop) + 1) / 64.0, q)


def _root(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_bytes())["attributes"]["mjarchive"]


def _commit_bytes(path: Path) -> bytes | None:
    doc = path / "_commit" / "zarr.json"
    return doc.read_bytes() if doc.exists() else None


def test_live_commits_write_only_the_commit_document(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path)
    root_at_creation = (path / "zarr.json").read_bytes()
    assert b"\n" not in root_at_creation, "the root document is written compactly"
    with mjarchive.open(path) as reader:
        for n in (3, 4, 9, 13):
            _append(writer, reader.n_frames if n != 3 else 0, n)
            writer.flush()
            assert (path / "zarr.json").read_bytes() == root_at_creation
            jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(_commit_bytes(path)))
            record = json.loads(_commit_bytes(path))["attributes"]["mjarchive_commit"]
            assert record == {"n_frames": n, "n_events": {}}
            assert reader.refresh() == n and reader.status == "live"
            np.testing.assert_array_equal(reader.select().qpos, deterministic_frames(0, n, W, NQ))
            assert reader._commit_source == "commit document"
        writer.close()
        assert reader.refresh() == 13 and reader.status == "finalized"
    assert _root(path)["n_frames"] == 13 and _root(path)["status"] == "finalized"
    kept = json.loads(_commit_bytes(path))["attributes"]["mjarchive_commit"]
    assert kept == {"n_frames": 13, "n_events": {}}, "finalizing keeps the commit document, with the final counts"
    assert mjarchive.open(path).verify().ok


def test_commit_document_size_does_not_depend_on_the_model(tmp_path):
    sizes = {}
    for nq in (2, 2000):
        bodies = "".join(f'<body name="b{i}"><joint name="a_long_joint_name_{i}"/><geom size=".1"/></body>'
                         for i in range(nq))
        path = tmp_path / f"m{nq}.zarr"
        xml = f"<mujoco><worldbody>{bodies}</worldbody></mujoco>"
        writer = mjarchive.create(path, ModelBundle.from_xml(xml), n_worlds=64, chunk_frames=CF)
        _append(writer, 0, CF + 1, nq)
        writer.flush()
        sizes[nq] = (len(_commit_bytes(path)), (path / "zarr.json").stat().st_size)
        writer.close()
    assert sizes[2][0] == sizes[2000][0] <= 128
    assert sizes[2000][1] > 500 * sizes[2000][0]  # what each commit rewrote before format 1.1


def test_resume_finalized_archive_sets_root_live_then_commits_in_the_document(tmp_path):
    path = tmp_path / "a.zarr"
    with _create(path) as w:
        _append(w, 0, 6)
    # A stale document (finalizing keeps the last live one; here one left behind by an older commit).
    (path / "_commit" / "zarr.json").write_text('{"zarr_format":3,"node_type":"group","attributes":'
                                                '{"mjarchive_commit":{"n_frames":2,"n_events":{}}}}')
    assert mjarchive.open(path).n_frames == 6  # a finalized root wins
    writer = mjarchive.open(path, mode="a")
    assert _root(path)["status"] == "finalized"  # nothing changes before the first commit
    _append(writer, 6, 7)
    writer.flush()
    assert _root(path)["status"] == "live" and _root(path)["n_frames"] == 7
    assert json.loads(_commit_bytes(path))["attributes"]["mjarchive_commit"]["n_frames"] == 7
    a = mjarchive.open(path)
    assert a.n_frames == 7 and a.status == "live"
    writer.close()
    a.refresh()
    assert a.n_frames == 7 and a.status == "finalized"
    assert json.loads(_commit_bytes(path))["attributes"]["mjarchive_commit"]["n_frames"] == 7
    np.testing.assert_array_equal(a.select().qpos, deterministic_frames(0, 7, W, NQ))


def test_crashed_live_archive_resumes_from_the_commit_document(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path)
    _append(writer, 0, 10)
    writer.flush()  # then the process "dies": the writer is never closed
    writer._lease.release()  # as the kernel releases a dead process's lock (test_single_writer kills one)
    resumed = mjarchive.open(path, mode="a")
    assert resumed.n_committed == 10
    _append(resumed, 10, 12)
    resumed.close()
    with mjarchive.open(path) as a:
        assert a.n_frames == 12 and a.verify().ok
        np.testing.assert_array_equal(a.select().qpos, deterministic_frames(0, 12, W, NQ))
    writer._closed = True  # the abandoned writer must not finalize on top (its thread is idle)


def test_format_1_0_archive_keeps_committing_in_its_root(tmp_path):
    path = tmp_path / "a.zarr"
    with _create(path) as w:
        _append(w, 0, 5)
    doc = json.loads((path / "zarr.json").read_bytes())
    doc["attributes"]["mjarchive"]["format_version"] = "1.0"
    (path / "zarr.json").write_text(json.dumps(doc))
    shutil.rmtree(path / "_commit")  # as a 1.0 writer left it
    writer = mjarchive.open(path, mode="a")
    _append(writer, 5, 9)
    writer.flush()
    assert _root(path)["n_frames"] == 9 and _root(path)["format_version"] == "1.0"
    assert _commit_bytes(path) is None
    writer.close()
    assert mjarchive.open(path).n_frames == 9


def test_hostile_commit_document_is_refused_with_its_rule(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path)
    _append(writer, 0, 5)
    writer.flush()
    good = _commit_bytes(path)
    for raw, match in [(good.replace(b'"n_frames":5', b'"n_frames":5.0'), "integer"),
                       (good.replace(b'"n_frames":5', b'"n_frames":500'), "exceeds"),
                       (good.replace(b'"n_events":{}', b'"n_events":{},"x":1'), "exactly"),
                       (b" " * (64 * 1024 + 1), "65536"), (b"[1]", "not a JSON object|group document")]:
        (path / "_commit" / "zarr.json").write_bytes(raw)
        with pytest.raises(FormatError, match=match):
            with mjarchive.open(path) as a:
                a.select().qpos
    writer._closed = True


def test_direct_reads_equal_zarr_reads(tmp_path):
    path = tmp_path / "a.zarr"
    ids = [9, 2, 40, 7, 11]
    with mjarchive.create(path, ModelBundle.from_xml(hinge_chain_xml(NQ)), world_ids=ids, chunk_frames=CF,
                          shard_worlds=2, tracks={"reward": ()}) as w:
        q = deterministic_frames(0, 23, len(ids), NQ)
        for f in range(23):
            w.append((f + 1) / 64.0, q[f], reward=np.full(len(ids), f, np.float32), reset=np.arange(len(ids)) == f % 5)
    stored = {name: zarr.open_array(path / name, mode="r")[...] for name in ("qpos", "reward", "reset", "time")}
    rng = np.random.default_rng(0)
    with mjarchive.open(path) as a:
        for _ in range(30):
            worlds = list(rng.choice(ids, size=int(rng.integers(1, 6)), replace=False))
            lo = int(rng.integers(0, 22))
            frames = [slice(lo, int(rng.integers(lo + 1, 24))), slice(lo, None, int(rng.integers(1, 5))),
                      rng.integers(0, 23, size=7)][int(rng.integers(0, 3))]
            sel = a.select(worlds=worlds, frames=frames)
            pos = [ids.index(w) for w in worlds]
            idx = sel.frame_indices
            for name in ("qpos", "reward", "reset"):
                np.testing.assert_array_equal(getattr(sel, name), stored[name][idx][:, pos])
            np.testing.assert_array_equal(sel.time, stored["time"][idx])
        assert a._store.reads_directly("qpos"), "the direct path served these reads"


@pytest.mark.parametrize("array", ["reset", "time", "world_id"])
def test_open_refuses_damaged_array_metadata(tmp_path, array):
    path = tmp_path / "a.zarr"
    with _create(path) as w:
        _append(w, 0, 5)
    with mjarchive.open(path) as a:  # a warm open of the intact archive (its checks are remembered)
        assert a.n_frames == 5
    (path / array / "zarr.json").write_text("{broken")
    with pytest.raises(FormatError, match=array):
        mjarchive.open(path)


def test_a_reader_rereads_a_partly_filled_shard_that_a_flush_replaced(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path, chunk_frames=64)
    try:
        _append(writer, 0, 65)  # one full chunk, one partly filled (big enough to compress)
        writer.flush()
        with mjarchive.open(path) as reader, mjarchive.open(path) as twin:
            before = reader.select().qpos
            _append(writer, 65, 100)
            writer.flush()  # replaces the partly filled shard: its index now has other offsets
            np.testing.assert_array_equal(reader.select().qpos, before)
            assert twin.refresh() == 100
            np.testing.assert_array_equal(twin.select().qpos, deterministic_frames(0, 100, W, NQ))
    finally:
        writer.close()


def test_opening_the_bundle_does_not_lower_the_committed_counts(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path)
    try:
        _append(writer, 0, 2 * CF)
        writer.flush()
        (path / "qpos" / "c" / "1" / "0" / "0").unlink()  # committed frames CF..2CF lost
        with mjarchive.open(path) as a:
            a.bundle  # zarr reads the (live, n_frames = 0) root document again
            with pytest.raises(FormatError, match="missing|committed"):
                a.select(frames=slice(CF, 2 * CF)).qpos
            assert not a.verify().ok
    finally:
        writer.close()


def test_a_refused_refresh_keeps_the_last_accepted_record(tmp_path):
    path = tmp_path / "a.zarr"
    writer = _create(path)
    try:
        _append(writer, 0, 5)
        writer.flush()
        with mjarchive.open(path) as a:
            _append(writer, 5, 9)
            writer.flush()
            (path / "reset" / "zarr.json").write_text("{broken")
            with pytest.raises(FormatError, match="reset"):
                a.refresh()
            assert a.n_frames == 5
            np.testing.assert_array_equal(a.select().qpos, deterministic_frames(0, 5, W, NQ))
    finally:
        writer._closed = True  # its arrays are damaged on purpose


def test_open_refuses_metadata_the_checked_store_cannot_read(tmp_path):
    path = tmp_path / "a.zarr"
    with _create(path) as w:
        _append(w, 0, 5)
    doc = json.loads((path / "qpos" / "zarr.json").read_bytes())
    inner = doc["codecs"][0]["configuration"]["codecs"]
    inner.insert(2, inner.pop(0))  # transpose after bytes: a bytes-to-bytes position
    (path / "qpos" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="qpos"):
        mjarchive.open(path)
