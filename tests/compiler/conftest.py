"""Builds shared by the compiler tests: every shipped spec at small widths, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SPECS

# Small enough to compile and export quickly on 2 cores, large enough to have several chunks at
# length 1000 (max_len 1024, chunk 64) and every mechanism of the spec.
SMALL = ["d_model=32", "max_len=1024"]
PER_SPEC = {
    "ffn-aoglu": ["layers[0].layers[0].mixer.feature_map.rank=2", "layers[0].repeat=2"],
    "gateloop": ["layers[0].layers[0].mixer.heads=32", "layers[0].repeat=2"],
    "hybrid": ["layers[0].repeat=1", "layers[0].layers[0].repeat=2"],
    "rank-collapse-san": ["max_len=128", "layers[0].repeat=3"],
}


def small_overrides(spec: Path) -> list[str]:
    extra = PER_SPEC.get(spec.stem, ["layers[0].repeat=2"])
    return SMALL + extra


@pytest.fixture(scope="session")
def built_specs(tmp_path_factory):
    """``{name: BuildResult}`` for every spec in specs/, all built in this one process (compiled + exported).
    Their compile checks run Inductor's generated code (``--inductor``; a build's default only traces), so the
    suite holds every shipped spec to Inductor's compiled output."""
    from attnspec.compiler.build import build_directory

    root = tmp_path_factory.mktemp("builds")
    return {spec.stem: build_directory(spec, root / spec.stem, overrides=small_overrides(spec), compile_check="inductor")
            for spec in SPECS}
