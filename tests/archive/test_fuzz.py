"""A fixed-seed sample of the mutation fuzzer (tests/fuzz_hostile.py): each case damages one file
of a real archive and runs the public entry points on it in a limited child; every outcome must be
a success or a clean MjArchiveError, touching nothing outside. Seeds 3 and 4 found raw zarr errors
escaping from a damaged bundle member's metadata, 293 a list as `fill_value`, 1185 a damaged
bundle group when appending."""

from __future__ import annotations

import pytest

import fuzz_hostile
from mjarchive.testing import OpenWatcher

pytestmark = pytest.mark.skipif(not OpenWatcher.available(), reason="needs Linux inotify")


@pytest.fixture(scope="module")
def fuzz_setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    return fuzz_hostile.make_base(work / "base.mjarchive"), work, outside


@pytest.mark.parametrize("seed", [*range(12), 293, 1185])
def test_damaged_archive_gives_clean_outcomes(fuzz_setup, seed):
    base, work, outside = fuzz_setup
    assert fuzz_hostile.run_case(base, work, seed, outside) == []
