# SPDX-License-Identifier: Apache-2.0
"""Sessions as processes come and go: each session is served by a worker process of its own; a
killed client's session, worker and files are freed, a killed phosd or worker fails the client's
calls quickly, and one client cannot touch another's device memory.

The clients are session_client (tests/shim/clients), driven one command per line.
"""
import os
import pathlib
import select
import signal
import subprocess
import time

import pytest

from job_output import wait_for

ANSWER_TIMEOUT = 30
SHM = pathlib.Path("/dev/shm")
MIB = 1 << 20
# The shim notices a dead daemon at its next liveness check (every 100 ms);
# 1 s is the bound the design promises.
DEAD_DAEMON_BOUND_MS = 1000


class SessionClient:
    """A running session_client under a daemon: send a command, get its answer's fields."""

    def __init__(self, client, env):
        self.proc = subprocess.Popen([str(client)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self.buffer = b""
        ready = self.read_line()
        assert ready.startswith("ready "), ready + self.stderr()
        self.pid = int(ready.split()[1])
        assert self.pid == self.proc.pid

    def read_line(self) -> str:
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"session_client said nothing for {ANSWER_TIMEOUT}s (so far: {self.buffer!r})")
            readable, _, _ = select.select([self.proc.stdout], [], [], left)
            if readable:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    pytest.fail(f"session_client exited ({self.proc.wait()}): {self.buffer!r}{self.stderr()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def stderr(self) -> str:
        return self.proc.stderr.read().decode() if self.proc.poll() is not None else ""

    def send(self, command: str):
        """Returns (result, milliseconds, value or None)."""
        self.proc.stdin.write((command + "\n").encode())
        fields = self.read_line().split()
        assert fields[0] == command.split()[0], fields
        return fields[1], float(fields[2]), fields[3] if len(fields) > 3 else None

    def ok(self, command: str):
        result, _, value = self.send(command)
        assert result == "CUDA_SUCCESS", f"{command}: {result}"
        return value

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(b"exit\n")
            self.proc.stdin.close()
            assert self.proc.wait(timeout=ANSWER_TIMEOUT) == 0
        assert self.stderr() == ""

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=ANSWER_TIMEOUT)


@pytest.fixture
def clients(shim_clients):
    started = []

    def start(daemon):
        client = SessionClient(shim_clients / "session_client", daemon.client_env())
        started.append(client)
        return client

    yield start
    for client in started:
        if client.proc.poll() is None:
            client.kill()


def start_stuck_sync(daemon, client):
    """Has the client block in cuCtxSynchronize behind a kernel whose gate never opens.

    Returns the pinned-memory file that holds the gate: writing 1 at its start
    lets the kernel end.
    """
    session = daemon.session_of(client.pid)
    client.proc.stdin.write(b"stuck_sync\n")
    # Session files are named after the worker that serves the session.
    gate = SHM / f"phos-{session['worker_pid']}-{session['session']}-pinned-1"
    wait_for(gate.exists, 10, f"the gate's pinned memory {gate}")
    # The launch and the synchronize follow at once; the answer must not.
    assert select.select([client.proc.stdout], [], [], 0.3)[0] == [], "cuCtxSynchronize returned too early"
    return gate


def open_gate(gate):
    try:
        with open(gate, "r+b") as f:
            f.write((1).to_bytes(4, "little"))
    except FileNotFoundError:
        pass  # the session, and the kernel with it, is gone already


def gone(pid: int) -> bool:
    """The process exited and was reaped (a zombie still has its /proc entry)."""
    return not pathlib.Path(f"/proc/{pid}").exists()


def parent_of(pid: int) -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_killed_client_frees_its_session_worker_and_files(start_phosd, clients):
    daemon = start_phosd(PHOS_VGPU_MEMORY=256 * MIB)
    hog = clients(daemon)
    hog.ok(f"alloc {192 * MIB}")
    hog.ok(f"hostalloc {MIB}")
    session = daemon.session_of(hog.pid)
    assert session is not None
    assert (session["device_bytes"], session["pinned_bytes"]) == (192 * MIB, MIB)
    # The session's ring and its pinned memory are files of its worker.
    worker = session["worker_pid"]
    session_files = f"phos-{worker}-{session['session']}"
    assert len(list(SHM.glob(session_files + "*"))) == 2

    hog.kill()
    wait_for(lambda: daemon.session_of(hog.pid) is None, 5, "phos ps to drop the killed client's session")
    # Its worker stops the session and exits; phosd reaps it (no zombie)
    # and removes whatever files it left.
    wait_for(lambda: gone(worker), 10, f"worker {worker} to exit and be reaped")
    wait_for(lambda: list(SHM.glob(f"phos-{worker}-*")) == [], 5, "the session's ring and pinned files to go")
    # The next client gets another worker, with the whole device. (Device
    # memory is a worker's: vgpu's limit is per process; a GPU's is shared
    # by every process, and the driver frees a dead worker's memory.)
    second = clients(daemon)
    second.ok(f"alloc {192 * MIB}")
    assert daemon.session_of(second.pid)["worker_pid"] != worker
    second.close()


def test_each_session_is_served_by_a_worker_of_its_own(phosd, clients):
    first, second = clients(phosd), clients(phosd)
    a, b = phosd.session_of(first.pid), phosd.session_of(second.pid)
    assert a["worker_pid"] != b["worker_pid"]
    for s in (a, b):
        assert s["worker_pid"] != phosd.process.pid
        assert parent_of(s["worker_pid"]) == phosd.process.pid
    serving = {w["pid"]: w for w in phosd.workers() if w["state"] == "serving"}
    assert serving.keys() == {a["worker_pid"], b["worker_pid"]}
    assert serving[a["worker_pid"]]["session"] == a["session"]
    first.close()
    second.close()
    # Clients that exit normally leave no worker, zombie or file behind.
    for s in (a, b):
        wait_for(lambda: gone(s["worker_pid"]), 10, f"worker {s['worker_pid']} to exit and be reaped")
        assert list(SHM.glob(f"phos-{s['worker_pid']}-*")) == []
    assert phosd.sessions() == []


def spare_workers(daemon) -> set:
    return {w["pid"] for w in daemon.workers() if w["state"] == "spare"}


def test_a_spare_worker_replaces_the_one_an_attach_took(phosd, clients):
    # The fixture's daemon keeps one spare worker (--pool 1).
    wait_for(lambda: len(spare_workers(phosd)) == 1, 10, "a spare worker")
    before = spare_workers(phosd)
    client = clients(phosd)
    assert phosd.session_of(client.pid)["worker_pid"] in before
    wait_for(lambda: len(spare_workers(phosd) - before) == 1, 10, "a new spare worker")
    pong = phosd.request({"op": "ping"})
    assert (pong["spare_workers"], pong["spare_target"], pong["sessions"]) == (1, 1, 1)
    # The spare's pre-created contexts: one per device (--pool-contexts 1).
    assert [(p["free"], p["target"]) for p in pong["pool"]] == [(1, 1)]
    client.close()


def test_killed_worker_fails_its_client_and_spares_the_others(phosd, clients):
    victim, other = clients(phosd), clients(phosd)
    kept = other.ok(f"alloc {MIB}")
    other.ok(f"set {kept} 7 {MIB}")
    victim.ok(f"alloc {MIB}")
    session = phosd.session_of(victim.pid)
    os.kill(session["worker_pid"], signal.SIGKILL)
    result, ms, _ = victim.send("sync")
    assert result == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    assert ms < DEAD_DAEMON_BOUND_MS
    wait_for(lambda: phosd.session_of(victim.pid) is None, 5, "phos ps to drop the lost session")
    wait_for(lambda: gone(session["worker_pid"]), 5, "the killed worker to be reaped")
    wait_for(lambda: list(SHM.glob(f"phos-{session['worker_pid']}-*")) == [], 5, "the lost session's files to go")
    # The other session and the daemon carry on.
    assert other.ok(f"read {kept} 16") == "0x7"
    other.ok("sync")
    third = clients(phosd)
    third.ok(f"alloc {MIB}")
    assert phosd.process.poll() is None
    victim.close()
    other.close()
    third.close()


def test_client_killed_while_its_kernel_runs_is_freed(phosd, clients):
    client = clients(phosd)
    gate = start_stuck_sync(phosd, client)
    client.kill()
    try:
        deadline = time.monotonic() + 5
        answer = None
        while time.monotonic() < deadline:
            answer = phosd.request({"op": "ps"}, timeout=1)
            if answer is not None and answer["sessions"] == []:
                break
            time.sleep(0.05)
        assert answer is not None and answer["sessions"] == [], f"after 5 s phosd answers {answer}"
    finally:
        # Lets the kernel end, so that the daemon can stop.
        open_gate(gate)


def test_killed_daemon_fails_the_next_call_quickly(phosd, clients):
    client = clients(phosd)
    buffer = client.ok(f"alloc {MIB}")
    client.ok(f"set {buffer} 7 {MIB}")
    phosd.kill()
    result, ms, _ = client.send("sync")
    assert result != "CUDA_SUCCESS"
    assert result == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    assert ms < DEAD_DAEMON_BOUND_MS
    # And so does every later call.
    result, ms, _ = client.send(f"read {buffer} 16")
    assert result == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    assert ms < DEAD_DAEMON_BOUND_MS
    result, ms, _ = client.send(f"alloc {MIB}")
    assert result == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    assert ms < DEAD_DAEMON_BOUND_MS
    client.close()


def test_killed_daemon_fails_a_call_waiting_on_it(phosd, clients):
    client = clients(phosd)
    start_stuck_sync(phosd, client)
    killed = time.monotonic()
    phosd.kill()
    fields = client.read_line().split()
    elapsed_ms = (time.monotonic() - killed) * 1000
    assert fields[:2] == ["stuck_sync", "CUDA_ERROR_DEVICE_UNAVAILABLE"]
    assert elapsed_ms < DEAD_DAEMON_BOUND_MS
    client.close()


def test_daemon_answers_while_a_client_waits_on_its_kernel(phosd, clients):
    client = clients(phosd)
    gate = start_stuck_sync(phosd, client)
    try:
        answer = phosd.request({"op": "ps"}, timeout=2)
        assert answer is not None, "phosd did not answer ps within 2 s"
        assert [s["launches"] for s in answer["sessions"]] == [1]
    finally:
        open_gate(gate)
        assert client.read_line().split()[:2] == ["stuck_sync", "CUDA_SUCCESS"]
        client.close()


def test_a_client_cannot_touch_another_clients_memory(phosd, clients):
    size = 4096
    owner = clients(phosd)
    # Each worker's driver hands out addresses from the same start: the
    # owner's secret is its second buffer, so that it is not also the
    # intruder's first.
    owner.ok(f"alloc {MIB}")
    secret = owner.ok(f"alloc {size}")
    owner.ok(f"set {secret} 5a {size}")
    assert owner.ok(f"read {secret} {size}") == "0x5a"

    # The intruder learns the address (here from the test, as it could from a
    # file or a pipe) and has memory of its own at a different address.
    intruder = clients(phosd)
    own = intruder.ok(f"alloc {size}")
    assert own != secret
    intruder.ok(f"set {own} 0 {size}")
    for command in [f"read {secret} {size}", f"write {secret} ff {size}", f"set {secret} ff {size}",
                    f"free {secret}", f"read {secret} 1", f"set {secret} 0 1",
                    f"dtod {own} {secret} {size}", f"dtod {secret} {own} {size}",
                    f"memcpy {own} {secret} {size}", f"memcpy {secret} {own} {size}"]:
        result, _, _ = intruder.send(command)
        assert result == "CUDA_ERROR_INVALID_VALUE", command
    # Nothing of the owner's arrived in the intruder's own buffer either.
    assert intruder.ok(f"read {own} {size}") == "0x0"
    # A pointer one byte into the owner's allocation is no better.
    inside = hex(int(secret, 16) + 1)
    assert intruder.send(f"read {inside} 8")[0] == "CUDA_ERROR_INVALID_VALUE"

    # A kernel is not checked call by call; the device faults it. The launch
    # is posted (success), the fault is reported at the synchronize.
    launched, _, synced = intruder.send(f"copy_kernel {secret} {own} {size}")
    assert launched == "CUDA_SUCCESS"
    assert synced == "CUDA_ERROR_ILLEGAL_ADDRESS"

    # A second intruder tries to write with a kernel.
    writer = clients(phosd)
    source = writer.ok(f"alloc {size}")
    writer.ok(f"set {source} ff {size}")
    launched, _, synced = writer.send(f"copy_kernel {source} {secret} {size}")
    assert launched == "CUDA_SUCCESS"
    assert synced == "CUDA_ERROR_ILLEGAL_ADDRESS"

    # The owner's data is untouched and its session unharmed.
    assert owner.ok(f"read {secret} {size}") == "0x5a"
    owner.ok("sync")
    owner.ok(f"free {secret}")
    owner.close()


def test_files_of_a_killed_daemon_are_removed_at_the_next_start(start_phosd):
    # A daemon that was SIGKILLed leaves its rings and pinned files behind; the
    # next one removes those of daemons that are gone, and nobody else's. Another
    # test's daemon (pytest-xdist runs two at once) may start in between and
    # remove them first: then the files are made again, for another daemon.
    alive = SHM / f"phos-{os.getpid()}-7"  # this test process stands for a daemon that is still running
    for attempt in range(5):
        gone = subprocess.Popen(["true"])
        gone.wait()
        stale = [SHM / f"phos-{gone.pid}-7", SHM / f"phos-{gone.pid}-7-pinned-1", SHM / f"phos-{gone.pid}-7-hostcalls"]
        for path in stale + [alive]:
            path.write_bytes(b"x")
        try:
            daemon = start_phosd()
            assert [p for p in stale if p.exists()] == []
            assert alive.exists()
            if f"removed /dev/shm/phos-{gone.pid}-7" in daemon.log():
                return
        finally:
            for path in stale + [alive]:
                path.unlink(missing_ok=True)
    pytest.fail(f"five daemons in a row did not say they removed a gone daemon's files:\n{daemon.log()}")


@pytest.mark.hostile
@pytest.mark.parametrize("second_op", ["checkpoint", "migrate"])
def test_a_second_checkpoint_of_a_session_is_refused_while_one_runs(phosd, clients, tmp_path, second_op):
    """A second checkpoint, or a migration, of a session whose checkpoint runs is refused as busy."""
    import json
    import socket
    client = clients(phosd)
    gate = start_stuck_sync(phosd, client)
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        first.connect(str(phosd.socket_path))
        request = {"op": "checkpoint", "pid": client.pid, "image": str(tmp_path / "image"), "leave_running": True}
        first.sendall((json.dumps(request) + "\n").encode())
        # The engine waits for the session's call (the stuck kernel) before
        # it saves device memory; a final answer now means it never got there.
        time.sleep(0.5)
        if select.select([first], [], [], 0)[0]:
            answer = first.makefile().readline()
            if "progress" not in answer:
                pytest.skip(f"the checkpoint ended before it waited for the session: {answer}")
        if second_op == "checkpoint":
            second = phosd.request(dict(request, image=str(tmp_path / "other")), timeout=10)
        else:  # a valid migration request (its target never answers: it must not be tried)
            second = phosd.request({"op": "migrate", "pid": client.pid, "to": "127.0.0.1:9", "key": "ab" * 16},
                                   timeout=10)
        assert second is not None and second["ok"] is False, second
        assert second["code"] == "busy", second
        assert "checkpoint" in second["error"], second
        assert not (tmp_path / "other").exists()
    finally:
        open_gate(gate)
        first.settimeout(120)
        for line in first.makefile():
            if "progress" not in json.loads(line):
                break
        first.close()
    assert client.read_line().split()[:2] == ["stuck_sync", "CUDA_SUCCESS"]
    client.close()
