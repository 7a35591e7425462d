"""mjarchive against the conformance cases of spec/conformance/ (cases as data, see spec/README.md).

Every valid case reads back bit for bit; every invalid case is refused with the stated error class
and a message matching the case's `match`. The committed cases must equal what the generator
produces now, so the data cannot silently rot, and the JSON Schemas must agree with each case's
recorded schema verdict.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from mjarchive.archive.manifest import Manifest, check_schema
from mjarchive import FormatError

CONFORMANCE = Path(__file__).resolve().parents[2] / "spec" / "conformance"
INDEX = json.loads((CONFORMANCE / "cases.json").read_text())
BUNDLE_SCHEMA = json.loads((CONFORMANCE.parent / "bundle-attributes.schema.json").read_text())
PARTS_SCHEMA = json.loads((CONFORMANCE.parent / "parts-root-attributes.schema.json").read_text())

#: Cases the reference implementation does not pass yet, with the reason; remove when fixed.
KNOWN_FAILURES: dict[str, str] = {}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"mjarchive_conformance_{name}", CONFORMANCE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


make_cases = _load("make_cases")
run = _load("run")


@pytest.fixture(scope="module")
def runtime_cases(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("runtime-cases")
    make_cases.write_cases(directory, runtime=True)
    return directory


def _path(name: str, runtime_cases: Path) -> Path:
    return (runtime_cases if INDEX[name].get("runtime") else CONFORMANCE / "cases") / name


@pytest.mark.parametrize("name", list(INDEX))
def test_case(name, runtime_cases, request):
    if name in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=False))
    ok, detail = run.run_case(run.mjarchive_reader, _path(name, runtime_cases), INDEX[name],
                              error_classes=True, messages=True)
    assert ok, detail


def _root_attrs(path: Path) -> dict:
    # (bytes: json detects UTF-16/32, so a case about the encoding still shows its attributes here)
    return json.loads((path / "zarr.json").read_bytes())["attributes"]["mjarchive"]


@pytest.mark.parametrize("name", [n for n, e in INDEX.items() if not e.get("runtime")])
def test_schema_verdict(name):
    """The JSON Schemas accept exactly what each case records (`schema`, default its outcome)."""
    entry = INDEX[name]
    path = CONFORMANCE / "cases" / name
    attrs = _root_attrs(path)
    bundle = json.loads((path / "model" / "zarr.json").read_text())["attributes"]["mjarchive_bundle"]
    if entry.get("error") == "FormatVersionError":
        return  # another major version may have another schema: the version is checked first
    if "parts" in (attrs.get("required_features") if isinstance(attrs.get("required_features"), list) else ()):
        _parts_schema_verdict(entry, path, attrs, bundle)
        return
    if entry["expect"] == "valid" or entry["rule"] not in ("root-attributes", "rules-beyond-the-schema", "conventions"):
        check_schema(attrs)
        if entry["expect"] == "valid":
            jsonschema.Draft202012Validator(BUNDLE_SCHEMA).validate(bundle)
        return
    if entry.get("schema", entry["expect"]) == "valid":
        check_schema(attrs)  # only the rules beyond the schema catch it...
        with pytest.raises(FormatError):
            Manifest.from_dict(attrs)  # ...and the hand-written checks do
    else:
        with pytest.raises(FormatError):
            check_schema(attrs)


def _parts_schema_verdict(entry: dict, path: Path, attrs: dict, bundle: dict) -> None:
    """A multi-part archive's root against parts-root-attributes.schema.json, its parts' documents
    (those of valid cases) against the single root's schema."""
    from mjarchive.archive.parts import PartsRoot

    errors = list(jsonschema.Draft202012Validator(PARTS_SCHEMA).iter_errors(attrs))
    if entry.get("schema", "valid") == "invalid":
        assert errors, "the parts root schema accepts a root the case says it refuses"
        return
    assert not errors, errors[0].message
    if entry["expect"] == "valid":
        jsonschema.Draft202012Validator(BUNDLE_SCHEMA).validate(bundle)
        for part in (path / "parts").iterdir():
            if (part / "zarr.json").is_file() and "mjarchive" in _doc(part)["attributes"]:
                check_schema(_doc(part)["attributes"]["mjarchive"])
    elif entry.get("schema") == "valid":  # only the rules beyond the schema catch it...
        with pytest.raises(FormatError):
            PartsRoot.parse(attrs)  # ...and the hand-written checks do


def _doc(node: Path) -> dict:
    return json.loads((node / "zarr.json").read_bytes())


def test_committed_cases_equal_the_generator(tmp_path):
    index = make_cases.write_cases(tmp_path)
    assert json.loads(json.dumps(index)) == {n: e for n, e in INDEX.items() if not e.get("runtime")}, (
        "spec/conformance/cases.json is stale: run python spec/conformance/make_cases.py")
    assert {n for n, e in make_cases.CASES.items() if e.get("runtime")} == {n for n, e in INDEX.items() if e.get("runtime")}
    committed = sorted(p.name for p in (CONFORMANCE / "cases").iterdir())
    assert committed == sorted(index), "spec/conformance/cases/ holds other cases than the generator writes"
    for name in index:
        fresh, stored = make_cases.snapshot(tmp_path / name), make_cases.snapshot(CONFORMANCE / "cases" / name)
        assert fresh == stored, f"case {name} differs from its generator: run python spec/conformance/make_cases.py"


def test_committed_cases_are_small():
    for case in (CONFORMANCE / "cases").iterdir():
        size = sum(p.stat().st_size for p in case.rglob("*") if p.is_file())
        # About 1 kB per array's zarr.json: the two-part variants case is the largest, near 24 kB.
        assert size < 25 * 1024, f"conformance case {case.name} is {size} bytes; keep committed cases small"


def test_every_invalid_case_names_a_spec_section():
    readme = (CONFORMANCE.parent / "README.md").read_text().lower()
    headings = {line.lstrip("#").strip().replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
                for line in readme.splitlines() if line.startswith("#")}
    for name, entry in INDEX.items():
        if entry["expect"] == "invalid":
            assert entry["rule"] in headings, f"{name}: rule {entry['rule']!r} is not a section anchor of spec/README.md"
            assert entry["error"] in ("FormatError", "FormatVersionError", "UnsafeBundleError", "LayoutMismatchError")


def test_runner_command_line(capsys):
    assert run.main(["--only", "valid-minimal", "--only", "world-ids-duplicate", "--error-classes"]) == 0
    out = capsys.readouterr().out
    assert "valid-minimal: PASS" in out and "world-ids-duplicate: PASS FormatError" in out
