"""MkDocs hook: pages rendered at build time from what they document, so none of them can go stale:

- the format spec (spec/README.md, with its JSON Schemas) and the benchmark tables
  (benchmarks/README.md); a relative link in them to anything the site does not carry (a script, a
  folder) becomes the path in the repository, in code; anchors and the schemas stay links;
- the API reference: every name of `mjarchive.__all__` (the build fails on a name no section
  lists, or a listed name that is not public), then the integration modules."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite(text: str, folder: str, carried: set[str]) -> str:
    def link(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if target.startswith(("#", "http://", "https://")) or target.split("#")[0] in carried:
            return m.group(0)
        return f"{label} (`{folder}/{target}` in the repository)"
    return LINK.sub(link, text)


API_SECTIONS = {
    "Open and read": ["open", "Archive", "Selection", "VerifyReport", "Manifest", "TrackSpec", "ModelBundle",
                      "QposLayout", "FORMAT_VERSION"],
    "Write and record": ["create", "ArchiveWriter", "Recorder", "Overlay", "OverlayFrames", "compact",
                         "import_flygym"],
    "Replay": ["render", "iter_frames", "Camera", "close_pool", "view"],
    "Errors and warnings": ["MjArchiveError", "FormatError", "FormatVersionError", "BundleError",
                            "UnsafeBundleError", "LayoutMismatchError", "ArchiveNotFoundError", "ArchiveExistsError",
                            "SelectionError", "AppendError", "WriterLockedError", "ClosedError", "BackendError",
                            "StorageError", "UnenforcedWriterWarning"],
}
INTEGRATIONS = ["mjarchive.gymnasium", "mjarchive.mjlab", "mjarchive.playground", "mjarchive.flygym"]
API_INTRO = """# API reference

Everything on this page up to *Integrations* is `mjarchive.__all__`, the public surface: import it
from `mjarchive` (`mjarchive.create`, `mjarchive.open`, ...). The integrations are modules of their
own, imported only when used, each needing its stack installed.
"""


def api_page() -> str:
    import mjarchive

    listed = [name for names in API_SECTIONS.values() for name in names]
    unlisted, unknown = set(mjarchive.__all__) - set(listed), set(listed) - set(mjarchive.__all__)
    if unlisted or unknown or len(listed) != len(set(listed)):
        raise PluginError(f"docs/hooks.py API_SECTIONS is out of step with mjarchive.__all__: add {sorted(unlisted)}, "
                          f"remove {sorted(unknown)}, list each name once")
    lazy = getattr(mjarchive, "_LAZY", {})
    out = [API_INTRO]
    for title, names in API_SECTIONS.items():
        out.append(f"## {title}\n")
        for name in names:
            # Lazily imported names are documented where they are defined (mkdocstrings reads the
            # source, it does not import), shown under their public name.
            path = f"mjarchive{lazy[name]}.{name}" if name in lazy else f"mjarchive.{name}"
            out.append(f"::: {path}\n    options:\n      show_root_full_path: false\n      heading_level: 3\n")
    out.append("## Integrations\n")
    for module in INTEGRATIONS:
        out.append(f"::: {module}\n    options:\n      heading_level: 3\n      show_submodules: false\n")
    return "\n".join(out)


def on_files(files, config):
    files.append(File.generated(config, "api.md", content=api_page()))
    schemas = sorted((ROOT / "spec").glob("*.schema.json"))
    carried = {s.name for s in schemas}
    spec = _rewrite((ROOT / "spec" / "README.md").read_text(encoding="utf-8"), "spec", carried)
    files.append(File.generated(config, "format/spec.md", content=spec))
    for schema in schemas:
        files.append(File.generated(config, f"format/{schema.name}", abs_src_path=str(schema)))
    tables = _rewrite((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"), "benchmarks", set())
    files.append(File.generated(config, "benchmarks/tables.md", content=tables))
    return files
