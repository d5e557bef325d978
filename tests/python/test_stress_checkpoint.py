# SPDX-License-Identifier: Apache-2.0
"""Stress: one job checkpointed and restored over and over at random moments.

A job that writes its GPU buffers and prints a checksum of all of them every
iteration runs under phos run. The test waits a random time, checkpoints it
with a random protocol (stop-the-world, soft recopy, or soft copy-on-write and
soft recopy with --leave-running, after which the original is killed),
restores the image (concurrently or --eager, at random), and so on, until the
job ends or the number of cycles is reached (PHOS_STRESS_CYCLES, default 20;
PHOS_STRESS_SEED makes a run repeatable). Every restored run's lines must be
the uninterrupted run's from a line within its checkpoint's window, and the
job must end with the uninterrupted run's last line.
"""
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from driver_client import PRELUDE
from job_output import lines, wait_for
from test_checkpoint_phos import criu  # noqa: F401 (a fixture)

TIMEOUT = 60

# Four 256 KiB buffers: a kernel on each, a memset and a copy into one, every
# iteration; the line is the iteration and a checksum of every byte.
CLIENT = PRELUDE + r'''
import time
src = b"""
extern "C" __global__ void step(unsigned* a, unsigned n, unsigned k) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = a[i] * 1664525u + 1013904223u + k;
}
"""
iterations = int(sys.argv[1])
words = (256 << 10) // 4
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
step = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(compile_ptx(src))), b"step"))
bufs = [ok(cu.cuMemAlloc(words * 4)) for _ in range(4)]
host = np.zeros(words, dtype=np.uint32)
small = np.arange(1024, dtype=np.uint32)
for i, b in enumerate(bufs):
    ok(cu.cuMemsetD32(b, i + 1, words))
for k in range(1, iterations + 1):
    for b in bufs:
        holders = [np.array([int(b)], dtype=np.uint64), np.array([words], dtype=np.uint32),
                   np.array([k], dtype=np.uint32)]
        args = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
        ok(cu.cuLaunchKernel(step, 16, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))
    ok(cu.cuMemsetD32(int(bufs[1]) + 4096, k, 256))
    small += 1
    ok(cu.cuMemcpyHtoD(int(bufs[2]) + 8192, small.ctypes.data, small.nbytes))
    total = 0
    for b in bufs:
        ok(cu.cuMemcpyDtoH(host.ctypes.data, b, words * 4))
        total = (total * 31 + int(host.astype(np.uint64).sum())) % (1 << 61)
    print(k, total, flush=True)
    time.sleep(0.01)
'''

PROTOCOLS = [("stop", False), ("recopy", False), ("cow", True), ("recopy", True)]
PID_MAX = pathlib.Path("/proc/sys/kernel/pid_max")


@pytest.fixture
def roomy_pids():
    """CRIU restores a process with its thread ids, so a restore fails once
    another process took one of them. A cycle starts about 130 processes
    (CRIU, its action scripts, phos, workers): with Linux's default pid_max of
    32768 the ids wrap after some 250 cycles, and a thread id of the job may be
    taken. The test raises pid_max (as root) for its run; outside namespaces,
    that limit is CRIU's and every restore's, and is not what it tests."""
    before = int(PID_MAX.read_text())
    if before < 4194304:
        try:
            PID_MAX.write_text("4194304")
        except OSError:
            pass
    yield
    if int(PID_MAX.read_text()) != before:
        PID_MAX.write_text(str(before))


def test_random_checkpoints_and_restores(criu, roomy_pids, phos, build_dir, start_phosd, tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    cycles = int(os.environ.get("PHOS_STRESS_CYCLES", "20"))
    seed = int(os.environ.get("PHOS_STRESS_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    # A cycle lets the job run at least one iteration: the job outlasts the cycles.
    iterations = 8 * cycles + 40
    print(f"stress: {cycles} cycles, PHOS_STRESS_SEED={seed}")
    # Copies 300 times their modelled time: the concurrent windows span calls.
    phosd = start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=300)
    env = phosd.client_env(PHOS=phos)
    env["LD_LIBRARY_PATH"] = ":".join(["/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")])
    env.pop("LD_PRELOAD")
    cmd = [sys.executable, "-c", CLIENT, str(iterations)]

    truth_env = dict(env)
    truth_env["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), truth_env["LD_LIBRARY_PATH"]])
    truth = subprocess.run(cmd, env=truth_env, capture_output=True, text=True, timeout=600)
    assert truth.returncode == 0, truth.stderr
    ref = truth.stdout.splitlines()
    assert len(ref) == iterations

    def start(argv, n):
        out = tmp_path / f"segment-{n}.out"
        with open(out, "w") as f, open(tmp_path / f"segment-{n}.err", "w") as err:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=err,
                                    start_new_session=True)
        return proc, out

    holder, out = start([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--", *cmd], 0)
    pid = holder.pid  # phos run execs the job; every restore brings it back with this pid
    segments = []  # (lines the segment printed, lines its predecessor had printed when its checkpoint was asked)
    asked = 0
    try:
        for n in range(1, cycles + 1):
            wait_for(lambda: len(lines(out)) >= 1 or holder.poll() is not None, TIMEOUT, f"segment {n - 1} to run")
            time.sleep(rng.uniform(0, 0.4))
            if holder.poll() is not None:
                break
            mode, leave = rng.choice(PROTOCOLS)
            image = tmp_path / f"image-{n}"
            asking = len(lines(out))
            argv = [str(phos), "checkpoint", "--pid", str(pid), "--image", str(image), "--mode", mode,
                    "--runtime-dir", str(phosd.runtime_dir), "--json"] + (["--leave-running"] if leave else [])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
            if r.returncode != 0 and holder.poll() is not None:
                break  # the job ended meanwhile
            assert r.returncode == 0, f"cycle {n} ({mode}, seed {seed}): {r.stderr}\n{phosd.log()[-3000:]}"
            if leave:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # it reached its end between the checkpoint and here: the image still holds the cut
            holder.wait(timeout=TIMEOUT)
            segments.append((lines(out), asked))
            if n > 1:
                shutil.rmtree(tmp_path / f"image-{n - 1}")  # the segment that ended was restored from it
            asked = asking
            eager = rng.random() < 0.25
            holder, out = start([str(phos), "restore", "--image", str(image), "--runtime-dir",
                                 str(phosd.runtime_dir)] + (["--eager"] if eager else []), n)
        assert holder.wait(timeout=600) == 0, (tmp_path / f"segment-{len(segments)}.err").read_text()
        segments.append((lines(out), asked))
    finally:
        if holder.poll() is None:
            holder.kill()
    _check(ref, segments, seed)
    assert len(segments) > min(cycles, 10), f"only {len(segments) - 1} cycles before the job ended (seed {seed})"


def _check(ref, segments, seed):
    """Each restored segment continues its predecessor from a line within its
    checkpoint's window (asked .. what the predecessor printed), as the
    uninterrupted run does; the last one ends the job."""
    base, printed = 0, 0  # where the predecessor started, and how many lines it printed
    for n, (seen, asked) in enumerate(segments):
        # A restore right before the job's end may have nothing left to print.
        first = int(seen[0].split()[0]) - 1 if seen else base + printed
        if n > 0:
            assert base + asked <= first <= base + printed, \
                f"segment {n} starts at line {first}, outside its checkpoint's window " \
                f"{base + asked}..{base + printed} (seed {seed})"
        assert seen == ref[first:first + len(seen)], f"segment {n} differs from the uninterrupted run (seed {seed})"
        base, printed = first, len(seen)
    assert base + printed == len(ref), f"the job ended after {base + printed} of {len(ref)} lines (seed {seed})"
