# SPDX-License-Identifier: Apache-2.0
"""Sessions as processes come and go: a killed client's session and memory are freed, a killed
phosd fails the client's calls quickly, and one client cannot touch another's device memory.

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
    session = daemon.session_of(client.pid)["session"]
    client.proc.stdin.write(b"stuck_sync\n")
    gate = SHM / f"phos-{daemon.process.pid}-{session}-pinned-1"
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


def test_killed_client_frees_its_session_and_memory(start_phosd, clients):
    # A small device, most of which the first client takes.
    daemon = start_phosd(PHOS_VGPU_MEMORY=256 * MIB)
    hog = clients(daemon)
    hog.ok(f"alloc {192 * MIB}")
    hog.ok(f"hostalloc {MIB}")
    session = daemon.session_of(hog.pid)
    assert session is not None
    assert (session["device_bytes"], session["pinned_bytes"]) == (192 * MIB, MIB)
    # The session's ring and its pinned memory are files of the daemon's.
    session_files = f"phos-{daemon.process.pid}-{session['session']}"
    assert len(list(SHM.glob(session_files + "*"))) == 2

    # While it lives, nobody else gets that memory: the limit is real.
    second = clients(daemon)
    result, _, _ = second.send(f"alloc {192 * MIB}")
    assert result == "CUDA_ERROR_OUT_OF_MEMORY"

    hog.kill()
    wait_for(lambda: daemon.session_of(hog.pid) is None, 5, "phos ps to drop the killed client's session")
    # The session is freed on a thread of its own (its last call may still be
    # running), right after ps stops listing it.
    wait_for(lambda: list(SHM.glob(session_files + "*")) == [], 5, "the session's ring and pinned files to go")
    # The killed session's context is destroyed right after, on the pool's thread.
    deadline = time.monotonic() + 5
    while (result := second.send(f"alloc {192 * MIB}")[0]) == "CUDA_ERROR_OUT_OF_MEMORY":
        assert time.monotonic() < deadline, "the killed client's memory was not released within 5 s"
        time.sleep(0.05)
    assert result == "CUDA_SUCCESS"
    assert daemon.session_of(second.pid)["device_bytes"] == 192 * MIB
    second.close()


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
    # next one removes those of daemons that are gone, and nobody else's.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = [SHM / f"phos-{gone.pid}-7", SHM / f"phos-{gone.pid}-7-pinned-1", SHM / f"phos-{gone.pid}-7-hostcalls"]
    alive = SHM / f"phos-{os.getpid()}-7"  # this test process stands for a daemon that is still running
    for path in stale + [alive]:
        path.write_bytes(b"x")
    try:
        daemon = start_phosd()
        assert [p for p in stale if p.exists()] == []
        assert alive.exists()
        assert f"removed /dev/shm/phos-{gone.pid}-7" in daemon.log()
    finally:
        for path in stale + [alive]:
            path.unlink(missing_ok=True)
