# SPDX-License-Identifier: Apache-2.0
"""CUDA runtime programs built with plain nvcc (tests/cudart/programs): directly on vgpu,
under `phos run`, and checkpointed and restored with every protocol.

The programs check their own results against the CPU and print checksums; the
ground truth of each run is the same program run uninterrupted directly on
vgpu, whose stdout must come out the same byte for byte. cudart reaches the
driver through NVIDIA's private export tables (export_tables/), its modules are
nvcc's fatbins, and train keeps state in a __device__ global and a __constant__
(docs/cudart.md).
"""
import json
import os
import signal
import subprocess

import pytest

from test_checkpoint_phos import Job, after_checkpoint, checkpoint, criu, restore  # noqa: F401 (fixtures)
from test_concurrent_restore import restore as restore_with

TIMEOUT = 120
PROGRAMS = ["vector_add", "matmul_tiled", "streams_events", "symbols", "atomics_warp", "reduction",
            "printf_hostfunc", "train", "vector_add_shared", "train_shared"]
STEPS = 14
SLEEP_MS = 200


@pytest.fixture(scope="module")
def cudart_dir(build_dir):
    path = build_dir / "tests" / "cudart"
    if not (path / "train").exists():
        pytest.skip(f"the cudart programs were not built in {path} (they need nvcc)")
    return path


@pytest.fixture(scope="module")
def env(build_dir):
    """vgpu's libcuda.so.1 first: what a program linked against cudart dlopens."""
    e = dict(os.environ)
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_STDERR", "PHOS_DRIVER"):
        e.pop(name, None)
    e["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), e.get("LD_LIBRARY_PATH", "")])
    e["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    return e


def run(cmd, env):
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{cmd} exited with {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("program", PROGRAMS)
def test_runs_on_vgpu_and_under_phos_alike(phos, phosd, cudart_dir, env, program):
    direct = run([cudart_dir / program], env)
    assert "OK" in direct or "weights checksum" in direct, direct
    under = run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / program], env)
    assert under == direct
    assert "session" in phosd.log(), "the program never had a PhOS session"


def train(cudart_dir, name="train"):
    return [str(cudart_dir / name), "--steps", str(STEPS), "--sleep-ms", str(SLEEP_MS)]


def reference(cudart_dir, env, name="train"):
    out = run([cudart_dir / name, "--steps", str(STEPS)], env).splitlines()
    assert len(out) == STEPS + 1
    return out


@pytest.mark.parametrize("name", ["train", "train_shared"])
def test_killed_and_restored(criu, phos, phosd, cudart_dir, env, tmp_path, name):
    """Stop-the-world: the job ends at the checkpoint; its restore finishes it exactly."""
    ref = reference(cudart_dir, env, name)
    job = Job(phos, phosd, train(cudart_dir, name), env, tmp_path)
    try:
        job.wait_line(4)
        checkpoint(phos, phosd, job.pid, tmp_path / "image")
        assert job.proc.wait(timeout=30) == -signal.SIGKILL
        before = job.lines()
        assert before == ref[:len(before)] and len(before) < len(ref)
        assert before + restore(phos, phosd, tmp_path / "image", env) == ref
    finally:
        job.stop()


@pytest.mark.parametrize("mode", ["cow", "recopy", "stop"])
def test_left_running_and_restored(criu, phos, phosd, cudart_dir, env, tmp_path, mode):
    """The job goes on to the uninterrupted end; the image restores to it as well."""
    ref = reference(cudart_dir, env)
    job = Job(phos, phosd, train(cudart_dir), env, tmp_path)
    try:
        job.wait_line(3)
        asked = len(job.lines())
        report = checkpoint(phos, phosd, job.pid, tmp_path / "image", "--leave-running", "--mode", mode)
        done = len(job.lines())
        assert report["left_running"] is True
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ref
        restored = restore(phos, phosd, tmp_path / "image", env)
        # Copy-on-write saves the state when it began, recopy when it ended.
        after_checkpoint(ref, restored, asked, done)
    finally:
        job.stop()


@pytest.mark.parametrize("eager", [False, True])
def test_restored_concurrently_or_eagerly(criu, phos, phosd, cudart_dir, env, tmp_path, eager):
    ref = reference(cudart_dir, env)
    job = Job(phos, phosd, train(cudart_dir), env, tmp_path)
    try:
        job.wait_line(5)
        checkpoint(phos, phosd, job.pid, tmp_path / "image")
        job.proc.wait(timeout=30)
        before = job.lines()
    finally:
        job.stop()
    out, report, _ = restore_with(phos, phosd, tmp_path / "image", env, *(["--eager"] if eager else []))
    assert before + out == ref
    assert report["gpu_session"] is True


def test_image_names_every_global_of_the_fatbin(criu, phos, phosd, cudart_dir, env, tmp_path):
    """A runtime program's image: its module is nvcc's fatbin, and both of its
    globals (a __device__ and a __constant__) are saved."""
    job = Job(phos, phosd, train(cudart_dir), env, tmp_path)
    try:
        job.wait_line(2)
        checkpoint(phos, phosd, job.pid, tmp_path / "image", "--leave-running")
    finally:
        job.stop()
    manifest = json.loads((tmp_path / "image" / "manifest.json").read_text())
    (module,) = manifest["state"]["gpu"]["sessions"][0]["modules"]
    assert module["globals_enumerated"] is True
    assert {g["name"] for g in module["globals"]} == {"gSteps", "kLearningRate"}
