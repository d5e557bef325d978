# SPDX-License-Identifier: Apache-2.0
"""CRIU through the project's own install: dump a running job, restore it,
and compare its output with an uninterrupted run (bit-identical)."""
import json
import os
import pathlib
import signal
import subprocess

import pytest

from job_output import lines, wait_for

ITERATIONS, MS = 30, 30


def criu_path(phos) -> str:
    r = subprocess.run([str(phos), "doctor", "--json"], capture_output=True, text=True, check=True)
    check = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "criu")
    assert check["ok"], check["detail"]
    return check["detail"].split()[0]




@pytest.fixture(scope="module")
def counter(build_dir):
    return str(build_dir / "examples" / "smoke-counter")


@pytest.fixture(scope="module")
def reference(counter):
    return subprocess.run([counter, str(ITERATIONS), "0"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def start_job(counter, out: pathlib.Path):
    with open(out, "w") as f:
        return subprocess.Popen([counter, str(ITERATIONS), str(MS)], stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.DEVNULL, start_new_session=True)


def restore_and_finish(criu, image: pathlib.Path, out: pathlib.Path):
    subprocess.run([criu, "restore", "-D", str(image), "--restore-detached", "-o", "restore.log"],
                   check=True, timeout=60)
    wait_for(lambda: any(l.startswith("final") for l in lines(out)), 60, "the restored job")


@pytest.mark.parametrize("checkpoint_at", [1, 12, 25])
def test_dump_kill_restore_is_bit_identical(phos, counter, reference, tmp_path, checkpoint_at):
    criu = criu_path(phos)
    out, image = tmp_path / "job.out", tmp_path / "image"
    image.mkdir()
    job = start_job(counter, out)
    wait_for(lambda: len(lines(out)) >= checkpoint_at, 30, f"iteration {checkpoint_at}")
    subprocess.run([criu, "dump", "-t", str(job.pid), "-D", str(image), "-o", "dump.log"],
                   check=True, timeout=60)
    assert job.wait(timeout=10) == -signal.SIGKILL  # dump without --leave-running kills it
    dumped_at = len(lines(out))
    assert dumped_at < ITERATIONS, "the job finished before the checkpoint"

    restore_and_finish(criu, image, out)
    assert lines(out) == reference


def test_same_image_restores_twice(phos, counter, reference, tmp_path):
    criu = criu_path(phos)
    out, image = tmp_path / "job.out", tmp_path / "image"
    image.mkdir()
    job = start_job(counter, out)
    wait_for(lambda: len(lines(out)) >= 5, 30, "iteration 5")
    subprocess.run([criu, "dump", "-t", str(job.pid), "-D", str(image), "-o", "dump.log"],
                   check=True, timeout=60)
    job.wait(timeout=10)
    snapshot = out.read_bytes()
    for attempt in range(2):
        # CRIU checks that the output file has the size it had at dump time.
        out.write_bytes(snapshot)
        restore_and_finish(criu, image, out)
        assert lines(out) == reference, f"restore #{attempt + 1}"
        # The restored job keeps its pid; the next restore needs it free again.
        wait_for(lambda: not pathlib.Path(f"/proc/{job.pid}").exists(), 30,
                 f"restored pid {job.pid} to exit")


def test_leave_running_keeps_the_job_correct(phos, counter, reference, tmp_path):
    criu = criu_path(phos)
    out, image = tmp_path / "job.out", tmp_path / "image"
    image.mkdir()
    job = start_job(counter, out)
    wait_for(lambda: len(lines(out)) >= 5, 30, "iteration 5")
    subprocess.run([criu, "dump", "-t", str(job.pid), "-D", str(image), "--leave-running",
                    "-o", "dump.log"], check=True, timeout=60)
    assert job.wait(timeout=60) == 0
    assert lines(out) == reference


def test_dump_of_missing_process_fails_cleanly(phos, tmp_path):
    criu = criu_path(phos)
    # A pid that is not in use: the largest pid the kernel allows plus... the
    # kernel never hands out pid_max itself.
    pid_max = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text())
    r = subprocess.run([criu, "dump", "-t", str(pid_max), "-D", str(tmp_path), "-o", "dump.log"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
