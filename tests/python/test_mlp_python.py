# SPDX-License-Identifier: Apache-2.0
"""examples/mlp/train.py, the cuda.core twin of mlp-train, prints the same lines bit for bit.

Both programs run on the built vgpu (LD_LIBRARY_PATH), each in its own process;
train.py finds the PTX through PHOS_BUILD_DIR, as it does when run from a build.
"""
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("cuda.core")

TRAIN_PY = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mlp" / "train.py"
STEPS = 20


@pytest.fixture(scope="module")
def vgpu_env(build_dir):
    libdir = build_dir / "vgpu"
    if not (libdir / "libcuda.so.1").exists():
        pytest.skip(f"vgpu was not built in {build_dir}")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([str(libdir), env.get("LD_LIBRARY_PATH", "")])
    env["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    env["PHOS_BUILD_DIR"] = str(build_dir)
    return env


@pytest.fixture(scope="module")
def mlp_train(build_dir):
    exe = build_dir / "examples" / "mlp-train"
    if not exe.exists() or not (build_dir / "examples" / "mlp_kernels.ptx").exists():
        pytest.skip(f"mlp-train and its PTX were not built in {build_dir} (they need nvcc)")
    return exe


def run(cmd, env):
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=600)


def test_python_and_cpp_print_identical_lines(mlp_train, vgpu_env):
    cpp = run([mlp_train, "--iterations", STEPS], vgpu_env)
    assert cpp.returncode == 0, cpp.stderr
    py = run([sys.executable, TRAIN_PY, "--iterations", STEPS], vgpu_env)
    assert py.returncode == 0, py.stderr
    lines = py.stdout.splitlines()
    assert len(lines) == STEPS + 1, py.stdout
    assert lines[0].startswith("step 0 loss ") and lines[-1].startswith("weights checksum "), py.stdout
    assert py.stdout == cpp.stdout


def test_missing_ptx_is_a_clear_error(vgpu_env, tmp_path):
    missing = tmp_path / "no_such.ptx"
    py = run([sys.executable, TRAIN_PY, "--iterations", 1, "--ptx", missing], vgpu_env)
    assert py.returncode == 2, py.stdout + py.stderr
    assert py.stdout == ""
    assert f"cannot read the kernels' PTX at {missing}" in py.stderr
    assert "Traceback" not in py.stderr
