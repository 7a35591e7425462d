"""`mjarchive view` in a real browser: Debian's Chromium, headless, driven by playwright.

The viewer runs as the command line starts it (`python -m mjarchive view ... --port 0`) over a real
humanoid archive; the page is loaded, screenshots of the 3D canvas (the control panel hidden) are
compared as the slider and the world choice change, a writer process commits frames while a page
follows the live archive, bad requests must leave a message in the page and the server running, a
page's camera follows a body, and an s3:// archive is viewed with --storage-options. Two tests need
no browser: the poses the server sends are MuJoCo's kinematics plus the grid offsets, and limits.
The viewport is 800 px wide (narrower, viser 1.0 switches to a bottom sheet) at half resolution.
Set MJARCHIVE_SAVE_SCREENSHOT=1 to write the site's docs/images/view.png.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import mujoco
import numpy as np
import pytest

import mjarchive

pytest.importorskip("viser", reason="the viewer needs viser (pip install 'mjarchive[view]')")

from mjarchive.replay.views.scene import ScenePlan  # noqa: E402
from s3_server import s3_server, s3_url  # noqa: E402,F401  (pytest fixtures)
from mjarchive.viewer.app import Viewer  # noqa: E402
from mjarchive.viewer.request import is_loopback, parse_worlds  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# SwiftShader: WebGL on the CPU, the same pixels on machines with and without a GPU.
CHROMIUM_ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"]
VIEWPORT = {"width": 800, "height": 720}
# Screenshots show only the 3D canvas: the control panel and notifications are hidden meanwhile.
HIDE_PANEL = ".mantine-Paper-root, .mantine-Notifications-root { visibility: hidden !important; }"
WORLDS = [3, 7, 42, 100]
N = 24
STATUS = re.compile(r"frame (\d+) / (\d+)")


def _humanoid_qpos(model: mujoco.MjModel, n: int, n_worlds: int) -> np.ndarray:
    """A motion that shows: the torso slides along x and each world bends its own joint."""
    qpos = np.tile(model.qpos0, (n, n_worlds, 1))
    qpos[:, :, 0] = np.linspace(0.0, 1.0, n)[:, None]
    qpos[:, :, 2] = 1.3
    for w in range(n_worlds):
        qpos[:, w, 7 + 3 * w] = np.linspace(0.0, 1.2, n)
    return qpos


@pytest.fixture(scope="module")
def run(tmp_path_factory, humanoid_xml) -> Path:
    """Four humanoid worlds, 24 frames in chunks of 4, world 7 resets at frame 8 and world 42 at 16."""
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    path = tmp_path_factory.mktemp("view") / "run.mjarchive"
    reset = np.zeros((N, len(WORLDS)), bool)
    reset[8, 1] = reset[16, 2] = True
    with mjarchive.create(path, humanoid_xml, world_ids=WORLDS, dtype="float64", chunk_frames=4) as w:
        w.append(np.arange(N) * 0.05, _humanoid_qpos(model, N, len(WORLDS)), reset=reset)
    return path


# -- the server-side poses (no browser) ----------------------------------------------------------------
def test_hostile_names_values_and_poses_never_reach_the_page_raw(tmp_path):
    """A body named like the 'no body' choice, a non-finite world number from a page, and a world
    whose stored qpos is NaN (check_finite=False): the page gets messages, never NaN poses."""
    spec = mujoco.MjSpec.from_string("""
    <mujoco><worldbody><geom type="plane" size="2 2 .1"/>
      <body name="none (free orbit)" pos="0 0 .3"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    </worldbody></mujoco>""")
    model = spec.compile()
    path = tmp_path / "hostile.mjarchive"
    qpos = np.tile(model.qpos0, (3, 2, 1))
    qpos[1, 1, :3] = np.nan
    with mjarchive.create(path, spec, world_ids=[0, 1], dtype="float64", check_finite=False) as w:
        w.append(np.arange(3) * 0.1, qpos)
    with mjarchive.view(path, port=0, block=False) as v:
        assert "none (free orbit)" not in v._body_names  # the label stays the 'no body' choice
        v._body_in.value = "none (free orbit) (1)"
        field = v._body_world_in
        for bad in (float("nan"), float("inf"), 1e300):  # what a crafted page can send; viser's setter refuses some
            v._body_world_in = types.SimpleNamespace(value=bad)
            v._on_follow_body()
            assert "not a world ID" in v._message.content and v._follow_body is None
        v._body_world_in = field
        v.seek(1)
        positions = np.stack([d.handle.batched_positions for d in v._drawn if not d.shared])
        assert np.isfinite(positions).all()
        assert "not finite here: world 1" in v._status.content
        v.seek(2)
        assert "not finite" not in v._status.content


def test_the_poses_sent_for_a_frame_are_the_kinematics_of_its_qpos_plus_the_grid_offsets(run):
    archive = mjarchive.open(run)
    model = archive.model()
    qpos = archive.select().qpos
    shown = [42, 3, 100]
    with mjarchive.view(run, worlds=shown, port=0, block=False) as v:
        assert isinstance(v, Viewer) and v.world_ids == tuple(shown) and v.n_frames == N and v.frame == 0
        assert v.url == f"http://127.0.0.1:{v.port}/" and v.port > 0
        offsets = np.asarray(ScenePlan.grid(shown, 2.0).offsets)
        data = mujoco.MjData(model)
        for k in (0, 5, 17, N - 1):
            v.seek(k)
            assert v.frame == k
            per_world = [d for d in v._drawn if not d.shared]
            assert len(per_world) == model.ngeom - 1  # every humanoid geom; the floor is drawn once
            for i, w in enumerate(shown):
                data.qpos[:] = qpos[k, archive.world_index(w)]
                mujoco.mj_kinematics(model, data)
                for d in per_world:
                    np.testing.assert_allclose(d.handle.batched_positions[i], data.geom_xpos[d.geom] + offsets[i],
                                               atol=1e-5)
                    q = np.empty(4)
                    mujoco.mju_mat2Quat(q, data.geom_xmat[d.geom])
                    assert abs(float(np.dot(d.handle.batched_wxyzs[i], q))) == pytest.approx(1.0, abs=1e-5)
        (floor,) = [d for d in v._drawn if d.shared]
        assert floor.handle.batched_positions.shape == (1, 3)  # once for the grid, as the scene render
        with pytest.raises(mjarchive.SelectionError, match="out of range"):
            v.seek(N)
        # Refused requests change nothing; a good one switches worlds and keeps the playhead.
        for bad, match in (("5", "not in this archive"), ("3,,7", "bad world list"), ("1:x", "bad range"),
                           ("7,7", "once")):
            with pytest.raises(mjarchive.SelectionError, match=match):
                v.show_worlds(bad)
        assert v.world_ids == tuple(shown)
        assert v.show_worlds("0:8") == (3, 7)
        assert v.frame == N - 1 and len(v._drawn[1].handle.batched_positions) == 2
    with pytest.raises(mjarchive.ClosedError):
        v.seek(0)
    archive.close()


def test_limits_ports_and_the_public_name(run):
    with pytest.raises(mjarchive.SelectionError, match="at most 2 at once"):
        mjarchive.view(run, worlds=WORLDS, max_worlds=2, port=0, block=False)
    with pytest.raises(mjarchive.MjArchiveError, match="max_worlds .--max-worlds. must be"):
        mjarchive.view(run, max_worlds=65, port=0, block=False)
    with pytest.raises(mjarchive.SelectionError, match="out of range"):
        mjarchive.view(run, frame=N, port=0, block=False)
    with mjarchive.view(run, port=0, block=False, frame=-1) as v:
        assert v.frame == N - 1 and v.world_ids == tuple(WORLDS)
        with pytest.raises(mjarchive.MjArchiveError, match="in use"):
            mjarchive.view(run, port=v.port, block=False)
    # The package is `mjarchive.viewer`, so importing it never rebinds the public function `mjarchive.view`.
    assert callable(mjarchive.view) and mjarchive.view.__module__ == "mjarchive.viewer.app"
    assert parse_worlds("7,42") == [7, 42] and parse_worlds("0:8") == slice(0, 8) and parse_worlds(" 7 ") == 7
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


# -- the browser ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; its browser download is not needed)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class _Server:
    """`python -m mjarchive view ARCHIVE --port 0 ...` in a child process; its output is collected."""

    def __init__(self, archive: Path, *args: str):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "mjarchive", "view", str(archive), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 90
        while True:
            try:
                m = re.search(r"(http://127\.0\.0\.1:\d+/)", self.lines.get(timeout=0.2))
            except queue.Empty:
                m = None
                if self.proc.poll() is not None and self.lines.empty():
                    pytest.fail(f"the viewer exited with {self.proc.returncode}: {''.join(self.output)}")
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"the viewer printed no URL in 90 s: {''.join(self.output)}")
            if m:
                self.url = m.group(1)
                return

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """Ctrl-C, as a user stops it: the viewer closes and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(run):
    """All four worlds (the default: the first --max-worlds, 16)."""
    s = _Server(run)
    yield s
    assert s.stop() == 0, "".join(s.output)


@pytest.fixture(scope="module")
def limited_server(run):
    """Three worlds at most, so that asking for all four is refused."""
    s = _Server(run, "--worlds", "3,7,42", "--max-worlds", "3")
    yield s
    assert s.stop() == 0, "".join(s.output)


def _open(browser, url: str):
    page = browser.new_page(viewport=VIEWPORT, device_scale_factor=0.5)
    page.goto(url)
    return page


def _input(page, label: str):
    """The input of the control labelled `label` (viser's labels do not name their inputs)."""
    return page.locator(f"xpath=//label[normalize-space()='{label}']"
                        "/ancestor::div[contains(@class, 'mantine-Flex-root')][1]//input").first


def _choose(page, label: str, option: str) -> None:
    """Pick `option` in the dropdown labelled `label` (the option list may open below the viewport)."""
    _input(page, label).click()
    page.get_by_role("option", name=option, exact=True).dispatch_event("click")


def _status(page, timeout: float = 30) -> tuple[int, int]:
    """(frame, n_frames) from the page's 'frame k / N' line."""
    loc = page.get_by_text(STATUS).first
    loc.wait_for(timeout=timeout * 1000)
    k, n = STATUS.search(loc.inner_text()).groups()
    return int(k), int(n)


def _wait_status(page, frame: int, n: int, timeout: float = 30) -> None:
    page.get_by_text(f"frame {frame} / {n}", exact=False).first.wait_for(timeout=timeout * 1000)


def _canvas(page, settle: int = 6) -> np.ndarray:
    """A screenshot of the 3D view once two in a row agree (the scene has drawn what it was sent)."""
    from PIL import Image

    last = None
    for _ in range(settle):
        page.wait_for_timeout(300)
        shot = np.asarray(Image.open(io.BytesIO(page.screenshot(style=HIDE_PANEL, animations="disabled"))))[..., :3]
        if last is not None and np.array_equal(shot, last):
            return shot
        last = shot
    return last


def _save(tmp_path: Path, name: str, image: np.ndarray) -> Path:
    from PIL import Image

    path = tmp_path / f"{name}.png"
    Image.fromarray(image).save(path)
    return path


def _changed(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of pixels that differ noticeably."""
    return float((np.abs(a.astype(int) - b.astype(int)).max(axis=-1) > 24).mean())


def _readme_picture(browser, url: str, tmp_path: Path) -> None:
    """docs/images/view.png for the documentation site: a larger page, with its controls."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        page.goto(url)
        _wait_status(page, 0, N)
        page.locator(".mantine-Notification-closeButton").first.click()  # "software WebGL" (SwiftShader)
        page.wait_for_timeout(1500)
        shot = tmp_path / "view-readme.png"
        page.screenshot(path=str(shot), animations="disabled")
        images = Path(__file__).resolve().parents[2] / "docs" / "images"
        images.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, images / "view.png")
    finally:
        page.close()


def test_the_page_draws_the_worlds_and_redraws_for_another_frame_and_other_worlds(browser, server, tmp_path):
    page = _open(browser, server.url)
    try:
        _wait_status(page, 0, N)
        first = _canvas(page)
        _save(tmp_path, "view-frame-0", first)
        if os.environ.get("MJARCHIVE_SAVE_SCREENSHOT") == "1":
            _readme_picture(browser, server.url, tmp_path)
        colours = np.unique(first.reshape(-1, 3) // 8, axis=0)
        assert len(colours) > 20, "the canvas is blank"
        assert (np.abs(first.astype(int) - first[0, 0]).max(axis=-1) > 24).mean() > 0.01, "nothing drawn"

        slider = page.get_by_role("slider")
        slider.focus()
        page.keyboard.press("End")  # the slider's keyboard control: to the last committed frame
        _wait_status(page, N - 1, N)
        assert slider.get_attribute("aria-valuemax") == str(N - 1)
        last = _canvas(page)
        _save(tmp_path, "view-frame-23", last)
        assert _changed(first, last) > 0.002, "moving the slider did not redraw the scene"

        _input(page, "World IDs").fill("42")
        page.get_by_role("button", name="Show worlds").click()
        page.get_by_text("Showing 1 of 4 worlds").wait_for(timeout=20_000)
        assert _status(page) == (N - 1, N)  # the playhead stays
        one = _canvas(page)
        _save(tmp_path, "view-world-42", one)
        assert _changed(last, one) > 0.002, "selecting another world did not redraw the scene"

        page.get_by_role("button", name="◀ previous").click()  # world 42's reset at frame 16
        _wait_status(page, 16, N)
        page.get_by_role("button", name="◀ frame").click()
        _wait_status(page, 15, N)

        _choose(page, "Speed", "4×")
        page.get_by_role("button", name="Play").click()
        page.get_by_role("button", name="Pause").wait_for(timeout=10_000)
        page.wait_for_function("() => !document.body.innerText.includes('frame 15 / 24')", timeout=10_000)
        page.get_by_role("button", name="Pause").click()
        page.get_by_role("button", name="Play").wait_for(timeout=10_000)
        page.wait_for_timeout(300)
        paused = _status(page)
        page.wait_for_timeout(700)
        assert _status(page) == paused, "the playhead moved after Pause"
    finally:
        page.close()


def test_bad_world_requests_leave_a_message_and_the_server_keeps_serving(browser, limited_server):
    server = limited_server
    page = _open(browser, server.url)
    try:
        _status(page)
        field = _input(page, "World IDs")
        show = page.get_by_role("button", name="Show worlds")
        for text, message in (("5", "world 5 is not in this archive"), ("3,,7", "bad world list"),
                              ("1:x:", "bad range"), ("0:1000", "4 worlds selected, but this viewer shows at most 3")):
            field.fill(text)
            show.click()
            page.get_by_text("Not shown").first.wait_for(timeout=10_000)
            page.get_by_text(message).first.wait_for(timeout=10_000)
            assert server.alive()
        field.fill("7,100")
        show.click()
        page.get_by_text("Showing 2 of 4 worlds").wait_for(timeout=20_000)
        assert server.alive()
    finally:
        page.close()


WRITER = textwrap.dedent("""
    import sys, numpy as np, mujoco, mjarchive
    path, xml = sys.argv[1], sys.argv[2]
    model = mujoco.MjModel.from_xml_path(xml)
    qpos = np.tile(model.qpos0, (14, 2, 1))
    qpos[:, :, 2] = 1.3
    qpos[:, :, 0] = np.linspace(0.0, 1.0, 14)[:, None]
    w = mjarchive.create(path, xml, world_ids=[0, 1], dtype="float64", chunk_frames=4)
    w.append(np.arange(6) * 0.05, qpos[:6])
    w.flush()
    print("committed 6", flush=True)
    sys.stdin.readline()  # the page is open
    for lo, hi in ((6, 10), (10, 14)):
        w.append(np.arange(lo, hi) * 0.05, qpos[lo:hi])
        w.flush()
        print(f"committed {hi}", flush=True)
    sys.stdin.readline()
    w.close()
""")


def test_follow_live_extends_the_timeline_as_frames_are_committed_and_never_past_them(browser, tmp_path,
                                                                                       humanoid_xml):
    path = tmp_path / "live.mjarchive"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(path), str(humanoid_xml)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "committed 6"
        server = _Server(path)
        try:
            page = _open(browser, server.url)
            _wait_status(page, 0, 6)
            assert _input(page, "Follow live").is_checked()
            writer.stdin.write("go\n")
            writer.stdin.flush()
            seen = set()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                k, n = _status(page)
                seen.add(n)
                assert k < n <= 14, f"the page shows frame {k} of {n}: past the committed frames"
                # flushes commit 10 and 14; a writer may also commit as a chunk of 4 fills (8, 12)
                assert n in (6, 8, 10, 12, 14), f"{n} frames were never committed together"
                if n == 14:
                    break
                page.wait_for_timeout(100)
            assert writer.stdout.readline().strip() == "committed 10"
            assert writer.stdout.readline().strip() == "committed 14"
            assert max(seen) == 14, f"the timeline did not grow to 14 frames within 20 s (saw {sorted(seen)})"
            assert page.get_by_role("slider").get_attribute("aria-valuemax") == "13"
            page.close()
        finally:
            assert server.stop() == 0, "".join(server.output)
    finally:
        with contextlib.suppress(Exception):
            writer.stdin.write("done\n")
            writer.stdin.close()
        writer.wait(timeout=30)


def test_follow_body_keeps_each_page_camera_on_the_body_with_its_offset(browser, run):
    archive = mjarchive.open(run)
    model = archive.model()
    data = mujoco.MjData(model)
    torso = model.body("torso").id
    with mjarchive.view(run, worlds=[3, 7], port=0, block=False) as v:
        offset = np.asarray(ScenePlan.grid([3, 7], 2.0).offsets[1])
        page = _open(browser, v.url)
        try:
            _wait_status(page, 0, N)
            _input(page, "Of world").fill("7")
            _choose(page, "Follow body", "torso")
            deadline = time.monotonic() + 10
            while not v._server.get_clients() and time.monotonic() < deadline:
                time.sleep(0.05)
            (client,) = v._server.get_clients().values()
            gaps = []
            for k in (3, 12, N - 1):
                data.qpos[:] = archive.select(worlds=[7], frames=[k]).qpos[0, 0]
                mujoco.mj_kinematics(model, data)
                target = data.xpos[torso] + offset
                deadline = time.monotonic() + 10
                while True:  # the page's camera reports back asynchronously
                    if k != v.frame:
                        v.seek(k)
                    cam = client.camera
                    if np.allclose(cam.look_at, target, atol=1e-3) or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                np.testing.assert_allclose(cam.look_at, target, atol=1e-3)
                gaps.append(np.asarray(cam.position) - np.asarray(cam.look_at))
            np.testing.assert_allclose(gaps[1], gaps[0], atol=1e-3)  # the camera moved with the body
            np.testing.assert_allclose(gaps[2], gaps[0], atol=1e-3)
        finally:
            page.close()
    archive.close()


def test_an_s3_archive_is_viewed_with_storage_options(browser, s3_server, s3_url, humanoid_xml):
    so = s3_server.storage_options()
    model = mujoco.MjModel.from_xml_path(str(humanoid_xml))
    with mjarchive.create(s3_url, humanoid_xml, world_ids=WORLDS, chunk_frames=4, storage_options=so) as w:
        w.append(np.arange(N) * 0.05, _humanoid_qpos(model, N, len(WORLDS)))
    server = _Server(s3_url, "--storage-options", json.dumps(so), "--worlds", "42", "--frame", "-1")
    try:
        page = _open(browser, server.url)
        _wait_status(page, N - 1, N)
        page.get_by_text("Showing 1 of 4 worlds").wait_for(timeout=10_000)
        page.close()
    finally:
        assert server.stop() == 0, "".join(server.output)
