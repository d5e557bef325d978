# SPDX-License-Identifier: Apache-2.0
"""Soft recopy checkpoints: GPU memory copied while the job runs, then what it wrote again.

The image must hold the GPU state of the end t2 (the final quiesce, right
before CRIU's dump) byte for byte, while the job keeps writing some of its
buffers during the copy. phosd takes the reference at t2 straight from the
device (PHOS_TEST_REFERENCE_SNAPSHOT), and the modelled copy bandwidth is slowed
so that the first round spans many of the job's iterations. A kernel that writes
outside the buffer its argument names makes every chunk be copied again at t2,
and the image is still good. A job checkpointed this way (and ended by the dump)
restores to the uninterrupted run's end.
"""
import json
import signal
import subprocess
import sys

import pytest

from driver_client import PRELUDE
from test_checkpoint_phos import after_checkpoint, app_env, command, criu, programs, reference  # noqa: F401
from test_concurrent_restore import restore
from test_soft_cow import BUFFER_BYTES, BUFFERS, Client, read_blob

TIMEOUT = 90
# The job: test_soft_cow's client writing two of its buffers whole per iteration.
HOT = 2


@pytest.fixture
def slow_copies(start_phosd, tmp_path):
    """A daemon whose copies take 2000 times their modelled time, writing the
    reference snapshot of each recopy checkpoint at t2."""
    snapshots = tmp_path / "reference"
    snapshots.mkdir()
    daemon = start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=2000, PHOS_TEST_REFERENCE_SNAPSHOT=snapshots)
    return daemon, snapshots


def checkpoint(phos, phosd, pid, image, *extra):
    try:
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(pid), "--image", str(image), "--mode", "recopy",
                            "--compress", "none", "--runtime-dir", str(phosd.runtime_dir), "--json", *extra],
                           capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"phos checkpoint did not finish in {TIMEOUT} s:\n{phosd.log()[-4000:]}")
    assert r.returncode == 0, f"phos checkpoint failed ({r.returncode}): {r.stderr}\n{phosd.log()[-4000:]}"
    return json.loads(r.stdout)


def image_matches_reference(image, snapshots):
    manifest = json.loads((image / "manifest.json").read_text())
    assert manifest["state"]["protocol"] == "soft-recopy"
    allocations = manifest["state"]["gpu"]["sessions"][0]["allocations"]
    assert len(allocations) == BUFFERS
    assert {p.name for p in snapshots.iterdir()} == {hex(a["address"]) for a in allocations}
    for a in allocations:
        expected = (snapshots / hex(a["address"])).read_bytes()
        assert len(expected) == a["bytes"] == BUFFER_BYTES
        assert read_blob(image, manifest, a["blob"]) == expected, \
            f"buffer {hex(a['address'])}: the image differs from the state at t2"


@pytest.mark.parametrize("spill_every", [0, 1])
def test_recopy_image_is_the_state_at_the_end(criu, phos, slow_copies, tmp_path, spill_every):
    phosd, snapshots = slow_copies
    client = Client(phos, phosd, tmp_path, spill_every, hot=HOT)
    try:
        client.wait_iterations(3)
        image = tmp_path / "image"
        before = client.iterations()
        report = checkpoint(phos, phosd, client.proc.pid, image, "--leave-running")
        during = client.iterations() - before
        assert report["protocol"] == "soft-recopy", report
        recopy = report["recopy"]
        # The job ran on while its memory was copied, writing some of it.
        assert during >= 2, f"only {during} iterations while the checkpoint ran: {report}"
        assert recopy["rounds"] >= 1 and recopy["round_chunks"][0] == BUFFERS * 2, report
        total = BUFFERS * BUFFER_BYTES
        assert recopy["reused_bytes"] + recopy["recopied_bytes"] == total, report
        if spill_every:
            # Writes the twins caught: no chunk could be trusted clean.
            assert recopy["misspeculations"] > 0 and recopy["recopied_bytes"] == total, report
        else:
            # Only what the job wrote was copied again at t2.
            assert recopy["misspeculations"] == 0, report
            assert recopy["reused_bytes"] >= 3 * BUFFER_BYTES, report
        client.wait_iterations(client.iterations() + 2)  # and still runs
    finally:
        client.stop()
    image_matches_reference(image, snapshots)
    verify = subprocess.run([str(phos), "verify", str(image)], capture_output=True, text=True, timeout=TIMEOUT)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("job", ["mlp-train", "train.py"])
def test_recopied_job_restores_to_the_uninterrupted_end(criu, phos, slow_copies, app_env, programs, tmp_path, job):
    from test_checkpoint_phos import Job
    phosd, _ = slow_copies
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    running = Job(phos, phosd, cmd, app_env, tmp_path)
    try:
        running.wait_line(3)
        asked = len(running.lines())
        image = tmp_path / "image"
        report = checkpoint(phos, phosd, running.pid, image)
        assert report["protocol"] == "soft-recopy" and report["left_running"] is False, report
        assert running.proc.wait(timeout=30) == -signal.SIGKILL
        before = running.lines()
    finally:
        running.stop()
    assert asked <= len(before) < len(ref) and before == ref[:len(before)]
    after, _, _ = restore(phos, phosd, image, app_env)
    after_checkpoint(ref, after, len(before), len(before))


# Eight buffers allocated, written and freed over and over, beside one kept.
CHURN = PRELUDE + r'''
ok(cu.cuInit(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
keep = ok(cu.cuMemAlloc(1 << 20))
ok(cu.cuMemsetD8(keep, 7, 1 << 20))
print("ready", flush=True)
while True:
    churn = [ok(cu.cuMemAlloc((64 + i) << 10)) for i in range(8)]
    for b in churn:
        ok(cu.cuMemsetD8(b, 1, 64 << 10))
    for b in churn:
        ok(cu.cuMemFree(b))
'''


def test_a_buffer_freed_as_the_recopy_begins_is_not_copied(criu, phos, phosd, app_env, tmp_path):  # noqa: F811
    """The list of buffers to copy is taken before the gate that sees frees is
    in: a buffer freed in between was copied from an address no longer mapped,
    and the checkpoint failed with CUresult 1 (found by the differential tester)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from job_output import wait_for
    from test_checkpoint_phos import Job
    env = dict(app_env, LD_LIBRARY_PATH=":".join(["/usr/local/cuda/lib64", app_env["LD_LIBRARY_PATH"]]))
    job = Job(phos, phosd, [sys.executable, "-c", CHURN], env, tmp_path)
    try:
        job.wait_line(1)
        for n in range(8):
            report = checkpoint(phos, phosd, job.pid, tmp_path / f"image-{n}", "--leave-running")
            assert report["protocol"] == "soft-recopy", report
        wait_for(lambda: job.proc.poll() is None, 1, "the job to run on")
    finally:
        job.stop()
