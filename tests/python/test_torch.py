# SPDX-License-Identifier: Apache-2.0
"""PyTorch (the default PyPI wheel, a CUDA build) on vgpu and under `phos run`.

Runs when `scripts/setup --with-torch` has installed it into .venv-torch;
skipped otherwise. torch's wheels carry no PTX, so its kernels run only on a
real GPU: tests/python/torch_job.py does what needs no kernel (device
properties, tensors made and changed by copies, pageable and pinned, streams
and events, memory statistics) with the native caching allocator and with
cudaMallocAsync, and ends with one kernel launch, which torch must report
cleanly. Ground truth: the job directly on vgpu.
"""
import os
import signal
import subprocess

import pytest

from conftest import ROOT
from test_checkpoint_phos import Job, after_checkpoint, checkpoint, criu, restore  # noqa: F401 (fixtures)

TIMEOUT = 300
STEPS = 8
ALLOCATORS = ["native", "cudaMallocAsync"]


@pytest.fixture(scope="module")
def torch_python():
    python = ROOT / ".venv-torch" / "bin" / "python"
    if not python.exists():
        pytest.skip("PyTorch is not installed (scripts/setup --with-torch)")
    return python


def job_env(build_dir, allocator):
    e = dict(os.environ)
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_STDERR", "PHOS_DRIVER"):
        e.pop(name, None)
    e["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), e.get("LD_LIBRARY_PATH", "")])
    e["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    e["PYTORCH_CUDA_ALLOC_CONF"] = f"backend:{allocator}"
    return e


def job(torch_python, *args):
    return [str(torch_python), str(ROOT / "tests" / "python" / "torch_job.py"), *map(str, args)]


def run(cmd, env):
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{cmd} exited with {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_runs_on_vgpu_and_under_phos_alike(phos, phosd, build_dir, torch_python, allocator):
    env = job_env(build_dir, allocator)
    cmd = job(torch_python, "--steps", STEPS, "--launch")
    direct = run(cmd, env)
    lines = direct.splitlines()
    assert lines[0].startswith("device PhOS vGPU") and lines[0].endswith(f"allocator {allocator}"), lines[0]
    assert len(lines) == STEPS + 3
    assert lines[-1] == ("kernel refused: AcceleratorError: CUDA error: no kernel image is available for "
                         "execution on the device"), lines[-1]
    under = run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", *cmd], env)
    assert under == direct
    # The refused launch left the daemon serving.
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", *job(torch_python, "--steps", 1)],
               env).splitlines()[1].startswith("step 0 ")


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_killed_and_restored(criu, phos, phosd, build_dir, torch_python, tmp_path, allocator):
    """Every tensor's bytes come back: the restored job's checksums are the uninterrupted run's."""
    env = job_env(build_dir, allocator)
    ref = run(job(torch_python, "--steps", STEPS), env).splitlines()
    running = Job(phos, phosd, job(torch_python, "--steps", STEPS, "--sleep-ms", 400), env, tmp_path)
    try:
        running.wait_line(4)
        checkpoint(phos, phosd, running.pid, tmp_path / "image")
        assert running.proc.wait(timeout=60) == -signal.SIGKILL
        before = running.lines()
        assert before == ref[:len(before)] and len(before) < len(ref)
        assert before + restore(phos, phosd, tmp_path / "image", env) == ref
    finally:
        running.stop()


def test_left_running_and_restored(criu, phos, phosd, build_dir, torch_python, tmp_path):
    env = job_env(build_dir, "cudaMallocAsync")
    ref = run(job(torch_python, "--steps", STEPS), env).splitlines()
    running = Job(phos, phosd, job(torch_python, "--steps", STEPS, "--sleep-ms", 300), env, tmp_path)
    try:
        running.wait_line(3)
        asked = len(running.lines())
        checkpoint(phos, phosd, running.pid, tmp_path / "image", "--leave-running", "--mode", "cow")
        done = len(running.lines())
        assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
        assert running.lines() == ref
        after_checkpoint(ref, restore(phos, phosd, tmp_path / "image", env), asked, done)
    finally:
        running.stop()
