# SPDX-License-Identifier: Apache-2.0
"""phos checkpoint / restore / inspect / verify on a running CPU process: the
restored run must print exactly what an uninterrupted run prints, and every
wrong input must be refused with a message that names it, leaving the process
running and no image behind."""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from job_output import lines, wait_for

ITERATIONS, MS = 60, 30

# No phosd answers here: these tests pin down the CPU-only path, whatever
# daemon the host runs (test_checkpoint_daemon.py covers the daemon's side).
NO_DAEMON = tempfile.mkdtemp(prefix="phos-no-daemon-")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child still answers kill(0); it is not running.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def run(phos, *args, env=None, **kwargs):
    env = dict(env or os.environ)
    env.setdefault("PHOS_RUNTIME_DIR", NO_DAEMON)
    return subprocess.run([str(phos), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env, **kwargs)


def report_of(r):
    """A foreground restore's --json report: the last line of its stderr."""
    return json.loads(r.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def counter(build_dir):
    return str(build_dir / "examples" / "smoke-counter")


@pytest.fixture(scope="module")
def reference(counter):
    return subprocess.run([counter, str(ITERATIONS), "0"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


@pytest.fixture
def job(counter, tmp_path):
    out = tmp_path / "job.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([counter, str(ITERATIONS), str(MS)], stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.DEVNULL, start_new_session=True)
    yield proc, out
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def no_leftovers(parent: pathlib.Path):
    return [p.name for p in parent.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("at", [2, 20])
def test_checkpoint_kill_restore_is_bit_identical(phos, job, reference, tmp_path, at):
    proc, out = job
    image = tmp_path / "image"
    wait_for(lambda: len(lines(out)) >= at, 30, f"iteration {at}")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", image, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["pid"] == proc.pid and report["cpu_files"] > 0 and report["cpu_bytes"] > 0
    assert proc.wait(timeout=10) == -signal.SIGKILL  # without --leave-running the job ends
    assert len(lines(out)) < ITERATIONS, "the job finished before the checkpoint"

    r = run(phos, "verify", image)
    assert r.returncode == 0, r.stderr
    assert "intact" in r.stdout
    info = json.loads(run(phos, "inspect", image, "--json").stdout)
    assert info["state"]["process"]["pid"] == proc.pid
    assert info["state"]["protocol"] == "stop-the-world"
    assert info["cpu"]["files"] == report["cpu_files"]

    before = lines(out)
    # In the foreground, phos restore is the job: its stdout, its exit code.
    for _ in range(2):  # the same image restores twice to the same result
        r = run(phos, "restore", "--image", image, "--json")
        assert r.returncode == 0, r.stderr
        report = report_of(r)
        assert report["pid"] == proc.pid and report["exit_code"] == 0  # CRIU restores the pid
        assert before + r.stdout.splitlines() == reference
        assert lines(out) == before, "the restored job writes to phos restore's stdout"
    assert no_leftovers(tmp_path) == []


def test_compressed_image_restores(phos, job, reference, tmp_path):
    proc, out = job
    image = tmp_path / "image"
    wait_for(lambda: len(lines(out)) >= 3, 30, "iteration 3")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", image, "--compress", "zstd")
    assert r.returncode == 0, r.stderr
    assert f"checkpointed pid {proc.pid}" in r.stdout
    proc.wait(timeout=10)
    r = run(phos, "restore", "--image", image)
    assert r.returncode == 0, r.stderr
    assert f"restored pid {proc.pid}" in r.stderr
    assert lines(out) + r.stdout.splitlines() == reference


def test_leave_running_keeps_the_job_correct(phos, job, reference, tmp_path):
    proc, out = job
    wait_for(lambda: len(lines(out)) >= 3, 30, "iteration 3")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", tmp_path / "image",
            "--leave-running")
    assert r.returncode == 0, r.stderr
    assert "still running" in r.stdout
    assert proc.wait(timeout=60) == 0
    assert lines(out) == reference
    assert run(phos, "verify", tmp_path / "image").returncode == 0


def test_checkpoint_of_missing_process_is_refused(phos, tmp_path):
    pid_max = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text())
    r = run(phos, "checkpoint", "--pid", pid_max, "--image", tmp_path / "image")
    assert r.returncode == 2
    assert f"no process with pid {pid_max}" in r.stderr
    assert not (tmp_path / "image").exists() and no_leftovers(tmp_path) == []


def test_checkpoint_into_existing_directory_is_refused(phos, job, tmp_path):
    proc, out = job
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "precious").write_text("keep me")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", tmp_path / "image")
    assert r.returncode == 2
    assert "already exists" in r.stderr
    assert alive(proc.pid)
    assert (tmp_path / "image" / "precious").read_text() == "keep me"


def test_failed_dump_leaves_the_process_running(phos, tmp_path):
    # CRIU refuses an established TCP connection unless asked to handle it.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    client = subprocess.Popen(
        [sys.executable, "-c",
         f"import socket,time; s=socket.create_connection(('127.0.0.1',{port})); "
         "print('ok', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    conn, _ = server.accept()
    try:
        assert client.stdout.readline().strip() == "ok"
        r = run(phos, "checkpoint", "--pid", client.pid, "--image", tmp_path / "image")
        assert r.returncode == 1
        assert "CRIU could not dump" in r.stderr
        assert "keeps running" in r.stderr
        assert alive(client.pid)
        assert not (tmp_path / "image").exists() and no_leftovers(tmp_path) == []
    finally:
        client.kill()
        client.wait()
        conn.close()
        server.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: too small for any process's image."""
    where = tmp_path / "small"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)])


def test_a_full_disk_is_named(phos, small_disk):
    script = ("import time\nb = bytearray(b'\\x01') * (16 << 20)\nprint('ready', flush=True)\n"
              "while True:\n    time.sleep(0.1)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = run(phos, "checkpoint", "--pid", proc.pid, "--image", small_disk / "image")
        assert r.returncode == 1
        assert "CRIU could not dump" in r.stderr
        assert "the file system of the image is full (No space left on device" in r.stderr, r.stderr
        assert "no error lines" not in r.stderr
        assert alive(proc.pid)
        assert list(small_disk.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


def test_restore_refuses_missing_and_damaged_images(phos, job, tmp_path):
    r = run(phos, "restore", "--image", tmp_path / "nothing")
    assert r.returncode == 2 and "no such image directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run(phos, "restore", "--image", tmp_path / "empty")
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr

    proc, out = job
    image = tmp_path / "image"
    wait_for(lambda: len(lines(out)) >= 2, 30, "iteration 2")
    assert run(phos, "checkpoint", "--pid", proc.pid, "--image", image).returncode == 0
    proc.wait(timeout=10)
    pages = sorted((image / "cpu").glob("pages-*.img"))[0]
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))

    r = run(phos, "restore", "--image", image)
    assert r.returncode == 1
    assert f"cpu/{pages.name}: does not match its checksum in the manifest" in r.stderr
    assert not alive(proc.pid), "nothing may run from a damaged image"

    r = run(phos, "verify", image)
    assert r.returncode == 1
    assert f"cpu/{pages.name}" in r.stderr and "damaged (1 problems)" in r.stderr
    v = json.loads(run(phos, "verify", image, "--json").stdout)
    assert v["ok"] is False and v["problems"][0]["where"] == f"cpu/{pages.name}"

    (image / "manifest.json").write_text("{ not json")
    r = run(phos, "inspect", image)
    assert r.returncode == 2 and "not valid JSON" in r.stderr
    r = run(phos, "verify", image)
    assert r.returncode == 1 and "not valid JSON" in r.stderr


def test_restore_while_the_process_still_runs_fails_with_crius_reason(phos, job, tmp_path):
    proc, out = job
    wait_for(lambda: len(lines(out)) >= 2, 30, "iteration 2")
    image = tmp_path / "image"
    assert run(phos, "checkpoint", "--pid", proc.pid, "--image", image,
               "--leave-running").returncode == 0
    r = run(phos, "restore", "--image", image)  # the pid is still taken
    assert r.returncode == 1
    assert "CRIU could not restore" in r.stderr
    assert alive(proc.pid)


@pytest.mark.parametrize("args, message", [
    (["checkpoint", "--image", "/tmp/x"], "--pid is required"),
    (["checkpoint", "--pid", "1"], "--image is required"),
    (["checkpoint", "--pid", "abc", "--image", "/tmp/x"], "abc"),
    (["checkpoint", "--pid", "0", "--image", "/tmp/phos-never"], "pid 0 is not a process id"),
    (["checkpoint", "--pid", "1", "--image", "/tmp/x", "--compress", "gzip"], "gzip"),
    (["restore"], "--image is required"),
    # The job's descriptors are opened before anything is restored.
    (["restore", "--image", "/tmp/phos-never", "--stdin", "/nonexistent/in"],
     "cannot open /nonexistent/in for the job's stdin"),
    (["restore", "--image", "/tmp/phos-never", "--stdout", "/nonexistent/out"],
     "cannot open /nonexistent/out for the job's stdout"),
    (["inspect"], "IMAGE is required"),
])
def test_bad_command_lines_are_refused(phos, args, message):
    r = run(phos, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


# --- Standard descriptors, exit codes, detaching ------------------------------

def checkpoint_left_running(phos, proc, out, image, at=3):
    wait_for(lambda: len(lines(out)) >= at, 30, f"iteration {at}")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", image, "--leave-running")
    assert r.returncode == 0, r.stderr
    return r


def test_restore_after_the_log_grew_attaches_stdout_to_phos(phos, job, reference, tmp_path):
    """The job goes on appending to its log after the checkpoint; CRIU alone
    refuses such a restore ("has bad size"); phos restore by default gives the
    job its own stdout instead."""
    proc, out = job
    image = tmp_path / "image"
    checkpoint_left_running(phos, proc, out, image)
    assert proc.wait(timeout=60) == 0
    assert lines(out) == reference  # the log grew to its end after the checkpoint
    state = json.loads(run(phos, "inspect", image, "--json").stdout)["state"]
    stdio = {d["fd"]: d for d in state["cpu"]["stdio"]}
    assert stdio[1]["kind"] == "file" and stdio[1]["inherit_key"] == str(out)[1:]
    assert stdio[0]["inherit_key"] == "dev/null"

    r = run(phos, "restore", "--image", image)
    assert r.returncode == 0, r.stderr
    restored = r.stdout.splitlines()
    assert restored and restored[-1].startswith("final")
    # It resumes where the checkpoint froze it: the tail of the reference run.
    assert len(restored) < len(reference)
    assert restored == reference[len(reference) - len(restored):]
    assert lines(out) == reference, "the old log is left alone"

    # As the descriptors were: CRIU's refusal, explained, and nothing runs.
    r = run(phos, "restore", "--image", image, "--keep-descriptors")
    assert r.returncode == 1
    assert f"File {str(out)[1:]} has bad size" in r.stderr
    assert "changed size since the checkpoint" in r.stderr
    assert "--keep-descriptors" in r.stderr
    # CRIU kills the half-restored task it forked; nothing stays.
    wait_for(lambda: not alive(proc.pid), 10, "the failed restore's task to go")


def test_keep_descriptors_and_detach_restore_into_the_old_log(phos, job, reference, tmp_path):
    proc, out = job
    image = tmp_path / "image"
    wait_for(lambda: len(lines(out)) >= 3, 30, "iteration 3")
    assert run(phos, "checkpoint", "--pid", proc.pid, "--image", image).returncode == 0
    proc.wait(timeout=10)
    r = run(phos, "restore", "--image", image, "--detach", "--keep-descriptors", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["pid"] == proc.pid and report["detached"] is True and "exit_code" not in report
    wait_for(lambda: any(l.startswith("final") for l in lines(out)), 60, "the restored job")
    assert lines(out) == reference


JOB_WITH_EXIT = ("import sys, time\n"
                 "for i in range(100):\n"
                 "    print('step', i, flush=True)\n"
                 "    time.sleep(0.03)\n"
                 "sys.exit(3)\n")


def python_job(tmp_path, script=JOB_WITH_EXIT):
    out = tmp_path / "py.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, out


def test_restore_exits_with_the_jobs_exit_code(phos, tmp_path):
    proc, out = python_job(tmp_path)
    try:
        wait_for(lambda: len(lines(out)) >= 5, 30, "step 5")
        image = tmp_path / "image"
        assert run(phos, "checkpoint", "--pid", proc.pid, "--image", image).returncode == 0
        proc.wait(timeout=10)
        r = run(phos, "restore", "--image", image)
        assert r.returncode == 3, r.stderr
        assert lines(out) + r.stdout.splitlines() == [f"step {i}" for i in range(100)]
        assert "exited with code 3" in r.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_signals_to_phos_restore_reach_the_job(phos, tmp_path):
    proc, out = python_job(tmp_path, "import time\nwhile True:\n    print('tick', flush=True)\n"
                                     "    time.sleep(0.05)\n")
    try:
        wait_for(lambda: len(lines(out)) >= 3, 30, "tick 3")
        image = tmp_path / "image"
        assert run(phos, "checkpoint", "--pid", proc.pid, "--image", image).returncode == 0
        proc.wait(timeout=10)
        env = dict(os.environ, PHOS_RUNTIME_DIR=NO_DAEMON)
        restore = subprocess.Popen([str(phos), "restore", "--image", str(image)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert restore.stdout.readline().strip() == "tick"  # the job runs again
        restore.send_signal(signal.SIGTERM)
        assert restore.wait(timeout=30) == 128 + signal.SIGTERM
        assert not alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_checkpoint_without_daemon_says_so(phos, job, tmp_path):
    proc, out = job
    wait_for(lambda: len(lines(out)) >= 2, 30, "iteration 2")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", tmp_path / "image", "--leave-running")
    assert r.returncode == 0, r.stderr
    assert "no PhOS session, CPU state only" in r.stdout
    assert f"no phosd at {NO_DAEMON}/phosd.sock" in r.stdout
    state = json.loads(run(phos, "inspect", tmp_path / "image", "--json").stdout)["state"]
    assert state["gpu"] == {"sessions": []}
    # This kernel has no soft-dirty bits: no pre-dump, and the image says why.
    check = subprocess.run(["/opt/phos/criu/bin/criu", "check", "--feature", "mem_dirty_track"],
                           capture_output=True)
    assert state["cpu"]["pre_dump"] is (check.returncode == 0)
    if check.returncode != 0:
        assert "mem_dirty_track" in state["cpu"]["pre_dump_reason"]
        r = run(phos, "inspect", tmp_path / "image")
        assert "pre-dump   no: the kernel does not track dirty pages" in r.stdout


# --- Damaged, foreign and partial images -------------------------------------

@pytest.fixture
def good_image(phos, counter, tmp_path):
    # A long job: on a loaded host it must not finish before the checkpoint.
    out = tmp_path / "long.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([counter, "100000", str(MS)], stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        image = tmp_path / "image"
        wait_for(lambda: len(lines(out)) >= 2, 30, "iteration 2")
        r = run(phos, "checkpoint", "--pid", proc.pid, "--image", image)
        assert r.returncode == 0, r.stderr
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert run(phos, "verify", image).returncode == 0
        yield proc.pid, image
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def edit_manifest(image, change):
    manifest = json.loads((image / "manifest.json").read_text())
    change(manifest)
    (image / "manifest.json").write_text(json.dumps(manifest))


def truncate_pages(image):
    pages = sorted((image / "cpu").glob("pages-*.img"))[0]
    data = pages.read_bytes()
    pages.write_bytes(data[: len(data) // 2])
    return f"cpu/{pages.name}"


def newer_version(image):
    edit_manifest(image, lambda m: m.update(version=99))
    return "newer than this PhOS reads"


def foreign_manifest(image):
    (image / "manifest.json").write_text(json.dumps({"name": "left-pad", "version": "1.3.0"}))
    return "not a PhOS manifest"


def no_manifest(image):
    (image / "manifest.json").unlink()
    return "not a PhOS image (manifest.json is missing)"


@pytest.mark.parametrize("damage, code", [
    (truncate_pages, 1),
    (newer_version, 2),
    (foreign_manifest, 2),
    (no_manifest, 2),
])
def test_verify_and_restore_name_the_problem_and_start_nothing(phos, good_image, damage, code):
    pid, image = good_image
    what = damage(image)
    v = run(phos, "verify", image)
    assert v.returncode == code, v.stderr
    assert what in v.stderr
    r = run(phos, "restore", "--image", image)
    assert r.returncode == code, r.stderr
    assert what in r.stderr
    assert "CRIU" not in r.stderr, "CRIU must not run on a refused image"
    assert not alive(pid)


def test_image_with_gpu_state_starts_phosd_which_refuses_a_bad_session(phos, good_image):
    pid, image = good_image
    # A session whose blobs are all there (what restore checks itself, as
    # verify does) but which lacks what only phosd reads.
    add_gpu_blob(phos, image, b"\0" * 8192)

    def bad_session(m):
        m["blobs"][-1].update(name="session/ring", kind="call-ring")
        m["state"]["gpu"].update(sessions=[{"id": 4, "ring": {"blob": "session/ring"}}])
    edit_manifest(image, bad_session)
    # Under /tmp: a socket path has at most 107 bytes.
    runtime = pathlib.Path(tempfile.mkdtemp(prefix="phos-test-", dir="/tmp"))
    try:
        r = run(phos, "restore", "--image", image, "--runtime-dir", runtime)
        # A GPU image needs phosd: restore starts one, as phos run does...
        assert (runtime / "phosd.sock").exists(), r.stderr
        # ...which refuses the session and names why; nothing runs.
        assert r.returncode == 1
        assert "phosd could not re-create the GPU session" in r.stderr
        assert '"pid" is missing' in r.stderr
        assert not alive(pid)
    finally:
        run(phos, "daemon", "--stop", "--runtime-dir", runtime)
        shutil.rmtree(runtime, ignore_errors=True)


def processes_naming(text):
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:
            pass
    return found


def test_killed_checkpoint_leaves_no_image_and_the_earlier_one_intact(phos, tmp_path):
    # 1.5 GiB of touched memory: CRIU needs a while to write it.
    script = ("import time\nb = bytearray(b'\\x01') * (1536 << 20)\nprint('ready', flush=True)\n"
              "while True:\n    time.sleep(0.1)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        first, second = tmp_path / "first", tmp_path / "second"
        assert run(phos, "checkpoint", "--pid", proc.pid, "--image", first,
                   "--leave-running").returncode == 0
        env = dict(os.environ, PHOS_RUNTIME_DIR=NO_DAEMON)
        # Not --leave-running: CRIU is then told to leave the job stopped, and
        # only a published image would let phos kill it.
        killed = subprocess.Popen([str(phos), "checkpoint", "--pid", str(proc.pid), "--image",
                                   str(second)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: no_leftovers(tmp_path) != [], 30, "the checkpoint's staging directory")
        wait_for(lambda: any((tmp_path / n / "cpu").glob("pages-*.img")
                             for n in no_leftovers(tmp_path)), 30, "CRIU writing pages")
        killed.kill()
        killed.wait()
        # CRIU, orphaned, either dies of SIGPIPE on its output to phos (the
        # kernel then detaches and resumes the job) or finishes and leaves the
        # job stopped; phos never publishes, and never kills the job.
        state = lambda: pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wait_for(lambda: not processes_naming(f".second.partial-{killed.pid}"), 60,
                 "the orphaned CRIU to finish")
        assert alive(proc.pid), "the job must survive a killed checkpoint"
        os.kill(proc.pid, signal.SIGCONT)  # if CRIU left it stopped
        wait_for(lambda: state() not in "tT", 10, "the job to run again")
        assert not second.exists()
        assert no_leftovers(tmp_path) == [f".second.partial-{killed.pid}"]
        for command in (["verify", second], ["restore", "--image", second]):
            r = run(phos, *command)
            assert r.returncode == 2
            assert "no such image directory" in r.stderr
            assert "interrupted checkpoint" in r.stderr
        assert run(phos, "verify", first).returncode == 0
        # The next checkpoint clears what the dead writer left.
        r = run(phos, "checkpoint", "--pid", proc.pid, "--image", second, "--leave-running")
        assert r.returncode == 0, r.stderr
        assert no_leftovers(tmp_path) == []
        assert run(phos, "verify", second).returncode == 0
    finally:
        proc.kill()
        proc.wait()


def add_gpu_blob(phos, image, data, chunk_bytes=4096):
    """Adds a blob as phosd would write one (device 0), with XXH3-64 checksums
    of its chunks (phos verify never prints the ones it computes: they are
    derived from file contents): the crafted image must verify intact first."""
    xxhash = pytest.importorskip("xxhash")
    (image / "blobs").mkdir(exist_ok=True)
    (image / "blobs" / "000000").write_bytes(data)
    count = (len(data) + chunk_bytes - 1) // chunk_bytes
    chunks = [data[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(count)]
    blob = {"name": "gpu/0/0x7f0000000000", "kind": "gpu-memory", "size": len(data),
            "chunk_bytes": chunk_bytes, "file": "blobs/000000",
            "attributes": {"device": 0, "address": "0x7f0000000000"},
            "chunks": [[i * chunk_bytes, len(c), "none", xxhash.xxh3_64_hexdigest(c)]
                       for i, c in enumerate(chunks)]}
    edit_manifest(image, lambda m: m["blobs"].append(blob))
    r = run(phos, "verify", image)
    assert r.returncode == 0, r.stderr
    assert "2 chunks in 1 blobs" in r.stdout


def test_gpu_blobs_inspected_per_device_and_damage_named(phos, good_image):
    pid, image = good_image
    data = bytes(range(256)) * 32  # 8 KiB: two chunks of 4 KiB
    add_gpu_blob(phos, image, data)
    info = json.loads(run(phos, "inspect", image, "--json").stdout)
    assert info["devices"] == {"0": {"bytes": len(data), "blobs": 1}}
    assert info["gpu_memory_bytes"] == len(data) and info["pinned_bytes"] == 0
    assert "device 0" in run(phos, "inspect", image).stdout

    # A flipped bit in chunk 1.
    blob = image / "blobs" / "000000"
    flipped = bytearray(data)
    flipped[5000] ^= 0x10
    blob.write_bytes(bytes(flipped))
    r = run(phos, "verify", image)
    assert r.returncode == 1
    assert "blob 'gpu/0/0x7f0000000000' chunk 1: " in r.stderr and "does not match" in r.stderr
    assert "chunk 0" not in r.stderr

    # Truncated: refused when opened, by verify and by restore alike.
    blob.write_bytes(data[:6000])
    for command in (["verify", image], ["restore", "--image", image]):
        r = run(phos, *command)
        assert r.returncode == 1, r.stderr
        assert "blob 'gpu/0/0x7f0000000000'" in r.stderr and "6000 bytes" in r.stderr
    assert not alive(pid)
