"""HUD: parsing the user's choice, formatting one frame's values, burning text into frames in place."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from mjarchive import MjArchiveError
from mjarchive.replay.views import hud as hud_module
from mjarchive.replay.views.hud import CORNERS, HUD_FIELDS, Hud, draw_label, draw_text, format_lines, sanitize

TRACKS = ("reward", "qvel")


def _frame(h=120, w=160, seed=0):
    """A textured frame, so a darkened box shows everywhere it is drawn."""
    rng = np.random.default_rng(seed)
    return rng.integers(60, 200, size=(h, w, 3), dtype=np.uint8)


def _changed(a, b):
    """(y0, y1, x0, x1) bounding box of pixels that differ, or None."""
    ys, xs = np.nonzero((a != b).any(-1))
    if not len(ys):
        return None
    return ys.min(), ys.max() + 1, xs.min(), xs.max() + 1


# --- Hud.parse ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, False, (), [], ""])
def test_parse_off(value):
    assert Hud.parse(value) is None


def test_parse_true_is_world_top_left():
    assert Hud.parse(True) == Hud(("world",), "top-left")


def test_parse_cli_string_with_corner_and_tracks():
    hud = Hud.parse("world, episode,time,reward,bottom-right", track_names=TRACKS)
    assert hud == Hud(("world", "episode", "time", "reward"), "bottom-right")


def test_parse_sequence_keeps_order_and_drops_duplicates():
    hud = Hud.parse(["time", "world", "top-right", "time", "qvel", "world"], track_names=TRACKS)
    assert hud == Hud(("time", "world", "qvel"), "top-right")


def test_parse_corner_alone_shows_the_world():
    assert Hud.parse("bottom-left") == Hud(("world",), "bottom-left")


def test_parse_accepts_its_own_forms():
    hud = Hud.parse("frame,reward,top-right", track_names=TRACKS)
    assert Hud.parse(hud, track_names=TRACKS) == hud
    assert Hud.parse(hud.to_dict(), track_names=TRACKS) == hud
    assert Hud.from_dict(hud.to_dict()) == hud
    assert pickle.loads(pickle.dumps(hud)) == hud and hash(hud) == hash(Hud.from_dict(hud.to_dict()))


def test_key_is_stable_json():
    hud = Hud.parse("world,time,bottom-right")
    assert hud.key() == '{"corner":"bottom-right","fields":["world","time"]}'
    assert Hud.parse(["world", "time", "bottom-right"]).key() == hud.key()
    assert Hud.parse("time,world").key() != Hud.parse("world,time").key()  # order is shown, so it counts


def test_unknown_field_lists_every_valid_field_and_corner():
    with pytest.raises(MjArchiveError) as err:
        Hud.parse("world,rewrd,bogus", track_names=TRACKS)
    message = str(err.value)
    assert "'rewrd'" in message and "'bogus'" in message
    for name in (*HUD_FIELDS, *TRACKS, *CORNERS):
        assert name in message


def test_a_track_name_is_only_valid_for_an_archive_that_has_it():
    with pytest.raises(MjArchiveError, match="reward"):
        Hud.parse("reward")


def test_two_corners_are_refused():
    with pytest.raises(MjArchiveError, match="one HUD corner"):
        Hud.parse("world,top-left,bottom-right")


@pytest.mark.parametrize("value", [3, 1.5, b"world", {"fields": ["world"], "colour": "red"}, ["world", 7]])
def test_parse_refuses_other_types(value):
    with pytest.raises(MjArchiveError):
        Hud.parse(value)


def test_hud_checks_its_corner():
    with pytest.raises(MjArchiveError, match="top-left"):
        Hud(("world",), "middle")
    with pytest.raises(MjArchiveError):
        Hud((), "top-left")


def test_hostile_track_names_in_errors_are_sanitized():
    hostile = "\x1b[31mevil\n" + "x" * 100
    with pytest.raises(MjArchiveError) as err:
        Hud.parse("bogus", track_names=[hostile])
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value)
    assert "x" * 33 not in str(err.value)


# --- format_lines ---------------------------------------------------------------------------------

def test_format_lines_example():
    hud = Hud.parse("world,episode,frame,time,reward", track_names=TRACKS)
    lines = format_lines(hud, world=42, episode=3, frame=1200, time=12.34, tracks={"reward": np.float32(0.53214)})
    assert lines == ["world 42", "episode 3", "frame 1200", "t 12.340 s", "reward 0.5321"]


def test_format_lines_shows_large_numbers_in_full():
    hud = Hud.parse("world,frame")
    assert format_lines(hud, world=np.uint32(4_000_000_000), frame=12_345_678) == ["world 4000000000", "frame 12345678"]


def test_format_lines_skips_missing_values():
    hud = Hud.parse("world,episode,frame,time,reward,qvel", track_names=TRACKS)
    assert format_lines(hud, frame=7) == ["frame 7"]
    assert format_lines(hud, world=np.int64(3), tracks={"qvel": None}) == ["world 3"]


def test_format_lines_vectors_show_four_components():
    hud = Hud.parse("qvel", track_names=TRACKS)
    assert format_lines(hud, tracks={"qvel": np.arange(7) / 3}) == ["qvel [0 0.3333 0.6667 1 \u2026]"]
    assert format_lines(hud, tracks={"qvel": [1.5, -2.25]}) == ["qvel [1.5 -2.25]"]
    assert format_lines(hud, tracks={"qvel": np.full((1,), 123456.0)}) == ["qvel 1.235e+05"]


def test_format_lines_sanitizes_hostile_track_names():
    hostile = "\x1b[2J\u202eevil\x00name" + "y" * 60
    hud = Hud.parse([hostile], track_names=[hostile])
    (line,) = format_lines(hud, tracks={hostile: 1.0})
    name, _, value = line.rpartition(" ")
    assert value == "1"
    assert name == sanitize(hostile) and len(name) == 32
    assert all(" " <= ch <= "~" for ch in name)
    unprintable = "\u202e\x00"
    hud = Hud.parse([unprintable], track_names=[unprintable])
    assert format_lines(hud, tracks={unprintable: 2}) == ["? 2"]


# --- draw_text ------------------------------------------------------------------------------------

@pytest.mark.parametrize("corner", CORNERS)
def test_draw_text_stays_in_its_corner(corner):
    before = _frame()
    rgb = before.copy()
    draw_text(rgb, ["world 3", "t 1.000 s"], corner)
    y0, y1, x0, x1 = _changed(before, rgb)
    h, w = rgb.shape[:2]
    assert y1 - y0 < h / 2 and x1 - x0 < w / 2
    assert (y0 < 10) if corner.startswith("top") else (y1 > h - 10)
    assert (x0 < 10) if corner.endswith("left") else (x1 > w - 10)
    # The box is darkened, the text is bright.
    box = rgb[y0:y1, x0:x1].astype(int)
    assert box.min() < before.min() and box.max() > before.max()


def test_different_values_differ_only_in_the_box():
    base = _frame()
    one, two = base.copy(), base.copy()
    draw_text(one, ["frame 1"], "top-left")
    draw_text(two, ["frame 2"], "top-left")
    y0, y1, x0, x1 = _changed(base, one)
    diff = _changed(one, two)
    assert diff is not None  # different values, different pixels
    dy0, dy1, dx0, dx1 = diff
    assert y0 <= dy0 and dy1 <= y1 and x0 <= dx0 and dx1 <= x1
    outside = np.ones(base.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(one[outside], base[outside]) and np.array_equal(two[outside], base[outside])


def test_draw_text_is_deterministic_and_empty_is_a_no_op():
    a, b = _frame(), _frame()
    draw_text(a, ["world 1", "episode 2"], "bottom-right")
    draw_text(b, ["world 1", "episode 2"], "bottom-right")
    assert np.array_equal(a, b)
    c = _frame()
    draw_text(c, [], "top-left")
    assert np.array_equal(c, _frame())


@pytest.mark.parametrize("size", [(32, 48), (64, 96), (240, 320), (480, 640), (1080, 1920)])
def test_draw_text_sizes(size):
    h, w = size
    before = np.zeros((h, w, 3), np.uint8)
    before[...] = 128
    rgb = before.copy()
    lines = ["world 12345", "episode 3", "frame 1200", "t 12.340 s", "reward [0.1 0.2 0.3 0.4 \u2026]"]
    for corner in CORNERS:
        draw_text(rgb, lines, corner)
    assert (rgb != before).any()


def test_font_scales_with_the_frame():
    heights = []
    for h in (120, 480, 1080):
        before = np.full((h, h * 16 // 9, 3), 128, np.uint8)
        rgb = before.copy()
        draw_text(rgb, ["world 1"], "top-left")
        y0, y1, _, _ = _changed(before, rgb)
        heights.append(y1 - y0)
    assert heights[0] < heights[1] < heights[2]
    assert heights[2] > 40  # readable on a 1080p frame


def test_text_that_does_not_fit_is_clipped():
    before = _frame(32, 48)
    rgb = before.copy()
    draw_text(rgb, ["x" * 500] * 40, "bottom-right")
    assert (rgb != before).any()


def test_draw_text_refuses_what_it_cannot_draw_into():
    with pytest.raises(MjArchiveError, match="uint8"):
        draw_text(np.zeros((8, 8, 3), np.float32), ["a"])
    with pytest.raises(MjArchiveError, match=r"\(H, W, 3\)"):
        draw_text(np.zeros((8, 8), np.uint8), ["a"])
    frozen = np.zeros((8, 8, 3), np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(MjArchiveError, match="writable"):
        draw_text(frozen, ["a"])
    with pytest.raises(MjArchiveError, match="bottom-right"):
        draw_text(np.zeros((8, 8, 3), np.uint8), ["a"], "centre")


def test_bitmap_font_fallback(monkeypatch):
    """Without FreeType (or Pillow < 10.1) the bitmap font draws, scaled up for large frames."""
    from PIL import ImageFont

    original = ImageFont.load_default

    def no_freetype(size=None):
        if size is not None:
            raise TypeError("load_default() got an unexpected keyword argument 'size'")
        return original()

    monkeypatch.setattr(ImageFont, "load_default", no_freetype)
    hud_module._font.cache_clear()
    hud_module._glyphs.cache_clear()
    try:
        for h, w in ((32, 48), (480, 640)):
            before = _frame(h, w)
            rgb = before.copy()
            draw_text(rgb, ["frame 1", "q [1 2 3 4 \u2026]"], "top-right")
            assert (rgb != before).any()
        small, large = np.full((120, 160, 3), 128, np.uint8), np.full((480, 640, 3), 128, np.uint8)
        draw_text(small, ["w"])
        draw_text(large, ["w"])
        assert _changed(np.full_like(large, 128), large)[1] > 2 * _changed(np.full_like(small, 128), small)[1]
    finally:
        hud_module._font.cache_clear()
        hud_module._glyphs.cache_clear()


# --- draw_label -----------------------------------------------------------------------------------

def test_draw_label_is_centred_above_the_point():
    before = _frame(240, 320)
    rgb = before.copy()
    draw_label(rgb, "world 7", (160, 150))
    y0, y1, x0, x1 = _changed(before, rgb)
    assert y1 <= 150 and y1 > 130
    assert abs((x0 + x1) / 2 - 160) <= 2


@pytest.mark.parametrize("xy", [(0, 0), (319, 0), (0, 239), (319, 239), (2, 120), (317, 30)])
def test_draw_label_near_the_border_is_clipped(xy):
    rgb = _frame(240, 320)
    draw_label(rgb, "world 1234567", xy)  # no error; whatever fits is drawn


@pytest.mark.parametrize("xy", [(-1, 10), (10, -1), (320, 10), (10, 240), (float("nan"), 5), (5, float("inf"))])
def test_draw_label_outside_the_image_is_skipped(xy):
    before = _frame(240, 320)
    rgb = before.copy()
    draw_label(rgb, "world 1", xy)
    assert np.array_equal(rgb, before)


def test_draw_label_near_the_left_border_draws_inside():
    before = _frame(240, 320)
    rgb = before.copy()
    draw_label(rgb, "world 1", (1, 120))
    y0, y1, x0, x1 = _changed(before, rgb)
    assert x0 == 0 and y1 <= 120


def test_draw_label_sanitizes_its_text():
    before = _frame(240, 320)
    a, b = before.copy(), before.copy()
    draw_label(a, "w\x1b\n1", (160, 120))
    draw_label(b, "w1", (160, 120))
    assert np.array_equal(a, b)
    c = before.copy()
    draw_label(c, "\x00\x1b", (160, 120))  # nothing printable: nothing drawn
    assert np.array_equal(c, before)


def test_draw_text_drops_unprintable_characters():
    a, b = _frame(), _frame()
    draw_text(a, ["wor\x1bld\u202e 1\U0001F600"], "top-left")
    draw_text(b, ["world 1"], "top-left")
    assert np.array_equal(a, b)


def test_draw_text_from_threads_matches_one_thread():
    from concurrent.futures import ThreadPoolExecutor

    def drawn(i):
        rgb = _frame(96, 128)
        draw_text(rgb, [f"frame {i}", f"t {i / 7:.3f} s"], "bottom-left")
        return rgb

    hud_module._glyphs.cache_clear()  # the glyphs are first rendered concurrently
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(drawn, range(64)))
    assert all(np.array_equal(rgb, drawn(i)) for i, rgb in enumerate(threaded))
