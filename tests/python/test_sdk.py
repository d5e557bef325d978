# SPDX-License-Identifier: Apache-2.0
"""The application SDK: a job asks, in one line, for a checkpoint of itself.

The examples take --checkpoint-at STEP --checkpoint-image DIR, which call
phos_checkpoint() (sdk/include/phos/sdk.h; mlp-train) or phos_sdk.checkpoint()
(sdk/python; train.py) right after that step's line. Under phos run the job
runs on and finishes as the uninterrupted run does; the image, restored,
completes the uninterrupted run from a line after the one the call followed.
Without PhOS, and for an image that exists, the call fails with its errno and
the job runs on.
"""
import json
import pathlib
import subprocess
import sys

import pytest

from job_output import wait_for
from test_checkpoint_phos import (STEPS, Job, after_checkpoint, app_env, command, criu, programs,  # noqa: F401
                                  reference)
from test_concurrent_restore import restore

AT = 3
SDK_PYTHON = pathlib.Path(__file__).resolve().parents[2] / "sdk" / "python"


def with_checkpoint(cmd, image, mode="cow"):
    return cmd + ["--checkpoint-at", str(AT), "--checkpoint-image", str(image), "--checkpoint-mode", mode]


@pytest.mark.parametrize("job,mode", [("mlp-train", "cow"), ("train.py", "cow"), ("mlp-train", "recopy")])
def test_job_checkpoints_itself(criu, phos, phosd, app_env, programs, tmp_path, job, mode):
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    image = tmp_path / "image"
    running = Job(phos, phosd, with_checkpoint(cmd, image, mode), app_env, tmp_path)
    try:
        assert running.proc.wait(timeout=120) == 0, running.err.read_text()
    finally:
        running.stop()
    assert running.lines() == ref, "the job that checkpointed itself did not finish as the uninterrupted run"
    log = pathlib.Path(f"{image}.log")
    wait_for(lambda: log.exists() and log.read_text().strip().endswith("}"), 60, f"the report in {log}")
    report = json.loads(log.read_text())
    assert report["left_running"] is True and report["gpu_bytes"] > 0, report
    assert report["protocol"] == {"cow": "soft-copy-on-write", "recopy": "soft-recopy"}[mode], report
    after, _, _ = restore(phos, phosd, image, app_env)
    after_checkpoint(ref, after, AT + 1, STEPS)


def test_an_existing_image_is_refused(phos, phosd, app_env, programs, tmp_path):
    cmd = command(programs, "mlp-train")
    image = tmp_path / "image"
    image.mkdir()
    running = Job(phos, phosd, with_checkpoint(cmd, image), app_env, tmp_path)
    try:
        assert running.proc.wait(timeout=120) == 0, running.err.read_text()
    finally:
        running.stop()
    assert f"no checkpoint at step {AT}: File exists" in running.err.read_text()
    assert running.lines() == reference(cmd, app_env)


@pytest.mark.parametrize("job", ["mlp-train", "train.py"])
def test_without_phos_the_job_runs_on(app_env, programs, job):
    cmd = command(programs, job)
    r = subprocess.run(with_checkpoint(cmd, "/nonexistent/image"), env=app_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"no checkpoint at step {AT}: not running under PhOS" in r.stderr
    assert r.stdout.splitlines() == reference(cmd, app_env)


def test_python_sdk_rejects_a_bad_mode():
    sys.path.insert(0, str(SDK_PYTHON))
    try:
        import phos_sdk
        with pytest.raises(ValueError, match="mode must be one of cow, recopy, stop"):
            phos_sdk.checkpoint("/tmp/never", mode="fast")
        assert phos_sdk.available() is False  # pytest does not run under PhOS
        with pytest.raises(OSError, match="not running under PhOS"):
            phos_sdk.checkpoint("/tmp/never")
    finally:
        sys.path.remove(str(SDK_PYTHON))
