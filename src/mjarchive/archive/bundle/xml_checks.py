"""Static checks of a bundle's XML and declared sizes, before any parser that could disagree with
ElementTree (MuJoCo's TinyXML2) or allocate from a hostile number sees it (spec "Safe bundles")."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from ..._errors import UnsafeBundleError
from .compile_child import MAX_ARENA_BYTES

__all__ = ["DIR_ATTRS", "check_bundle_xml", "check_xml_text"]

DIR_ATTRS = ("meshdir", "texturedir", "assetdir")  # must be empty in a bundle: its files have flat names


#: The only XML declaration a bundle may start with; nothing else of the <?...?> or <!...> kinds.
_XML_DECL_RE = re.compile(r"""<\?xml\s+version\s*=\s*(["'])1\.[0-9]\1(?:\s+encoding\s*=\s*(["'])(?i:utf-8)\2)?"""
                          r"""(?:\s+standalone\s*=\s*(["'])(?:yes|no)\3)?\s*\?>""")
_MARKUP_DECL_RE = re.compile(r"<!(?!--)|<\?")
_BAD_ENTITY_RE = re.compile(r"&(?!(?:amp|lt|gt|quot|apos);)")
_BAD_CHAR_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufeff\ufffe\uffff]")
MAX_XML_DEPTH = 512
MAX_XML_ELEMENTS = 250_000  # real flattened robot models hold a few thousand
MAX_SUBMODEL_DEPTH = 0  # MuJoCo reads <model file=...> from the host disk, never from the assets
# Declared sizes checked before MuJoCo sees a bundle (the compile child enforces hard limits too).
MAX_REPLICATED = 100_000  # product of nested <replicate count>
MAX_GENERATED = 100_000  # <composite>/<flexcomp> count products
MAX_TEXTURE_PIXELS = 1 << 26  # 8192 x 8192, per builtin texture or decoded PNG
MAX_HFIELD_SAMPLES = 1 << 26
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _refuse(what: str) -> UnsafeBundleError:
    return UnsafeBundleError(f"{what}; the bundle may be hostile (bundles hold plain, flattened MJCF)")


def check_xml_text(xml: str) -> None:
    """Refuse text that two XML parsers could read differently, before any parser sees it.

    The checker below parses with ElementTree and MuJoCo with TinyXML2: a DOCTYPE (internal subset,
    external id), custom entity or character references, processing instructions, CDATA or
    control characters could make them see different documents.
    """
    if not isinstance(xml, str):
        raise _refuse("the bundled XML is not text")
    decl = _XML_DECL_RE.match(xml)
    body = xml[decl.end():] if decl else xml
    found = _MARKUP_DECL_RE.search(body)
    if found:
        kind = "a processing instruction or second XML declaration" if found.group() == "<?" else \
            "a DOCTYPE, entity declaration, CDATA section or other <! declaration"
        raise _refuse(f"the bundled XML contains {kind} at offset {found.start() + (decl.end() if decl else 0)}")
    found = _BAD_ENTITY_RE.search(xml)
    if found:
        raise _refuse(f"the bundled XML uses an entity or character reference at offset {found.start()} "
                      "(only &amp; &lt; &gt; &quot; &apos; are allowed)")
    found = _BAD_CHAR_RE.search(xml)
    if found:
        raise _refuse(f"the bundled XML contains the control character {found.group()!r} at offset {found.start()}")


def _parse_xml(xml: str) -> ET.Element:
    """ElementTree's view of already text-checked XML, refusing deep nesting and namespaces."""
    parser = ET.XMLPullParser(events=("start", "end"))
    root, depth, count = None, 0, 0
    try:
        # Fed in pieces, so deep or huge documents are refused before the whole tree is built.
        for offset in range(0, len(xml), 1 << 16):
            parser.feed(xml[offset:offset + (1 << 16)])
            for event, element in parser.read_events():
                if event == "end":
                    depth -= 1
                    continue
                depth, count = depth + 1, count + 1
                root = element if root is None else root
                if depth > MAX_XML_DEPTH:
                    raise _refuse(f"the bundled XML nests elements more than {MAX_XML_DEPTH} deep")
                if count > MAX_XML_ELEMENTS:
                    raise _refuse(f"the bundled XML has more than {MAX_XML_ELEMENTS} elements")
                if not isinstance(element.tag, str) or ":" in element.tag or "{" in element.tag:
                    raise _refuse(f"the bundled XML uses a namespaced element {element.tag!r}")
                for attr in element.attrib:
                    if ":" in attr or "{" in attr or attr == "xmlns":
                        raise _refuse(f"the bundled XML uses a namespaced attribute {attr!r} in <{element.tag}>")
        parser.close()
    except ET.ParseError as exc:
        raise UnsafeBundleError(f"the bundled XML is not well-formed: {exc}") from None
    if root is None:
        raise UnsafeBundleError("the bundled XML has no root element")
    return root


def _numbers(element: ET.Element, attr: str) -> list[float]:
    try:
        values = [float(v) for v in (element.get(attr) or "").split()]
    except ValueError:
        return []  # MuJoCo reports malformed numbers itself
    return [v if math.isfinite(v) else float("inf") for v in values]


def _product(values: list[float]) -> float:
    return math.prod(max(1.0, v) for v in values) if values else 1.0


def _memory_bytes(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]+)\s*([KMGT]?)\s*", text or "")
    return int(m.group(1)) * 1024 ** "_KMGT".index(m.group(2) or "_") if m else 0.0


def _check_declared_sizes(root: ET.Element, assets: Mapping[str, bytes]) -> None:
    """Bound the work and memory a model's own numbers ask for, before compiling it."""
    def walk(element: ET.Element, replicated: float) -> None:
        stack = [(element, replicated)]
        while stack:
            el, rep = stack.pop()
            tag = el.tag
            if tag == "replicate":
                rep *= _product(_numbers(el, "count"))
                if rep > MAX_REPLICATED:
                    raise _refuse(f"<replicate> elements multiply to {rep:g} copies (limit {MAX_REPLICATED})")
            elif tag in ("composite", "flexcomp") and _product(_numbers(el, "count")) * rep > MAX_GENERATED:
                raise _refuse(f"<{tag} count={el.get('count')!r}> generates more than {MAX_GENERATED} elements")
            elif tag == "texture":
                pixels = _product(_numbers(el, "width")) * _product(_numbers(el, "height"))
                if pixels > MAX_TEXTURE_PIXELS:
                    raise _refuse(f"texture {el.get('name')!r} declares {pixels:g} pixels (limit {MAX_TEXTURE_PIXELS})")
            elif tag == "hfield":
                samples = _product(_numbers(el, "nrow")) * _product(_numbers(el, "ncol"))
                if samples > MAX_HFIELD_SAMPLES:
                    raise _refuse(f"height field {el.get('name')!r} declares {samples:g} samples")
            elif tag == "size" and _memory_bytes(el.get("memory", "")) > MAX_ARENA_BYTES:
                raise _refuse(f"<size memory={el.get('memory')!r}> is above the replay limit of {MAX_ARENA_BYTES} bytes")
            stack.extend((child, rep) for child in el)

    walk(root, 1.0)
    for name, data in assets.items():
        if data[:8] == _PNG_SIGNATURE and len(data) >= 24 and data[12:16] == b"IHDR":
            width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
            if width * height > MAX_TEXTURE_PIXELS:
                raise _refuse(f"PNG asset {name!r} decodes to {width}x{height} pixels (limit {MAX_TEXTURE_PIXELS})")


def check_bundle_xml(xml: str, assets: Mapping[str, bytes]) -> None:
    """Refuse bundle XML that would make MuJoCo open anything but bundle members, that two parsers
    could read differently, or whose declared sizes are out of bounds.

    MuJoCo opens absolute and '../' paths in file=, *dir= and <include> even when an assets dict
    is given (and <model file=...> sub-models always from disk), so every file reference must name
    a bundle member exactly and sub-models are refused.
    """
    check_xml_text(xml)
    root = _parse_xml(xml)
    for element in root.iter():
        tag = element.tag
        if tag == "include":
            raise UnsafeBundleError("the bundled XML contains <include>; bundles must be flattened")
        if tag == "model" and element.get("file") is not None:
            raise _refuse(f"the bundled XML loads a sub-model from file {element.get('file')!r} (<model file=...>), "
                          "which MuJoCo reads from the host disk, not from the bundle")
        for attr, value in element.attrib.items():
            if attr in DIR_ATTRS and value:
                raise UnsafeBundleError(f"the bundled XML sets {tag} {attr}={value!r}; bundles must not name directories")
            if attr.startswith("file") and value and value not in assets:
                raise UnsafeBundleError(
                    f"the bundled XML references {attr}={value!r} in <{tag}>, which is not a bundle member"
                )
    _check_declared_sizes(root, assets)
