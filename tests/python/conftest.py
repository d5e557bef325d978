# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the Python end-to-end tests: paths of the built programs."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("PHOS_BUILD_DIR", ROOT / "build"))
    if not (path / "build.ninja").exists():
        pytest.fail(f"no build in {path}; run scripts/test or set PHOS_BUILD_DIR")
    return path


@pytest.fixture(scope="session")
def phos(build_dir) -> pathlib.Path:
    exe = build_dir / "cli" / "phos"
    assert exe.exists(), f"{exe} was not built"
    return exe
