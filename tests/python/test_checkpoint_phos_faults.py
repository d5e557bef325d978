# SPDX-License-Identifier: Apache-2.0
"""GPU checkpoints through phosd that go wrong: a damaged image, a daemon killed in
the middle of a checkpoint, a restore of a session that still runs. Each must end
with a clear error, nothing started, and nothing that looks like a good image."""
import json
import os
import pathlib
import subprocess

import pytest

from job_output import lines, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CRIU needs root")


def control_env(daemon) -> dict:
    """What `phos` itself runs with: the test's daemon, no preload."""
    env = dict(daemon.env)
    env["PHOS_RUNTIME_DIR"] = str(daemon.runtime_dir)
    return env


def start_job(daemon, build_dir, out: pathlib.Path, *args):
    """mlp-train under libphos.so, in a session of its own (no --shell-job needed)."""
    job = [str(build_dir / "examples" / "mlp-train"), *args]
    with open(out, "w") as f:
        return subprocess.Popen(job, env=daemon.client_env(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def steps(out: pathlib.Path) -> int:
    return sum(1 for line in lines(out) if line.startswith("step"))


def phos_run(phos, daemon, *args, timeout=120):
    return subprocess.run([str(phos), *args], env=control_env(daemon), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def checkpoint(phos, daemon, pid, image, *extra):
    r = phos_run(phos, daemon, "checkpoint", "--pid", str(pid), "--image", str(image), "--json", *extra)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["gpu_bytes"] > 0, report  # the GPU state came from phosd
    return report


def alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def ended_by_a_checkpoint(phos, phosd, build_dir, tmp_path):
    """mlp-train checkpointed after 3 steps, which ends it: the job and its image."""
    out = tmp_path / "run.out"
    job = start_job(phosd, build_dir, out, "--iterations", "30", "--sleep-ms", "100")
    wait_for(lambda: steps(out) >= 3, 60, "3 steps")
    image = tmp_path / "image"
    checkpoint(phos, phosd, job.pid, image)
    job.wait(timeout=30)  # the dump ended it
    return job, image


def test_a_damaged_gpu_chunk_is_refused_before_anything_runs(phos, phosd, build_dir, tmp_path):
    job, image = ended_by_a_checkpoint(phos, phosd, build_dir, tmp_path)

    manifest = json.loads((image / "manifest.json").read_text())
    blob = next(b for b in manifest["blobs"] if b["kind"] == "gpu-memory" and b["size"] >= 64)
    chunk = blob["chunks"][0]
    path = image / blob["file"]
    data = bytearray(path.read_bytes())
    data[chunk[0] + 7] ^= 0x20  # [file offset, stored bytes, codec, checksum]
    path.write_bytes(bytes(data))

    verify = phos_run(phos, phosd, "verify", str(image))
    assert verify.returncode == 1
    assert blob["name"] in verify.stdout + verify.stderr

    restore = phos_run(phos, phosd, "restore", "--image", str(image))
    assert restore.returncode != 0
    assert blob["name"] in restore.stderr, restore.stderr
    assert not alive(job.pid), "a process was restored from a damaged image"
    # The daemon is fine and holds no half-restored session.
    assert phosd.request({"op": "ping"})["ok"] is True
    assert phosd.sessions() == []


def test_a_damaged_cpu_file_is_refused_before_criu_runs(phos, phosd, build_dir, tmp_path):
    """cpu/ is checked while phosd re-creates the GPU session: a damaged file still stops the restore
    before CRIU runs, names the file, and phosd keeps no session."""
    job, image = ended_by_a_checkpoint(phos, phosd, build_dir, tmp_path)

    pages = max((image / "cpu").glob("pages-*.img"), key=lambda f: f.stat().st_size)
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0x01
    pages.write_bytes(bytes(data))

    restore = phos_run(phos, phosd, "restore", "--image", str(image))
    assert restore.returncode == 1, restore.stderr
    assert f"cpu/{pages.name}" in restore.stderr and "phos verify lists every problem" in restore.stderr, \
        restore.stderr
    assert "CRIU could not" not in restore.stderr, restore.stderr
    assert not alive(job.pid), "a process was restored from a damaged image"
    wait_for(lambda: phosd.sessions() == [], 10, "phosd to abandon the re-created session")
    assert phosd.request({"op": "ping"})["ok"] is True


def test_a_restore_of_a_session_that_still_runs_is_refused(phos, phosd, build_dir, tmp_path):
    reference = subprocess.run([str(build_dir / "examples" / "mlp-train"), "--iterations", "12"],
                               capture_output=True, text=True, timeout=120, env=phosd.client_env())
    assert reference.returncode == 0, reference.stdout
    out = tmp_path / "run.out"
    job = start_job(phosd, build_dir, out, "--iterations", "12", "--sleep-ms", "150")
    wait_for(lambda: steps(out) >= 2, 60, "2 steps")
    image = tmp_path / "image"
    checkpoint(phos, phosd, job.pid, image, "--leave-running")

    restore = phos_run(phos, phosd, "restore", "--image", str(image))
    assert restore.returncode != 0
    assert "still runs" in restore.stderr, restore.stderr
    # The original was not disturbed: it finishes as an uninterrupted run does.
    assert job.wait(timeout=120) == 0
    assert out.read_text() == reference.stdout


def test_killing_phosd_during_a_checkpoint_leaves_no_image_and_keeps_an_earlier_one(
        phos, phosd, build_dir, tmp_path):
    out = tmp_path / "run.out"
    # Enough device memory that the copy takes a while.
    job = start_job(phosd, build_dir, out, "--iterations", "1000", "--sleep-ms", "50", "--state-mib", "768")
    wait_for(lambda: steps(out) >= 2, 120, "2 steps")
    earlier = tmp_path / "earlier"
    checkpoint(phos, phosd, job.pid, earlier, "--leave-running")

    image = tmp_path / "image"
    env = control_env(phosd)
    running = subprocess.Popen([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image), "--json"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    wait_for(lambda: any(tmp_path.glob(".image.partial-*")) or running.poll() is not None, 60,
             "the checkpoint's staging directory")
    assert running.poll() is None, "the checkpoint finished before phosd could be killed"
    phosd.kill()
    stdout, stderr = running.communicate(timeout=60)
    assert running.returncode != 0, stdout

    assert not image.exists()
    verify = phos_run(phos, phosd, "verify", str(image))
    assert verify.returncode != 0
    assert "no such image" in verify.stderr + verify.stdout
    intact = phos_run(phos, phosd, "verify", str(earlier))
    assert intact.returncode == 0, intact.stdout + intact.stderr

    # Its daemon gone, the job's calls fail instead of hanging.
    job.wait(timeout=60)
    assert job.returncode != 0


def ring_file(pid: int) -> pathlib.Path:
    """The session's ring as the job maps it (/dev/shm/phos-<worker>-<session>)."""
    for line in pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1]
        if path.startswith("/dev/shm/phos-") and path.count("-") == 2:
            return pathlib.Path(path)
    raise AssertionError(f"pid {pid} maps no ring")


# The default ring (256 slots of 16 KiB after a 4 KiB header), then lane 0's
# words: produced, consumed, abandoned, busy and accepted, 64 bytes apart.
LANE0 = 4096 + 256 * 16384
ABANDONED, BUSY = 2 * 64, 3 * 64


def set_lane_words(ring: pathlib.Path, value: int):
    """What a thread stopped inside lane 0 after phosd gave up on it leaves (1), or not (0)."""
    with open(ring, "r+b") as f:
        for word in (ABANDONED, BUSY):
            f.seek(LANE0 + word)
            f.write(value.to_bytes(4, "little"))


def test_a_thread_left_inside_a_transfer_lane_fails_the_checkpoint_and_names_it(phos, phosd, build_dir, tmp_path):
    """A thread still inside its half of a lane copy that phosd gave up on (stopped in it) would
    read the lane after a restore, which re-creates the lanes empty: the checkpoint fails, says
    why, and the job runs on; once the thread is out, the checkpoint succeeds."""
    out = tmp_path / "run.out"
    job = start_job(phosd, build_dir, out, "--iterations", "40", "--sleep-ms", "50")
    wait_for(lambda: steps(out) >= 3, 60, "3 steps")
    ring = ring_file(job.pid)
    set_lane_words(ring, 1)
    r = phos_run(phos, phosd, "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "refused"),
                 "--leave-running")
    assert r.returncode != 0
    assert "transfer lane 0" in r.stderr and str(job.pid) in r.stderr, r.stderr
    assert alive(job.pid)
    set_lane_words(ring, 0)
    checkpoint(phos, phosd, job.pid, tmp_path / "image", "--leave-running")
    assert job.wait(timeout=120) == 0
    assert steps(out) == 40
