# SPDX-License-Identifier: Apache-2.0
"""phos checkpoint / restore / inspect / verify on a running CPU process: the
restored run must print exactly what an uninterrupted run prints, and every
wrong input must be refused with a message that names it, leaving the process
running and no image behind."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from job_output import lines, wait_for

ITERATIONS, MS = 30, 30




def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child still answers kill(0); it is not running.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def run(phos, *args, **kwargs):
    return subprocess.run([str(phos), *map(str, args)], capture_output=True, text=True,
                          timeout=120, **kwargs)


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

    r = run(phos, "restore", "--image", image, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == proc.pid  # CRIU restores the pid
    wait_for(lambda: any(l.startswith("final") for l in lines(out)), 60, "the restored job")
    assert lines(out) == reference
    assert no_leftovers(tmp_path) == []


def test_compressed_image_restores(phos, job, reference, tmp_path):
    proc, out = job
    image = tmp_path / "image"
    wait_for(lambda: len(lines(out)) >= 3, 30, "iteration 3")
    r = run(phos, "checkpoint", "--pid", proc.pid, "--image", image, "--compress", "zstd")
    assert r.returncode == 0, r.stderr
    assert f"checkpointed pid {proc.pid}" in r.stdout
    proc.wait(timeout=10)
    assert run(phos, "restore", "--image", image).returncode == 0
    wait_for(lambda: any(l.startswith("final") for l in lines(out)), 60, "the restored job")
    assert lines(out) == reference


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
    assert r.returncode == 2
    assert f"cpu/{pages.name}: checksum" in r.stderr
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
    (["inspect"], "IMAGE is required"),
])
def test_bad_command_lines_are_refused(phos, args, message):
    r = run(phos, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
