"""Format 1.1 overlays: per-frame points, arrows and labels with variable counts, read back as
written and refused when hostile."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import mjarchive
from mjarchive import AppendError, FormatError, Overlay, SelectionError
from mjarchive.testing import hinge_chain_xml

OVERLAYS = {"target": Overlay.points(radius=0.03, rgba=(1, 0, 0, 1), max_count=3),
            "command": Overlay.arrows(width=0.01, max_count=2),
            "label": Overlay.text(max_count=2, max_chars=16)}


def _archive(path, frames=6):
    w = mjarchive.create(path, mjarchive.ModelBundle.from_xml(hinge_chain_xml(2)), world_ids=[5, 9], overlays=OVERLAYS, chunk_frames=4)
    for f in range(frames):
        w.append(0.1 * (f + 1), np.zeros((2, 2)), overlays={
            "target": [np.full((f % 4, 3), f, float), None],  # 0..3 points in world 5, none in world 9
            "command": np.arange(2 * 2 * 6, dtype=float).reshape(2, 2, 6) + f,
            "label": [["höhe"], [((1.0, 2.0, 3.0), f"frame {f}"), "x"]],
        } if f != 4 else None)  # frame 4: nothing at all
    return w


def test_overlays_read_back_per_frame_and_world(tmp_path):
    _archive(tmp_path / "a.zarr").close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.format_version == "1.3" and set(a.overlays) == set(OVERLAYS)
        assert a.overlays["target"] == OVERLAYS["target"]
        t = a.select().overlay("target")
        assert t.count[:, 0].tolist() == [0, 1, 2, 3, 0, 1] and not t.count[:, 1].any()
        np.testing.assert_array_equal(t.items(3, 0), np.full((3, 3), 3, np.float32))
        assert t.items(3, 1).shape == (0, 3)
        c = a.select(worlds=[9], frames=slice(2, 6)).overlay("command")
        assert c.count[:, 0].tolist() == [2, 2, 0, 2]
        np.testing.assert_array_equal(c.items(0, 0), np.arange(12, 24).reshape(2, 6) + 2)
        lab = a.select(worlds=[9, 5], frames=[1, 4]).overlay("label")
        assert lab.text == [[["frame 1", "x"], ["höhe"]], [[], []]]
        (pos, text), (none, x) = lab.items(0, 0)
        np.testing.assert_array_equal(pos, [1, 2, 3])
        assert text == "frame 1" and none is None and x == "x"
        assert lab.items(0, 1)[0][0] is None  # unanchored: drawn at the world's first body
        with pytest.raises(SelectionError, match="target"):
            a.select().overlay("targets")
        sel = a.select()
        for read in (sel.overlay, sel.overlay_counts, lambda name: sel.overlay_rows(name, np.zeros((6, 2), int))):
            with pytest.raises(SelectionError, match="no overlay 'targets'; this archive has"):
                read("targets")  # named, not a KeyError
        assert sel.overlay_counts("target")[:, 0].tolist() == [0, 1, 2, 3, 0, 1]
        for take in (np.zeros((6, 1), int), np.zeros((6, 3), int), np.zeros((5, 2), int)):
            with pytest.raises(SelectionError, match="the selection's shape"):
                sel.overlay_rows("target", take)
        # Replay and viewer plumbing, not the documented API; the unchecked stored arrays are private.
        assert not hasattr(sel, "overlay_array")
        assert not {"overlay_counts", "overlay_rows", "variant_window", "VariantWindow"} & set(mjarchive.__all__)
        assert a.verify().ok


def test_bad_overlay_values_are_refused_at_append(tmp_path):
    w = _archive(tmp_path / "a.zarr", frames=0)
    q = np.zeros((2, 2))
    cases = [
        ({"target": [np.zeros((4, 3)), None]}, "max_count"),
        ({"target": [np.full((1, 3), np.nan), None]}, "finite"),
        ({"target": np.zeros((2, 1, 2))}, "shape"),
        ({"target": [None]}, "one per world"),
        ({"label": [["a" * 17], []]}, "16 UTF-8 bytes"),
        ({"label": [["bad\nline"], []]}, "control"),
        ({"label": ["one string", []]}, "list of labels"),
        ({"nothing": None}, "unknown overlay"),
    ]
    for overlays, match in cases:
        with pytest.raises(AppendError, match=match):
            w.append(0.1, q, overlays=overlays)
    w.append(0.1, q)  # still usable, and a frame without overlays draws none
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.n_frames == 1 and not a.select().overlay("target").count.any()


def test_block_append_takes_one_value_per_frame(tmp_path):
    w = mjarchive.create(tmp_path / "a.zarr", mjarchive.ModelBundle.from_xml(hinge_chain_xml(1)), n_worlds=1, overlays={"p": Overlay.points()})
    w.append(np.array([0.1, 0.2]), np.zeros((2, 1, 1)), overlays={"p": [[np.zeros((1, 3))], [np.ones((2, 3))]]})
    with pytest.raises(AppendError, match="frames"):
        w.append(np.array([0.3, 0.4]), np.zeros((2, 1, 1)), overlays={"p": [None]})
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.select().overlay("p").count[:, 0].tolist() == [1, 2]


def test_overlay_declarations_are_checked():
    with pytest.raises(AppendError, match="max_count"):
        Overlay.points(max_count=0)
    with pytest.raises(AppendError, match="rgba"):
        Overlay.arrows(rgba=(2, 0, 0, 1))
    with pytest.raises(AppendError, match="radius"):
        Overlay.points(radius=-1)
    with pytest.raises(AppendError, match="max_bytes"):
        Overlay.text(max_count=4096, max_chars=1024)
    assert Overlay.from_dict(Overlay.text().to_dict()) == Overlay.text()


def test_overlay_names_are_store_keys(tmp_path):
    with pytest.raises(mjarchive.MjArchiveError, match="overlay name"):
        mjarchive.create(tmp_path / "a.zarr", mjarchive.ModelBundle.from_xml(hinge_chain_xml(1)), n_worlds=1, overlays={"../x": Overlay.points()})


@pytest.mark.parametrize("key, value, match", [
    ("overlays/target/count", 4, "count outside"),
    ("overlays/target/count", -1, "count outside"),
    ("overlays/target/data", np.full((3, 3), np.inf, np.float32), "non-finite"),
    ("overlays/label/text", np.frombuffer(b"\xff\xfe" + bytes(14), np.uint8), "UTF-8"),
    ("overlays/label/text", np.frombuffer(b"a\x1bb" + bytes(13), np.uint8), "control"),
])
def test_hostile_overlay_chunks_are_refused(tmp_path, key, value, match):
    _archive(tmp_path / "a.zarr").close()
    arr = zarr.open_group(str(tmp_path / "a.zarr"), mode="r+")[key]
    if key.endswith("text"):
        arr[1, 0, 0] = value
    elif key.endswith("data"):
        arr[3, 0] = value
    else:
        arr[1, 0] = value
    with mjarchive.open(tmp_path / "a.zarr") as a:
        name = key.split("/")[1]
        with pytest.raises(FormatError, match=match):
            a.select().overlay(name)
        assert not a.verify().ok


@pytest.mark.parametrize("edit, match", [
    (lambda o: o["target"].update(kind="mesh"), "kind"),
    (lambda o: o["target"].update(max_count=1 << 20), "max_count"),
    (lambda o: o["target"].update(radius=1e9), "radius"),
    (lambda o: o["label"].update(max_bytes=0), "max_bytes"),
    (lambda o: o["target"].update(width=0.1), "keys"),
    (lambda o: o.update({"../x": o["target"]}), "name"),
])
def test_hostile_overlay_declarations_are_refused(tmp_path, edit, match):
    _archive(tmp_path / "a.zarr").close()
    doc = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    edit(doc["attributes"]["mjarchive"]["overlays"])
    (tmp_path / "a.zarr" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=match):
        mjarchive.open(tmp_path / "a.zarr")


@pytest.mark.parametrize("kind", [[], {}, ["points"], None, 1])
def test_overlay_kind_of_any_json_type_is_refused(tmp_path, kind):
    _archive(tmp_path / "a.zarr").close()
    doc = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    doc["attributes"]["mjarchive"]["overlays"]["target"]["kind"] = kind  # a list is unhashable: no TypeError
    (tmp_path / "a.zarr" / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="kind"):
        mjarchive.open(tmp_path / "a.zarr")


def test_overlay_names_may_be_reserved_track_names(tmp_path):
    """Overlays live under overlays/: a name like 'time' collides with nothing."""
    w = mjarchive.create(tmp_path / "a.zarr", mjarchive.ModelBundle.from_xml(hinge_chain_xml(1)), n_worlds=1,
                         overlays={"time": Overlay.points()})
    w.append(0.1, np.zeros((1, 1)), overlays={"time": [np.zeros((1, 3))]})
    w.close()
    with mjarchive.open(tmp_path / "a.zarr") as a:
        assert a.select().overlay("time").count.tolist() == [[1]]
