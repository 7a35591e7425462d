"""Compile an untrusted model bundle in a process of its own, under memory and CPU limits.

Run as a script (`python -I compile_child.py MEMORY_BYTES CPU_SECONDS`) by `sandbox.py`; it imports
only MuJoCo, so nothing else of the parent's state is within reach. Standard input carries one
JSON header line `{"xml": n, "assets": [[name, n], ...]}` followed by the raw bytes; standard
output returns the compiled model as MJB bytes, standard error one JSON line `{"error": "..."}` on
refusal. `check_spec_files` is also imported by `bundle.py` for in-process parsing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import mujoco

#: What a compiled untrusted model may hold: checked after compiling, before any MjData exists.
MAX_MODEL_BYTES = 512 * 2**20
MAX_ARENA_BYTES = 512 * 2**20
MAX_TEXTURE_BYTES = 256 * 2**20
MAX_OFFSCREEN_SIDE = 8192
MAX_SHADOW_SIZE = 8192
MAX_OFFSAMPLES = 16
MAX_QUALITY_SEGMENTS = 512  # numslices, numstacks, numquads


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
    model = spec.compile()
    check_compiled(model)
    data = mujoco.MjData(model)  # allocates the arena: within the memory limit, or fails here
    mujoco.mj_kinematics(model, data)
    import numpy as np

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
