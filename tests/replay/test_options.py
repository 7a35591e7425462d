"""Scene options: parsing, names from the installed MuJoCo, and real CPU and Warp renders showing their effect."""

from __future__ import annotations

import pickle

import mujoco
import numpy as np
import pytest

from conftest import requires_warp_replay

from mjarchive import BackendError, MjArchiveError
from mjarchive.replay.views.options import (FRAMES, KEYS, REFUSED, RENDER_FLAGS, VIS_FLAGS, SceneOptions, apply_cpu,
                                      warp_render_kwargs)

SIZE = (48, 64)
# A floor (group 0), a green box (group 1) and a red site in group 4, which MuJoCo hides by default.
MARKER_XML = """
<mujoco>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom type="plane" size="2 2 .1" rgba=".4 .4 .4 1"/>
    <body name="block">
      <geom name="box" type="box" group="1" size=".5 .5 .2" pos="0 0 .2" rgba="0 .9 0 1"/>
    </body>
    <site name="marker" group="4" type="sphere" size=".3" pos="1 0 .5" rgba="1 0 0 1"/>
    <camera name="top" pos="0 0 4"/>
  </worldbody>
</mujoco>
"""


def _green(rgb):
    return int(((rgb[..., 1] > 100) & (rgb[..., 0] < 80) & (rgb[..., 2] < 80)).sum())


def _red(rgb):
    return int(((rgb[..., 0] > 100) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)).sum())


# --- parsing --------------------------------------------------------------------------------------

def test_dict_and_cli_forms_are_equal():
    from_dict = SceneOptions.parse({"geomgroup": [1, 1, 0], "sites": True, "frames": "body", "transparent": True,
                                    "shadow": False})
    from_cli = SceneOptions.parse("sites,frames=body,geomgroup=110,transparent,shadow=0")
    assert from_dict == from_cli
    assert from_dict == SceneOptions(geomgroup=(1, 1, 0), sitegroup=(1,) * 6, frames="body",
                                     flags=(("transparent", True),), render_flags=(("shadow", False),))
    assert hash(from_dict) == hash(from_cli)
    assert pickle.loads(pickle.dumps(from_dict)) == from_dict


@pytest.mark.parametrize("value", [None, {}, "", " , "])
def test_defaults_change_nothing(value):
    options = SceneOptions.parse(value)
    assert options == SceneOptions() and options.is_default and options.to_dict() == {}


def test_value_spellings():
    expected = SceneOptions.parse({"joint": True, "wireframe": False, "geomgroup": (0, 1)})
    for cli in ("joint=1,wireframe=0,geomgroup=01", "JOINT=on, wireframe=off, geomgroup=01",
                "joint=true,wireframe=false,geomgroup=01", "joint=yes,wireframe=no,geomgroup=01"):
        assert SceneOptions.parse(cli) == expected
    assert SceneOptions.parse({"joint": 1, "wireframe": np.bool_(False), "geomgroup": np.array([0, 1])}) == expected
    assert SceneOptions.parse({"geomgroup": "01", "joint": "on", "wireframe": "0"}) == expected
    assert SceneOptions.parse("cull-face=0") == SceneOptions.parse({"cull_face": False})


def test_round_trip_and_key():
    options = SceneOptions.parse("tendon,frames=site,sitegroup=00001,haze=0,geomgroup=1")
    assert SceneOptions.parse(options.to_dict()) == options
    assert SceneOptions.parse(options) is options
    # The key does not depend on the order the options were given in.
    assert SceneOptions.parse("haze=0,geomgroup=1,sitegroup=00001,frames=site,tendon").key() == options.key()
    assert options.key() == ('{"frames":"site","geomgroup":[1],"haze":false,"sitegroup":[0,0,0,0,1],'
                             '"tendon":true}')
    assert SceneOptions().key() == "{}"


def test_names_come_from_the_installed_mujoco():
    for name in VIS_FLAGS:
        assert hasattr(mujoco.mjtVisFlag, f"mjVIS_{name.upper()}")
    for name in RENDER_FLAGS:
        assert hasattr(mujoco.mjtRndFlag, f"mjRND_{name.upper()}")
    for name in FRAMES:
        assert hasattr(mujoco.mjtFrame, f"mjFRAME_{name.upper()}")
    assert {"joint", "actuator", "tendon", "com", "inertia", "texture", "skin", "static", "convexhull",
            "transparent"} <= set(VIS_FLAGS)
    assert {"shadow", "wireframe", "reflection", "skybox", "fog", "haze", "cull_face"} <= set(RENDER_FLAGS)
    assert set(FRAMES) == {"none", "body", "geom", "site", "camera", "light", "world"}
    every = set(VIS_FLAGS) | set(RENDER_FLAGS)
    assert not every & set(REFUSED) and not every & set(KEYS)
    assert not any(name.startswith("mjn") or name in ("nvisflag", "nrndflag", "nframe") for name in every)


@pytest.mark.parametrize("name", ["contactpoint", "contactforce", "contactsplit", "constraint", "island",
                                  "pertforce", "pertobj", "select", "segment", "idcolor"])
def test_refused_flags_say_why(name):
    with pytest.raises(MjArchiveError) as err:
        SceneOptions.parse({name: True})
    assert name in str(err.value)
    assert any(word in str(err.value) for word in ("contacts", "constraint", "perturbation", "colours"))
    with pytest.raises(MjArchiveError, match=name):
        SceneOptions.parse(f"{name}=0")  # refused whatever the value


def test_contact_frame_is_refused():
    with pytest.raises(MjArchiveError, match="frames=contact.*contacts"):
        SceneOptions.parse("frames=contact")


def test_unknown_names_are_listed_in_one_error():
    with pytest.raises(MjArchiveError) as err:
        SceneOptions.parse("sites,jiont,shaddow=0")
    message = str(err.value)
    assert "'jiont'" in message and "'shaddow'" in message
    for name in (*KEYS, *VIS_FLAGS, *RENDER_FLAGS, *FRAMES):
        assert name in message


def test_refused_and_unknown_are_reported_together():
    with pytest.raises(MjArchiveError) as err:
        SceneOptions.parse({"contactforce": True, "bogus": 1})
    assert "contactforce" in str(err.value) and "'bogus'" in str(err.value)


@pytest.mark.parametrize("value, match", [
    ("geomgroup", "geomgroup needs a value"),
    ("geomgroup=1111111", "1 to 6 values"),
    ("geomgroup=12", "1 to 6 values"),
    ({"geomgroup": []}, "1 to 6 values"),
    ({"geomgroup": [1, 2]}, "1 to 6 values"),
    ({"sitegroup": 110}, "1 to 6 values"),
    ("sites=maybe", "on or off"),
    ({"joint": 2}, "on or off"),
    ({"joint": None}, "on or off"),
    ("frames=xyz", "none, body, geom"),
    ("frames", "none, body, geom"),
    ("sites,sitegroup=1", "not both"),
    ("joint,joint=0", "given twice"),
    (42, "a dict or a string"),
    (["sites"], "a dict or a string"),
])
def test_bad_values(value, match):
    with pytest.raises(MjArchiveError, match=match):
        SceneOptions.parse(value)


def test_hostile_names_are_shown_safely():
    with pytest.raises(MjArchiveError) as err:
        SceneOptions.parse({"\x1b[2J" + "x" * 200: True})
    assert "\x1b" not in str(err.value) and "x" * 65 not in str(err.value)


# --- apply_cpu ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def marker_model():
    return mujoco.MjModel.from_xml_string(MARKER_XML)


def _fresh(model):
    return mujoco.MjvOption(), mujoco.MjvScene(model, maxgeom=100)


def test_default_options_change_nothing(marker_model):
    option, scene = _fresh(marker_model)
    reference, reference_scene = _fresh(marker_model)
    apply_cpu(SceneOptions(), option, scene)
    for field in ("geomgroup", "sitegroup", "flags", "jointgroup", "actuatorgroup"):
        assert np.array_equal(getattr(option, field), getattr(reference, field))
    assert option.frame == reference.frame
    assert np.array_equal(scene.flags, reference_scene.flags)


def test_partial_groups_keep_mujocos_defaults(marker_model):
    option, scene = _fresh(marker_model)
    apply_cpu(SceneOptions.parse("geomgroup=0,sitegroup=0001"), option, scene)
    assert list(option.geomgroup) == [0, 1, 1, 0, 0, 0]
    assert list(option.sitegroup) == [0, 0, 0, 1, 0, 0]
    apply_cpu(SceneOptions.parse("sites=0"), option, scene)
    assert list(option.sitegroup) == [0] * 6


def test_every_flag_applies(marker_model):
    option, scene = _fresh(marker_model)
    for on in (True, False):
        apply_cpu(SceneOptions.parse({name: on for name in (*VIS_FLAGS, *RENDER_FLAGS)}), option, scene)
        for name in VIS_FLAGS:
            assert option.flags[getattr(mujoco.mjtVisFlag, f"mjVIS_{name.upper()}")] == on
        for name in RENDER_FLAGS:
            assert scene.flags[getattr(mujoco.mjtRndFlag, f"mjRND_{name.upper()}")] == on
    for frame in FRAMES:
        apply_cpu(SceneOptions.parse({"frames": frame}), option, scene)
        assert option.frame == getattr(mujoco.mjtFrame, f"mjFRAME_{frame.upper()}")


class _Cpu:
    """One mujoco.Renderer; each render starts from MuJoCo's defaults and applies the options."""

    def __init__(self, model, camera):
        self.model, self.camera = model, camera
        self.data = mujoco.MjData(model)
        mujoco.mj_forward(model, self.data)
        self.renderer = mujoco.Renderer(model, *SIZE)
        self.defaults = self.renderer.scene.flags.copy()
        self.render(None)  # a fresh renderer's first frame differs from steady state

    def render(self, value):
        option = mujoco.MjvOption()
        self.renderer.scene.flags[:] = self.defaults
        apply_cpu(SceneOptions.parse(value), option, self.renderer.scene)
        self.renderer.update_scene(self.data, camera=self.camera, scene_option=option)
        return self.renderer.render().copy()


@pytest.fixture(scope="module")
def humanoid_cpu(humanoid_xml):
    cpu = _Cpu(mujoco.MjModel.from_xml_path(str(humanoid_xml)), camera=0)
    yield cpu
    cpu.renderer.close()


@pytest.fixture(scope="module")
def marker_cpu(marker_model):
    cpu = _Cpu(marker_model, camera=0)
    yield cpu
    cpu.renderer.close()


def test_cpu_default_is_mujocos_own_render(humanoid_cpu):
    option = mujoco.MjvOption()
    humanoid_cpu.renderer.update_scene(humanoid_cpu.data, camera=0, scene_option=option)
    plain = humanoid_cpu.renderer.render().copy()
    assert np.array_equal(humanoid_cpu.render(None), plain)


def test_cpu_hiding_the_humanoids_geom_group_removes_it(humanoid_cpu):
    groups = set(humanoid_cpu.model.geom_group.tolist())
    assert groups == {0}  # every humanoid geom (and the floor) is in group 0
    default = humanoid_cpu.render(None)
    hidden = humanoid_cpu.render({"geomgroup": [0]})
    changed = (default != hidden).any(-1).mean()
    assert changed > 0.9  # only the skybox is left
    assert np.array_equal(humanoid_cpu.render("geomgroup=011"), hidden)
    assert np.array_equal(humanoid_cpu.render("geomgroup=1"), default)  # group 0 on: as MuJoCo's default


def test_cpu_hiding_group_1_removes_only_the_box(marker_cpu):
    default = marker_cpu.render(None)
    hidden = marker_cpu.render("geomgroup=101")
    assert _green(default) > 50 and _green(hidden) == 0


def test_cpu_sites_add_pixels(marker_cpu):
    default = marker_cpu.render(None)
    assert _red(default) == 0  # the site is in group 4: hidden by MuJoCo's default
    shown = marker_cpu.render({"sites": True})
    assert _red(shown) > 20
    assert np.array_equal(marker_cpu.render("sitegroup=00001"), shown)
    assert np.array_equal(marker_cpu.render("sites=0"), default)


def test_cpu_frames_change_pixels(humanoid_cpu):
    default = humanoid_cpu.render(None)
    assert (humanoid_cpu.render("frames=body") != default).any()
    assert (humanoid_cpu.render("frames=world") != default).any()
    assert np.array_equal(humanoid_cpu.render("frames=none"), default)


def test_cpu_visual_and_render_flags_change_pixels(humanoid_cpu):
    default = humanoid_cpu.render(None)
    for value in ("joint,com", "wireframe", "shadow=0", "transparent"):
        assert (humanoid_cpu.render(value) != default).any(), value


# --- Warp -----------------------------------------------------------------------------------------

def test_warp_kwargs_for_groups_and_mapped_flags():
    assert warp_render_kwargs(SceneOptions()) == {}
    assert warp_render_kwargs(SceneOptions.parse("geomgroup=101")) == {"enabled_geom_groups": [0, 2]}
    assert warp_render_kwargs(SceneOptions.parse("geomgroup=0")) == {"enabled_geom_groups": [1, 2]}
    assert warp_render_kwargs(SceneOptions.parse("geomgroup=000111")) == {"enabled_geom_groups": [3, 4, 5]}
    assert warp_render_kwargs(SceneOptions.parse("shadow,skybox=0,texture=0,cull_face=0")) == {
        "use_shadows": True, "render_skybox": False, "use_textures": False, "enable_backface_culling": False}


def test_warp_accepts_what_it_already_does():
    # Warp never draws sites, frames or decorations, always draws static bodies, has no reflections or haze.
    options = SceneOptions.parse("sites=0,frames=none,joint=0,transparent=0,static=1,reflection=0,haze=0,fog=0")
    assert warp_render_kwargs(options) == {}


def test_warp_refuses_what_it_cannot_draw_naming_each():
    options = SceneOptions.parse("sites,frames=body,convexhull,transparent,joint,wireframe,reflection,fog,static=0,"
                                 "flexedge=0")
    with pytest.raises(BackendError) as err:
        warp_render_kwargs(options)
    message = str(err.value)
    for name in ("sites", "frames=body", "convexhull", "transparent", "joint", "wireframe", "reflection", "fog",
                 "static=0", "flexedge=0"):
        assert name in message
    assert "backend='cpu'" in message


@pytest.mark.parametrize("name", VIS_FLAGS + RENDER_FLAGS)
def test_warp_every_flag_is_mapped_or_refused(name):
    for on in (True, False):
        try:
            kwargs = warp_render_kwargs(SceneOptions.parse({name: on}))
        except BackendError as err:
            assert name in str(err)
        else:
            assert all(isinstance(v, bool) for v in kwargs.values())


def test_warp_kwargs_checks_the_installed_signature():
    with pytest.raises(BackendError, match="render_skybox"):
        warp_render_kwargs(SceneOptions.parse("skybox"), supported={"use_shadows", "enabled_geom_groups"})
    assert warp_render_kwargs(SceneOptions.parse("shadow"), supported={"use_shadows"}) == {"use_shadows": True}


def test_warp_kwargs_match_the_installed_create_render_context():
    mjw = requires_warp_replay()
    import inspect

    params = inspect.signature(mjw.create_render_context).parameters
    every = SceneOptions.parse("geomgroup=1,shadow,skybox,texture,cull_face")
    assert set(warp_render_kwargs(every)) <= set(params)
    assert warp_render_kwargs(every, supported=params)


def test_warp_render_hiding_a_group_removes_it(marker_model):
    """One tiny real render on Warp's "cpu" device.

    It compiles Warp's render kernels: 14 s measured with an empty Warp kernel cache, under 1 s cached.
    """
    mjw = requires_warp_replay()
    wp = pytest.importorskip("warp")
    h, w = 32, 48

    def render(options):
        with wp.ScopedDevice("cpu"):
            m = mjw.put_model(marker_model)
            d = mjw.put_data(marker_model, mujoco.MjData(marker_model), nworld=1, nconmax=1, njmax=1)
            rc = mjw.create_render_context(marker_model, nworld=1, cam_res=(w, h), render_rgb=True,
                                           render_depth=False, render_seg=False, cam_active=[0],
                                           **warp_render_kwargs(SceneOptions.parse(options)))
            mjw.kinematics(m, d)
            mjw.camlight(m, d)
            mjw.refit_bvh(m, d, rc)
            mjw.render(m, d, rc)
            packed = rc.rgb_data.numpy()[0, : h * w].reshape(h, w)
        return np.stack([(packed >> 16) & 255, (packed >> 8) & 255, packed & 255], -1).astype(np.uint8)

    default = render(None)
    hidden = render("geomgroup=101")
    assert _green(default) > 20 and _green(hidden) == 0
    assert (default != hidden).any(-1).sum() >= _green(default)
