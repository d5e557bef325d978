# SPDX-License-Identifier: Apache-2.0
"""The examples print bit-identical output on vgpu directly and under PhOS (`phos run`).

Both examples print every step's loss with its float bits and end with a
checksum of the weights, so any difference in what the remoted calls compute
shows in the text.
"""
import os
import pathlib
import subprocess
import sys

import pytest

TRAIN_PY = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mlp" / "train.py"
STEPS = 4


def run(cmd, env):
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def direct_env(build_dir):
    """vgpu in the application's process, as test_mlp_python.py runs the examples."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), env.get("LD_LIBRARY_PATH", "")])
    env["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    env["PHOS_BUILD_DIR"] = str(build_dir)
    return env


def phos_run(phos, phosd, cmd, env):
    """`phos run` against the test's daemon; the application keeps the direct run's environment.

    Also checks that the program had a session: identical output from a run
    that never reached phosd would prove nothing.
    """
    proc = subprocess.Popen([str(c) for c in [phos, "run", "--runtime-dir", phosd.runtime_dir, "--", *cmd]],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    # `phos run` execs the program: the session's pid is the one we started.
    assert f": pid {proc.pid} uid" in phosd.log(), phosd.log()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def check_identical(direct, remoted):
    assert direct.returncode == 0, direct.stderr
    assert remoted.returncode == 0, remoted.stderr
    lines = direct.stdout.splitlines()
    assert len(lines) == STEPS + 1 and lines[-1].startswith("weights checksum "), direct.stdout
    assert remoted.stdout == direct.stdout
    assert remoted.stderr == direct.stderr == ""


def test_mlp_train_is_identical_under_phos(build_dir, phos, phosd, direct_env):
    exe = build_dir / "examples" / "mlp-train"
    if not exe.exists():
        pytest.skip(f"mlp-train was not built in {build_dir} (it needs nvcc)")
    cmd = [exe, "--iterations", STEPS]
    direct = run(cmd, direct_env)
    remoted = phos_run(phos, phosd, cmd, direct_env)
    check_identical(direct, remoted)


def test_train_py_is_identical_under_phos(build_dir, phos, phosd, direct_env):
    pytest.importorskip("cuda.core")
    if not (build_dir / "examples" / "mlp_kernels.ptx").exists():
        pytest.skip(f"the examples' PTX was not built in {build_dir} (it needs nvcc)")
    cmd = [sys.executable, TRAIN_PY, "--iterations", STEPS]
    direct = run(cmd, direct_env)
    remoted = phos_run(phos, phosd, cmd, direct_env)
    check_identical(direct, remoted)
