"""Format 1.1 model variants: events per (world, field), committed with the frames they start at,
refused when hostile, and byte-compatible archives when unused."""

from __future__ import annotations

import json
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import AppendError, FormatError, FormatVersionError, LayoutMismatchError, SelectionError

XML = """<mujoco><asset><material name="m0" rgba="1 1 1 1"/><material name="m1" rgba="0 0 0 1"/></asset>
<worldbody><light pos="0 0 3"/><camera name="c" pos="0 -2 1" xyaxes="1 0 0 0 1 2"/>
<body name="a" pos="0 0 .5"><freejoint/><geom name="ball" size=".1" rgba="1 0 0 1"/>
<geom name="box" type="box" size=".1 .1 .1" pos=".3 0 0"/></body></worldbody></mujoco>"""
RED_GREEN = np.array([[1, 0, 0, 1], [0, 1, 0, 1]], np.float32)
BLUE_YELLOW = np.array([[0, 0, 1, 1], [1, 1, 0, 1]], np.float32)


@pytest.fixture
def xml(tmp_path) -> Path:
    path = tmp_path / "model.xml"
    path.write_text(XML)
    return path


def _qpos(n_worlds: int) -> np.ndarray:
    q = np.zeros((n_worlds, 7))
    q[:, 3] = 1
    return q


def _write(path, xml, *, frames=10, reset_at=6, **kwargs):
    w = mjarchive.create(path, xml, world_ids=[3, 7], variant_fields=("geom_rgba", "geom_size"), chunk_frames=4,
                         **kwargs)
    w.set_variant([3, 7], frame=0, geom_rgba=np.stack([RED_GREEN, BLUE_YELLOW]))
    for f in range(frames):
        if f == reset_at:
            w.set_variant(7, geom_rgba=RED_GREEN, geom_size=np.full((2, 3), 0.2))
        w.append(0.1 * (f + 1), _qpos(2), reset=np.array([False, f == reset_at]))
    return w


def test_values_in_force_per_world_and_frame(tmp_path, xml):
    _write(tmp_path / "a.zarr", xml).close()
    model = mujoco.MjModel.from_xml_path(str(xml))
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.format_version == "1.3"
        assert a.variant_fields == ("geom_rgba", "geom_size")
        assert a.variant_event_counts == {"geom_rgba": 3, "geom_size": 1}
        assert a.variant_changes(3).tolist() == [] and a.variant_changes(7).tolist() == [6]
        for f in range(10):
            np.testing.assert_array_equal(a.variant(3, f)["geom_rgba"], RED_GREEN)  # no leak from world 7
            np.testing.assert_array_equal(a.variant(3, f)["geom_size"], model.geom_size)
            np.testing.assert_array_equal(a.variant(7, f)["geom_rgba"], BLUE_YELLOW if f < 6 else RED_GREEN)
            np.testing.assert_array_equal(a.variant(7, f)["geom_size"], model.geom_size if f < 6 else 0.2)
        m = a.model(world=7, frame=-1)  # negative frames count from the end, as in select()
        np.testing.assert_array_equal(m.geom_rgba, RED_GREEN)
        np.testing.assert_array_equal(m.geom_size, 0.2)
        np.testing.assert_array_equal(a.model().geom_rgba, model.geom_rgba)  # the model as recorded
        with pytest.raises(SelectionError):
            a.variant(5, 0)
        with pytest.raises(SelectionError):
            a.variant(3, 10)
        with pytest.raises(SelectionError):
            a.model(world=3)
        assert a.verify().ok


def test_later_event_at_the_same_frame_wins_and_block_values(tmp_path, xml):
    w = mjarchive.create(tmp_path / "a.zarr", xml, n_worlds=2, variant_fields=("geom_rgba",))
    w.set_variant([0, 1], geom_rgba=RED_GREEN)
    w.set_variant(1, geom_rgba=BLUE_YELLOW)
    w.append(0.1, _qpos(2))
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        np.testing.assert_array_equal(a.variant(0, 0)["geom_rgba"], RED_GREEN)
        np.testing.assert_array_equal(a.variant(1, 0)["geom_rgba"], BLUE_YELLOW)


def test_events_are_committed_with_the_frame_they_start_at(tmp_path, xml):
    w = mjarchive.create(tmp_path / "a.zarr", xml, n_worlds=2, variant_fields=("geom_rgba",), chunk_frames=4)
    for f in range(5):
        w.append(0.1 * (f + 1), _qpos(2))
    w.set_variant(0, geom_rgba=BLUE_YELLOW)  # from frame 5, not yet appended
    w.flush()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.n_frames == 5 and a.variant_event_counts == {"geom_rgba": 0}
    w.append(0.6, _qpos(2))
    w.flush()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.n_frames == 6 and a.variant_event_counts == {"geom_rgba": 1}
        assert a.variant_changes(0).tolist() == [5]
    w.set_variant(1, frame=9, geom_rgba=BLUE_YELLOW)  # never reached: dropped at close
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.variant_event_counts == {"geom_rgba": 1}
        assert zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["variants/geom_rgba/value"].shape == (1, 2, 4)


def test_resume_continues_the_event_lists(tmp_path, xml):
    _write(tmp_path / "a.zarr", xml).close()
    with mjarchive.open(tmp_path / "a.zarr", mode="a") as w:
        w.set_variant(3, geom_size=np.full((2, 3), 0.05))
        w.append(1.1, _qpos(2))
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.variant_event_counts == {"geom_rgba": 3, "geom_size": 2}
        np.testing.assert_array_equal(a.variant(3, 10)["geom_size"], 0.05)
        np.testing.assert_array_equal(a.variant(7, 10)["geom_size"], 0.2)


def test_writer_refuses_bad_variants(tmp_path, xml):
    with pytest.raises(mjarchive.MjArchiveError, match="allowed"):
        mjarchive.create(tmp_path / "x.zarr", xml, n_worlds=1, variant_fields=("body_mass",))
    with pytest.raises(mjarchive.MjArchiveError, match="no site"):
        mjarchive.create(tmp_path / "y.zarr", xml, n_worlds=1, variant_fields=("site_rgba",))
    w = mjarchive.create(tmp_path / "a.zarr", xml, world_ids=[3, 7],
                         variant_fields=("geom_rgba", "body_quat", "geom_matid", "geom_dataid"))
    with pytest.raises(AppendError, match="not declared"):
        w.set_variant(3, geom_size=np.ones((2, 3)))
    with pytest.raises(AppendError, match="not recorded"):
        w.set_variant(4, geom_rgba=RED_GREEN)
    with pytest.raises(AppendError, match="shape"):
        w.set_variant(3, geom_rgba=np.ones((3, 4)))
    with pytest.raises(AppendError, match=r"\[0, 1\]"):
        w.set_variant(3, geom_rgba=RED_GREEN * 2)
    with pytest.raises(AppendError, match="unit norm"):
        w.set_variant(3, body_quat=np.full((2, 4), 0.7))
    with pytest.raises(AppendError, match="material"):
        w.set_variant(3, geom_matid=np.array([2, -1]))
    with pytest.raises(AppendError, match="mesh"):
        w.set_variant(3, geom_dataid=np.array([0, -1]))  # a sphere draws no mesh
    with pytest.raises(AppendError, match="integer"):
        w.set_variant(3, geom_matid=np.array([0.5, 1.0]))
    w.set_variant(3, frame=2, geom_matid=np.array([1, -1]))
    with pytest.raises(AppendError, match="frame order"):
        w.set_variant(3, frame=1, geom_rgba=RED_GREEN)
    w.append(0.1, _qpos(2))
    with pytest.raises(AppendError, match="already appended"):
        w.set_variant(3, frame=0, geom_rgba=RED_GREEN)
    w.close()
    w = mjarchive.create(tmp_path / "b.zarr", xml, n_worlds=1)
    with pytest.raises(AppendError, match="variant_fields"):
        w.set_variant(0, geom_rgba=RED_GREEN)
    w.close()


def test_archives_without_features_require_none(tmp_path, xml):
    w = mjarchive.create(tmp_path / "a.zarr", xml, n_worlds=2, chunk_frames=4)
    w.append(0.1, _qpos(2))
    w.close()
    root = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())["attributes"]["mjarchive"]
    assert root["format_version"] == "1.3"  # for its commit document, which 1.0 readers may ignore
    assert not {"required_features", "variants", "overlays"} & set(root)
    assert not (tmp_path / "a.zarr" / "variants").exists() and not (tmp_path / "a.zarr" / "overlays").exists()


# -- hostile archives ------------------------------------------------------------------------------------

def _edit_root(path: Path, edit) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    edit(doc["attributes"]["mjarchive"])
    (path / "zarr.json").write_text(json.dumps(doc))


@pytest.fixture
def written(tmp_path, xml) -> Path:
    _write(tmp_path / "a.zarr", xml).close()
    return tmp_path / "a.zarr"


@pytest.mark.parametrize("edit, error, match", [
    (lambda d: d["required_features"].append("teleport"), FormatVersionError, "teleport"),
    (lambda d: d.update(required_features=["overlays", "variants"]), FormatError, "required_features"),
    (lambda d: d.pop("required_features"), FormatError, "required_features"),
    (lambda d: d.update(format_version="1.0"), FormatError, "1.1"),
    (lambda d: d["variants"]["geom_rgba"].update(n_events=4), FormatError, "events"),
    (lambda d: d["variants"]["geom_rgba"].update(n_events=1 << 40), FormatError, "n_events"),
    (lambda d: d["variants"]["geom_rgba"].update(shape=[2, 3]), FormatError, "shape"),
    (lambda d: d["variants"]["geom_rgba"].update(dtype="float64"), FormatError, "dtype"),
    (lambda d: d["variants"].update(body_mass=d["variants"]["geom_size"]), FormatError, "allowed"),
    (lambda d: d["variants"]["geom_rgba"].update(chunk_events=1 << 16, shape=[1 << 16, 4]), FormatError,
     "chunk"),
    (lambda d: d["variants"]["geom_rgba"].update(extra=1), FormatError, "unknown"),
])
def test_hostile_variant_metadata_is_refused(written, edit, error, match):
    _edit_root(written, edit)
    with pytest.raises(error, match=match):
        mjarchive.open(written)


def test_unknown_feature_is_refused_whatever_the_minor_version(written):
    _edit_root(written, lambda d: d.update(format_version="1.9", required_features=[*d["required_features"], "x"]))
    with pytest.raises(FormatVersionError, match="upgrade"):
        mjarchive.open(written)


@pytest.mark.parametrize("key, index, value, match", [
    ("variants/geom_rgba/frame", 1, 7, "nondecreasing"),
    ("variants/geom_rgba/frame", 2, 10, "committed"),
    ("variants/geom_rgba/world", 1, 2, "world"),
    ("variants/geom_rgba/world", 1, -1, "world"),
    ("variants/geom_rgba/value", 2, np.full((2, 4), np.nan, np.float32), "finite"),
    ("variants/geom_rgba/value", 2, np.full((2, 4), 5, np.float32), r"\[0, 1\]"),
])
def test_hostile_event_rows_are_refused(written, key, index, value, match):
    zarr.open_group(str(written), mode="r+")[key][index] = value
    with mjarchive.open(written) as a:  # events are read lazily, when a value is asked for
        with pytest.raises(FormatError, match=match):
            for f in range(a.n_frames):
                a.variant(7, f)
        assert not a.verify().ok


def test_declared_shape_must_match_the_model(written):
    _edit_root(written, lambda d: d["variants"]["geom_size"].update(shape=[3, 3]))
    root = zarr.open_group(str(written), mode="r+")
    for key in ("variants/geom_size/value",):
        arr = root[key]
        data = arr[:]
        del root[key]
        root.create_array(key, shape=(data.shape[0], 3, 3), chunks=(arr.chunks[0], 3, 3), dtype="float64",
                          dimension_names=("event", "geom_size_0", "geom_size_1"))
    with mjarchive.open(written) as a:
        with pytest.raises(LayoutMismatchError, match="geom_size"):
            a.model()


def test_info_shows_variants_and_verify_reports_damage(written):
    from mjarchive.cli.info import archive_info, format_info

    with mjarchive.open(written) as a:
        info = archive_info(a)
    assert info["required_features"] == ["variants"]
    assert info["variants"]["geom_rgba"]["n_events"] == 3 and info["variants"]["geom_size"]["shape"] == [2, 3]
    assert "geom_rgba (2, 4) (3 events)" in format_info(info)
    (written / "variants" / "geom_size" / "value" / "c" / "0" / "0" / "0").unlink()
    with mjarchive.open(written) as a:
        report = a.verify()
        assert not report.ok and any("geom_size" in p for p in report.problems)


def test_pose_variants_move_geoms_and_sites_placed_in_their_body_frame(tmp_path):
    """MuJoCo ignores geom_pos/quat of geoms it flags as sharing their body's frame; a variant that
    moves one must still move it (the model's flag is cleared for the geoms that move)."""
    xml = """<mujoco><worldbody><body name="b" pos="0 0 1"><freejoint/><geom name="g" size=".1"/>
    <site name="s" size=".05"/></body></worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)
    assert model.geom_sameframe[0] and model.site_sameframe[0]  # the case under test
    w = mjarchive.create(tmp_path / "a.zarr", mjarchive.ModelBundle.from_xml(xml), n_worlds=1,
                         variant_fields=("geom_pos", "site_pos"))
    w.set_variant(0, frame=1, geom_pos=[[0.5, 0, 0]], site_pos=[[0, 0.25, 0]])
    q = np.array([[0, 0, 1, 1, 0, 0, 0]], float)
    w.append(0.1, q)
    w.append(0.2, q)
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        for frame, geom, site in [(0, [0, 0, 1], [0, 0, 1]), (1, [0.5, 0, 1], [0, 0.25, 1])]:
            m = a.model(world=0, frame=frame)
            d = mujoco.MjData(m)
            d.qpos[:] = q[0]
            mujoco.mj_kinematics(m, d)
            np.testing.assert_allclose(d.geom_xpos[0], geom)
            np.testing.assert_allclose(d.site_xpos[0], site)


# -- hostile archives, found by review -------------------------------------------------------------------

def _set_event_length(path: Path, field: str, n: int, chunk_events: int | None = None) -> None:
    """Declare `field`'s event arrays n rows long (optionally re-chunked), as a hostile or crashed
    writer could leave them; no chunk is written."""
    for column in ("frame", "world", "value"):
        doc_path = path / "variants" / field / column / "zarr.json"
        doc = json.loads(doc_path.read_text())
        doc["shape"][0] = n
        if chunk_events is not None:
            doc["chunk_grid"]["configuration"]["chunk_shape"][0] = chunk_events
        doc_path.write_text(json.dumps(doc))


def test_variants_null_is_refused(written):
    _edit_root(written, lambda d: d.update(variants=None, required_features=[]))
    with pytest.raises(FormatError, match="variants"):
        mjarchive.open(written)


def test_event_frames_that_wrap_around_int64_are_refused(written):
    # np.diff of these is nondecreasing (it wraps), although -2**63 and 2**63 - 1 are no committed frames.
    _edit_root(written, lambda d: d["variants"]["geom_rgba"].update(n_events=5))
    root = zarr.open_group(str(written), mode="r+")
    for key, rows in (("frame", [0, 2**63 - 1, -2**63, -1, 3]), ("world", [0, 1, 0, 1, 1])):
        root[f"variants/geom_rgba/{key}"].resize((5,))
        root[f"variants/geom_rgba/{key}"][:] = np.array(rows)
    root["variants/geom_rgba/value"].resize((5, 2, 4))
    root["variants/geom_rgba/value"][:] = np.full((5, 2, 4), 0.5, np.float32)
    with mjarchive.open(written) as a:
        with pytest.raises(FormatError, match="nondecreasing"):
            a.variant_changes(7)
        assert not a.verify().ok


def test_a_huge_event_count_in_tiny_chunks_fails_at_once(written):
    # 2**24 committed events in chunks of one, none stored: reading them all at once made zarr list
    # 2**24 chunk reads first (about 60 GB and 10 minutes) before failing at the first missing one.
    n = 1 << 24
    _edit_root(written, lambda d: d["variants"]["geom_rgba"].update(n_events=n, chunk_events=1))
    _set_event_length(written, "geom_rgba", n, chunk_events=1)
    with mjarchive.open(written) as a:
        with pytest.raises(FormatError, match="committed events is missing"):
            a.variant_changes(3)
        with pytest.raises(FormatError, match="missing"):
            a.variant_events("geom_rgba")
        assert not a.verify().ok


def test_event_arrays_longer_than_committed_stay_readable_and_resumable(written):
    # One commit may add any number of events: a writer that crashed after storing 65 chunks of them
    # but before its commit leaves longer arrays, which are no damage. A hostile 2**62 rows must not
    # make the resumed writer list chunks either.
    for n in (3 + 4096 * 65, 1 << 62):
        _set_event_length(written, "geom_rgba", n)
        with mjarchive.open(written) as a:
            assert a.variant_event_counts["geom_rgba"] == 3 and a.verify().ok
        with mjarchive.open(written, mode="a") as w:
            w.set_variant(3, geom_rgba=BLUE_YELLOW)
            w.append(1.0 + a.n_frames, _qpos(2))
        with mjarchive.open(written) as a:
            assert a.variant_event_counts["geom_rgba"] == 4 and a.verify().ok
            np.testing.assert_array_equal(a.variant(3, a.n_frames - 1)["geom_rgba"], BLUE_YELLOW)
        assert zarr.open_group(str(written), mode="r")["variants/geom_rgba/frame"].shape == (4,)
        _edit_root(written, lambda d: d["variants"]["geom_rgba"].update(n_events=3))  # for the next round


def test_writer_refuses_more_events_than_readers_accept(tmp_path, xml, monkeypatch):
    monkeypatch.setattr(mjarchive.archive.events, "MAX_VARIANT_EVENTS", 3)
    w = mjarchive.create(tmp_path / "a.zarr", xml, n_worlds=2, variant_fields=("geom_rgba",))
    w.set_variant([0, 1], geom_rgba=RED_GREEN)
    w.set_variant(0, geom_rgba=RED_GREEN)
    with pytest.raises(AppendError, match="allows 3"):
        w.set_variant(1, geom_rgba=RED_GREEN)  # would commit n_events = 4, which readers refuse
    w.append(0.1, _qpos(2))
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.variant_event_counts == {"geom_rgba": 3}


def test_huge_hostile_values_are_refused_without_warnings(written):
    import warnings

    from mjarchive.archive.variants import check_values

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning would escape as RuntimeWarning under -W error
        for field, width in (("body_quat", 4), ("light_dir", 3)):
            with pytest.raises(FormatError):
                check_values(field, np.full((1, 2, width), 1e300))
        root = zarr.open_group(str(written), mode="r+")
        time = root["time"][:]
        time[:2] = [1e308, -1e308]
        root["time"][:] = time
        with mjarchive.open(written) as a:
            assert any("time" in p for p in a.verify().problems)


def test_fovy_rule_follows_the_camera_projection(tmp_path):
    xml = """<mujoco><worldbody><camera name="p" fovy="45"/><camera name="o" projection="orthographic" fovy="3"/>
    <geom size=".1"/></worldbody></mujoco>"""
    w = mjarchive.create(tmp_path / "a.zarr", mjarchive.ModelBundle.from_xml(xml), n_worlds=1,
                         variant_fields=("cam_fovy",))
    with pytest.raises(AppendError, match="180"):
        w.set_variant(0, cam_fovy=[200.0, 3.0])  # a perspective camera's angle
    w.set_variant(0, cam_fovy=[60.0, 250.0])  # an orthographic camera's view height, in metres
    w.append(0.1, np.zeros((1, 0)))
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        np.testing.assert_array_equal(a.model(world=0, frame=0).cam_fovy, [60.0, 250.0])
