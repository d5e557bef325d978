# SPDX-License-Identifier: Apache-2.0
"""Soft copy-on-write checkpoints: the job runs on while its GPU memory is saved.

The image must hold the GPU state of the quiesce point t1 byte for byte, while
the job writes every buffer as fast as it can during the copy. phosd takes the
reference at t1 straight from the device (PHOS_TEST_REFERENCE_SNAPSHOT), and the
modelled copy bandwidth is slowed so that the copy spans many of the job's
iterations. A kernel that writes outside the buffer its argument names makes
the copy fall back to stop-the-world, and the image is still good.
"""
import json
import pathlib
import subprocess
import sys

import pytest

from driver_client import PRELUDE
from job_output import lines, wait_for
from test_checkpoint_phos import app_env, criu, programs  # noqa: F401 (fixtures)

TIMEOUT = 60
BUFFERS = 6
BUFFER_BYTES = 8 << 20

# Writes its first `hot` buffers whole with kernels, 4 KiB of the second with
# a memset and `transfer_bytes` of the third with a copy from its memory,
# iteration after iteration, until killed; prints a line per iteration. With
# spill_every, a kernel also writes into the second buffer through a pointer
# into the first.
CLIENT = PRELUDE + r'''
src = b"""
extern "C" __global__ void step(unsigned* a, unsigned n, unsigned k) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = a[i] * 1664525u + 1013904223u + k;
}
// Writes n words `offset` bytes past a: in the next buffer, which its
// arguments do not name (the mis-speculation a validator twin must catch).
extern "C" __global__ void spill(unsigned* a, long long offset, unsigned n, unsigned k) {
    unsigned* b = (unsigned*)((char*)a + offset);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) b[i] = k;
}
"""
buffers, words, spill_every = int(sys.argv[1]), int(sys.argv[2]) // 4, int(sys.argv[3])
transfer_words, hot = int(sys.argv[4]) // 4, int(sys.argv[5])
ptx = compile_ptx(src)
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
module = ok(cu.cuModuleLoadData(ptx))
step = ok(cu.cuModuleGetFunction(module, b"step"))
spill = ok(cu.cuModuleGetFunction(module, b"spill"))
bufs = [ok(cu.cuMemAlloc(words * 4)) for _ in range(buffers)]

def launch(f, *values):
    holders = [np.array([v], dtype=t) for v, t in values]
    args = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
    ok(cu.cuLaunchKernel(f, 64, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))

for i, b in enumerate(bufs):
    ok(cu.cuMemsetD32(b, i + 1, words))
small = np.arange(transfer_words, dtype=np.uint32)
k = 0
while True:
    k += 1
    for b in bufs[:hot]:
        launch(step, (int(b), np.uint64), (words, np.uint32), (k, np.uint32))
    ok(cu.cuMemsetD32(int(bufs[1]) + 4096, k, 1024))
    small += 1
    ok(cu.cuMemcpyHtoD(int(bufs[2]) + 8192, small.ctypes.data, small.nbytes))
    if spill_every and k % spill_every == 0:
        launch(spill, (int(bufs[0]), np.uint64), (int(bufs[1]) - int(bufs[0]), np.int64), (1024, np.uint32),
               (k, np.uint32))
    ok(cu.cuCtxSynchronize())
    print(k, flush=True)
'''


def read_blob(image: pathlib.Path, manifest: dict, name: str) -> bytes:
    for index, blob in enumerate(manifest["blobs"]):
        if blob["name"] != name:
            continue
        data = bytearray()
        with open(image / "blobs" / f"{index:06d}", "rb") as f:
            for chunk in blob["chunks"]:
                offset, stored, codec = chunk[0], chunk[1], chunk[2]
                assert codec == "none", f"chunk of {name} stored with {codec}: the test asks for --compress none"
                f.seek(offset)
                data += f.read(stored)
        return bytes(data)
    raise AssertionError(f"no blob {name} in the image")


class Client:
    def __init__(self, phos, phosd, tmp_path, spill_every=0, transfer_bytes=4096, hot=BUFFERS):
        pytest.importorskip("cuda.bindings.nvrtc")
        env = phosd.client_env(PHOS=phos)
        env["LD_LIBRARY_PATH"] = ":".join(["/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")])
        env.pop("LD_PRELOAD")
        self.out = tmp_path / "client.out"
        self.err = tmp_path / "client.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--", sys.executable, "-c", CLIENT,
                 str(BUFFERS), str(BUFFER_BYTES), str(spill_every), str(transfer_bytes), str(hot)],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)

    def iterations(self):
        done = lines(self.out)
        return int(done[-1]) if done else 0

    def wait_iterations(self, n):
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"the client exited with {self.proc.returncode}: {self.err.read_text()}")
            return self.iterations() >= n
        wait_for(ready, TIMEOUT, f"{n} iterations of the client")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def slow_copies(start_phosd, tmp_path):
    """A daemon whose device-to-host copies take 2000 times their modelled time
    (48 MiB take about 4 s), writing the reference snapshot of each CoW checkpoint."""
    reference = tmp_path / "reference"
    reference.mkdir()
    daemon = start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=2000, PHOS_TEST_REFERENCE_SNAPSHOT=reference)
    return daemon, reference


def checkpoint(phos, phosd, pid, image, *extra):
    try:
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(pid), "--image", str(image), "--leave-running",
                            "--compress", "none", "--runtime-dir", str(phosd.runtime_dir), "--json", *extra],
                           capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"phos checkpoint did not finish in {TIMEOUT} s:\n{phosd.log()[-4000:]}")
    assert r.returncode == 0, f"phos checkpoint failed ({r.returncode}): {r.stderr}\n{phosd.log()[-4000:]}"
    return json.loads(r.stdout)


def test_an_existing_image_directory_is_refused_and_the_job_runs_on(criu, phos, phosd, tmp_path):
    """A failure before the copy begins (here: the image directory exists)
    says what went wrong, as stop-the-world does; it once read a field of
    the copy's report that did not exist yet."""
    client = Client(phos, phosd, tmp_path)
    try:
        client.wait_iterations(2)
        image = tmp_path / "image"
        image.mkdir()
        (image / "precious").write_text("keep me")
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(client.proc.pid), "--image", str(image),
                            "--leave-running", "--mode", "cow", "--runtime-dir", str(phosd.runtime_dir)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 2, r.stderr
        assert "already exists" in r.stderr and "json" not in r.stderr, r.stderr
        assert (image / "precious").read_text() == "keep me"
        client.wait_iterations(client.iterations() + 1)
    finally:
        client.stop()


def test_cow_image_is_the_state_at_the_quiesce_point(criu, phos, slow_copies, tmp_path):
    phosd, reference = slow_copies
    client = Client(phos, phosd, tmp_path)
    try:
        client.wait_iterations(3)
        image = tmp_path / "image"
        before = client.iterations()
        report = checkpoint(phos, phosd, client.proc.pid, image)
        during = client.iterations() - before
        assert report["protocol"] == "soft-copy-on-write", report
        cow = report["copy_on_write"]
        # The job ran on during the copy, and wrote buffers that were not saved yet.
        assert during >= 2, f"only {during} iterations while the checkpoint ran: {report}"
        assert cow["shadowed_chunks"] > 0, report
        assert cow["misspeculations"] == 0, report
        client.wait_iterations(client.iterations() + 2)  # and still runs
    finally:
        client.stop()

    manifest = json.loads((image / "manifest.json").read_text())
    assert manifest["state"]["protocol"] == "soft-copy-on-write"
    allocations = manifest["state"]["gpu"]["sessions"][0]["allocations"]
    assert len(allocations) == BUFFERS
    snapshots = {p.name for p in reference.iterdir()}
    for a in allocations:
        expected = (reference / hex(a["address"])).read_bytes()
        assert len(expected) == a["bytes"] == BUFFER_BYTES
        saved = read_blob(image, manifest, a["blob"])
        assert saved == expected, f"buffer {hex(a['address'])}: the image differs from the state at t1"
        snapshots.discard(hex(a["address"]))
    # Module globals (none in this module) would be the only other buffers.
    assert not snapshots - {hex(g["address"]) for m in manifest["state"]["gpu"]["sessions"][0]["modules"]
                            for g in m["globals"]}
    verify = subprocess.run([str(phos), "verify", str(image)], capture_output=True, text=True, timeout=TIMEOUT)
    assert verify.returncode == 0, verify.stdout + verify.stderr


# One 48 MiB buffer of which each iteration updates a 64 KiB window, the
# window moving down from the end (the saving loop goes up from the start), as
# a KV cache or an embedding table is updated; prints a line per iteration.
WINDOW_BYTES = 64 << 10
WINDOW_CLIENT = PRELUDE + r'''
src = b"""
extern "C" __global__ void update(unsigned* a, unsigned n, unsigned k) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = a[i] * 1664525u + k;
}
"""
total, window = int(sys.argv[1]), int(sys.argv[2])
ptx = compile_ptx(src)
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
update = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(ptx)), b"update"))
buf = int(ok(cu.cuMemAlloc(total)))
ok(cu.cuMemsetD32(buf, 7, total // 4))
k = 0
while True:
    k += 1
    at = buf + total - (k % (total // window - 1) + 1) * window
    holders = [np.array([at], dtype=np.uint64), np.array([window // 4], dtype=np.uint32),
               np.array([k], dtype=np.uint32)]
    args = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
    ok(cu.cuLaunchKernel(update, 16, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))
    ok(cu.cuCtxSynchronize())
    print(k, flush=True)
'''


def cow_of_a_window_client(phos, start_phosd, tmp_path, name, **env):
    """Copy-on-write of WINDOW_CLIENT with slow copies; the image is checked against the state at t1."""
    pytest.importorskip("cuda.bindings.nvrtc")
    reference = tmp_path / f"reference-{name}"
    reference.mkdir()
    phosd = start_phosd(PHOS_VGPU_BANDWIDTH_SCALE=2000, PHOS_TEST_REFERENCE_SNAPSHOT=reference, **env)
    client_env = phosd.client_env(PHOS=phos)
    client_env["LD_LIBRARY_PATH"] = ":".join(["/usr/local/cuda/lib64", client_env.get("LD_LIBRARY_PATH", "")])
    client_env.pop("LD_PRELOAD")
    out = tmp_path / f"{name}.out"
    with open(out, "w") as o, open(tmp_path / f"{name}.err", "w") as e:
        proc = subprocess.Popen([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--", sys.executable,
                                 "-c", WINDOW_CLIENT, str(BUFFERS * BUFFER_BYTES), str(WINDOW_BYTES)],
                                env=client_env, stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
    try:
        wait_for(lambda: len(lines(out)) >= 3 or proc.poll() is not None, TIMEOUT, "3 iterations of the client")
        assert proc.poll() is None, (tmp_path / f"{name}.err").read_text()
        image = tmp_path / f"image-{name}"
        report = checkpoint(phos, phosd, proc.pid, image)
        before = len(lines(out))
        wait_for(lambda: len(lines(out)) > before, TIMEOUT, "the client after the checkpoint")
    finally:
        proc.kill()
        proc.wait()
    manifest = json.loads((image / "manifest.json").read_text())
    [allocation] = manifest["state"]["gpu"]["sessions"][0]["allocations"]
    assert read_blob(image, manifest, allocation["blob"]) == (reference / hex(allocation["address"])).read_bytes(), \
        "the image differs from the state at t1"
    assert report["protocol"] == "soft-copy-on-write" and report["copy_on_write"]["misspeculations"] == 0, report
    return report["copy_on_write"]


def test_a_step_that_writes_a_window_of_one_large_buffer_shadows_only_that_window(criu, phos, start_phosd,
                                                                                  tmp_path):
    """Access bounds (docs/speculation.md): the launch's write set is the 64 KiB
    window its arguments and grid reach, not the 48 MiB buffer, so the gate
    shadows the chunks the windows fall in, not every chunk not saved yet. The
    same job against a daemon that speculates whole buffers shadows more."""
    narrowed = cow_of_a_window_client(phos, start_phosd, tmp_path, "bounds")
    whole = cow_of_a_window_client(phos, start_phosd, tmp_path, "whole", PHOS_SPECULATION_BOUNDS="0")
    chunk = 4 << 20
    print(f"shadowed: {narrowed['shadowed_bytes']} bytes in {narrowed['shadowed_chunks']} chunks with access bounds, "
          f"{whole['shadowed_bytes']} in {whole['shadowed_chunks']} (waited {whole['waited_calls']}) with whole "
          "buffers")
    assert narrowed["shadowed_bytes"] <= 3 * chunk, narrowed
    assert whole["shadowed_bytes"] + whole["waited_calls"] * chunk > 2 * narrowed["shadowed_bytes"], (narrowed, whole)


def test_checkpoints_in_a_row_of_one_session(criu, phos, phosd, tmp_path):
    """Each copy-on-write checkpoint registers a staging buffer with the driver
    and must unregister it: a registration left behind covered the next one's
    memory, and every other checkpoint failed with CUresult 1."""
    client = Client(phos, phosd, tmp_path)
    try:
        client.wait_iterations(2)
        for n in range(3):
            report = checkpoint(phos, phosd, client.proc.pid, tmp_path / f"image{n}")
            assert report["protocol"] == "soft-copy-on-write", report
        client.wait_iterations(client.iterations() + 1)
    finally:
        client.stop()
    for n in range(3):
        verify = subprocess.run([str(phos), "verify", str(tmp_path / f"image{n}")], capture_output=True, text=True,
                                timeout=TIMEOUT)
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_write_outside_the_speculated_buffers_falls_back_to_stop_the_world(criu, phos, slow_copies, tmp_path):
    phosd, _ = slow_copies
    client = Client(phos, phosd, tmp_path, spill_every=1)
    try:
        client.wait_iterations(2)
        report = checkpoint(phos, phosd, client.proc.pid, tmp_path / "image")
        assert report["protocol"] == "stop-the-world", report
        assert report["requested_protocol"] == "soft-copy-on-write"
        assert "outside the speculated buffers" in report["fallback"] and "spill" in report["fallback"], report
        client.wait_iterations(client.iterations() + 2)
    finally:
        client.stop()
    verify = subprocess.run([str(phos), "verify", str(tmp_path / "image")], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_jobs_own_transfers_go_first(criu, phos, slow_copies, tmp_path):
    """The saving loop waits while the job has a transfer of its own pending
    (here it does little else: a 4 MiB copy into device memory per iteration,
    about 0.3 s each)."""
    phosd, reference = slow_copies
    client = Client(phos, phosd, tmp_path, transfer_bytes=4 << 20, hot=0)
    try:
        client.wait_iterations(2)
        report = checkpoint(phos, phosd, client.proc.pid, tmp_path / "image")
        cow = report["copy_on_write"]
        assert report["protocol"] == "soft-copy-on-write" and cow["misspeculations"] == 0, report
        assert cow["yielded_seconds"] > 0.05, report
        client.wait_iterations(client.iterations() + 1)
    finally:
        client.stop()


def test_checkpoint_mode_errors(phos, phosd, tmp_path):
    r = subprocess.run([str(phos), "checkpoint", "--pid", "1", "--image", str(tmp_path / "i"), "--mode", "bogus",
                        "--runtime-dir", str(phosd.runtime_dir)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--mode" in r.stderr, r.stderr
    r = subprocess.run([str(phos), "checkpoint", "--pid", "1", "--image", str(tmp_path / "i"), "--cow-reserve-mib",
                        "0", "--runtime-dir", str(phosd.runtime_dir)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--cow-reserve-mib" in r.stderr, r.stderr



def slow_job(programs, app_env):
    """mlp-train with 24 MiB of state (about 2 s to copy here)."""
    from test_checkpoint_phos import command, reference
    cmd = command(programs, "mlp-train")
    cmd[cmd.index("--state-mib") + 1] = "24"
    cmd[cmd.index("--sleep-ms") + 1] = "10"
    return cmd, reference(cmd, app_env)


def test_a_job_that_ends_during_the_copy(criu, phos, slow_copies, app_env, programs, tmp_path):
    """Two steps before its end the job is checkpointed; it releases its
    context (and with it its memory) while that memory is being saved: the
    release waits for the copy, and the image restores to the uninterrupted end.
    Whether the job reaches its end before the copy does depends on how long
    CRIU held it frozen (2-4 s here, more on a loaded machine): a run where it
    did not is tried again, up to three times."""
    from test_checkpoint_phos import STEPS, Job, after_checkpoint
    from test_concurrent_restore import restore
    phosd, _ = slow_copies
    cmd, ref = slow_job(programs, app_env)
    reports = []
    for attempt in range(3):
        run_dir = tmp_path / f"attempt{attempt}"
        run_dir.mkdir()
        job = Job(phos, phosd, cmd, app_env, run_dir)
        try:
            job.wait_line(STEPS - 2)
            asked = len(job.lines())
            image = run_dir / "image"
            report = checkpoint(phos, phosd, job.pid, image)
            assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        finally:
            job.stop()
        assert job.lines() == ref
        cow = report["copy_on_write"]
        assert cow["misspeculations"] == 0, report
        after, _, _ = restore(phos, phosd, image, app_env)
        after_checkpoint(ref, after, asked, len(ref) - 1)
        reports.append(report)
        if cow["anything_calls"] >= 1:
            break
    # The release came while the copy ran, and waited for it.
    cow = reports[-1]["copy_on_write"]
    assert cow["anything_calls"] >= 1 and cow["waited_calls"] >= 1, reports


def test_a_job_that_ends_before_a_recopy_dump(criu, phos, slow_copies, app_env, programs, tmp_path):
    """Soft recopy dumps the process at the end: a job that ended before cannot be saved, and the error says so."""
    from test_checkpoint_phos import STEPS, Job
    phosd, _ = slow_copies
    cmd, ref = slow_job(programs, app_env)
    job = Job(phos, phosd, cmd, app_env, tmp_path)
    try:
        job.wait_line(STEPS - 1)
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--mode", "recopy", "--leave-running", "--runtime-dir", str(phosd.runtime_dir)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
    finally:
        job.stop()
    assert r.returncode == 1 and f"pid {job.pid} ended before it could be dumped" in r.stderr, r.stderr
    assert not (tmp_path / "image").exists()
    assert job.lines() == ref
