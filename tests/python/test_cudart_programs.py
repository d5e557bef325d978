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

from conftest import ROOT
from test_checkpoint_phos import Job, after_checkpoint, checkpoint, criu, restore  # noqa: F401 (fixtures)
from test_concurrent_restore import restore as restore_with

TIMEOUT = 120
PROGRAMS = ["vector_add", "matmul_tiled", "streams_events", "symbols", "atomics_warp", "reduction",
            "printf_hostfunc", "train", "pools", "device_assert", "event_times", "shared_optin", "vector_add_shared",
            "train_shared", "pipeline", "thrust_sort", "cg_partitions", "managed", "graphs", "graph_train", "graph_built",
            "vmm_grow", "graph_coop", "host_register", "memcpy_batch", "textures", "texture_train", "user_objects", "stream_waits"]
# Lines a program prints after its steps.
TAIL_LINES = {"train": 1, "train_shared": 1, "pools": 3, "event_times": 1, "shared_optin": 1, "pipeline": 1,
              "managed": 1, "graph_train": 1, "graph_built": 1, "vmm_grow": 1, "graph_coop": 1, "host_register": 1,
              "texture_train": 1, "user_objects": 1, "stream_waits": 1}
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


def test_the_private_tables_name_contexts_as_the_public_api_on_vgpu_and_under_phos(phos, phosd, build_dir, env):
    """cuBLASLt's view of a context (TOOLS_TLS [2], TOOLS_CONTEXT [3] and [4]),
    as NVIDIA's driver 580 answers it on an H200 (docs/gpu.md): the probe
    prints the same lines there, on vgpu and under phos."""
    probe = build_dir / "tests" / "export_tables" / "export-table-probe"
    direct = run([probe], env)
    for line in ("TOOLS_TLS[2](&context): 0, the current context", "TOOLS_CONTEXT[4](context, &id): 0, cuCtxGetId's id",
                 "TOOLS_CONTEXT[3](context, &device): 0, the context's device", "OK"):
        assert line in direct.splitlines(), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", probe], env) == direct


def test_a_failed_assertion_is_reported_on_stderr_under_phos_as_directly(phos, phosd, cudart_dir, env):
    """One line per failing thread, with its block and thread, on the
    application's stderr, as NVIDIA's driver prints it (docs/gpu.md)."""
    def assertions(cmd):
        r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stdout + r.stderr
        return [line for line in r.stderr.splitlines() if "Assertion `v[i] != forbidden` failed." in line]
    direct = assertions([cudart_dir / "device_assert"])
    assert len(direct) == 32 and "block: [0,0,0], thread: [31,0,0]" in direct[-1], direct
    assert assertions([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "device_assert"]) == direct


def test_linear_filtering_weighs_texels_as_an_h200_does(cudart_dir, env):
    """Every value of texture_weights.cu, as an H200 printed it: weights of 8
    fractional bits, a fraction halfway between two rounded up."""
    expected = (ROOT / "tests" / "cudart" / "programs" / "texture_weights.h200.txt").read_text()
    assert run([cudart_dir / "texture_weights"], env) == expected


def train(cudart_dir, name="train"):
    return [str(cudart_dir / name), "--steps", str(STEPS), "--sleep-ms", str(SLEEP_MS)]


def reference(cudart_dir, env, name="train"):
    out = run([cudart_dir / name, "--steps", str(STEPS)], env).splitlines()
    assert len(out) == STEPS + TAIL_LINES[name]
    return out


@pytest.mark.parametrize("name", ["train", "train_shared", "pools", "event_times", "shared_optin", "pipeline",
                                  "managed", "graph_train", "graph_built", "vmm_grow", "graph_coop",
                                  "host_register", "texture_train", "user_objects", "stream_waits"])
def test_killed_and_restored(criu, phos, phosd, cudart_dir, env, tmp_path, name):
    """Stop-the-world: the job ends at the checkpoint; its restore finishes it exactly."""
    killed_and_restored(phos, phosd, train(cudart_dir, name), reference(cudart_dir, env, name), env, tmp_path, 4)


def killed_and_restored(phos, phosd, cmd, ref, env, tmp_path, line):
    """Checkpoints `cmd` stop-the-world once it printed `line` lines; the lines
    before the kill and those of the restore make up `ref` exactly."""
    job = Job(phos, phosd, cmd, env, tmp_path)
    try:
        job.wait_line(line)
        checkpoint(phos, phosd, job.pid, tmp_path / "image")
        assert job.proc.wait(timeout=30) == -signal.SIGKILL
        before = job.lines()
        assert before == ref[:len(before)] and len(before) < len(ref)
        assert before + restore(phos, phosd, tmp_path / "image", env) == ref
    finally:
        job.stop()


def checkpointed(phos, phosd, cmd, env, tmp_path, line):
    """Checkpoints `cmd` stop-the-world into tmp_path/image once it printed `line` lines: the lines
    it printed, and the image's manifest (its text), which the garbled-image tests change."""
    job = Job(phos, phosd, cmd, env, tmp_path)
    try:
        job.wait_line(line)
        checkpoint(phos, phosd, job.pid, tmp_path / "image")
        job.proc.wait(timeout=30)
        return job.lines(), (tmp_path / "image" / "manifest.json").read_text()
    finally:
        job.stop()


def refused_restore(phos, phosd, env, tmp_path, manifest):
    """Restores tmp_path/image with `manifest` (a dict) as its manifest: the restore must fail; its stderr."""
    (tmp_path / "image" / "manifest.json").write_text(json.dumps(manifest))
    r = subprocess.run([str(phos), "restore", "--image", str(tmp_path / "image"), "--runtime-dir",
                        str(phosd.runtime_dir)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode != 0, r.stdout
    return r.stderr


@pytest.mark.parametrize("mode,name", [("cow", "train"), ("recopy", "train"), ("stop", "train"), ("cow", "pools"),
                                       ("recopy", "pools"), ("cow", "event_times"), ("recopy", "shared_optin"),
                                       ("cow", "pipeline"), ("recopy", "pipeline"), ("cow", "managed"),
                                       ("recopy", "managed"), ("cow", "graph_train"), ("recopy", "graph_train"),
                                       ("stop", "graph_train"), ("cow", "graph_built"), ("recopy", "graph_built"),
                                       ("cow", "vmm_grow"), ("recopy", "vmm_grow"), ("cow", "graph_coop"),
                                       ("recopy", "graph_coop"), ("cow", "host_register"), ("cow", "texture_train"),
                                       ("recopy", "texture_train"), ("cow", "user_objects"), ("recopy", "user_objects"),
                                       ("cow", "stream_waits"), ("recopy", "stream_waits")])
def test_left_running_and_restored(criu, phos, phosd, cudart_dir, env, tmp_path, mode, name):
    """The job goes on to the uninterrupted end; the image restores to it as well."""
    ref = reference(cudart_dir, env, name)
    job = Job(phos, phosd, train(cudart_dir, name), env, tmp_path)
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


@pytest.mark.parametrize("eager,name", [(False, "train"), (True, "train"), (False, "pools"), (False, "managed"),
                                        (False, "graph_train"), (False, "graph_built"), (False, "vmm_grow"),
                                        (False, "host_register"), (False, "texture_train"), (False, "user_objects"),
                                        (False, "stream_waits")])
def test_restored_concurrently_or_eagerly(criu, phos, phosd, cudart_dir, env, tmp_path, eager, name):
    ref = reference(cudart_dir, env, name)
    job = Job(phos, phosd, train(cudart_dir, name), env, tmp_path)
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


def test_a_checkpoint_of_vmm_memory_mapped_nowhere_is_refused_naming_it(criu, phos, phosd, cudart_dir, env,
                                                                        tmp_path):
    """vmm_grow --keep-unmapped holds the handle of a chunk it unmapped: its bytes live on in no
    mapping, through which PhOS saves VMM memory. The checkpoint fails naming it, writes no image,
    and the job runs on to its uninterrupted end."""
    cmd = train(cudart_dir, "vmm_grow") + ["--keep-unmapped"]
    ref = run([cudart_dir / "vmm_grow", "--steps", str(STEPS), "--keep-unmapped"], env).splitlines()
    job = Job(phos, phosd, cmd, env, tmp_path)
    try:
        job.wait_line(6)
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--runtime-dir", str(phosd.runtime_dir), "--leave-running"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0
        assert "physical memory of cuMemCreate with bytes mapped nowhere" in r.stderr, r.stderr
        assert not (tmp_path / "image" / "manifest.json").exists()
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ref
    finally:
        job.stop()


def test_a_synchronous_copy_behind_a_stream_memory_wait_lets_other_threads_release_it(phos, phosd, cudart_dir,
                                                                                       env):
    """stream_waits --legacy: the main thread's cudaMemcpy runs on the legacy stream, which waits for
    the blocking work stream, which waits for the flag the producer thread writes 20 ms later from its
    own stream. CUDA runs both; phosd answers the copy once the wait is over and serves the producer
    meanwhile, and the program prints what it prints directly."""
    args = ["--steps", "6", "--legacy"]
    direct = run([cudart_dir / "stream_waits", *args], env)
    assert direct.endswith("stream_waits OK\n"), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "stream_waits", *args],
               env) == direct


def test_frees_behind_a_stream_memory_wait_let_other_threads_release_it(phos, phosd, cudart_dir, env):
    """stream_waits --free: the main thread frees device and pinned memory, which waits for the device's
    work, while the work stream still waits for the producer's flag. phosd answers the frees once the
    wait is over and serves the producer meanwhile (it used to block the session there: a deadlock)."""
    args = ["--steps", "4", "--free"]
    direct = run([cudart_dir / "stream_waits", *args], env)
    assert direct.endswith("stream_waits OK\n"), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "stream_waits", *args],
               env) == direct


def test_a_checkpoint_while_a_stream_memory_wait_holds_a_stream_is_refused_naming_it(criu, phos, phosd, cudart_dir,
                                                                                     env, tmp_path):
    """stream_waits --hold-at 3: the host stores the word its work stream waits for only 6 s later,
    while the main thread waits for that stream. phosd goes on serving the program's other threads;
    the checkpoint gives the wait 2 s to end, then fails naming it and writes no image, and the job
    runs on to its uninterrupted end."""
    args = ["--steps", "6", "--hold-at", "3", "--hold-ms", "6000"]
    ref = run([cudart_dir / "stream_waits", *args], env).splitlines()
    job = Job(phos, phosd, [str(cudart_dir / "stream_waits"), *args], env, tmp_path)
    try:
        job.wait_line(4)  # three steps and "holding"
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--runtime-dir", str(phosd.runtime_dir), "--leave-running"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0
        assert "waits (cuStreamWaitValue64) for the word at" in r.stderr, r.stderr
        assert "cannot wait for the session's work while a stream memory wait holds it" in r.stderr, r.stderr
        assert not (tmp_path / "image" / "manifest.json").exists()
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ref
    finally:
        job.stop()


def test_stream_memory_operations_on_memory_not_the_programs_are_refused_as_on_vgpu(phos, phosd, cudart_dir, env):
    """A word phosd would wait on or write must be the session's: an address allocated nowhere or on
    the program's stack gets CUDA_ERROR_INVALID_VALUE under phos as directly, and so do the flags and
    counts the driver refuses."""
    direct = run([cudart_dir / "stream_waits", "--refusals"], env)
    assert direct.count("CUDA_ERROR_INVALID_VALUE") == 5 and direct.endswith("batch of one CUDA_SUCCESS\n"), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "stream_waits", "--refusals"],
               env) == direct


def test_vmm_requests_phos_does_not_serve_are_refused_naming_them(phos, phosd, cudart_dir, env, tmp_path):
    """Shareable handles would be phosd's file descriptors, host memory is not device memory: the
    program gets CUDA_ERROR_NOT_SUPPORTED and phosd's log names the request."""
    out = run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "vmm_grow", "--refusals"], env)
    assert out == "shareable CUDA_ERROR_NOT_SUPPORTED\nhost CUDA_ERROR_NOT_SUPPORTED\n", out
    assert "cuMemCreate: a shareable handle type is not served" in phosd.log()
    assert "cuMemCreate: memory of a host location is not served" in phosd.log()


def test_what_host_registration_refuses_under_phos_is_named(phos, phosd, cudart_dir, env):
    """A range registered twice and memory never registered get CUDA's errors, as on vgpu; a
    file's pages (a memory-mapped array) are not served: they would stop being the file's when
    they became the file phosd shares. The program is told CUDA_ERROR_NOT_SUPPORTED and the shim's
    log names the mapping."""
    direct = run([cudart_dir / "host_register", "--refusals"], env)
    assert direct == ("twice cudaErrorHostMemoryAlreadyRegistered\nnever cudaErrorHostMemoryNotRegistered\n"
                      "file cudaSuccess\n"), direct
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--",
                        str(cudart_dir / "host_register"), "--refusals"], env={**env, "PHOS_LOG_STDERR": "1"},
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == direct.replace("file cudaSuccess", "file cudaErrorNotSupported"), r.stdout
    assert "are not private anonymous read-write memory" in r.stderr, r.stderr


def test_an_image_whose_registered_memory_is_garbled_is_refused_naming_it(criu, phos, phosd, cudart_dir, env,
                                                                         tmp_path):
    """The image is untrusted input: a registered range in the addresses phosd hands out (it would
    take another session's) or that is not the pages of its registration refuses the restore, naming
    it; the untouched image still restores the job exactly."""
    ref = reference(cudart_dir, env, "host_register")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "host_register"), env, tmp_path, 4)
    pinned = json.loads(original)["state"]["gpu"]["sessions"][0]["pinned"]
    assert [p["registered"] != 0 for p in pinned] == [True, True], pinned
    for garble, message in [(lambda p: p.update(address=0x500000000000,
                                                registered=0x500000000000 + p["registered"] - p["address"]),
                             "lies in the addresses phosd hands out"),
                            (lambda p: p.update(registered=p["registered"] + 8192), "is not the pages of")]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["pinned"][0])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert message in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_texture_objects_come_back_under_their_handles_or_the_restore_is_refused(criu, phos, phosd, cudart_dir,
                                                                                 env, tmp_path):
    """texture_train's kernels hold its texture and surface objects' handles in
    their arguments: a restore makes them again under the same values, past
    the slot the job freed (a placeholder fills it meanwhile); one the driver
    would give another value, or whose array the image lacks, refuses the
    restore, naming it. The untouched image still restores the job exactly."""
    ref = reference(cudart_dir, env, "texture_train")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "texture_train"), env, tmp_path, 4)
    session = json.loads(original)["state"]["gpu"]["sessions"][0]
    objects = session["texture_objects"]
    # Slot 1 of the textures was freed; the surface has its own slots.
    assert sorted((o["surface"], o["handle"]) for o in objects) == [(False, 2), (False, 3), (True, 1)], objects
    assert len(session["arrays"]) == 1 and session["arrays"][0]["width"] == 64, session["arrays"]
    texture = next(i for i, o in enumerate(objects) if not o["surface"] and o["handle"] == 2)
    surface = next(i for i, o in enumerate(objects) if o["surface"])

    def other_array(o):
        # The resource's array (its first 8 bytes after the 4-byte type and padding): an id of no array.
        o["resource"] = o["resource"][:16] + (session["arrays"][0]["id"] + 1).to_bytes(8, "little").hex() + \
            o["resource"][32:]

    for index, garble, message in [
            (texture, lambda o: o.update(handle=0), "texture object 0x0 came back as 0x1"),
            (surface, other_array, "surface object 0x1: its array"),
            (texture, lambda o: o.update(resource="00"), "\"resource\" is not")]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["texture_objects"][index])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert message in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def refused_checkpoint(phos, phosd, cmd, env, tmp_path, message):
    """Checkpoints `cmd` after its second line: the checkpoint must fail with `message` on stderr and
    the job run on to its end; the lines it printed."""
    job = Job(phos, phosd, cmd, env, tmp_path)
    try:
        job.wait_line(2)
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--runtime-dir", str(phosd.runtime_dir)], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0, r.stdout
        assert message in r.stderr, r.stderr
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        return job.lines()
    finally:
        job.stop()


def test_a_checkpoint_of_a_texture_over_a_freed_array_is_refused_and_the_job_runs_on(criu, phos, phosd, cudart_dir,
                                                                                     env, tmp_path):
    """A texture object whose array the program freed could not be made again:
    the checkpoint fails naming it, and the job finishes as it would have."""
    lines = refused_checkpoint(phos, phosd, train(cudart_dir, "texture_train") + ["--dangling"], env, tmp_path,
                               "a texture object over an array the program destroyed (0x1)")
    assert lines == reference(cudart_dir, env, "texture_train")


def test_user_objects_come_back_with_their_references_or_the_restore_is_refused(criu, phos, phosd, cudart_dir,
                                                                                 env, tmp_path):
    """After step 3 the program holds none of A's references, the graph and its executable graph
    two each, and B is the program's alone: the image says so, a holder that is no graph of the
    session refuses the restore, naming it, and the untouched image restores the job exactly
    (A's destructor at step 8, B's at step 6)."""
    ref = reference(cudart_dir, env, "user_objects")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "user_objects"), env, tmp_path, 4)
    objects = json.loads(original)["state"]["gpu"]["sessions"][0]["user_objects"]
    a, b = objects
    assert a["application_refs"] == 0 and sorted(h["refs"] for h in a["holders"]) == [2, 2], objects
    assert b["application_refs"] == 1 and b["holders"] == [], objects
    bad = json.loads(original)
    bad["state"]["gpu"]["sessions"][0]["user_objects"][0]["holders"][0]["holder"] += 1000
    assert "is no graph of the session" in refused_restore(phos, phosd, env, tmp_path, bad)
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_a_checkpoint_of_user_objects_held_through_a_child_graph_is_refused(criu, phos, phosd, cudart_dir, env,
                                                                           tmp_path):
    """A child graph node holds a clone of its graph, with the graph's references to A, which phosd
    cannot follow: the checkpoint fails naming the graph, and the job finishes as it would have."""
    lines = refused_checkpoint(phos, phosd, train(cudart_dir, "user_objects") + ["--child"], env, tmp_path,
                               "holding user objects' references through a child graph node")
    assert lines[-1] == "user_objects OK", lines


def test_a_managed_variable_runs_on_vgpu_and_phos_names_what_it_does_not_serve(phos, phosd, cudart_dir, env):
    """__managed__ variables: vgpu serves them (cuLibraryGetManaged); under PhOS
    they live in phosd's driver, and the job is told which entry point is not
    served before cudart leaves the variable's pointer null."""
    assert run([cudart_dir / "managed_variable"], env) == "counter 165 weights 4 8 12 16 OK\n"
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--",
                        str(cudart_dir / "managed_variable")], env=env, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode != 0
    assert "cuLibraryGetManaged is not supported by PhOS (managed variables of modules live in the driver's " \
           "module memory in phosd" in r.stderr, r.stderr


def test_a_copy_node_of_pageable_memory_is_refused_under_phos_naming_why(phos, phosd, cudart_dir, env):
    """CUDA lets a graph's copy node name pageable memory; phosd runs the copy at each launch, long after
    the call, and sees only pinned and device memory: the call is refused (the program's check names
    it) and phosd's log says why. vgpu alone runs the same program to its end."""
    out = run([cudart_dir / "graph_built", "--steps", "3", "--pageable-copy"], env)
    assert "graph_built OK" in out, out
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--", str(cudart_dir / "graph_built"),
                        "--steps", "3", "--pageable-copy"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0
    assert "cudaGraphAddMemcpyNode1D" in r.stderr, r.stderr
    assert "cuGraphAddMemcpyNode: a side of the copy is not device or pinned memory of the session" in phosd.log()


def test_a_child_graph_node_is_restored_inside_its_node(criu, phos, phosd, cudart_dir, env, tmp_path):
    """graph_built's copy of the loss in a child graph node: the restore makes the child graph again
    inside its node, in the graph and in the executable graph, and the job ends as the uninterrupted run."""
    cmd = train(cudart_dir, "graph_built") + ["--child-graph"]
    ref = run([cudart_dir / "graph_built", "--steps", str(STEPS), "--child-graph"], env).splitlines()
    killed_and_restored(phos, phosd, cmd, ref, env, tmp_path, 4)


def test_a_checkpoint_of_a_child_graph_the_program_holds_is_refused_naming_it(criu, phos, phosd, cudart_dir,
                                                                               env, tmp_path):
    """A restore makes a child graph again inside its node, under no handle: a program holding the
    child graph's handle (cudaGraphChildGraphNodeGetGraph) would hold nothing. The checkpoint fails
    naming it, writes no image, and the job runs on to its uninterrupted end."""
    cmd = train(cudart_dir, "graph_built") + ["--child-handle"]
    ref = run([cudart_dir / "graph_built", "--steps", str(STEPS), "--child-handle"], env).splitlines()
    job = Job(phos, phosd, cmd, env, tmp_path)
    try:
        job.wait_line(2)
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--runtime-dir", str(phosd.runtime_dir), "--leave-running"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0
        assert "a CUDA graph holding a child graph node whose graph the program holds a handle of" in r.stderr, \
            r.stderr
        assert not (tmp_path / "image" / "manifest.json").exists()
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ref
    finally:
        job.stop()


def test_a_checkpoint_during_a_stream_capture_is_refused_and_the_capture_goes_on(criu, phos, phosd, cudart_dir,
                                                                                  env, tmp_path):
    """A checkpoint waits for the session's work by synchronizing its contexts, which would invalidate
    a capture in progress: it waits 2 s for the capture to end, and then is refused, naming the
    capture; no image is written, and the job's capture and replays (graph_train holds its capture
    open for 3 s) run to the uninterrupted end."""
    ref = reference(cudart_dir, env, "graph_train")
    job = Job(phos, phosd, train(cudart_dir, "graph_train") + ["--hold-capture-ms", "3000"], env, tmp_path)
    try:
        job.wait_line(1)
        assert job.lines() == ["capturing"]
        r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                            "--runtime-dir", str(phosd.runtime_dir), "--leave-running"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0
        assert "1 stream capture is in progress" in r.stderr, r.stderr
        assert not (tmp_path / "image" / "manifest.json").exists()
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ["capturing"] + ref
    finally:
        job.stop()


def test_a_checkpoint_asked_during_a_short_stream_capture_waits_for_its_end(criu, phos, phosd, cudart_dir, env,
                                                                             tmp_path):
    """A checkpoint asked while the job captures (graph_train holds its capture open for 0.5 s) lets
    the job's calls go on until the capture ends, then checkpoints: the job runs to the
    uninterrupted end, and the image restores to it."""
    ref = reference(cudart_dir, env, "graph_train")
    job = Job(phos, phosd, train(cudart_dir, "graph_train") + ["--hold-capture-ms", "500"], env, tmp_path)
    try:
        job.wait_line(1)
        assert job.lines() == ["capturing"]
        report = checkpoint(phos, phosd, job.pid, tmp_path / "image", "--leave-running")
        assert report["stall"]["quiesce_seconds"] < 5, report
        assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()
        assert job.lines() == ["capturing"] + ref
        restored = restore(phos, phosd, tmp_path / "image", env)
        assert restored == ref[len(ref) - len(restored):] and restored, restored
    finally:
        job.stop()


def test_an_image_whose_graph_is_garbled_is_refused_naming_the_node(criu, phos, phosd, cudart_dir, env, tmp_path):
    """The image is untrusted input: a graph node placed after a node not made before it, a kernel
    parameter of the wrong size, or a copy reaching past the session's memory (phosd's worker may run as
    root: the driver would copy its memory) refuses the restore with a message naming the graph and
    node; the untouched image still restores the job exactly."""
    ref = reference(cudart_dir, env, "graph_train")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "graph_train"), env, tmp_path, 3)
    manifest = json.loads(original)
    graphs = manifest["state"]["gpu"]["sessions"][0]["graphs"]
    assert [g["kind"] for g in graphs] == ["exec"], graphs  # the loop keeps its executable graph only
    kernel = next(i for i, n in enumerate(graphs[0]["nodes"]) if "params" in n)
    copy = next(i for i, n in enumerate(graphs[0]["nodes"]) if "copy" in n)

    def copy_from_elsewhere(g):
        # The copy's srcXInBytes (its first field): far past the loss's allocation, into phosd's own memory.
        g["nodes"][copy]["copy"] = (1 << 40).to_bytes(8, "little").hex() + g["nodes"][copy]["copy"][16:]

    for garble, message in [(lambda g: g["nodes"][0].update(after=[len(g["nodes"])]),
                             "node 0: it comes after node"),
                            (lambda g: g["nodes"][kernel]["params"].__setitem__(0, "00"),
                             f"node {kernel}: parameter 0 is not 8 bytes"),
                            (copy_from_elsewhere, f"node {copy}: a copy of memory that is not the session's")]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["graphs"][0])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert f"graph {hex(graphs[0]['id'])}, {message}" in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_an_image_whose_vmm_state_is_garbled_is_refused_naming_it(criu, phos, phosd, cudart_dir, env, tmp_path):
    """The image is untrusted input: a VMM reservation outside the sessions' windows (phosd's worker
    would reserve and map where the image says) or across the end of its own, a mapping outside the
    reservations, or one of a handle the image does not have refuses the restore, naming it; the
    untouched image still restores the job exactly."""
    ref = reference(cudart_dir, env, "vmm_grow")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "vmm_grow"), env, tmp_path, 7)
    vmm = json.loads(original)["state"]["gpu"]["sessions"][0]["application_vmm"]
    assert len(vmm["reservations"]) == 1 and len(vmm["mappings"]) == 2, vmm
    for garble, message in [(lambda v: v["reservations"][0].update(address=0x7f0000000000),
                             "the VMM reservation 0x7f0000000000+"),
                            # Inside the windows, but running past the end of its own (1 TiB each).
                            (lambda v: v["reservations"][0].update(bytes=(1 << 40) + (2 << 20)),
                             "crosses the end of its window"),
                            (lambda v: v["mappings"][1].update(address=v["mappings"][1]["address"] + (1 << 39)),
                             "lies outside the image's reservations or over another"),
                            (lambda v: v["mappings"][0].update(physical=99), "is of handle 99, which the image")]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["application_vmm"])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert message in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_an_image_whose_kernel_node_attribute_is_garbled_is_refused_naming_it(criu, phos, phosd, cudart_dir, env,
                                                                             tmp_path):
    """graph_coop's nodes carry attributes (a captured cooperative launch, a priority): one of an id
    phosd does not serve (13, a device-updatable node's) or of bytes that are not a value refuses the restore,
    naming the node; the untouched image still restores the job exactly."""
    ref = reference(cudart_dir, env, "graph_coop")
    before, original = checkpointed(phos, phosd, train(cudart_dir, "graph_coop"), env, tmp_path, 3)
    graphs = json.loads(original)["state"]["gpu"]["sessions"][0]["graphs"]
    g, i = next((g, i) for g, graph in enumerate(graphs) for i, n in enumerate(graph["nodes"]) if "attributes" in n)
    for garble in [lambda a: a.update({"13": a.pop(next(iter(a)))}), lambda a: a.update({next(iter(a)): "01"})]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["graphs"][g]["nodes"][i]["attributes"])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert f"node {i}: a garbled kernel node attribute" in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_an_image_whose_child_graph_or_host_node_is_garbled_is_refused_naming_it(criu, phos, phosd, cudart_dir,
                                                                                   env, tmp_path):
    """graph_built --child-graph's image, made untrusted input: child graphs nested without end (phosd
    makes them recursively: a bounded depth, not a crashed worker), a host node of no function, a kernel
    node naming a library kernel the session never had, refuse the restore naming graph and node; the
    untouched image still restores the job exactly."""
    cmd = train(cudart_dir, "graph_built") + ["--child-graph"]
    ref = run([cudart_dir / "graph_built", "--steps", str(STEPS), "--child-graph"], env).splitlines()
    before, original = checkpointed(phos, phosd, cmd, env, tmp_path, 3)
    graphs = json.loads(original)["state"]["gpu"]["sessions"][0]["graphs"]
    g = next(i for i, g in enumerate(graphs) if g["kind"] == "graph")
    nodes = graphs[g]["nodes"]
    child = next(i for i, n in enumerate(nodes) if "graph" in n)
    host = next(i for i, n in enumerate(nodes) if "user_data" in n)
    kernel = next(i for i, n in enumerate(nodes) if "params" in n and "kernel" in n)

    def nest(graph):
        inner = graph["nodes"][child]
        for _ in range(100):
            inner = {"type": 4, "after": [], "id": 0, "graph": [inner | {"after": []}]}
        graph["nodes"][child] = inner | {"after": graph["nodes"][child]["after"]}

    for garble, message in [(nest, f"node {child}, child graph, node 0, child graph"),
                            (lambda graph: graph["nodes"][host].update(function=0),
                             f"node {host}: a host node of no function"),
                            (lambda graph: graph["nodes"][kernel].update(kernel=graph["nodes"][kernel]["kernel"] + 999),
                             f"node {kernel}: kernel")]:
        bad = json.loads(original)
        garble(bad["state"]["gpu"]["sessions"][0]["graphs"][g])
        stderr = refused_restore(phos, phosd, env, tmp_path, bad)
        assert f"graph {hex(graphs[g]['id'])}, {message}" in stderr, stderr
    bad = json.loads(original)
    nest(bad["state"]["gpu"]["sessions"][0]["graphs"][g])
    stderr = refused_restore(phos, phosd, env, tmp_path, bad)
    assert "child graphs nested deeper than 64" in stderr, stderr
    (tmp_path / "image" / "manifest.json").write_text(original)
    assert before + restore(phos, phosd, tmp_path / "image", env) == ref


def test_image_names_every_global_of_the_fatbin(criu, phos, phosd, cudart_dir, env, tmp_path):
    """A runtime program's image: its module is nvcc's fatbin, and both of its
    globals (a __device__ and a __constant__) are saved. The runtime loads the
    module after the program's allocations, and the image says so: a restore
    repeats that order, on which NVIDIA's driver's placement of the globals
    depends (docs/checkpoint.md)."""
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
    orders = [a["order"] for a in manifest["state"]["gpu"]["sessions"][0]["allocations"]]
    assert len(orders) == 5 and len(set(orders)) == 5 and 0 < max(orders) < module["order"], (orders, module["order"])


def test_driver_api_program_linked_with_lcuda(phos, phosd, cudart_dir, env):
    """A program with libcuda.so.1 in its DT_NEEDED starts under `phos run` on a
    host with no NVIDIA driver: phos run puts the shim first on its library path."""
    fatbin = cudart_dir / "driver_kernels.fatbin"
    direct = run([cudart_dir / "driver_api", fatbin], env)
    assert direct.startswith("driver_api OK"), direct
    bare = dict(env, LD_LIBRARY_PATH="")
    alone = subprocess.run([str(cudart_dir / "driver_api"), str(fatbin)], env=bare, capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert alone.returncode == 127 and "libcuda.so.1" in alone.stderr, "this host has a libcuda.so.1 of its own"
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", cudart_dir / "driver_api", fatbin],
               bare) == direct


def trace_table(path):
    """{entry point: (calls, how it was served)} from a --trace-api file."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("phos: CUDA Driver API calls of pid"), lines
    table = {}
    for line in lines[1:]:
        calls, symbol, how = line.split(maxsplit=2)
        table[symbol] = (int(calls), how)
    return table


def test_trace_api_lists_every_entry_point_the_job_called(phos, phosd, cudart_dir, env, tmp_path):
    out = tmp_path / "trace.txt"
    direct = run([cudart_dir / "streams_events"], env)
    under = run([phos, "run", "--runtime-dir", phosd.runtime_dir, f"--trace-api={out}", "--",
                 cudart_dir / "streams_events"], env)
    assert under == direct
    table = trace_table(out)
    # The program's two kernels, three events and two streams, through cudart.
    assert table["cuLaunchKernel"] == (2, "remoted")
    assert table["cuEventCreate"] == (3, "remoted")
    assert table["cuStreamCreate"] == (2, "remoted")
    assert table["cuGetExportTable"][1] == "answered in the shim"
    assert table["cuLibraryLoadData"] == (1, "remoted")
    assert not [s for s, (_, how) in table.items() if how.startswith("NOT SUPPORTED")]
    # The shim's own calls (parameter sizes before a launch) are not the program's.
    assert "cuFuncGetParamInfo" not in table and "cuKernelGetParamInfo" not in table


EXCLUDED_CALLER = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
value = ctypes.c_int()
size = ctypes.c_size_t(ctypes.sizeof(value))
get = lambda: cuda.cuCoredumpGetAttributeGlobal(1, ctypes.byref(value), ctypes.byref(size))
print(get(), get())
"""


def test_an_entry_point_phos_does_not_serve_says_why(phos, phosd, env, tmp_path):
    import sys
    out = tmp_path / "trace.txt"
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), f"--trace-api={out}", "--",
                        sys.executable, "-c", EXCLUDED_CALLER], env=dict(env, LD_LIBRARY_PATH=""),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["801", "801"]  # CUDA_ERROR_NOT_SUPPORTED
    warnings = [line for line in r.stderr.splitlines() if "cuCoredumpGetAttributeGlobal" in line]
    assert warnings == ["phos: cuCoredumpGetAttributeGlobal is not supported by PhOS (coredumps are the daemon's): "
                        "the call returns CUDA_ERROR_NOT_SUPPORTED"]
    calls, how = trace_table(out)["cuCoredumpGetAttributeGlobal"]
    assert calls == 2 and how.startswith("NOT SUPPORTED: coredumps are the daemon's")


def test_trace_api_to_a_file_that_cannot_be_written(phos, phosd, cudart_dir, env, tmp_path):
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir),
                        f"--trace-api={tmp_path}/missing/trace.txt", "--", str(cudart_dir / "vector_add")],
                       env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout
    assert f"phos: cannot write the API trace to {tmp_path}/missing/trace.txt: No such file or directory" in r.stderr


@pytest.fixture(scope="module")
def cudart12(cudart_dir):
    """PyPI's CUDA 12 runtime (nvidia-cuda-runtime-cu12, in .venv) and a job of it."""
    import glob
    import sys
    found = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cuda_runtime", "lib",
                                   "libcudart.so.12"))
    if not found:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed in this environment (scripts/requirements.txt)")
    job = os.path.join(os.path.dirname(__file__), "cudart12_job.py")
    return [sys.executable, job, found[0], str(cudart_dir / "driver_kernels.fatbin")]


def test_cudart12_runs_on_vgpu_and_under_phos_alike(phos, phosd, env, cudart12):
    direct = run([*cudart12, "--steps", 4], env)
    assert direct.startswith("runtime 12.") and direct.endswith("cudart12 OK\n"), direct
    assert run([phos, "run", "--runtime-dir", phosd.runtime_dir, "--", *cudart12, "--steps", 4], env) == direct


def test_cudart12_killed_and_restored(criu, phos, phosd, env, cudart12, tmp_path):
    ref = run([*cudart12, "--steps", 8], env).splitlines()
    killed_and_restored(phos, phosd, [*cudart12, "--steps", "8", "--sleep-ms", "300"], ref, env, tmp_path, 3)
