# SPDX-License-Identifier: Apache-2.0
"""phos checkpoint / restore talking to phosd over its control stream, against a
scripted stand-in for phosd (the daemon's side of "checkpoint" and "restore" is
tested with the daemon): what the CLI asks, how it shows progress, when it falls
back to a CPU-only checkpoint, and how it hands a restored pid to the daemon."""
import json
import os
import pathlib
import pty
import select
import socket
import subprocess
import tempfile
import threading

import pytest

from job_output import lines, wait_for

ITERATIONS, MS = 100, 30


class ScriptedDaemon:
    """Listens on RUNTIME/phosd.sock; `answer(request, conn_file)` writes the lines."""

    def __init__(self, answer):
        self.runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-fake-", dir="/tmp"))
        self.answer = answer
        self.requests = []
        self.received = []  # lines the client wrote after its request
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.runtime_dir / "phosd.sock"))
        self.server.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, conn.makefile("rw") as f:
                request = json.loads(f.readline())
                self.requests.append(request)
                self.answer(request, f, self)

    def send(self, f, message):
        f.write(json.dumps(message) + "\n")
        f.flush()

    def env(self):
        return dict(os.environ, PHOS_RUNTIME_DIR=str(self.runtime_dir))

    def close(self):
        self.server.close()


@pytest.fixture
def scripted_daemon():
    made = []

    def make(answer):
        d = ScriptedDaemon(answer)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def job(build_dir, tmp_path):
    out = tmp_path / "job.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([str(build_dir / "examples" / "smoke-counter"), str(ITERATIONS),
                                 str(MS)], stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: len(lines(out)) >= 3, 30, "iteration 3")
    yield proc, out
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def reference(build_dir):
    return subprocess.run([str(build_dir / "examples" / "smoke-counter"), str(ITERATIONS), "0"],
                          capture_output=True, text=True, check=True).stdout.splitlines()


def run(phos, daemon, *args):
    return subprocess.run([str(phos), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=daemon.env())


def test_no_session_falls_back_to_a_cpu_checkpoint(phos, scripted_daemon, job, tmp_path):
    proc, out = job

    def answer(request, f, d):
        d.send(f, {"ok": False, "code": "no-session",
                   "error": f"pid {request['pid']} has no PhOS session in this phosd"})

    daemon = scripted_daemon(answer)
    image = tmp_path / "sub" / ".." / "image"
    r = run(phos, daemon, "checkpoint", "--pid", proc.pid, "--image", image, "--leave-running",
            "--compress", "lz4", "--json")
    assert r.returncode == 0, r.stderr
    assert daemon.requests == [{"op": "checkpoint", "pid": proc.pid,
                                "image": str(tmp_path / "image"), "leave_running": True,
                                "compress": "lz4", "mode": "cow"}]
    report = json.loads(r.stdout)
    assert report["gpu_session"] is False and "has no PhOS session" in report["gpu_note"]
    assert report["cpu_files"] > 0
    assert run(phos, daemon, "verify", tmp_path / "image").returncode == 0
    assert proc.wait(timeout=60) == 0


REPORT = {"pid": 4242, "image": "/x/image", "cpu_bytes": 1 << 20, "cpu_files": 12,
          "gpu_bytes": 64 << 20, "freeze_seconds": 0.25, "total_seconds": 1.5,
          "left_running": False}


def progress_then_report(request, f, d):
    for done in range(0, 65, 16):
        d.send(f, {"progress": {"phase": "gpu-memory", "bytes": done << 20, "total": 64 << 20}})
    d.send(f, {"ok": True, "report": dict(REPORT, pid=request["pid"])})


def test_daemon_report_is_printed_with_the_same_keys(phos, scripted_daemon, tmp_path):
    daemon = scripted_daemon(progress_then_report)
    r = run(phos, daemon, "checkpoint", "--pid", 4242, "--image", tmp_path / "image", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    for key, value in REPORT.items():
        assert report[key] == value
    assert r.stderr == "", "no progress when stderr is not a terminal"
    r = run(phos, daemon, "checkpoint", "--pid", 4242, "--image", tmp_path / "image")
    assert r.returncode == 0, r.stderr
    assert "checkpointed pid 4242 into /x/image" in r.stdout and "64.0 MiB from phosd" in r.stdout


def run_on_terminal(phos, daemon, *args):
    """Runs phos with stderr on a pseudo-terminal; returns (exit code, what it drew)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(phos), *map(str, args)], env=daemon.env(),
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return proc.wait(timeout=30), drawn.decode(errors="replace")


def test_progress_is_drawn_on_a_terminal_only_without_json(phos, scripted_daemon, tmp_path):
    daemon = scripted_daemon(progress_then_report)
    code, drawn = run_on_terminal(phos, daemon, "checkpoint", "--pid", 4242, "--image",
                                  tmp_path / "image")
    assert code == 0
    assert "gpu-memory" in drawn and "/ 64.0 MiB" in drawn
    assert "\r\x1b[K" in drawn  # redrawn in place, and erased at the end
    code, drawn = run_on_terminal(phos, daemon, "checkpoint", "--pid", 4242, "--image",
                                  tmp_path / "image", "--json")
    assert code == 0 and drawn == ""


@pytest.mark.parametrize("code, exit_code", [("already-exists", 2), ("invalid-argument", 2),
                                             ("permission", 1), ("internal", 1)])
def test_daemon_errors_are_printed(phos, scripted_daemon, tmp_path, code, exit_code):
    daemon = scripted_daemon(lambda request, f, d: d.send(
        f, {"ok": False, "code": code, "error": f"refused because {code}"}))
    r = run(phos, daemon, "checkpoint", "--pid", 4242, "--image", tmp_path / "image")
    assert r.returncode == exit_code
    assert f"refused because {code}" in r.stderr
    assert not (tmp_path / "image").exists()


def test_daemon_dying_mid_checkpoint_is_an_error(phos, scripted_daemon, tmp_path):
    daemon = scripted_daemon(lambda request, f, d: d.send(
        f, {"progress": {"phase": "gpu-memory", "bytes": 0, "total": 1}}))
    r = run(phos, daemon, "checkpoint", "--pid", 4242, "--image", tmp_path / "image")
    assert r.returncode == 1
    assert "phosd stopped answering" in r.stderr


def make_gpu_image(phos, proc, image, *extra):
    """A CPU image whose manifest says it has a GPU session (as phosd would write it)."""
    env = dict(os.environ, PHOS_RUNTIME_DIR=tempfile.mkdtemp(prefix="phos-no-daemon-"))
    r = subprocess.run([str(phos), "checkpoint", "--pid", str(proc.pid), "--image", str(image),
                        *extra], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((image / "manifest.json").read_text())
    # Its blobs are there, as restore checks before it asks phosd (checkGpuState).
    xxhash = pytest.importorskip("xxhash")
    (image / "blobs").mkdir(exist_ok=True)
    allocations = []
    for i, (name, kind) in enumerate([("gpu/0/0x7f0000000000", "gpu-memory"), ("gpu/0/0x7f0000001000", "gpu-memory"),
                                      ("session/ring", "call-ring")]):
        data = bytes([i + 1]) * 4096
        (image / "blobs" / f"{i:06d}").write_bytes(data)
        manifest["blobs"].append({"name": name, "kind": kind, "size": len(data), "chunk_bytes": 4 << 20,
                                  "file": f"blobs/{i:06d}", "attributes": {},
                                  "chunks": [[0, len(data), "none", xxhash.xxh3_64_hexdigest(data)]]})
        if kind == "gpu-memory":
            allocations.append({"address": int(name.split("/")[-1], 16), "bytes": len(data), "blob": name})
    manifest["state"]["gpu"]["sessions"] = [{"id": 9, "allocations": allocations, "streams": [],
                                             "ring": {"blob": "session/ring"}}]
    (image / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def gpu_image(phos, job, tmp_path):
    proc, out = job
    make_gpu_image(phos, proc, tmp_path / "image")
    proc.wait(timeout=10)
    return proc.pid, out, tmp_path / "image"


def test_gpu_restore_recreates_the_session_then_hands_it_the_pid(phos, scripted_daemon,
                                                                 gpu_image, reference):
    pid, out, image = gpu_image

    def answer(request, f, d):
        d.send(f, {"progress": {"phase": "gpu-memory", "bytes": 1, "total": 1}})
        d.send(f, {"ok": True, "session": 9, "pid": 777})
        adopt = f.readline()
        d.received.append(json.loads(adopt))
        d.send(f, {"ok": True})

    daemon = scripted_daemon(answer)
    r = run(phos, daemon, "restore", "--image", image, "--json")
    assert r.returncode == 0, r.stderr
    assert daemon.requests == [{"op": "restore", "image": str(image), "eager": False}]
    assert daemon.received == [{"adopt": pid}]
    assert lines(out) + r.stdout.splitlines() == reference
    assert json.loads(r.stderr.strip().splitlines()[-1])["gpu_session"] is True
    info = json.loads(run(phos, daemon, "inspect", image, "--json").stdout)
    assert info["sessions"] == [{"id": 9, "allocations": 2, "streams": 0}]


def test_gpu_restore_refused_by_the_daemon_runs_nothing(phos, scripted_daemon, gpu_image):
    pid, out, image = gpu_image
    daemon = scripted_daemon(lambda request, f, d: d.send(
        f, {"ok": False, "error": "no free context in the pool"}))
    r = run(phos, daemon, "restore", "--image", image)
    assert r.returncode == 1
    assert "phosd could not re-create the GPU session: no free context in the pool" in r.stderr
    assert not pathlib.Path(f"/proc/{pid}").exists()


def test_failed_criu_restore_abandons_the_session(phos, scripted_daemon, job, tmp_path):
    proc, out = job
    image = tmp_path / "image"
    make_gpu_image(phos, proc, image, "--leave-running")  # its pid stays taken: CRIU fails
    closed = threading.Event()

    def answer(request, f, d):
        d.send(f, {"ok": True, "session": 9, "pid": 777})
        d.received.append(f.readline())  # "" once the client closes without adopting
        closed.set()

    daemon = scripted_daemon(answer)
    r = run(phos, daemon, "restore", "--image", image)
    assert r.returncode == 1
    assert "CRIU could not restore" in r.stderr and "pid is taken" in r.stderr
    assert closed.wait(10) and daemon.received == [""]
    assert proc.poll() is None, "the original keeps running"
