# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the Python end-to-end tests: paths of the built programs, and private daemons."""
import os
import pathlib
import stat

import pytest

from private_daemon import PrivateDaemon

ROOT = pathlib.Path(__file__).resolve().parents[2]


# Directories above the build that other users could not enter, and their modes.
_opened = []


def pytest_configure(config):
    config.addinivalue_line("markers", "hostile: what a hostile local user tries (docs/security.md); "
                                       "scripts/test --suite hostile runs only these")
    # The multi-user tests run the build's programs as another user: the build
    # may lie under a directory others cannot enter (a fresh clone in a mktemp
    # directory), so they may pass through it (o+x), as an install would. Once,
    # for the whole run, in pytest's main process (not in pytest-xdist's
    # workers): a job checkpointed with one mode of its working directory is
    # refused by CRIU's restore under another.
    if hasattr(config, "workerinput"):
        return
    # Tests of one xdist_group share a resource (the default test hosts, the
    # probe user's files) and must run in one worker. pytest-xdist 3.8 groups
    # them by renaming their ids, which pytest 9.2 ignores: they then ran side
    # by side and broke each other. scripts/requirements.txt pins a pair that
    # works.
    if config.getoption("dist", "no") == "loadgroup" and int(pytest.__version__.split(".")[0]) >= 9:
        raise pytest.UsageError(f"pytest {pytest.__version__} does not let pytest-xdist's --dist loadgroup group "
                                "tests: install scripts/requirements.txt (pytest 8.4)")
    if os.geteuid() != 0:
        return
    build = pathlib.Path(os.environ.get("PHOS_BUILD_DIR", ROOT / "build")).resolve()
    for d in [build, *build.parents]:
        if d.exists() and not d.stat().st_mode & stat.S_IXOTH:
            mode = d.stat().st_mode
            os.chmod(d, mode | stat.S_IXOTH)
            _opened.append((d, mode))


def pytest_unconfigure(config):
    for d, mode in reversed(_opened):
        os.chmod(d, stat.S_IMODE(mode))
    _opened.clear()


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


@pytest.fixture
def start_phosd(phos, build_dir):
    """Starts private daemons (`start_phosd(PHOS_VGPU_MEMORY=...)`); stops them after the test."""
    started = []

    def start(**env):
        daemon = PrivateDaemon(phos, build_dir, env)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def phosd(start_phosd):
    """A private daemon with the default vgpu."""
    return start_phosd()


@pytest.fixture(scope="session")
def shim_clients(build_dir) -> pathlib.Path:
    """Where the Driver API clients of tests/shim/clients are built."""
    path = build_dir / "tests" / "shim"
    if not (path / "shim_kernels.ptx").exists():
        pytest.skip(f"the shim test clients were not built in {path} (they need nvcc and vgpu)")
    return path
