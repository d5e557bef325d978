# SPDX-License-Identifier: Apache-2.0
"""Mistakes a user can make with `phos run`, `phos ps` and `phos daemon`, and a program started
without a daemon: each fails with a status and a message that say what is wrong."""
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest


def run(*args, env=None, timeout=60):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def empty_runtime_dir():
    """A runtime directory no daemon serves (under /tmp: socket paths are short)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="phos-test-empty-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def no_daemon_started(runtime_dir: pathlib.Path):
    return not (runtime_dir / "phosd.sock").exists()


def test_run_without_a_command(phos, empty_runtime_dir):
    for args in (["run"], ["run", "--"], ["run", "--runtime-dir", empty_runtime_dir, "--"]):
        r = run(phos, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert "command is required" in r.stderr, (args, r.stderr)
    assert no_daemon_started(empty_runtime_dir)


def test_run_of_a_missing_program(phos, phosd):
    missing = "/nonexistent/phos-test-program"
    r = run(phos, "run", "--runtime-dir", phosd.runtime_dir, "--", missing, "--flag")
    assert r.returncode == 2, r.stderr
    assert missing in r.stderr
    assert "No such file or directory" in r.stderr
    assert r.stdout == ""


def test_run_of_a_missing_program_starts_no_daemon(phos, empty_runtime_dir):
    missing = "/nonexistent/phos-test-program"
    r = run(phos, "run", "--runtime-dir", empty_runtime_dir, "--", missing, env=dict(os.environ,
                                                                                 PHOS_VGPU_BANDWIDTH_SCALE="0"))
    started = not no_daemon_started(empty_runtime_dir)
    if started:
        run(phos, "daemon", "--stop", "--runtime-dir", empty_runtime_dir)
    assert r.returncode == 2 and missing in r.stderr, r.stderr
    assert not started, "a typo in the command left a daemon running"


def test_ps_without_a_daemon(phos, empty_runtime_dir):
    r = run(phos, "ps", "--runtime-dir", empty_runtime_dir)
    assert r.returncode == 1, r.stderr
    assert str(empty_runtime_dir / "phosd.sock") in r.stderr
    assert r.stdout == ""


def test_second_daemon_on_the_same_directory(phos, phosd):
    r = run(phos, "daemon", "--runtime-dir", phosd.runtime_dir, "--pool", "1", env=phosd.env)
    assert r.returncode == 1, r.stderr
    assert f"already serves {phosd.runtime_dir}" in r.stderr, r.stderr
    # The first one keeps its socket and answers.
    assert phosd.process.poll() is None
    assert phosd.request({"op": "ping"})["ok"] is True
    assert phosd.sessions() == []


def test_daemon_pool_out_of_range(phos, empty_runtime_dir):
    r = run(phos, "daemon", "--runtime-dir", empty_runtime_dir, "--pool", "99")
    assert r.returncode == 2, r.stderr
    assert "--pool must be 0..64, not 99" in r.stderr
    assert no_daemon_started(empty_runtime_dir)


def test_daemon_with_a_missing_driver(phos, empty_runtime_dir):
    missing = "/nonexistent/libcuda.so.1"
    r = run(phos, "daemon", "--runtime-dir", empty_runtime_dir, "--driver", missing)
    assert r.returncode == 1, r.stderr
    assert missing in r.stderr
    assert no_daemon_started(empty_runtime_dir)


def test_cuinit_without_a_daemon_is_a_quiet_no_device(build_dir, shim_clients, empty_runtime_dir):
    libphos = build_dir / "shim" / "libphos.so"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_LOG")}
    env.update(LD_PRELOAD=str(libphos), PHOS_RUNTIME_DIR=str(empty_runtime_dir))
    r = run(shim_clients / "session_client", "--init-only", env=env)
    assert r.returncode == 0, r.stderr
    # Only the program's own line: the shim writes nothing to its stdout or stderr.
    assert r.stdout == "cuInit CUDA_ERROR_NO_DEVICE\n"
    assert r.stderr == ""
