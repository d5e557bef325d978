# SPDX-License-Identifier: Apache-2.0
"""GPU processes under `phos run`, checkpointed through phosd, killed and restored (issue 7).

The jobs: the examples (mlp-train and its cuda.core twin train.py, with some
--state-mib device memory) and tests/shim/clients/checkpoint_client in each of
its modes (worker threads, kernels in flight during a synchronizing call,
pinned memory, events across streams; module globals in all). Every one
prints a checksum per iteration and a final one, so a restore that loses or
misplaces any state changes the text. The ground truth is the same program run
uninterrupted directly on vgpu. Each test waits for line k of the job, then
checkpoints it, and requires:
  - killed and restored: the original's lines up to the checkpoint followed by
    the restored run's lines are the uninterrupted run's, bit for bit; restoring
    the same image a second time gives the same lines again;
  - left running: the original finishes with the uninterrupted run's lines, and
    its image restores to the same end.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from job_output import lines, wait_for

TRAIN_PY = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mlp" / "train.py"
TIMEOUT = 120
STEPS = 12      # iterations of every job: checkpoints land at line 2 or 6, several steps before the end
SLEEP_MS = 200  # the pause after a line that makes "checkpoint once line k is out" land in iteration k
STATE_MIB = 3   # the examples' extra device memory: a few 1 MiB windows, every byte in the checksum

# name -> (program, arguments): the jobs each test runs.
JOBS = {
    "mlp-train": ("mlp-train", ["--state-mib", STATE_MIB, "--sleep-ms", SLEEP_MS]),
    "train.py": ("train.py", ["--state-mib", STATE_MIB, "--sleep-ms", SLEEP_MS]),
    "client-threads": ("client", ["--threads", 3, "--sleep-ms", SLEEP_MS]),
    # No pause: the client prints a line once the next iteration's kernels
    # (about 0.25 s of them on vgpu) are queued and then waits for them in
    # cuCtxSynchronize, where a checkpoint asked at that line finds it. (With
    # 0.1 s of kernels, a loaded CI host once ended the job before a
    # checkpoint left running had returned.)
    "client-inflight": ("client", ["--inflight", "--kernels", 16, "--rounds", 80]),
    "client-pinned": ("client", ["--pinned", "--sleep-ms", SLEEP_MS]),
    # With stream attributes on the workers' streams, copied to the side
    # streams: restored, the driver reports them as the program set them.
    "client-events": ("client", ["--events", "--stream-attributes", "--threads", 2, "--sleep-ms", SLEEP_MS]),
    # Copies of 4.8 MB of pageable memory each way: through the ring's two
    # transfer lanes (two chunks each), and the third thread's without one.
    "client-large-copies": ("client", ["--threads", 3, "--words", 1200000, "--sleep-ms", SLEEP_MS]),
    # A module loaded with JIT options and a linker state open across the
    # checkpoint: restored, both are as the program left them.
    "client-jit": ("client", ["--jit", "--sleep-ms", SLEEP_MS]),
}


@pytest.fixture(scope="module")
def criu(phos):
    """CRIU dumps and restores the processes: it needs root and a working install."""
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")
    doctor = subprocess.run([str(phos), "doctor", "--json"], capture_output=True, text=True, timeout=60)
    checks = json.loads(doctor.stdout).get("checks", []) if doctor.stdout else []
    if not any(c.get("name") == "criu" and c.get("ok") for c in checks):
        pytest.skip(f"phos doctor finds no usable CRIU: {doctor.stdout}{doctor.stderr}")


@pytest.fixture(scope="module")
def app_env(build_dir):
    """The jobs' environment: vgpu's libcuda.so.1 on the library path (train.py loads it by name)."""
    return job_env(build_dir)


def job_env(build_dir):
    """app_env outside pytest (tests/python/difftest.py)."""
    env = dict(os.environ)
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_STDERR", "PHOS_DRIVER"):
        env.pop(name, None)
    env["LD_LIBRARY_PATH"] = ":".join([str(build_dir / "vgpu"), env.get("LD_LIBRARY_PATH", "")])
    env["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    env["PHOS_BUILD_DIR"] = str(build_dir)
    return env


@pytest.fixture(scope="module")
def programs(build_dir):
    """What runs each kind of job, or the reason it cannot."""
    found = {}
    mlp = build_dir / "examples" / "mlp-train"
    found["mlp-train"] = [str(mlp)] if mlp.exists() else f"mlp-train was not built in {build_dir} (needs nvcc)"
    try:
        import cuda.core  # noqa: F401
        found["train.py"] = [sys.executable, str(TRAIN_PY)]
    except ImportError:
        found["train.py"] = "cuda.core is not installed"
    client = build_dir / "tests" / "shim" / "checkpoint_client"
    found["client"] = [str(client)] if client.exists() else f"checkpoint_client was not built in {build_dir}"
    return found


def command(programs, job):
    program, args = JOBS[job]
    base = programs[program]
    if isinstance(base, str):
        pytest.skip(base)
    return base + ["--iterations", str(STEPS)] + [str(a) for a in args]


def without_pause(cmd):
    """The same job without --sleep-ms: its output does not depend on it."""
    if "--sleep-ms" not in cmd:
        return cmd
    i = cmd.index("--sleep-ms")
    return cmd[:i] + cmd[i + 2:]


_references = {}


def reference(cmd, env, steps=STEPS):
    """The uninterrupted run's lines (`steps` iterations), directly on vgpu (memoized per command)."""
    key = tuple(without_pause(cmd))
    if key not in _references:
        r = subprocess.run(list(key), env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        out = r.stdout.splitlines()
        assert len(out) == steps + 1, r.stdout
        _references[key] = out
    return _references[key]


class Job:
    """A job under `phos run` against the test's daemon, its output in a file."""

    def __init__(self, phos, daemon, cmd, env, tmp_path, name="job", as_user=None):
        """`as_user`: (uid, gid) of another user to run it as (setpriv, with that user's groups)."""
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        prefix = []
        if as_user is not None:
            prefix = ["setpriv", f"--reuid={as_user[0]}", f"--regid={as_user[1]}", "--init-groups"]
        for f in (self.out, self.err):
            f.touch()
            if as_user is not None:
                os.chown(f, *as_user)
        with open(self.out, "w") as out, open(self.err, "w") as err:
            # A session of its own, as a job started by a supervisor has: CRIU
            # then restores it without --shell-job. setpriv and phos run exec:
            # the job has the pid of the process started here.
            # Another user's job works in its own directory (CRIU restores its
            # cwd as that user, who may not read the build's).
            self.proc = subprocess.Popen([*prefix, str(pathlib.Path(phos).resolve()), "run", "--runtime-dir",
                                          str(daemon.runtime_dir), "--", *cmd],
                                         cwd=tmp_path if as_user is not None else None,
                                         env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True)

    @property
    def pid(self):
        return self.proc.pid  # phos run execs the job: same pid

    def lines(self):
        return lines(self.out)

    def wait_line(self, k):
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"the job exited with {self.proc.returncode} after {len(self.lines())} lines:\n"
                            f"{self.err.read_text()}")
            return len(self.lines()) >= k
        wait_for(ready, TIMEOUT, f"line {k} of the job")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def jobs():
    started = []
    yield started
    for job in started:
        job.stop()


def checkpoint(phos, daemon, pid, image, *extra, prefix=()):
    """`prefix`: what runs phos where the daemon is (difftest.py: a test host's `testhosts exec`)."""
    r = subprocess.run([*prefix, str(phos), "checkpoint", "--pid", str(pid), "--image", str(image),
                        "--runtime-dir", str(daemon.runtime_dir), "--json", *extra],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"phos checkpoint failed ({r.returncode}): {r.stderr}\n{daemon.log()[-4000:]}"
    report = json.loads(r.stdout)
    manifest = json.loads((pathlib.Path(image) / "manifest.json").read_text())
    sessions = manifest["state"]["gpu"]["sessions"]
    assert sessions, f"the image has no GPU session (report: {report})"
    # A str message, which pytest does not shorten: difftest.py reads 'gpu_bytes' in it.
    assert report["gpu_bytes"] > 0, f"'gpu_bytes': {report['gpu_bytes']}, no device memory in the image: {report}"
    if report["left_running"]:
        # The stall's parts are consecutive: they add up to it.
        parts = report["stall"]
        total = parts["capture_seconds"] + parts["criu_seconds"] + parts["after_dump_seconds"]
        assert abs(total - report["gpu_stall_seconds"]) < 1e-3, report
    # The timeline's boundaries come in order, and place the stall's parts.
    timeline = report["timeline"]
    order = ["before_dump", "pause_asked", "paused", "captured", "dumped", "resumed", "saved", "finished"]
    reached = [timeline[k] for k in order if k in timeline]
    assert reached == sorted(reached) and reached[0] >= 0, report
    assert {"paused", "captured", "dumped", "finished"} <= timeline.keys(), report
    if report["left_running"]:
        assert abs(timeline["resumed"] - timeline["paused"] - report["gpu_stall_seconds"]) < 1e-3, report
    return report


def restore(phos, daemon, image, env, *extra, report_to=None):
    """A foreground restore: its stdout is the restored job's. `report_to`: a list that gets its report."""
    r = subprocess.run([str(phos), "restore", "--image", str(image), "--runtime-dir", str(daemon.runtime_dir),
                        "--json", *extra], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, f"phos restore exited with {r.returncode}: {r.stderr}\n{daemon.log()[-4000:]}"
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["gpu_session"] is True, report
    assert 0 < report["gpu_rebuilt_seconds"] <= report["running_seconds"], report
    # Its CPU memory was loaded while it ran, or the report says why not.
    eager = "--eager" in extra
    assert report["cpu_lazy"] is not eager or "cpu_eager_reason" in report, report
    if report["cpu_lazy"]:
        assert 0 < report["cpu_loaded_seconds"] <= report["total_seconds"], report
    if report_to is not None:
        report_to.append(report)
    return r.stdout.splitlines()


def after_checkpoint(ref, restored, at_least, at_most):
    """Checks that `restored` ends the reference run from a line between at_least and at_most."""
    start = len(ref) - len(restored)
    assert at_least <= start <= at_most, \
        f"the restored job began after line {start}, but the checkpoint was taken after line " \
        f"{at_least}..{at_most}:\n" + "\n".join(restored[:3])
    assert restored == ref[start:]


@pytest.mark.parametrize("at", [2, 6])
@pytest.mark.parametrize("job", list(JOBS))
def test_killed_and_restored_twice(criu, phos, phosd, app_env, programs, jobs, tmp_path, job, at):
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    running = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(running)
    running.wait_line(at)
    image = tmp_path / "image"
    report = checkpoint(phos, phosd, running.pid, image)
    assert report["left_running"] is False
    assert running.proc.wait(timeout=30) == -signal.SIGKILL
    before = running.lines()
    assert at <= len(before) < len(ref), "the job finished before the checkpoint"
    assert before == ref[:len(before)]

    first = restore(phos, phosd, image, app_env)
    assert before + first == ref
    second = restore(phos, phosd, image, app_env)
    assert second == first, "restoring the same image twice gave different lines"


def left_running(phos, phosd, cmd, env, ref, jobs, tmp_path, at=3):
    """`cmd` under phos run, checkpointed with --leave-running at line `at`; it must go on to the
    uninterrupted end. Returns the image and the lines printed when the checkpoint was asked and
    when it returned."""
    running = Job(phos, phosd, cmd, env, tmp_path)
    jobs.append(running)
    running.wait_line(at)
    asked = len(running.lines())
    image = tmp_path / "image"
    report = checkpoint(phos, phosd, running.pid, image, "--leave-running")
    done = len(running.lines())
    assert report["left_running"] is True
    assert done < len(ref), "the job finished before the checkpoint"
    assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
    assert running.lines() == ref, "the original, left running, did not finish as the uninterrupted run"
    return image, asked, done


@pytest.mark.parametrize("job", list(JOBS))
def test_left_running_and_restored(criu, phos, phosd, app_env, programs, jobs, tmp_path, job):
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    image, asked, done = left_running(phos, phosd, cmd, app_env, ref, jobs, tmp_path)
    # Its pid is free again: the image comes back as the same process.
    after_checkpoint(ref, restore(phos, phosd, image, app_env), asked, done)


def test_a_checkpoint_refuses_a_default_streams_attribute_and_the_job_runs_on(criu, phos, phosd, app_env, programs,
                                                                              jobs, tmp_path):
    """The engine saves created streams' attributes only: one set on the NULL stream, and attributes
    copied into the per-thread default stream, fail the checkpoint, naming them, and the job
    finishes as it would have."""
    cmd = command(programs, "client-pinned") + ["--default-stream-attribute"]
    running = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(running)
    running.wait_line(2)
    r = subprocess.run([str(phos), "checkpoint", "--pid", str(running.pid), "--image", str(tmp_path / "image"),
                        "--runtime-dir", str(phosd.runtime_dir)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0, r.stdout
    assert "attribute 3 set on a default stream, which the engine does not save (0x0)" in r.stderr, r.stderr
    assert "attributes copied into a default stream, which the engine does not save (0x2)" in r.stderr, r.stderr
    assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
    assert running.lines() == reference(cmd, app_env)


@pytest.mark.parametrize("job", [j for j in JOBS if j.startswith("client-")])
def test_client_prints_the_same_under_phos(phos, phosd, app_env, programs, jobs, tmp_path, job):
    """The test client's output on vgpu directly is its output under PhOS."""
    cmd = without_pause(command(programs, job))
    running = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(running)
    assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
    assert f": pid {running.pid} uid" in phosd.log(), "the client never had a PhOS session"
    assert running.lines() == reference(cmd, app_env)
    assert running.err.read_text() == ""


@pytest.mark.parametrize("state_mib", [0, 1, 5])
def test_state_mib_python_and_cpp_print_the_same(programs, app_env, state_mib):
    """--state-mib keeps the two examples' lines identical; 0 is the run without it."""
    outs = []
    for name in ("mlp-train", "train.py"):
        if isinstance(programs[name], str):
            pytest.skip(programs[name])
        cmd = programs[name] + ["--iterations", "6", "--state-mib", str(state_mib)]
        r = subprocess.run(cmd, env=app_env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1]
    plain = subprocess.run(programs["mlp-train"] + ["--iterations", "6"], env=app_env, capture_output=True,
                           text=True, timeout=TIMEOUT, check=True).stdout
    assert outs[0].splitlines()[:-1] == plain.splitlines()[:-1], "the state must not change the step lines"
    assert (outs[0] == plain) == (state_mib == 0), "the state must be in the checksum, and only when asked"


def test_state_tensors_do_not_change_the_output(programs, app_env):
    """mlp-train --state-tensors splits the state into allocations; its bytes, and so the lines, stay."""
    if isinstance(programs["mlp-train"], str):
        pytest.skip(programs["mlp-train"])
    outs = set()
    for tensors in (1, 2, 5):
        r = subprocess.run(programs["mlp-train"] + ["--iterations", "6", "--state-mib", "5", "--state-tensors",
                                                    str(tensors)], env=app_env, capture_output=True, text=True,
                           timeout=TIMEOUT, check=True)
        outs.add(r.stdout)
    assert len(outs) == 1
    r = subprocess.run(programs["mlp-train"] + ["--state-mib", "2", "--state-tensors", "3"], env=app_env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "--state-tensors 3 is more than --state-mib 2" in r.stderr, r.stderr


def test_the_next_checkpoint_removes_what_a_killed_worker_left(criu, phos, phosd, app_env, programs, jobs, tmp_path):
    """CRIU's action-script directory of a worker that was killed mid-checkpoint does not stay in /tmp."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    left = pathlib.Path(f"/tmp/phos-criu-action.{ended.pid}.killed")
    left.mkdir()
    (left / "action.sh").write_text("#!/bin/sh\n")
    an_hour_ago = time.time() - 3600
    os.utime(left, (an_hour_ago, an_hour_ago))
    job = Job(phos, phosd, command(programs, "client-threads"), app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    checkpoint(phos, phosd, job.pid, tmp_path / "image")
    assert not left.exists()


@pytest.mark.parametrize("mode", ["cow", "recopy"])
def test_a_checkpoint_never_takes_the_memory_of_a_nearly_full_device(criu, phos, start_phosd, app_env, programs,
                                                                      jobs, tmp_path, mode):
    """The job fills the device but for 2 MiB, which it allocates, uses and frees every iteration, while a
    checkpoint left running copies slowly. The protocol's own device memory (copy-on-write shadows, the twins'
    range tables and reports) must not make the job's allocation or launch fail: the job finishes as the
    uninterrupted run, and its image restores to the same end."""
    if isinstance(programs["client"], str):
        pytest.skip(programs["client"])
    memory = str(32 << 20)
    # The copy is slowed to take about 3 s, while the job's iterations take a
    # few tenths of a second (100 ms and a few kernels): its first iteration
    # after the cut writes its buffers before the copy reaches them (they are
    # last, in address order), and its scratch allocation then finds the
    # shadows holding the device's last bytes, even with CI's other tests
    # slowing its kernels. The job runs on well past the copy's end.
    daemon = start_phosd(PHOS_VGPU_MEMORY=memory, PHOS_VGPU_BANDWIDTH_SCALE=2500)
    cmd = programs["client"] + ["--iterations", "20", "--fill-device", "--words", "262144",
                                "--sleep-ms", "100"]
    ref = reference(cmd, dict(app_env, PHOS_VGPU_MEMORY=memory), steps=20)
    running = Job(phos, daemon, cmd, app_env, tmp_path)
    jobs.append(running)
    running.wait_line(2)
    asked = len(running.lines())
    image = tmp_path / "image"
    # The reserve is fixed at the two buffers' 2 MiB. phosd's default follows
    # the free memory at the cut, 2 MiB less when the cut lands while the job
    # holds its scratch (its slowed memset makes that window wide under load):
    # then one shadow fits, the other write waits for the copy, and the
    # scratch fits beside the one shadow, so no allocation needs its memory.
    reserve = ["--cow-reserve-mib", "2"] if mode == "cow" else []
    report = checkpoint(phos, daemon, running.pid, image, "--leave-running", "--mode", mode, *reserve)
    done = len(running.lines())
    assert running.proc.wait(timeout=TIMEOUT) == 0, running.err.read_text()
    assert running.lines() == ref
    assert done > asked, f"the job ran no iteration while the checkpoint copied: {report}"
    if mode == "cow":
        assert report["copy_on_write"]["given_back"] >= 1, \
            f"no allocation of the job needed the shadows' memory: {report}"
    # Restored by a daemon whose copies are not slowed: the restore is not what this tests.
    restorer = start_phosd(PHOS_VGPU_MEMORY=memory)
    after_checkpoint(ref, restore(phos, restorer, image, app_env), asked, done)


def test_a_job_under_phos_is_not_checkpointed_without_its_phosd(criu, phos, phosd, app_env, programs, jobs,
                                                                tmp_path):
    """Asked of a runtime directory where no phosd answers, the checkpoint of a job that runs libphos.so is
    refused (a CRIU image alone would restore it without its GPU memory); the job runs on."""
    job = Job(phos, phosd, command(programs, "client-threads"), app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    nobody = tmp_path / "no-phosd"
    nobody.mkdir()
    r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(tmp_path / "image"),
                        "--runtime-dir", str(nobody), "--leave-running"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 1, r.stdout
    assert f"pid {job.pid} runs under PhOS (libphos.so is loaded)" in r.stderr, r.stderr
    assert f"no phosd at {nobody}/phosd.sock" in r.stderr, r.stderr
    assert not (tmp_path / "image").exists()
    assert job.proc.wait(timeout=TIMEOUT) == 0, job.err.read_text()


def test_inspect_lists_each_module_and_the_globals_saved_with_it(criu, phos, phosd, app_env, programs, jobs,
                                                                 tmp_path):
    """phos inspect names every module of the image, and every global the checkpoint saved for it, as the
    manifest records them; and counts each kind of object. Streams and events the job destroyed are not
    saved (each of its 2 threads keeps 2 of each, and destroyed one of each). The client loads its module
    before any allocation, and the image says so (a restore repeats the order, docs/checkpoint.md)."""
    job = Job(phos, phosd, command(programs, "client-events"), app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    image = tmp_path / "image"
    checkpoint(phos, phosd, job.pid, image, "--leave-running")
    saved = json.loads((image / "manifest.json").read_text())["state"]["gpu"]["sessions"][0]
    assert any(m["globals"] for m in saved["modules"]), "the client's modules have globals"
    (module,) = saved["modules"]
    orders = [a["order"] for a in saved["allocations"]]
    assert 0 < module["order"] < min(orders) and len(set(orders)) == len(orders), (module["order"], orders)

    session = json.loads(subprocess.run([str(phos), "inspect", str(image), "--json"], capture_output=True,
                                        text=True, timeout=TIMEOUT, check=True).stdout)["sessions"][0]
    assert [(m["id"], sorted(g["name"] for g in m["globals"])) for m in session["module_list"]] == \
        [(m["id"], sorted(g["name"] for g in m["globals"])) for m in saved["modules"]]
    for kind in ("functions", "streams", "events"):
        assert session[kind] == len(saved[kind]) and session[kind] > 0, kind
    assert (len(saved["streams"]), len(saved["events"])) == (4, 4), (saved["streams"], saved["events"])

    text = subprocess.run([str(phos), "inspect", str(image)], capture_output=True, text=True, timeout=TIMEOUT,
                          check=True).stdout
    for m in saved["modules"]:
        line = next(x for x in text.splitlines() if f"{m['id']:#x}:" in x)
        assert f"{len(m['globals'])} globals saved" in line, line
        for g in m["globals"]:
            assert f"{g['name']} (" in line, line


@pytest.mark.hostile
def test_verify_and_restore_check_the_gpu_state_against_its_blobs(criu, phos, phosd, app_env, programs, jobs,
                                                                  tmp_path):
    """An allocation whose size disagrees with its blob, or that names no blob of the image: verify reports
    it (exit 1) and restore refuses it before anything runs."""
    job = Job(phos, phosd, command(programs, "client-threads"), app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    image = tmp_path / "image"
    checkpoint(phos, phosd, job.pid, image)
    job.proc.wait(timeout=TIMEOUT)
    manifest_path = image / "manifest.json"
    original = manifest_path.read_text()

    def damaged(change, expected):
        manifest = json.loads(original)
        allocation = manifest["state"]["gpu"]["sessions"][0]["allocations"][0]
        change(allocation)
        manifest_path.write_text(json.dumps(manifest))
        for argv in (["verify", str(image)], ["restore", "--image", str(image)]):
            r = subprocess.run([str(phos), *argv, "--runtime-dir", str(phosd.runtime_dir)] if argv[0] == "restore"
                               else [str(phos), *argv], env=app_env, capture_output=True, text=True, timeout=TIMEOUT)
            assert r.returncode == 1, (argv, r.stdout, r.stderr)
            assert "gpu.sessions[0].allocations[0]" in r.stderr and expected in r.stderr, r.stderr
            assert r.stdout == "" or "intact" not in r.stdout
        assert phosd.request({"op": "ps"})["sessions"] == []

    damaged(lambda a: a.update(bytes=a["bytes"] + 4096), "bytes, its blob")
    damaged(lambda a: a.update(blob="gpu/9/0x1"), "blob gpu/9/0x1 is not in the image")
    manifest_path.write_text(original)
    assert subprocess.run([str(phos), "verify", str(image)], capture_output=True).returncode == 0


CRIU_INSTALL = "/opt/phos/criu/bin/criu"


def criu_saying(tmp_path, name, script):
    """A CRIU that runs the real one, except where `script` (sh, with "$@") answers first."""
    wrapper = tmp_path / name
    wrapper.write_text(f"#!/bin/sh\n{script}\nexec {CRIU_INSTALL} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def lazy_pages_work():
    r = subprocess.run([CRIU_INSTALL, "check", "--feature", "uffd-noncoop"], capture_output=True, text=True,
                       timeout=60)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def ended_by_a_checkpoint(phos, phosd, cmd, env, jobs, tmp_path):
    """`cmd` under phos run, checkpointed (without --leave-running) after its third line, which
    ends it. Returns the image and how many lines it had printed."""
    running = Job(phos, phosd, cmd, env, tmp_path)
    jobs.append(running)
    running.wait_line(3)
    image = tmp_path / "image"
    checkpoint(phos, phosd, running.pid, image)
    assert running.proc.wait(timeout=TIMEOUT) != 0, "the checkpoint without --leave-running did not end the job"
    return image, len(running.lines())


def test_restore_loads_cpu_memory_while_the_job_runs(criu, phos, phosd, app_env, programs, jobs, tmp_path):
    """A concurrent restore lets the job run while CRIU's lazy-pages server brings its CPU memory back
    (64 MiB of host data here, one batch of it read per step, all of it in the final checksum), and
    says when all of it was loaded; --eager loads it before the job runs. Both end as the
    uninterrupted run does."""
    works, said = lazy_pages_work()
    if not works:
        pytest.skip(f"CRIU cannot restore memory on demand on this host: {said}")
    cmd = command(programs, "mlp-train") + ["--host-mib", "64"]
    ref = reference(cmd, app_env)
    image, done = ended_by_a_checkpoint(phos, phosd, cmd, app_env, jobs, tmp_path)
    reports = []
    after_checkpoint(ref, restore(phos, phosd, image, app_env, report_to=reports), done, done)
    after_checkpoint(ref, restore(phos, phosd, image, app_env, "--eager", report_to=reports), done, done)
    lazy, eager = reports
    assert lazy["cpu_lazy"] is True and "cpu_eager_reason" not in lazy, lazy
    assert eager["cpu_lazy"] is False and "cpu_loaded_seconds" not in eager, eager


@pytest.mark.parametrize("script,reason", [
    ('case "$*" in *uffd-noncoop*) echo "Error: UFFD is not supported (test)"; exit 1;; esac',
     "CRIU cannot load memory on demand here (criu check --feature uffd-noncoop: Error: UFFD is not supported "
     "(test))"),
    ('case "$1" in lazy-pages) echo "lazy-pages refused (test)" >&2; exit 3;; esac',
     "CRIU's lazy-pages server did not start (exit 3)"),
])
def test_a_restore_without_lazy_pages_loads_the_memory_first(criu, phos, phosd, app_env, programs, jobs, tmp_path,
                                                              script, reason):
    """Where CRIU cannot serve pages on demand (no userfaultfd, or its server does not start), a
    concurrent restore loads the CPU memory before the job runs, says why, and ends right."""
    cmd = command(programs, "mlp-train")
    ref = reference(cmd, app_env)
    image, done = ended_by_a_checkpoint(phos, phosd, cmd, app_env, jobs, tmp_path)
    env = dict(app_env, PHOS_CRIU=criu_saying(tmp_path, "criu", script))
    reports = []
    after_checkpoint(ref, restore(phos, phosd, image, env, report_to=reports), done, done)
    assert reports[0]["cpu_lazy"] is False, reports[0]
    assert reports[0]["cpu_eager_reason"].startswith(reason), reports[0]
