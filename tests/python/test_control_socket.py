# SPDX-License-Identifier: Apache-2.0
"""Hostile clients of phosd's control socket: every malformed or refused request
gets an answer (or a closed connection), and the daemon keeps serving others."""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from job_output import wait_for

pytestmark = pytest.mark.hostile

# The daemon gives a connection this long to send its line.
RECEIVE_TIMEOUT = 2.0


class ControlDaemon:
    """`phos daemon --pool 1` in a runtime directory of its own (no shim needed)."""

    def __init__(self, phos: pathlib.Path):
        # Under /tmp: a socket path has at most 107 bytes. Traversable by
        # everyone, so that another user's client can reach the socket (0666).
        self.runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-ctl-", dir="/tmp"))
        self.runtime_dir.chmod(0o755)
        self.socket_path = self.runtime_dir / "phosd.sock"
        self.log_path = self.runtime_dir / "phosd.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_") and k != "LD_PRELOAD"}
        env.update(PHOS_VGPU_BANDWIDTH_SCALE="0", PHOS_LOG="daemon:info")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [str(phos), "daemon", "--runtime-dir", str(self.runtime_dir), "--pool", "1"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def answering():
            if self.process.poll() is not None:
                pytest.fail(f"phos daemon exited with {self.process.returncode}:\n{self.log()}")
            return self.request({"op": "ping"}) is not None

        wait_for(answering, 30, f"phosd to answer on {self.socket_path}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def connect(self, timeout=10.0) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A blocking connect, as libphos.so's: with a full backlog it waits
        # instead of failing with EAGAIN.
        s.connect(str(self.socket_path))
        s.settimeout(timeout)
        return s

    def exchange(self, raw: bytes, timeout=10.0):
        """Sends raw bytes; the answer as JSON, or None if the daemon closed without one."""
        with self.connect(timeout) as s:
            try:
                s.sendall(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon stopped reading: the answer may still be there
            return read_answer(s)

    def request(self, message, timeout=10.0):
        try:
            return self.exchange((json.dumps(message) + "\n").encode(), timeout)
        except (FileNotFoundError, ConnectionRefusedError, socket.timeout):
            return None

    def assert_serving(self):
        assert self.process.poll() is None, f"phosd died:\n{self.log()}"
        pong = self.request({"op": "ping"})
        assert pong is not None and pong["ok"] is True, pong
        assert pong["daemon_pid"] == self.process.pid

    def stop(self):
        if self.process.poll() is None:
            self.request({"op": "stop"})
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def read_answer(s: socket.socket):
    answer = b""
    try:
        while not answer.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    except ConnectionResetError:
        pass
    return json.loads(answer) if answer.endswith(b"\n") else None


@pytest.fixture
def daemon(phos):
    d = ControlDaemon(phos)
    yield d
    try:
        # After every hostile exchange the daemon still answers and is alive.
        d.assert_serving()
    finally:
        d.stop()


def refused(answer, words):
    assert answer is not None, "no answer"
    assert answer["ok"] is False, answer
    assert words in answer["error"], answer


def test_not_json(daemon):
    refused(daemon.exchange(b"hello phosd\n"), "not valid JSON")
    refused(daemon.exchange(b"{\"op\": \"ping\"\n"), "not valid JSON")
    refused(daemon.exchange(b"\xff\xfe\x00garbage\n"), "not valid JSON")


def test_json_that_is_not_an_object(daemon):
    for raw in (b"[1, 2]\n", b"42\n", b"\"ping\"\n", b"null\n", b"true\n"):
        refused(daemon.exchange(raw), "JSON object")


def test_op_missing_or_not_a_string(daemon):
    for message in ({}, {"operation": "ping"}, {"op": 5}, {"op": None}, {"op": ["ping"]}, {"op": {"op": "ping"}}):
        refused(daemon.request(message), "string \"op\"")


def test_unknown_op(daemon):
    refused(daemon.request({"op": "frobnicate"}), "unknown op \"frobnicate\"")
    refused(daemon.request({"op": ""}), "unknown op")


def test_deeply_nested_json(daemon):
    # Under 1 MiB; a recursive parser or destructor would overflow the stack.
    depth = 400_000
    refused(daemon.exchange(b"[" * depth + b"]" * depth + b"\n"), "JSON object")
    refused(daemon.exchange(b"{\"op\": \"ping\", \"x\": " + b"[" * depth + b"\n"), "not valid JSON")


def test_attach_without_pid(daemon):
    refused(daemon.request({"op": "attach"}), "integer \"pid\"")


def test_attach_with_a_pid_that_is_not_an_integer(daemon):
    for pid in (str(os.getpid()), float(os.getpid()) + 0.5, None, [os.getpid()], True, 2 ** 70):
        refused(daemon.request({"op": "attach", "pid": pid}), "integer \"pid\"")


def test_attach_for_another_process_is_refused(daemon):
    # SO_PEERCRED names the connecting process; a client cannot ask for a
    # session serving (reading the memory of) someone else.
    for pid in (1, daemon.process.pid, os.getppid(), 0, -1):
        refused(daemon.request({"op": "attach", "pid": pid}), "is not the connecting process")
    # Nor by a number that only truncates to its own pid.
    refused(daemon.request({"op": "attach", "pid": 2 ** 32 + os.getpid()}), "is not the connecting process")
    assert daemon.request({"op": "ps"})["sessions"] == []


def test_attach_for_itself_is_served(daemon):
    answer = daemon.request({"op": "attach", "pid": os.getpid()})
    assert answer["ok"] is True, answer
    ring = pathlib.Path(answer["ring"])
    # Only the client's user may map its ring.
    assert ring.stat().st_mode & 0o777 == 0o600
    assert ring.stat().st_uid == os.getuid()


def test_malformed_migrate_requests_are_refused(daemon):
    refused(daemon.request({"op": "migrate", "pid": os.getpid()}), "string \"to\"")
    refused(daemon.request({"op": "migrate", "pid": os.getpid(), "to": 7}), "string \"to\"")
    refused(daemon.request({"op": "migrate", "pid": os.getpid(), "to": "h:1", "mode": 3}), "\"mode\" must be a string")
    refused(daemon.request({"op": "migrate", "pid": os.getpid(), "to": "h:1", "compress": []}),
            "\"compress\" must be a string")
    refused(daemon.request({"op": "migrate", "pid": os.getpid(), "to": "h:1", "key": "abc"}), "key in hex")
    # This daemon was started without --key.
    refused(daemon.request({"op": "migrate", "pid": os.getpid(), "to": "h:1"}), "no key to prove")
    # A valid request for a process without a session.
    answer = daemon.request({"op": "migrate", "pid": os.getpid(), "to": "h:1", "key": "ab" * 16})
    assert answer["ok"] is False and answer["code"] == "no-session", answer
    assert daemon.request({"op": "ping"})["ok"] is True


def test_line_longer_than_1_mib(daemon):
    answer = daemon.exchange(b"{\"op\": \"ping\", \"pad\": \"" + b"a" * (1 << 20) + b"\"}\n")
    if answer is not None:  # the daemon may close before the client has sent it all
        refused(answer, "at most 1 MiB")
    answer = daemon.exchange(b"x" * (3 << 20))
    if answer is not None:
        refused(answer, "at most 1 MiB")


def test_connection_without_newline_then_close(daemon):
    with daemon.connect() as s:
        s.sendall(b"{\"op\": \"ping\"}")
        s.shutdown(socket.SHUT_WR)
        refused(read_answer(s), "one line")


def time_ping(daemon):
    start = time.monotonic()
    pong = daemon.request({"op": "ping"}, timeout=30)
    return pong, time.monotonic() - start


def test_silent_connection_does_not_stall_others(daemon):
    with daemon.connect() as silent:
        time.sleep(0.2)  # the daemon is now waiting for its line
        pong, took = time_ping(daemon)
        assert pong is not None and pong["ok"] is True
        assert took < RECEIVE_TIMEOUT + 2.0, f"a ping waited {took:.1f}s behind a silent connection"
        # The silent client is told why it was dropped.
        refused(read_answer(silent), "one line")


def test_slow_sender_does_not_stall_others(daemon):
    # One byte now and then resets a per-read timeout; the daemon must bound
    # the whole line instead.
    stop = threading.Event()

    def dribble():
        with daemon.connect() as s:
            for b in b"{\"op\": \"ping\", \"pad\": \"" + b"a" * 100:
                if stop.is_set():
                    return
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    return
                time.sleep(0.5)

    slow = threading.Thread(target=dribble)
    slow.start()
    try:
        time.sleep(0.3)
        pong, took = time_ping(daemon)
        assert pong is not None and pong["ok"] is True
        assert took < RECEIVE_TIMEOUT + 2.0, f"a ping waited {took:.1f}s behind a slow sender"
    finally:
        stop.set()
        slow.join()


def test_many_connections_at_once(daemon):
    answers = [None] * 100
    barrier = threading.Barrier(len(answers))

    def ping(i):
        barrier.wait()
        answers[i] = daemon.request({"op": "ping"}, timeout=30)

    threads = [threading.Thread(target=ping, args=(i,)) for i in range(len(answers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a is not None and a["ok"] is True for a in answers), answers


def test_connections_closed_at_once(daemon):
    # Clients that connect and leave without a word.
    for _ in range(50):
        daemon.connect().close()
    daemon.assert_serving()


def as_nobody(daemon, message):
    """Sends `message` from a client running as uid/gid 65534."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run a client as another user")
    # The test's own interpreter may live where uid 65534 cannot read it.
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} for a client running as another user")
    code = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.settimeout(10)\n"
        f"s.connect({str(daemon.socket_path)!r})\n"
        f"s.sendall((json.dumps({message!r}) + '\\n').encode())\n"
        "print(s.makefile().readline(), end='')\n"
    )
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_stop_from_another_user_is_refused(daemon):
    refused(as_nobody(daemon, {"op": "stop"}), "uid 65534 may not stop this daemon")
    time.sleep(0.5)
    assert daemon.process.poll() is None


def test_ps_from_another_user_shows_none_of_ours(daemon):
    assert daemon.request({"op": "attach", "pid": os.getpid()})["ok"] is True
    assert len(daemon.request({"op": "ps"})["sessions"]) == 1
    answer = as_nobody(daemon, {"op": "ps"})
    assert answer["ok"] is True and answer["sessions"] == []


def test_attach_from_another_user_for_our_pid_is_refused(daemon):
    refused(as_nobody(daemon, {"op": "attach", "pid": os.getpid()}), "is not the connecting process")


def read_final(s: socket.socket, timeout=30.0):
    """The lines of a long operation: progress lines, then the final one (with "ok")."""
    s.settimeout(timeout)
    lines = s.makefile("rb")
    progress = []
    for raw in lines:
        answer = json.loads(raw)
        if "progress" in answer:
            progress.append(answer["progress"])
            continue
        return answer, progress
    return None, progress


def long_request(daemon, message, timeout=30.0):
    with daemon.connect(timeout) as s:
        s.sendall((json.dumps(message) + "\n").encode())
        return read_final(s, timeout)[0]


def test_checkpoint_of_a_pid_without_session(daemon):
    answer = long_request(daemon, {"op": "checkpoint", "pid": os.getpid(), "image": "/nonexistent/phos-image"})
    assert answer["ok"] is False and answer["code"] == "no-session", answer
    assert str(os.getpid()) in answer["error"]
    refused(daemon.request({"op": "checkpoint"}), "integer \"pid\"")
    refused(daemon.request({"op": "checkpoint", "pid": "1"}), "integer \"pid\"")


def test_checkpoint_is_answered_by_the_sessions_worker(daemon):
    attached = daemon.request({"op": "attach", "pid": os.getpid()})
    assert attached["ok"] is True, attached
    # No image: the engine refuses before it touches the process; its answer
    # reaches the client from the session's worker.
    answer = long_request(daemon, {"op": "checkpoint", "pid": os.getpid()})
    assert answer["ok"] is False, answer
    assert answer.get("code") != "no-session", answer
    assert answer["error"], answer
    assert "session 1: checkpoint" in daemon.log()
    # The session is still there and the daemon answers.
    sessions = daemon.request({"op": "ps"})["sessions"]
    assert [s["pid"] for s in sessions] == [os.getpid()]
    assert sessions[0]["worker_pid"] == attached["worker_pid"]


def test_checkpoint_with_an_unknown_peer_offload_scheduler_is_refused(daemon, tmp_path):
    assert daemon.request({"op": "attach", "pid": os.getpid()})["ok"] is True
    for value, says in (("fastest", 'no offload scheduler "fastest"'), (3, "peer_offload must be a string")):
        request = {"op": "checkpoint", "pid": os.getpid(), "image": str(tmp_path / "image"), "mode": "cow",
                   "leave_running": True, "peer_offload": value}
        # The session's worker may still run the checkpoint of an earlier test
        # (a loaded machine): it says "busy" until it is done.
        answers = []
        wait_for(lambda: answers.append(long_request(daemon, request)) or answers[-1].get("code") != "busy", 60,
                 "the session's earlier checkpoint to end")
        answer = answers[-1]
        assert answer["ok"] is False and answer["code"] == "invalid-argument", answer
        assert says in answer["error"], answer
    assert not (tmp_path / "image").exists()
    assert [s["pid"] for s in daemon.request({"op": "ps"})["sessions"]] == [os.getpid()]


def test_checkpoint_from_another_user_is_refused(daemon):
    assert daemon.request({"op": "attach", "pid": os.getpid()})["ok"] is True
    answer = as_nobody(daemon, {"op": "checkpoint", "pid": os.getpid(), "image": "/tmp/phos-nobody-image"})
    assert answer["ok"] is False and answer["code"] == "permission", answer
    assert "uid 65534 may not checkpoint" in answer["error"]


def spare_workers(daemon) -> set:
    return {w["pid"] for w in daemon.request({"op": "ping"})["workers"] if w["state"] == "spare"}


def test_restore_of_a_missing_image(daemon):
    refused(daemon.request({"op": "restore"}), "non-empty string \"image\"")
    refused(daemon.request({"op": "restore", "image": 5}), "non-empty string \"image\"")
    wait_for(lambda: len(spare_workers(daemon)) == 1, 10, "a spare worker")
    taken = spare_workers(daemon)
    answer = long_request(daemon, {"op": "restore", "image": "/nonexistent/phos-image"})
    assert answer["ok"] is False, answer
    assert answer["error"], answer
    # The worker that tried is replaced by a fresh one; attaches still work.
    wait_for(lambda: len(spare_workers(daemon) - taken) == 1, 10, "a fresh spare worker")
    assert daemon.request({"op": "attach", "pid": os.getpid()})["ok"] is True
    assert len(daemon.request({"op": "ps"})["sessions"]) == 1


def test_restore_with_eager_that_is_not_a_boolean(daemon):
    refused(daemon.request({"op": "restore", "image": "/nonexistent/phos-image", "eager": "yes"}),
            '"eager" must be true or false')


def test_attached_clients_get_workers_of_their_own(daemon):
    # A client (this test) and one in a child process: two sessions, two workers.
    first = daemon.request({"op": "attach", "pid": os.getpid()})
    code = (
        "import json, socket\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.settimeout(30)\n"
        f"s.connect({str(daemon.socket_path)!r})\n"
        "s.sendall((json.dumps({'op': 'attach', 'pid': __import__('os').getpid()}) + '\\n').encode())\n"
        "print(s.makefile().readline(), end='')\n"
        "import sys; sys.stdin.read()\n"
    )
    import sys
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        second = json.loads(child.stdout.readline())
        assert first["ok"] is True and second["ok"] is True, (first, second)
        assert first["worker_pid"] != second["worker_pid"]
        assert first["ring"] != second["ring"]
        assert {s["worker_pid"] for s in daemon.request({"op": "ps"})["sessions"]} == {first["worker_pid"],
                                                                                      second["worker_pid"]}
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    # The child's session ends with it, and its worker is reaped.
    wait_for(lambda: len(daemon.request({"op": "ps"})["sessions"]) == 1, 10, "the child's session to end")
    wait_for(lambda: not pathlib.Path(f"/proc/{second['worker_pid']}").exists(), 10, "the child's worker to be reaped")


def test_ping_reports_spare_workers(daemon):
    wait_for(lambda: len(spare_workers(daemon)) == 1, 10, "a spare worker")
    pong = daemon.request({"op": "ping"})
    assert pong["spare_target"] == 1
    assert pong["driver"] and pong["driver_version"] > 0
    assert [(p["device"], p["free"], p["target"]) for p in pong["pool"]] == [(0, 1, 1)]
    assert isinstance(pong["pool_misses"], int)


# ---- one daemon per runtime directory, never starved ----------------------


def daemons_serving(runtime_dir):
    """Pids of `phos daemon` processes (main processes) running for `runtime_dir`."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"daemon" in argv and str(runtime_dir).encode() in argv and b"--stop" not in argv:
            found.append(int(proc.name))
    # Workers are forks of the main process with the same command line: keep
    # the ones whose parent is not such a process.
    def parent(pid):
        try:
            return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return 0
    return sorted(p for p in found if parent(p) not in found)


def run_true(phos, daemon, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_") and k != "LD_PRELOAD"}
    return subprocess.run([str(phos), "run", "--runtime-dir", str(daemon.runtime_dir), "--", "true"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_hundreds_of_idle_and_slow_connections_starve_no_one(daemon, phos):
    """Idle connections (more than the daemon keeps) and clients dribbling a
    byte at a time: ping answers at once, phos run and a checkpoint request
    are served, and no second daemon appears."""
    idle = [daemon.connect(timeout=30) for _ in range(300)]
    stop = threading.Event()

    def dribble():
        with daemon.connect() as s:
            while not stop.is_set():
                try:
                    s.sendall(b" ")
                except OSError:
                    return
                time.sleep(0.2)

    slow = [threading.Thread(target=dribble) for _ in range(20)]
    for t in slow:
        t.start()
    try:
        time.sleep(0.5)
        for _ in range(5):
            pong, took = time_ping(daemon)
            assert pong is not None and pong["ok"] is True
            assert took < 1.0, f"a ping took {took:.1f}s beside 320 idle and slow connections"
        r = run_true(phos, daemon)
        assert r.returncode == 0, r.stderr
        assert daemon.request({"op": "attach", "pid": os.getpid()})["ok"] is True
        answer = long_request(daemon, {"op": "checkpoint", "pid": os.getpid()})
        assert answer["ok"] is False and answer.get("code") != "no-session", answer  # the worker answered
        assert daemons_serving(daemon.runtime_dir) == [daemon.process.pid]
    finally:
        stop.set()
        for t in slow:
            t.join()
        for s in idle:
            s.close()


def test_a_second_daemon_leaves_the_first_one_and_its_socket_alone(daemon, phos):
    inode = daemon.socket_path.stat().st_ino
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_") and k != "LD_PRELOAD"}
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", str(daemon.runtime_dir), "--pool", "1"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert f"a phosd (pid {daemon.process.pid}) already serves {daemon.runtime_dir}" in r.stderr, r.stderr
    assert daemon.socket_path.stat().st_ino == inode
    assert (daemon.runtime_dir / "phosd.lock").read_text().strip() == str(daemon.process.pid)
    daemon.assert_serving()


def test_phos_run_waits_for_a_busy_daemon_and_replaces_a_dead_one(phos):
    daemon = ControlDaemon(phos)
    try:
        # Stopped for longer than run's ping waits: busy, not dead.
        os.kill(daemon.process.pid, signal.SIGSTOP)
        threading.Timer(4.0, os.kill, (daemon.process.pid, signal.SIGCONT)).start()
        r = run_true(phos, daemon)
        assert r.returncode == 0, r.stderr
        assert daemons_serving(daemon.runtime_dir) == [daemon.process.pid]
        assert "already serves" not in daemon.log(), "phos run started a second daemon"
        daemon.assert_serving()
        # Dead: the kernel dropped its lock, phos run starts another.
        os.kill(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait()
        r = run_true(phos, daemon)
        assert r.returncode == 0, r.stderr
        pong = daemon.request({"op": "ping"})
        assert pong["ok"] is True and pong["daemon_pid"] != daemon.process.pid
        # The dead one's workers end on their own.
        wait_for(lambda: daemons_serving(daemon.runtime_dir) == [pong["daemon_pid"]], 15, "one daemon")
    finally:
        daemon.request({"op": "stop"})
        wait_for(lambda: daemons_serving(daemon.runtime_dir) == [], 15, "the daemons to stop")
        daemon.stop()
