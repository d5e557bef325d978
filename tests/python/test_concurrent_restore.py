# SPDX-License-Identifier: Apache-2.0
"""Concurrent restore: the job runs again before its device memory is loaded.

phosd's copies are slowed (PHOS_VGPU_BANDWIDTH_SCALE) so that loading the
image's device memory spans many of the restored job's GPU calls: each call
that touches memory not loaded yet waits for it, and it is loaded next. The
ground truth is the job run uninterrupted directly on vgpu; the restored job
must end it bit for bit:
  - the examples (C++ and Python), checkpointed at two points;
  - a client whose kernel reads a buffer its arguments do not name (a
    mis-speculation the restore twins report): phosd ends the restored
    process once the loads are done, and phos restore restores it again
    eagerly, which ends the job as the uninterrupted run does;
  - `phos restore --eager` loads everything first.
"""
import json
import signal
import subprocess
import sys

import pytest

from driver_client import PRELUDE
from test_checkpoint_phos import (Job, after_checkpoint, app_env, checkpoint, command, criu, programs,  # noqa: F401
                                  reference)

TIMEOUT = 120
SLOW = 2000  # copies take this many times their modelled time: 1 MiB about 80 ms


@pytest.fixture
def slow_phosd(start_phosd):
    return start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=SLOW)


@pytest.fixture
def slower_phosd(start_phosd):
    """Loads four times slower: a 4 MiB chunk about 1.3 s, so that the restored
    job needs one before it is loaded even when a busy host slows the job."""
    return start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=4 * SLOW)


def restore(phos, daemon, image, env, *extra):
    """A foreground restore: (the restored job's stdout lines, the report, phos restore's stderr)."""
    r = subprocess.run([str(phos), "restore", "--image", str(image), "--runtime-dir", str(daemon.runtime_dir),
                        "--json", *extra], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, f"phos restore exited with {r.returncode}: {r.stderr}\n{daemon.log()[-4000:]}"
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["gpu_session"] is True, report
    return r.stdout.splitlines(), report, r.stderr


def killed_at(phos, daemon, cmd, env, tmp_path, at):
    """Runs `cmd` under phos run until line `at`, checkpoints it (the dump ends it): its lines and the image."""
    job = Job(phos, daemon, cmd, env, tmp_path)
    try:
        job.wait_line(at)
        image = tmp_path / "image"
        checkpoint(phos, daemon, job.pid, image)
        assert job.proc.wait(timeout=30) == -signal.SIGKILL
        return job.lines(), image
    finally:
        job.stop()


# Each job once, each checkpoint point once (early, and after the buffers
# have all been written): the full cross product doubled its CI time.
@pytest.mark.parametrize("job,at", [("mlp-train", 2), ("train.py", 6)])
def test_restored_job_runs_while_its_memory_loads(criu, phos, slow_phosd, slower_phosd, app_env, programs, tmp_path,
                                                  job, at):
    cmd = command(programs, job)
    cmd[cmd.index("--state-mib") + 1] = "24"
    ref = reference(cmd, app_env)
    before, image = killed_at(phos, slow_phosd, cmd, app_env, tmp_path, at)
    assert before == ref[:len(before)]

    after, report, _ = restore(phos, slower_phosd, image, app_env)
    assert before + after == ref
    loads = report["concurrent_load"]
    assert report["eager"] is False
    assert loads["misspeculations"] == 0, loads
    # The job ran before its memory was back: its calls waited for chunks,
    # which were loaded before their turn.
    assert loads["chunks"] >= 6 and loads["waited_calls"] > 0 and loads["demanded_chunks"] > 0, loads
    assert loads["load_seconds"] > 0.3, loads


def test_eager_restore_loads_everything_first(criu, phos, slow_phosd, app_env, programs, tmp_path):
    cmd = command(programs, "mlp-train")
    ref = reference(cmd, app_env)
    before, image = killed_at(phos, slow_phosd, cmd, app_env, tmp_path, 3)
    after, report, _ = restore(phos, slow_phosd, image, app_env, "--eager")
    assert before + after == ref
    assert report["eager"] is True and "concurrent_load" not in report, report


# Iterates over six buffers with kernels and prints a checksum per iteration.
# With a non-zero last argument, each step is preceded by a kernel that copies
# words of the last buffer through arguments naming only the first one: its
# speculated read set misses what it reads. Before every step, not once per
# iteration: a checkpoint taken after an iteration's first launch would
# otherwise leave the restored job's next such launch after the loads end.
CLIENT = PRELUDE + r'''
import time
src = b"""
extern "C" __global__ void step(unsigned* a, unsigned n, unsigned k) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = a[i] * 1664525u + 1013904223u + k;
}
extern "C" __global__ void peek(const unsigned* a, long long offset, unsigned n, unsigned* out) {
    const unsigned* b = (const unsigned*)((const char*)a + offset);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = b[i];
}
"""
iterations, words, misspeculate = int(sys.argv[1]), int(sys.argv[2]) // 4, int(sys.argv[3])
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
module = ok(cu.cuModuleLoadData(compile_ptx(src)))
step = ok(cu.cuModuleGetFunction(module, b"step"))
peek = ok(cu.cuModuleGetFunction(module, b"peek"))
bufs = [ok(cu.cuMemAlloc(words * 4)) for _ in range(6)]
out = ok(cu.cuMemAlloc(4096))
host = np.zeros(words, dtype=np.uint32)

def launch(f, *values):
    holders = [np.array([v], dtype=t) for v, t in values]
    args = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
    ok(cu.cuLaunchKernel(f, 64, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))

for i, b in enumerate(bufs):
    ok(cu.cuMemsetD32(b, i + 1, words))
for k in range(1, iterations + 1):
    total = 0
    for b in bufs:
        if misspeculate:
            launch(peek, (int(bufs[0]), np.uint64), (int(bufs[-1]) - int(bufs[0]), np.int64), (1024, np.uint32),
                   (int(out), np.uint64))
            ok(cu.cuMemcpyDtoH(host.ctypes.data, out, 4096))
            total += int(host[:1024].astype(np.uint64).sum())
        launch(step, (int(b), np.uint64), (words, np.uint32), (k, np.uint32))
        ok(cu.cuMemcpyDtoH(host.ctypes.data, b, words * 4))
        total = (total * 31 + int(host.astype(np.uint64).sum())) % (1 << 61)
    print(k, total, flush=True)
    time.sleep(0.1)
'''
CLIENT_ITERATIONS = 10
CLIENT_BYTES = 2 << 20


@pytest.mark.parametrize("misspeculate", [0, 1])
def test_client_restored_concurrently(criu, phos, slow_phosd, app_env, tmp_path, misspeculate):
    pytest.importorskip("cuda.bindings.nvrtc")
    env = dict(app_env)
    env["LD_LIBRARY_PATH"] = ":".join(["/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")])
    cmd = [sys.executable, "-c", CLIENT, str(CLIENT_ITERATIONS), str(CLIENT_BYTES), str(misspeculate)]
    truth = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert truth.returncode == 0, truth.stderr
    ref = truth.stdout.splitlines()
    assert len(ref) == CLIENT_ITERATIONS

    before, image = killed_at(phos, slow_phosd, cmd, env, tmp_path, 3)
    assert before == ref[:len(before)]
    after, report, stderr = restore(phos, slow_phosd, image, env)
    if not misspeculate:
        assert before + after == ref
        assert report["concurrent_load"]["misspeculations"] == 0, report
        assert report["eager"] is False
        return
    # The first attempt's lines (if it printed any before the loads ended)
    # come first; the eager restore's lines end the uninterrupted run.
    assert "outside the speculated buffers" in stderr and "peek" in stderr, stderr
    assert "restored again" in stderr, stderr
    assert report["eager"] is True, report
    after_checkpoint(ref, after[-(len(ref) - len(before)):], len(before), len(before))




def test_checkpoint_while_memory_loads_waits_for_the_loads(criu, phos, slow_phosd, tmp_path):
    """A job that writes two of its six 8 MiB buffers per iteration runs again
    while the other four load (about 3 s here); a checkpoint asked meanwhile
    starts once they are loaded."""
    from job_output import lines, wait_for
    from test_soft_cow import Client
    client = Client(phos, slow_phosd, tmp_path, hot=2)
    try:
        client.wait_iterations(2)
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(client.proc.pid), "--image", str(tmp_path / "image"),
                            "--mode", "stop", "--runtime-dir", str(slow_phosd.runtime_dir)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        client.proc.wait(timeout=TIMEOUT)
    finally:
        client.stop()
    out = tmp_path / "restored.out"
    env = slow_phosd.client_env(PHOS=phos)
    env.pop("LD_PRELOAD")
    with open(out, "w") as f:
        restoring = subprocess.Popen([str(phos), "restore", "--image", str(tmp_path / "image"), "--runtime-dir",
                                      str(slow_phosd.runtime_dir)], env=env, stdin=subprocess.DEVNULL, stdout=f,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: lines(out) or restoring.poll() is not None, TIMEOUT, "the restored job's first line")
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(client.proc.pid), "--image", str(tmp_path / "again"),
                            "--leave-running", "--runtime-dir", str(slow_phosd.runtime_dir)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        assert "running a restore" in r.stderr and "waiting for it to finish" in r.stderr, r.stderr
        assert restoring.poll() is None, "the restored job ended"
    finally:
        restoring.kill()
        restoring.wait()


@pytest.mark.hostile
def test_a_damaged_chunk_ends_the_job_before_it_reads_it(criu, phos, slow_phosd, app_env, programs, tmp_path):
    """A chunk that does not match its checksum (found as it loads, while the job runs) ends the job before
    any call that reads its memory returns: what the job printed is the uninterrupted run's, the restore fails
    naming the damage, and no second (eager) restore is tried. An eager restore refuses before anything runs."""
    cmd = command(programs, "mlp-train")
    cmd[cmd.index("--state-mib") + 1] = "24"
    ref = reference(cmd, app_env)
    before, image = killed_at(phos, slow_phosd, cmd, app_env, tmp_path, 2)
    manifest = json.loads((image / "manifest.json").read_text())
    blob = max((b for b in manifest["blobs"] if b["kind"] == "gpu-memory"), key=lambda b: b["size"])
    offset, size, codec, _ = blob["chunks"][-1]
    assert codec == "none"
    path = image / blob["file"]
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0x40
    path.write_bytes(bytes(data))

    r = subprocess.run([str(phos), "restore", "--image", str(image), "--runtime-dir", str(slow_phosd.runtime_dir)],
                       env=app_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    assert "the image is damaged" in r.stderr and "does not match its checksum" in r.stderr, r.stderr
    assert f"chunk {len(blob['chunks']) - 1}" in r.stderr, r.stderr
    assert "restored again" not in r.stderr
    after = r.stdout.splitlines()
    assert before + after == ref[:len(before) + len(after)]
    assert len(before) + len(after) < len(ref), "the job ended before the end of the uninterrupted run"
    assert slow_phosd.request({"op": "ps"})["sessions"] == []

    r = subprocess.run([str(phos), "restore", "--eager", "--image", str(image), "--runtime-dir",
                        str(slow_phosd.runtime_dir)],
                       env=app_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    assert "does not match its checksum" in r.stderr
    assert r.stdout == ""
