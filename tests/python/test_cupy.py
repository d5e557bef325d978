# SPDX-License-Identifier: Apache-2.0
"""CuPy (cupy-cuda13x from PyPI, in .venv) on vgpu and under `phos run`, and
checkpointed and restored.

CuPy compiles its kernels with NVRTC at run time; CUPY_COMPILE_WITH_PTX=1
makes it load PTX, which vgpu runs. Ground truth: tests/python/cupy_job.py
directly on vgpu (which itself checks every step against NumPy).
"""
import os
import signal
import subprocess

import pytest

from conftest import ROOT
from test_checkpoint_phos import Job, after_checkpoint, checkpoint, criu, restore  # noqa: F401 (fixtures)

TIMEOUT = 300
STEPS = 10


@pytest.fixture(scope="module")
def cupy_env(build_dir, tmp_path_factory):
    pytest.importorskip("cupy")
    e = dict(os.environ)
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_STDERR", "PHOS_DRIVER"):
        e.pop(name, None)
    e["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), e.get("LD_LIBRARY_PATH", "")])
    e["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    e["CUPY_COMPILE_WITH_PTX"] = "1"
    e["CUPY_ACCELERATORS"] = ""  # CUB's prebuilt module has PTX for sm_120 only
    e["CUPY_CACHE_DIR"] = str(tmp_path_factory.mktemp("cupy-cache"))
    return e


def job(*args):
    return [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "tests" / "python" / "cupy_job.py"),
            *map(str, args)]


def run(cmd, env):
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{cmd} exited with {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def reference(cupy_env):
    lines = run(job("--steps", STEPS), cupy_env).splitlines()
    assert len(lines) == STEPS + 1 and lines[-1].startswith("accuracy"), lines
    return lines


def test_runs_on_vgpu_and_under_phos_alike(phos, phosd, cupy_env, reference):
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", *job("--steps", STEPS)],
               cupy_env).splitlines() == reference


def test_killed_and_restored(criu, phos, phosd, cupy_env, reference, tmp_path):
    running = Job(phos, phosd, job("--steps", STEPS, "--sleep-ms", 300), cupy_env, tmp_path)
    try:
        running.wait_line(4)
        checkpoint(phos, phosd, running.pid, tmp_path / "image")
        assert running.proc.wait(timeout=60) == -signal.SIGKILL
        before = running.lines()
        assert before == reference[:len(before)] and len(before) < len(reference)
        assert before + restore(phos, phosd, tmp_path / "image", cupy_env) == reference
    finally:
        running.stop()


@pytest.mark.parametrize("mode", ["cow", "recopy"])
def test_left_running_and_restored(criu, phos, phosd, cupy_env, reference, tmp_path, mode):
    running = Job(phos, phosd, job("--steps", STEPS, "--sleep-ms", 250), cupy_env, tmp_path)
    try:
        running.wait_line(3)
        asked = len(running.lines())
        checkpoint(phos, phosd, running.pid, tmp_path / "image", "--leave-running", "--mode", mode)
        done = len(running.lines())
        assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
        assert running.lines() == reference
        after_checkpoint(reference, restore(phos, phosd, tmp_path / "image", cupy_env), asked, done)
    finally:
        running.stop()


CAPTURE = """
import cupy as cp
import numpy as np
x = cp.arange(4096, dtype=cp.float32)
y = cp.zeros_like(x)
out = cp.empty_like(x)
cp.multiply(x, 2, out=out)  # the kernels compiled before the capture
cp.add(out, y, out=y)
y.fill(0)
s = cp.cuda.Stream(non_blocking=True)
with s:
    s.begin_capture()
    cp.multiply(x, 2, out=out)
    cp.add(out, y, out=y)
    z = x * 3  # memory from CuPy's pool, taken inside the capture
    g = s.end_capture()
assert float(y.sum()) == 0.0  # captured, not run
for _ in range(3):
    g.launch(stream=s)
s.synchronize()
ref = np.arange(4096, dtype=np.float32)
print(bool((y.get() == ref * 2 * 3).all()), bool((z.get() == ref * 3).all()), float(y.sum()))
"""


def test_a_captured_graph_replays_under_phos_as_on_vgpu(phos, phosd, cupy_env, tmp_path):
    """CuPy's stream capture (Stream.begin_capture in relaxed mode, end_capture, Graph.launch) under
    phos run: captured on phosd's streams, launched three times, the same results as on vgpu."""
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE)
    python = str(ROOT / ".venv" / "bin" / "python")
    direct = run([python, script], cupy_env)
    assert direct.startswith("True True"), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", python, script], cupy_env) == direct
