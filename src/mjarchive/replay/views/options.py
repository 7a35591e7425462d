"""Scene options: what a replay draws (geom and site groups, frames, MuJoCo's visual and render flags).

`SceneOptions.parse` takes the user's `scene=` choice: None (MuJoCo's defaults, nothing changed), a
dict, or a CLI string, and validates it against the names of the installed MuJoCo's enums, so it
follows whichever MuJoCo is installed. `apply_cpu` sets them on a `mujoco.MjvOption` and
`mujoco.MjvScene`; `warp_render_kwargs` expresses them as `mujoco_warp.create_render_context`
keyword arguments and refuses what the Warp ray tracer cannot draw.

Example:
    SceneOptions.parse({"geomgroup": [1, 1, 0], "sites": True, "frames": "body"})
    SceneOptions.parse("sites,frames=body,geomgroup=110,transparent,shadow=0")   # the same, CLI form
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping

import mujoco
import numpy as np

from ..._errors import BackendError, MjArchiveError

__all__ = ["SceneOptions", "apply_cpu", "warp_render_kwargs", "KEYS", "VIS_FLAGS", "RENDER_FLAGS", "FRAMES",
           "REFUSED"]

NGROUP = 6


def _enum_names(enum, prefix: str) -> dict[str, int]:
    """{lowercased name without `prefix`: value} of a MuJoCo enum; counts like mjNVISFLAG are skipped."""
    members = getattr(enum, "__members__", None) or {n: getattr(enum, n) for n in dir(enum)}
    return {name[len(prefix):].lower(): int(value) for name, value in members.items() if name.startswith(prefix)}


_NEED_CONTACTS = "needs contacts, which position-only replay never computes"
_NEED_CONSTRAINTS = "needs constraint data, which position-only replay never computes"
_NEED_PERTURB = "shows an interactive perturbation or selection, which a recorded replay has none of"
_ID_COLOURS = "changes colours to object ids or depth; replay renders RGB videos"
#: Names MuJoCo has that replay refuses, with the reason. Refused whatever the value.
REFUSED: dict[str, str] = {
    "contactpoint": _NEED_CONTACTS,
    "contactforce": _NEED_CONTACTS,
    "contactsplit": _NEED_CONTACTS,
    "constraint": _NEED_CONSTRAINTS,
    "island": _NEED_CONSTRAINTS,
    "pertforce": _NEED_PERTURB,
    "pertobj": _NEED_PERTURB,
    "select": _NEED_PERTURB,
    "activation": "needs actuator activations, which replay does not pose",
    "sdfiter": "needs SDF collision iterations, which position-only replay never computes",
    "segment": _ID_COLOURS,
    "idcolor": _ID_COLOURS,
    "depth": _ID_COLOURS,
}
_REFUSED_FRAMES = {"contact": _NEED_CONTACTS}

_VIS = {k: v for k, v in _enum_names(mujoco.mjtVisFlag, "mjVIS_").items() if k not in REFUSED}
_RND = {k: v for k, v in _enum_names(mujoco.mjtRndFlag, "mjRND_").items() if k not in REFUSED}
_FRAME = {k: v for k, v in _enum_names(mujoco.mjtFrame, "mjFRAME_").items() if k not in _REFUSED_FRAMES}
#: The refused names this MuJoCo has (others are simply unknown to it).
_ALL_REFUSED = set(REFUSED) & (set(_enum_names(mujoco.mjtVisFlag, "mjVIS_"))
                                | set(_enum_names(mujoco.mjtRndFlag, "mjRND_")))

#: Option names besides the flags.
KEYS = ("geomgroup", "sitegroup", "sites", "frames")
#: mujoco.mjtVisFlag names replay accepts (lowercased, without mjVIS_), on this MuJoCo.
VIS_FLAGS = tuple(sorted(k for k in _VIS if k not in KEYS))
#: mujoco.mjtRndFlag names replay accepts (lowercased, without mjRND_), on this MuJoCo.
RENDER_FLAGS = tuple(sorted(k for k in _RND if k not in KEYS and k not in _VIS))
#: mujoco.mjtFrame names `frames` accepts.
FRAMES = tuple(sorted(_FRAME, key=_FRAME.get))

_DEFAULT_GEOMGROUP = tuple(int(v) for v in mujoco.MjvOption().geomgroup)
_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


def _valid_names() -> str:
    return (f"{', '.join(KEYS)} (geomgroup=110, sites, frames={'|'.join(FRAMES)}); visual flags: "
            f"{', '.join(VIS_FLAGS)}; render flags: {', '.join(RENDER_FLAGS)}")


def _shown(text: object) -> str:
    return repr("".join(ch for ch in str(text) if " " <= ch <= "~")[:64])


@dataclasses.dataclass(frozen=True)
class SceneOptions:
    """What a replay draws, as changes to MuJoCo's defaults; the default instance changes nothing.

    geomgroup, sitegroup: 0/1 for the first len() groups (up to 6); the rest keep MuJoCo's default.
    frames: a mujoco.mjtFrame name ("none", "body", ...) or None. flags: (mjtVisFlag name, on)
    pairs; render_flags: (mjtRndFlag name, on) pairs, both sorted by name.
    """

    geomgroup: tuple[int, ...] = ()
    sitegroup: tuple[int, ...] = ()
    frames: str | None = None
    flags: tuple[tuple[str, bool], ...] = ()
    render_flags: tuple[tuple[str, bool], ...] = ()

    @classmethod
    def parse(cls, value=None) -> SceneOptions:
        """SceneOptions from None (defaults), a SceneOptions, a dict or a CLI string.

        dict: {"geomgroup": [1, 1, 0] or "110", "sitegroup": ..., "sites": bool (all six site
        groups), "frames": "body", <flag>: bool}. CLI: "sites,frames=body,geomgroup=110,shadow=0"; a
        bare name turns a flag on, `name=0|1|on|off|true|false` sets it.
        """
        if value is None:
            return cls()
        if isinstance(value, SceneOptions):
            return value
        if isinstance(value, str):
            items = _cli_items(value)
        elif isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        else:
            raise MjArchiveError(
                f"scene options are a dict or a string like 'sites,frames=body,geomgroup=110', got "
                f"{type(value).__name__}; valid names: {_valid_names()}")
        return _from_items(items)

    @property
    def is_default(self) -> bool:
        return self == SceneOptions()

    def to_dict(self) -> dict:
        """The options as a dict `parse` accepts; only what differs from MuJoCo's defaults."""
        out: dict = {}
        if self.geomgroup:
            out["geomgroup"] = list(self.geomgroup)
        if self.sitegroup:
            out["sitegroup"] = list(self.sitegroup)
        if self.frames is not None:
            out["frames"] = self.frames
        out.update({name: bool(on) for name, on in (*self.flags, *self.render_flags)})
        return out

    def key(self) -> str:
        """A stable JSON string identifying these options (part of a render's resume key)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def _cli_items(text: str) -> list[tuple[str, object]]:
    items = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, raw = part.partition("=")
        items.append((name.strip(), raw.strip() if eq else True))
    return items


def _bool(name: str, value, problems: list[str]) -> bool | None:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    problems.append(f"{name} is on or off (true/false, 1/0, on/off), got {_shown(value)}")
    return None


def _groups(name: str, value, problems: list[str]) -> tuple[int, ...]:
    if isinstance(value, str):
        raw = list(value.strip())
    elif isinstance(value, (list, tuple, np.ndarray)):
        raw = list(np.asarray(value).reshape(-1)) if isinstance(value, np.ndarray) else list(value)
    else:
        raw = None
    ok = raw is not None and 1 <= len(raw) <= NGROUP
    out: list[int] = []
    for v in raw or ():
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and int(v) in (0, 1)):
            out.append(int(v))
        elif isinstance(v, str) and v in ("0", "1"):
            out.append(int(v))
        else:
            ok = False
    if not ok:
        problems.append(f"{name} is 1 to {NGROUP} values of 0 or 1, one per group from group 0 "
                        f"(e.g. {name}=110 or [1, 1, 0]; missing groups keep MuJoCo's default), got {_shown(value)}")
        return ()
    return tuple(out)


def _from_items(items: list[tuple[str, object]]) -> SceneOptions:
    problems: list[str] = []
    unknown: list[str] = []
    refused: list[str] = []
    seen: set[str] = set()
    geomgroup: tuple[int, ...] = ()
    sitegroup: tuple[int, ...] = ()
    sites: bool | None = None
    frames: str | None = None
    flags: dict[str, bool] = {}
    render_flags: dict[str, bool] = {}
    for raw_name, value in items:
        name = raw_name.strip().lower().replace("-", "_")
        if name in seen:
            problems.append(f"{_shown(name)} is given twice")
            continue
        seen.add(name)
        if name in ("geomgroup", "sitegroup"):
            if value is True:  # a bare CLI name
                problems.append(f"{name} needs a value, e.g. {name}=110")
                continue
            groups = _groups(name, value, problems)
            if name == "geomgroup":
                geomgroup = groups
            else:
                sitegroup = groups
        elif name == "sites":
            sites = _bool(name, value, problems)
        elif name == "frames":
            frame = str(value).strip().lower() if isinstance(value, str) else None
            if frame in _REFUSED_FRAMES:
                refused.append(f"frames={frame} ({_REFUSED_FRAMES[frame]})")
            elif frame not in _FRAME:
                problems.append(f"frames is one of {', '.join(FRAMES)}, got {_shown(value)}")
            else:
                frames = frame
        elif name in _ALL_REFUSED:
            refused.append(f"{name} ({REFUSED[name]})")
        elif name in VIS_FLAGS or name in RENDER_FLAGS:
            on = _bool(name, value, problems)
            if on is not None:
                (flags if name in VIS_FLAGS else render_flags)[name] = on
        else:
            unknown.append(_shown(raw_name))
    if sites is not None:
        if sitegroup:
            problems.append("give sites (all six site groups) or sitegroup, not both")
        else:
            sitegroup = (int(sites),) * NGROUP
    if refused:
        problems.insert(0, f"replay cannot draw {'; '.join(refused)}")
    if unknown:
        problems.append(f"unknown scene option(s) {', '.join(unknown)}; valid names: {_valid_names()}")
    if problems:
        raise MjArchiveError("; ".join(problems))
    return SceneOptions(geomgroup, sitegroup, frames, tuple(sorted(flags.items())),
                        tuple(sorted(render_flags.items())))


# --- backends -------------------------------------------------------------------------------------

def apply_cpu(options: SceneOptions, option: mujoco.MjvOption, scene: mujoco.MjvScene) -> None:
    """Set `options` on a MjvOption (geom/site groups, frame, visual flags) and a MjvScene (render flags).

    Only what `options` names changes; pass `option` to `Renderer.update_scene(..., scene_option=)`.
    """
    for i, on in enumerate(options.geomgroup):
        option.geomgroup[i] = on
    for i, on in enumerate(options.sitegroup):
        option.sitegroup[i] = on
    if options.frames is not None:
        option.frame = _FRAME[options.frames]
    for name, on in options.flags:
        option.flags[_VIS[name]] = on
    for name, on in options.render_flags:
        scene.flags[_RND[name]] = on


#: Options the Warp renderer has a create_render_context keyword for.
_WARP_VIS = {"texture": "use_textures"}
_WARP_RND = {"shadow": "use_shadows", "skybox": "render_skybox", "cull_face": "enable_backface_culling"}
#: What the Warp renderer always does for a flag it has no keyword for (absent: draws nothing of it).
#: Flexes it draws its own way, so no flex flag value matches it.
_WARP_FIXED = {"static": True}
_WARP_NEVER = {"flexvert", "flexedge", "flexface", "flexskin"}


def warp_render_kwargs(options: SceneOptions, supported: Collection[str] | None = None) -> dict:
    """Keyword arguments for `mujoco_warp.create_render_context` that draw `options`.

    supported: the keyword names the installed create_render_context takes (e.g.
    `inspect.signature(mjw.create_render_context).parameters`); None assumes mujoco-warp 4.0's.
    Options left at MuJoCo's defaults add nothing, so the caller's own defaults stand.
    Raises BackendError naming every option the Warp ray tracer cannot draw.
    """
    kwargs: dict = {}
    cannot: list[str] = []
    missing: list[str] = []

    def put(key: str, value, shown: str) -> None:
        if supported is not None and key not in supported:
            missing.append(f"{shown} (needs create_render_context({key}=...))")
        else:
            kwargs[key] = value

    if options.geomgroup:
        merged = options.geomgroup + _DEFAULT_GEOMGROUP[len(options.geomgroup):]
        put("enabled_geom_groups", [i for i, on in enumerate(merged) if on],
            f"geomgroup={''.join(map(str, options.geomgroup))}")
    if any(options.sitegroup):
        cannot.append(f"sites (sitegroup={''.join(map(str, options.sitegroup))})")
    if options.frames not in (None, "none"):
        cannot.append(f"frames={options.frames}")
    for name, on in options.flags:
        if name in _WARP_VIS:
            put(_WARP_VIS[name], bool(on), f"{name}={int(on)}")
        elif name in _WARP_NEVER or bool(on) != _WARP_FIXED.get(name, False):
            cannot.append(f"{name}={int(on)}")
    for name, on in options.render_flags:
        if name in _WARP_RND:
            put(_WARP_RND[name], bool(on), f"{name}={int(on)}")
        elif bool(on) != _WARP_FIXED.get(name, False):
            cannot.append(f"{name}={int(on)}")
    problems = []
    if cannot:
        problems.append(f"backend 'warp' cannot draw the scene options {', '.join(cannot)}; "
                        "backend='cpu' draws them, or leave them out")
    if missing:
        problems.append(f"the installed mujoco-warp cannot set {', '.join(missing)}; upgrade mujoco-warp "
                        "or use backend='cpu'")
    if problems:
        raise BackendError("; ".join(problems))
    return kwargs
