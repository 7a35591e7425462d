"""Compile an untrusted model bundle in a process of its own, under memory and CPU limits.

Run as a script (`compile_child.py MEMORY_BYTES CPU_SECONDS`, in an isolated interpreter given the
parent's import path) by `sandbox.py`; it imports only MuJoCo and NumPy, so nothing else of the parent's
state is within reach. Standard input carries one JSON header line
`{"xml": n, "assets": [[name, n], ...]}` followed by the raw bytes; standard
output returns the compiled model as MJB bytes, standard error one JSON line `{"error": "..."}` on
refusal. The header may also carry `"recipe"`: how to derive the replay model from the recorded
one (`apply_recipe`: copies side by side for a scene, extra replay cameras), applied after parsing
and checked like the rest of the input. `check_spec_files` is also imported by `model_bundle.py` for
in-process parsing, `apply_recipe` by the replay wing for trusted bundles.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

import mujoco
import numpy as np

#: What a compiled untrusted model may hold: checked after compiling, before any MjData exists.
MAX_MODEL_BYTES = 512 * 2**20
MAX_ARENA_BYTES = 512 * 2**20
MAX_TEXTURE_BYTES = 256 * 2**20
MAX_OFFSCREEN_SIDE = 8192
MAX_SHADOW_SIZE = 8192
MAX_OFFSAMPLES = 16
MAX_QUALITY_SEGMENTS = 512  # numslices, numstacks, numquads
#: What a replay recipe may ask for.
MAX_SCENE_COPIES = 64
#: A scene's compiled size, estimated from one extra copy's before the copies are composed.
MAX_SCENE_BYTES = 256 * 2**20
#: A scene's bodies, geoms, sites, joints, cameras, lights, tendons, actuators and sensors: composing
#: 64 of dm_control's fruitfly (29,312) took 12 s on 2 busy cores, and the time grows faster than that.
MAX_SCENE_ELEMENTS = 50_000
_COUNTED = ("nbody", "ngeom", "nsite", "njnt", "ncam", "nlight", "ntendon", "nu", "nsensor")
#: Replay poses and renders, never simulates: its arena holds only the stack that compiling and
#: posing use, never the constraint arena a model declares for simulation (dm_control's rodent,
#: `<size njmax="8000" nconmax="4000">`, asks 3.4 GB). Posing was measured to use at most 85 bytes
#: per dof (mj_flex of a 3,879-dof flex); compiling, a dense actuator-by-dof moment (mj_transmission).
REPLAY_ARENA_BYTES = 16 * 2**20
_ARENA_BYTES_PER_DOF = 1024
_DOFS = {mujoco.mjtJoint.mjJNT_FREE: 6, mujoco.mjtJoint.mjJNT_BALL: 3}
_MAX_REPLAY_CAMERAS = 16
_MAX_SCENE_OFFSET = 1e6  # metres, per coordinate


class Refused(Exception):
    """The bundle asks for something a replay must not do."""


def check_spec_files(spec: Any, assets: Mapping[str, bytes]) -> None:
    """Second line of defence, on the parsed MjSpec before compiling: every file it names is a
    bundle member and no directory is set, whatever the XML text looked like."""
    for attr in ("meshdir", "texturedir"):
        if getattr(spec, attr):
            raise Refused(f"the parsed model sets {attr}={getattr(spec, attr)!r}; bundles must not name directories")
    named: list[tuple[str, str]] = []
    for kind, elements in (("mesh", spec.meshes), ("hfield", spec.hfields), ("skin", spec.skins)):
        named += [(kind, e.file) for e in elements]
    for texture in spec.textures:
        named.append(("texture", texture.file))
        named += [("texture cube face", f) for f in texture.cubefiles]
    for kind, file in named:
        if file and file not in assets:
            raise Refused(f"the parsed model's {kind} file {file!r} is not a bundle member")


def size_for_replay(spec: mujoco.MjSpec) -> None:
    """Size `spec`'s arena for posing and rendering (`REPLAY_ARENA_BYTES` and some per joint), in
    place of what it declares or MuJoCo would choose for simulating, and its multisampling to at most
    MAX_OFFSAMPLES (dm_control's fruitfly asks 24); kinematics are unchanged."""
    nv = sum(_DOFS.get(joint.type, 1) for joint in spec.joints)
    spec.nstack = -1  # `memory` takes precedence when compiling; <size> allows only one of them
    spec.memory = _replay_arena(nv, len(spec.actuators))
    spec.visual.quality.offsamples = min(spec.visual.quality.offsamples, MAX_OFFSAMPLES)


def _replay_arena(nv: int, nu: int) -> int:
    return REPLAY_ARENA_BYTES + nv * (_ARENA_BYTES_PER_DOF + 8 * nu)


def check_compiled(model: Any) -> None:
    """Bound what rendering and MjData would allocate for this model."""
    size = mujoco.mj_sizeModel(model)
    g, q = model.vis.global_, model.vis.quality
    limits = [
        ("compiled model size (bytes)", size, MAX_MODEL_BYTES),
        ("<size memory> arena (bytes)", int(model.narena), MAX_ARENA_BYTES),
        ("texture data (bytes)", int(model.ntexdata), MAX_TEXTURE_BYTES),
        ("<visual><global offwidth>", int(g.offwidth), MAX_OFFSCREEN_SIDE),
        ("<visual><global offheight>", int(g.offheight), MAX_OFFSCREEN_SIDE),
        ("<visual><quality shadowsize>", int(q.shadowsize), MAX_SHADOW_SIZE),
        ("<visual><quality offsamples>", int(q.offsamples), MAX_OFFSAMPLES),
        ("<visual><quality numslices>", int(q.numslices), MAX_QUALITY_SEGMENTS),
        ("<visual><quality numstacks>", int(q.numstacks), MAX_QUALITY_SEGMENTS),
        ("<visual><quality numquads>", int(q.numquads), MAX_QUALITY_SEGMENTS),
    ]
    for what, value, limit in limits:
        if value > limit:
            raise Refused(f"the model asks for {what} = {value}, above the replay limit of {limit}")


# -- replay recipes ----------------------------------------------------------------------------
_RECIPE_KEYS = ("copies", "cameras")
# Everything of an MjSpec that is not an element: the scene takes it from the recorded model.
_GLOBALS = ("compiler", "option", "visual", "stat", "memory", "nstack", "njmax", "nconmax", "nemax",
            "nuserdata", "nuser_actuator", "nuser_body", "nuser_cam", "nuser_geom", "nuser_jnt",
            "nuser_sensor", "nuser_site", "nuser_tendon", "modelname", "strippath")
# (element lists, attributes) naming a mesh, texture, material or height field.
_ASSET_REFS = (("geoms", ("meshname", "hfieldname", "material")), ("sites", ("meshname", "material")),
               ("skins", ("material",)), ("tendons", ("material",)), ("flexes", ("material",)),
               ("lights", ("texture",)))
_USER_ARRAYS = (("bodies", "nuser_body"), ("joints", "nuser_jnt"), ("geoms", "nuser_geom"), ("sites", "nuser_site"),
                ("cameras", "nuser_cam"), ("tendons", "nuser_tendon"), ("actuators", "nuser_actuator"),
                ("sensors", "nuser_sensor"))
_COPY_PREFIX = re.compile(r"scene[0-9]+/")
_COPY_WORLD = re.compile(r"scene[0-9]+/world")
#: Name of the body the replay adds to a model (its cameras: `-0`, `-1`, ...); `~1`, `~2`, ... appended
#: when the model uses the name itself (see apply_recipe).
REPLAY_NAME = "mjarchive-replay"


def _number(value: Any, what: str, low: float, high: float, *, open_interval: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(f"the replay recipe's {what} must be a number, not {type(value).__name__}")
    inside = (low < value < high) if open_interval else (low <= value <= high)  # exact for huge ints too
    if not inside or not math.isfinite(value):
        bounds = f"({low:g}, {high:g})" if open_interval else f"[{low:g}, {high:g}]"
        raise Refused(f"the replay recipe's {what} = {value!r} is outside {bounds}")
    return float(value)


def _list(value: Any, what: str, low: int, high: int) -> list:
    if not isinstance(value, (list, tuple)) or not low <= len(value) <= high:
        raise Refused(f"the replay recipe's {what} must be a list of {low} to {high} entries")
    return list(value)


def _parse_recipe(recipe: Any) -> tuple[list[tuple[float, ...]], list[float]]:
    """Check a replay recipe (hostile JSON data): its copy offsets and camera fovys."""
    if not isinstance(recipe, dict):
        raise Refused(f"a replay recipe must be a JSON object, not {type(recipe).__name__}")
    unknown = sorted(str(k) for k in recipe if k not in _RECIPE_KEYS)
    if unknown:
        raise Refused(f"the replay recipe has unknown keys {unknown[:5]} (known: {list(_RECIPE_KEYS)})")
    copies = []
    if recipe.get("copies") is not None:
        for k, offset in enumerate(_list(recipe["copies"], "copies", 1, MAX_SCENE_COPIES)):
            xyz = _list(offset, f"copies[{k}]", 3, 3)
            copies.append(tuple(_number(v, f"copies[{k}][{i}] (metres)", -_MAX_SCENE_OFFSET, _MAX_SCENE_OFFSET)
                                for i, v in enumerate(xyz)))
    cameras = _list(recipe.get("cameras", []), "cameras", 0, _MAX_REPLAY_CAMERAS)
    fovys = [_number(v, f"cameras[{j}] (fovy, degrees)", 0, 180, open_interval=True) for j, v in enumerate(cameras)]
    return copies, fovys


def apply_recipe(spec: mujoco.MjSpec, recipe: dict) -> mujoco.MjSpec:
    """The replay model's spec, derived from the recorded model's `spec` by a checked `recipe`:

    - `"copies"`: `[[x, y, z], ...]` (1 to MAX_SCENE_COPIES offsets, metres). One copy of the whole
      model per offset, in order, its named elements prefixed `scene{k}/`; qpos and mocap bodies are
      the copies' in turn (copy k holds qpos `[k*nq, (k+1)*nq)`). Free-joint qpos and mocap_pos are
      world coordinates, so the caller adds copy k's offset to them; the rest moves with its frame.
      Meshes, textures, materials and height fields are copy 0's, shared. World-body planes and
      directional lights appear once (see `_share_world`). Keyframes are dropped; `<statistic>` is
      the recorded model's, so clipping planes, shadows and the headlight match one world's render.
    - `"cameras"`: `[fovy, ...]` (up to 16, degrees in (0, 180)): fixed cameras
      `mjarchive-replay-{j}` (`mjarchive-replay~k-{j}` if the model uses those names) at the
      origin, on a body of their own that comes last, ids `ncam - len(cameras) + j`, posed by the replay.

    The arena is sized for replay (`size_for_replay`). May return a new spec; `spec` may be changed
    either way. Raises `Refused` on a bad recipe."""
    copies, fovys = _parse_recipe(recipe)
    size_for_replay(spec)
    if copies:
        spec = _scene(spec, copies)
    if fovys:
        # The replay's names never collide with a valid model's: a model that names its own body or
        # camera like them keeps its names, and the replay takes `REPLAY_NAME~k` for the first free
        # k. Replay finds its body and cameras by place (the last body, and the cameras on it), not
        # by name (`replay.views.scene.replay_elements`).
        taken = {e.name for e in [*spec.bodies, *spec.cameras]}
        prefix, k = REPLAY_NAME, 0
        while prefix in taken or any(f"{prefix}-{j}" in taken for j in range(len(fovys))):
            k += 1
            prefix = f"{REPLAY_NAME}~{k}"
        # On a body of their own, last in the tree: cameras of the world body would come first.
        body = spec.worldbody.add_body(name=prefix)
        if hasattr(body, "fuse"):
            body.fuse = False  # <compiler fusestatic> would move them to the world body
        else:  # MuJoCo before 3.16 can only keep it by fusing no static body at all
            spec.compiler.fusestatic = False
        for j, fovy in enumerate(fovys):
            body.add_camera(name=f"{prefix}-{j}", fovy=fovy, mode=mujoco.mjtCamLight.mjCAMLIGHT_FIXED)
    return spec


def _scene(base: mujoco.MjSpec, copies: list[tuple[float, float, float]]) -> mujoco.MjSpec:
    for key in list(base.keys):  # a keyframe's qpos no longer fits the scene
        base.delete(key)
    base.nkey = 0  # <size nkey>: blank keyframes, unnamed, so prefixed to one repeated name
    # User arrays show in no picture, and N copies of them cost N times (64 humanoids with
    # nuser_geom="45000": a 422 MiB scene and 2.4 GiB to compose it; without them, 4 MiB).
    for elements, attr in _USER_ARRAYS:
        setattr(base, attr, 0)
        for element in getattr(base, elements):
            element.userdata = []
    base.nuserdata = 0
    first, rest = base.copy(), base.copy()
    model = first.compile()  # the recorded model as compiled alone: shared poses, statistic
    check_compiled(model)
    first.memory = rest.memory = -1  # the scene's arena is sized for all copies (attach warns of differing ones)
    offsets = np.asarray(copies, dtype=np.float64)
    mean = offsets.mean(axis=0)
    _share_world(first, model, offsets, mean)
    # The other copies bring no assets (their references are pointed at copy 0's below) and none of
    # what copy 0 holds for all. With its own meshes each, 16 copies of aloha_pot (134 meshes) took
    # 10 s and 1.8 GiB to compile; sharing copy 0's, 0.3 s and 0.4 GiB.
    for element in _shared_world(rest):
        rest.delete(element)
    for group in (rest.meshes, rest.textures, rest.materials, rest.hfields):
        for element in list(group):
            rest.delete(element)
    rest.assets.clear()

    scene = mujoco.MjSpec()
    for attr in _GLOBALS:
        setattr(scene, attr, getattr(base, attr))
    n = len(offsets)
    _check_scene_cost(model, n)
    scene.copy_during_attach = True  # `rest` is attached many times
    _attach_copies(scene, first, rest, offsets[:2])
    _share_assets(scene)
    if n > 2:  # bound the whole scene by what one more copy costs, before composing it
        size_for_replay(scene)
        extra = mujoco.mj_sizeModel(scene.compile()) - mujoco.mj_sizeModel(model)
        estimate = mujoco.mj_sizeModel(model) + extra * (n - 1)
        if estimate > MAX_SCENE_BYTES:
            raise Refused(f"a scene of {n} copies of this model would take about {estimate >> 20} MiB "
                          f"({extra >> 20} MiB a copy), above the replay limit of {MAX_SCENE_BYTES >> 20} MiB; "
                          "render fewer worlds per frame")
        _attach_copies(scene, first, rest, offsets[2:], start=2)
        _share_assets(scene)
    # MuJoCo's automatic arena grows faster than the copies (a 60-dof robot x 64 asked for 806 MB).
    size_for_replay(scene)
    # One world's statistic (meaninertia is deprecated and left out), centred on the grid.
    stat = scene.stat
    stat.extent, stat.center = model.stat.extent, model.stat.center + mean
    stat.meansize, stat.meanmass = model.stat.meansize, model.stat.meanmass
    return scene


def _check_scene_cost(model: Any, n: int) -> None:
    """Refuse a scene of `n` copies of `model` whose elements or arena are too many to compose."""
    elements = n * sum(int(getattr(model, count)) for count in _COUNTED)
    arena = _replay_arena(model.nv * n, model.nu * n)  # grows as the copies squared
    for what, value, limit in (("elements", elements, MAX_SCENE_ELEMENTS),
                               ("MiB of arena to compile", arena >> 20, MAX_ARENA_BYTES >> 20)):
        if value > limit:
            raise Refused(f"a scene of {n} copies of this model would have {value} {what}, above the replay limit "
                          f"of {limit}; render fewer worlds per frame")


def _attach_copies(scene: mujoco.MjSpec, first: mujoco.MjSpec, rest: mujoco.MjSpec, offsets: np.ndarray,
                   start: int = 0) -> None:
    for k, offset in enumerate(offsets, start):
        frame = scene.worldbody.add_frame(pos=offset)
        scene.attach(first if k == 0 else rest, frame=frame, prefix=f"scene{k}/")


def _share_assets(scene: mujoco.MjSpec) -> None:
    """Point the copies' asset references at copy 0's assets, and their targets at the world."""
    for elements, attrs in _ASSET_REFS:
        for element in getattr(scene, elements):
            for attr in attrs:
                name = getattr(element, attr, None)  # sites name meshes from MuJoCo 3.16 on
                if name and not name.startswith("scene0/"):
                    setattr(element, attr, _COPY_PREFIX.sub("scene0/", name, count=1))
    for element in [*scene.lights, *scene.cameras]:  # attach prefixes a target "world" here (only)
        if _COPY_WORLD.fullmatch(element.targetbody):
            element.targetbody = "world"


def _shared_world(spec: mujoco.MjSpec) -> list[Any]:
    """The world body's planes and directional lights: one of each serves every copy."""
    planes = [g for g in spec.worldbody.geoms if g.type == mujoco.mjtGeom.mjGEOM_PLANE]
    return planes + [light for light in spec.worldbody.lights if light.type == mujoco.mjtLightType.mjLIGHT_DIRECTIONAL]


def _share_world(first: mujoco.MjSpec, model: Any, offsets: np.ndarray, mean: np.ndarray) -> None:
    """Pose copy 0's shared elements for the whole grid, in a frame that undoes copy 0's offset.

    Coincident planes z-fight, so a floor appears once, centred on the grid and grown by its
    half-extent (an infinite one stays infinite); terrain, walls and height fields stay per copy.
    Directional lights light every copy alike, so N of them would light the scene N times over;
    spot and point lights have a position (and often a target body) and stay per copy."""
    shared = [(element, element.id) for element in _shared_world(first)]  # ids in `model`, until `first` changes
    frame = first.worldbody.add_frame(pos=mean - offsets[0])
    for element, i in shared:
        element.set_frame(frame)
        if isinstance(element, mujoco.MjsGeom):
            rot = np.empty(9)
            mujoco.mju_quat2Mat(rot, model.geom_quat[i])
            spread = np.abs((offsets - mean) @ rot.reshape(3, 3)).max(axis=0)  # in the plane's axes
            size = model.geom_size[i].copy()
            size[:2] = np.where(size[:2] > 0, size[:2] + spread[:2], 0.0)
            element.pos, element.quat, element.size = model.geom_pos[i], model.geom_quat[i], size
            element.alt.type = mujoco.mjtOrientation.mjORIENTATION_QUAT
        else:
            element.pos, element.dir = model.light_pos[i], model.light_dir[i]


def compile_payload(header: dict, body: bytes) -> bytes:
    """Parse, check, compile and pose the model once; returns its MJB bytes."""
    n_xml = int(header["xml"])
    xml = body[:n_xml].decode("utf-8")
    assets, offset = {}, n_xml
    for name, n in header["assets"]:
        assets[str(name)] = body[offset:offset + int(n)]
        offset += int(n)
    spec = mujoco.MjSpec.from_string(xml, assets=assets)
    check_spec_files(spec, assets)
    if header.get("recipe") is not None:
        spec = apply_recipe(spec, header["recipe"])  # sizes the arena for replay too
        check_spec_files(spec, assets)  # what the derived spec names is still only bundle members
    else:
        size_for_replay(spec)
    model = spec.compile()
    check_compiled(model)
    data = mujoco.MjData(model)  # allocates the arena: within the memory limit, or fails here
    mujoco.mj_kinematics(model, data)
    buffer = np.empty(mujoco.mj_sizeModel(model), np.uint8)
    mujoco.mj_saveModel(model, None, buffer)
    return buffer.tobytes()


def main(argv: list[str]) -> int:
    import resource

    for limit, value in ((resource.RLIMIT_AS, int(argv[0])), (resource.RLIMIT_CPU, int(argv[1]))):
        hard = resource.getrlimit(limit)[1]  # an inherited, stricter limit stays in force
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    try:
        header = json.loads(sys.stdin.buffer.readline())
        body = sys.stdin.buffer.read()
        mjb = compile_payload(header, body)
    except MemoryError:
        sys.stderr.write(json.dumps({"error": "compiling it ran out of the memory limit"}) + "\n")
        return 3
    except Exception as exc:  # MuJoCo's parser and compiler raise plain ValueError/Exception
        sys.stderr.write(json.dumps({"error": str(exc)[:500]}) + "\n")
        return 2
    sys.stdout.buffer.write(mjb)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
