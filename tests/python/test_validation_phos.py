# SPDX-License-Identifier: Apache-2.0
"""Validator twins under PhOS: `phos run --validate` runs every kernel as its twin.

The twins must compute exactly what the originals compute (the examples print
bit-identical output), report nothing when speculation was right, and report
every access outside the speculated buffers when it was wrong (a kernel that
writes through a pointer it loads from device memory: speculation cannot see
that buffer). `phos validate --pid P` is how a user reads the report.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from driver_client import PRELUDE
from job_output import wait_for
from test_checkpoint_phos import (Job, after_checkpoint, app_env, checkpoint, command, criu, jobs,  # noqa: F401
                                  left_running, programs, reference, restore)
from test_shim_examples import STEPS, check_identical, direct_env, run  # noqa: F401 (direct_env is a fixture)

# A Driver API client (cuda-bindings + NVRTC) with one honest and one deceiving
# kernel. It asks phos for its own report before exiting and prints it.
CLIENT = PRELUDE + r'''
src = b"""
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
// The buffer it writes is named nowhere in its arguments: a pointer stored in
// device memory (as in the Rodinia kernel the PhOS paper reports).
extern "C" __global__ void indirect(float* const* table, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) table[0][i] = 3.0f;
}
"""
ptx = compile_ptx(src)

ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
module = ok(cu.cuModuleLoadData(ptx))
n = 256
x = np.arange(n, dtype=np.float32)
dx = ok(cu.cuMemAlloc(x.nbytes))
dy = ok(cu.cuMemAlloc(x.nbytes))
target = ok(cu.cuMemAlloc(x.nbytes))
table = ok(cu.cuMemAlloc(8))
ok(cu.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes))
ptr = np.array([int(target)], dtype=np.uint64)
ok(cu.cuMemcpyHtoD(table, ptr.ctypes.data, 8))

def launch(name, *values):
    f = ok(cu.cuModuleGetFunction(module, name))
    holders = [np.array([v], dtype=t) for v, t in values]
    args = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
    ok(cu.cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))

launch(b"scale", (int(dx), np.uint64), (int(dy), np.uint64), (n, np.int32))
if sys.argv[1] == "deceive":
    launch(b"indirect", (int(table), np.uint64), (n, np.int32))
ok(cu.cuCtxSynchronize())
y = np.zeros(n, dtype=np.float32)
t = np.zeros(n, dtype=np.float32)
ok(cu.cuMemcpyDtoH(y.ctypes.data, dy, y.nbytes))
ok(cu.cuMemcpyDtoH(t.ctypes.data, target, t.nbytes))
assert (y == 2 * x).all()
assert (t == (3.0 if sys.argv[1] == "deceive" else 0.0)).all()
report = subprocess.run([os.environ["PHOS"], "validate", "--json", "--pid", str(os.getpid())],
                        capture_output=True, text=True, timeout=60)
assert report.returncode == 0, report.stderr
print(json.dumps({"target": int(target), "report": json.loads(report.stdout)}))
'''


def run_client(phos, phosd, build_dir, mode, validate=True):
    pytest.importorskip("cuda.bindings.nvrtc")
    env = phosd.client_env(PHOS=phos)
    env["LD_LIBRARY_PATH"] = ":".join(["/usr/local/cuda/lib64", env.get("LD_LIBRARY_PATH", "")])
    env.pop("LD_PRELOAD")  # phos run puts it back, with --validate
    cmd = [str(phos), "run", "--runtime-dir", str(phosd.runtime_dir)] + (["--validate"] if validate else [])
    proc = subprocess.run(cmd + ["--", sys.executable, "-c", CLIENT, mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr + phosd.log()
    return json.loads(proc.stdout.splitlines()[-1])


def test_honest_kernel_reports_nothing(phos, phosd, build_dir):
    out = run_client(phos, phosd, build_dir, "honest")
    report = out["report"]
    assert report["mode"] == "validate"
    assert report["twin_launches"] == report["launches"] == 1
    assert report["violations"] == 0 and report["reported"] == []


def test_write_through_a_stored_pointer_is_caught(phos, phosd, build_dir):
    out = run_client(phos, phosd, build_dir, "deceive")
    report = out["report"]
    assert report["launches"] == report["twin_launches"] == 2
    # Every one of the 256 threads stored outside the speculated buffers.
    assert report["violations"] == 256, report
    stores = report["reported"]
    assert stores and all(v["kernel"] == "indirect" and v["kind"] == "store" and v["size"] == 4 for v in stores)
    addresses = sorted(int(v["address"], 16) for v in stores)
    assert out["target"] <= addresses[0] and addresses[-1] < out["target"] + 256 * 4


def test_without_validate_twins_do_not_run(phos, phosd, build_dir):
    out = run_client(phos, phosd, build_dir, "deceive", validate=False)
    assert out["report"]["mode"] == "off"
    assert out["report"]["launches"] == 0 and out["report"]["violations"] == 0


def test_mlp_train_twins_compute_what_the_originals_do(build_dir, phos, phosd, direct_env):
    exe = build_dir / "examples" / "mlp-train"
    if not exe.exists():
        pytest.skip(f"mlp-train was not built in {build_dir} (it needs nvcc)")
    cmd = [exe, "--iterations", STEPS]
    direct = run(cmd, direct_env)
    remoted = subprocess.run([str(c) for c in [phos, "run", "--validate", "--runtime-dir", phosd.runtime_dir, "--",
                                               *cmd]], env=direct_env, capture_output=True, text=True, timeout=300)
    check_identical(direct, remoted)
    # The session's summary, logged when it ends: every launch ran as a twin
    # and none reported an access outside its speculated buffers.
    def summary():
        return [line for line in phosd.log().splitlines() if "validation:" in line]
    wait_for(lambda: summary(), 30, "the session's validation summary in phosd's log")
    assert " 0 without twin, 0 reported accesses" in summary()[-1], summary()[-1]


def test_validate_errors(phos, phosd):
    r = subprocess.run([str(phos), "validate", "--pid", "999999999", "--runtime-dir", str(phosd.runtime_dir)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "has no PhOS session" in r.stderr, r.stderr
    r = subprocess.run([str(phos), "validate", "--pid", "0", "--runtime-dir", str(phosd.runtime_dir)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--pid must name a process" in r.stderr, r.stderr
    r = subprocess.run([str(phos), "validate", "--pid", "1", "--runtime-dir", "/nonexistent-phos"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.startswith("phos validate: "), r.stderr


def test_daemon_loads_a_scanned_signature_database(phos, start_phosd, build_dir, tmp_path):
    scanner = build_dir / "instrument" / "phos-instrument"
    source = tmp_path / "k.cu"
    # The client's kernels as the application's sources declare them.
    source.write_text(CLIENT.split('src = b"""', 1)[1].split('"""', 1)[0])
    database = tmp_path / "signatures.json"
    scan = subprocess.run([str(scanner), "scan", str(source), "-o", str(database)], capture_output=True, text=True,
                          timeout=120)
    if scan.returncode != 0 and "built without Clang's libTooling" in scan.stderr:
        pytest.skip(scan.stderr.strip())
    assert scan.returncode == 0, scan.stderr
    assert sorted(k["name"] for k in json.loads(database.read_text())["kernels"]) == ["indirect", "scale"]
    # PHOS_SIGNATURES is `phos daemon --signatures`, for daemons phos run starts.
    phosd = start_phosd(PHOS_SIGNATURES=database)
    assert f"signature database {database}: 2 kernel(s)" in phosd.log(), phosd.log()
    out = run_client(phos, phosd, build_dir, "deceive")
    assert out["report"]["twin_launches"] == 2 and out["report"]["violations"] == 256


@pytest.mark.parametrize("content, message", [
    (None, "signature database {path}: "),
    ("{not json", "signature database {path}: "),
    ('{"version": 1, "kernels": [{"params": []}]}', "signature database {path}: "),
])
def test_daemon_refuses_a_bad_signature_database(phos, tmp_path, content, message):
    path = tmp_path / "signatures.json"
    if content is not None:
        path.write_text(content)
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", str(tmp_path / "run"), "--signatures", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message.format(path=path) in r.stderr, r.stderr


def test_a_restored_session_validates_as_the_checkpointed_one_did(criu, phos, phosd, app_env, programs, jobs,
                                                                  tmp_path):
    cmd = command(programs, "mlp-train")
    ref = reference(cmd, app_env)
    running = Job(phos, phosd, cmd, dict(app_env, PHOS_VALIDATE="1"), tmp_path)
    jobs.append(running)
    running.wait_line(3)
    image = tmp_path / "image"
    checkpoint(phos, phosd, running.pid, image)
    assert json.loads((image / "manifest.json").read_text())["state"]["gpu"]["sessions"][0]["validate"] is True
    assert running.proc.wait(timeout=30) == -signal.SIGKILL
    before = running.lines()

    def summaries():
        return [line for line in phosd.log().splitlines() if "validation:" in line]
    wait_for(lambda: len(summaries()) == 1, 30, "the checkpointed session's validation summary")
    assert before + restore(phos, phosd, image, app_env) == ref
    wait_for(lambda: len(summaries()) == 2, 30, "the restored session's validation summary")
    launches, twins = (int(n) for n in re.search(r"validation: (\d+) launches, (\d+) as twins", summaries()[-1]).groups())
    assert launches > 0 and twins == launches, summaries()[-1]
    assert " 0 without twin, 0 reported accesses" in summaries()[-1], summaries()[-1]


TWIN_MODULE_LOADED = "validator twins of the module of "


def validation_summaries(phosd):
    return [line for line in phosd.log().splitlines() if "validation:" in line]


def twin_launches(summary):
    launches, twins = (int(n) for n in re.search(r"validation: (\d+) launches, (\d+) as twins", summary).groups())
    return launches, twins


def test_twins_run_beside_the_programs_own_module(phos, phosd, app_env, programs, jobs, tmp_path):
    """The program's module is its own image, its twins in a module beside it (docs/twins.md).

    checkpoint_client's kernels count in a __device__ variable and read a
    __device__ salt and a __constant__ table the host writes; the host prints
    the count. Without validation no twin module is ever loaded; with it every
    launch runs as a twin, and the twins read and write the program's variables:
    the lines (the count included) are the uninterrupted direct run's, and no
    twin reports its counter's atomic, which speculation names at the address
    of the program's variable.
    """
    cmd = command(programs, "client-threads")
    ref = reference(cmd, app_env)
    plain = Job(phos, phosd, cmd, app_env, tmp_path, name="plain")
    jobs.append(plain)
    assert plain.proc.wait(timeout=120) == 0, plain.err.read_text()
    assert plain.lines() == ref
    assert TWIN_MODULE_LOADED not in phosd.log(), "a twin module was loaded for a session that never validates"

    validated = Job(phos, phosd, cmd, dict(app_env, PHOS_VALIDATE="1"), tmp_path, name="validated")
    jobs.append(validated)
    assert validated.proc.wait(timeout=120) == 0, validated.err.read_text()
    assert validated.lines() == ref, "the twins did not compute what the program's kernels do"
    wait_for(lambda: len(validation_summaries(phosd)) == 1, 30, "the validated session's summary")
    summary = validation_summaries(phosd)[-1]
    launches, twins = twin_launches(summary)
    assert launches > 0 and twins == launches, summary
    assert " 0 without twin, 0 reported accesses" in summary, summary
    loaded = [line for line in phosd.log().splitlines() if TWIN_MODULE_LOADED in line]
    assert len(loaded) == 1 and "3 of its variables shared" in loaded[0], loaded


def test_twins_beside_survive_a_copy_on_write_checkpoint_and_restore(criu, phos, phosd, app_env, programs, jobs,
                                                                     tmp_path):
    """A validated job checkpointed copy-on-write (--leave-running) ends as the
    uninterrupted run does, and so does its image restored: its kernels' module
    variables (a __device__ counter and salt, __constant__ data) are the
    program's, whether a kernel ran as itself or as a twin beside it."""
    cmd = command(programs, "client-threads")
    ref = reference(cmd, app_env)
    image, asked, done = left_running(phos, phosd, cmd, dict(app_env, PHOS_VALIDATE="1"), ref, jobs, tmp_path)
    wait_for(lambda: len(validation_summaries(phosd)) == 1, 30, "the checkpointed session's summary")
    launches, twins = twin_launches(validation_summaries(phosd)[-1])
    assert launches > 0 and twins == launches, validation_summaries(phosd)[-1]

    after_checkpoint(ref, restore(phos, phosd, image, app_env), asked, done)
    wait_for(lambda: len(validation_summaries(phosd)) == 2, 30, "the restored session's summary")
    summary = validation_summaries(phosd)[-1]
    launches, twins = twin_launches(summary)
    assert launches > 0 and twins == launches, summary
    assert " 0 without twin, 0 reported accesses" in summary, summary
    # The restored session loaded its twin module anew, beside the module the restore reloaded.
    assert sum(TWIN_MODULE_LOADED in line for line in phosd.log().splitlines()) == 2, phosd.log()[-3000:]


def test_a_checkpoints_twins_are_compiled_outside_the_worker(criu, phos, phosd, app_env, programs, jobs, tmp_path):
    """A copy-on-write checkpoint runs the job's launches as twins; their module is compiled before
    the window by a `phos jit` helper process, not by the worker's driver, whose launches NVIDIA's
    driver would hold while it compiles (docs/twins.md). The job and its image still end as the
    uninterrupted run does."""
    cmd = command(programs, "client-threads")
    ref = reference(cmd, app_env)
    running = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(running)
    running.wait_line(3)
    asked = len(running.lines())
    image = tmp_path / "image"
    checkpoint(phos, phosd, running.pid, image, "--leave-running", "--mode", "cow")
    done = len(running.lines())
    assert running.proc.wait(timeout=120) == 0, running.err.read_text()
    assert running.lines() == ref, "the original, left running, did not finish as the uninterrupted run"
    loaded = [line for line in phosd.log().splitlines() if TWIN_MODULE_LOADED in line]
    assert len(loaded) == 1 and "(compiled by the JIT helper)" in loaded[0], phosd.log()[-3000:]
    assert "are compiled in the worker" not in phosd.log(), phosd.log()[-3000:]
    after_checkpoint(ref, restore(phos, phosd, image, app_env), asked, done)


def test_phos_jit_names_what_it_cannot_compile(phos, tmp_path):
    """`phos jit` (run by phosd's workers) says what is wrong: no PTX, PTX the driver refuses, a driver
    it cannot load."""
    vgpu = str(pathlib.Path(phos).parents[1] / "vgpu" / "libcuda.so.1")
    cases = [(vgpu, b"", "phos jit: no PTX on descriptor 0"),
             (vgpu, b"not ptx", "phos jit: cuLinkAddData failed (CUresult 218)"),
             (str(tmp_path / "nothing.so"), b".version 8.0\n", "cannot load the CUDA driver")]
    for driver, ptx, message in cases:
        r = subprocess.run([str(phos), "jit", "--driver", driver, "--input-fd", "0"], input=ptx, capture_output=True,
                           timeout=60)
        assert r.returncode == 1 and r.stdout == b"", (driver, ptx, r)
        assert message in r.stderr.decode(), (driver, ptx, r.stderr)
    ok = subprocess.run([str(phos), "jit", "--driver", vgpu], input=b".version 8.0\n.target sm_80\n.address_size 64\n"
                        b".visible .entry empty()\n{\n  ret;\n}\n", capture_output=True, timeout=60)
    assert ok.returncode == 0 and b".entry empty()" in ok.stdout, ok
