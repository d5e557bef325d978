# SPDX-License-Identifier: Apache-2.0
"""The example GPU job (examples/mlp: a Driver API training loop on vgpu),
checkpointed with phos mid-training and restored: losses and the final weight
checksum must be bit-identical to an uninterrupted run.

Until phosd exists, vgpu runs inside the job and CRIU saves its device memory
as process memory; these tests pin that behaviour down as the ground truth the
phosd path will be compared against."""
import json
import os
import pathlib
import signal
import subprocess

import pytest

from job_output import lines, wait_for

STEPS = 20




@pytest.fixture(scope="module")
def trainer(build_dir):
    exe = build_dir / "examples" / "mlp-train"
    if not exe.exists():
        pytest.skip("mlp-train was not built (needs nvcc and vgpu)")
    return str(exe)


@pytest.fixture(scope="module")
def reference(trainer):
    out = subprocess.run([trainer, "--iterations", str(STEPS)], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    assert len(out) == STEPS + 1 and out[-1].startswith("weights checksum")
    return out


def test_training_is_deterministic(trainer, reference):
    again = subprocess.run([trainer, "--iterations", str(STEPS)], capture_output=True, text=True,
                           check=True, timeout=300, env={**os.environ, "PHOS_VGPU_THREADS": "1"})
    assert again.stdout.splitlines() == reference


@pytest.mark.parametrize("at", [1, 12])
def test_checkpoint_restore_mid_training_is_bit_identical(phos, trainer, reference, tmp_path, at):
    out, image = tmp_path / "train.out", tmp_path / "image"
    with open(out, "w") as f:
        job = subprocess.Popen([trainer, "--iterations", str(STEPS), "--sleep-ms", "100"],
                               stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        wait_for(lambda: len(lines(out)) >= at, 60, f"step {at}")
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image),
                            "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert job.wait(timeout=10) == -signal.SIGKILL
        assert len(lines(out)) < STEPS, "training finished before the checkpoint"

        # phos restore is the job again: it runs in the foreground, with the
        # job's output on its stdout and the job's exit code.
        before = lines(out)
        r = subprocess.run([str(phos), "restore", "--image", str(image)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert before + r.stdout.splitlines() == reference
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
