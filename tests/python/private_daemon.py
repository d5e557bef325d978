# SPDX-License-Identifier: Apache-2.0
"""A phosd of the test's own: a fresh runtime directory, `phos daemon --pool 1`, stopped afterwards.

Tests get one through the `start_phosd` and `phosd` fixtures (conftest.py) and
run their programs with `daemon.client_env()`, which puts libphos.so in front
of the driver and points it at this daemon only.
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile

import pytest

from job_output import wait_for

START_TIMEOUT = 30
STOP_TIMEOUT = 10


class PrivateDaemon:
    def __init__(self, phos: pathlib.Path, build_dir: pathlib.Path, env: dict):
        self.phos = pathlib.Path(phos)
        self.libphos = pathlib.Path(build_dir) / "shim" / "libphos.so"
        if not self.libphos.exists():
            pytest.skip(f"libphos.so was not built in {build_dir} (it needs apigen)")
        # Under /tmp, not pytest's tmp_path: a socket path has at most 107 bytes.
        self.runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-test-", dir="/tmp"))
        self.log_path = self.runtime_dir / "phosd-foreground.log"
        self.env = dict(os.environ)
        # Nothing of the caller's PhOS setup leaks in: the shim must stay
        # silent on the application's stderr unless asked.
        for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_FILE", "PHOS_LOG_STDERR", "PHOS_DRIVER"):
            self.env.pop(name, None)
        self.env["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
        self.env.update({k: str(v) for k, v in env.items()})
        self.process = None
        self.known_workers = set()

    @property
    def socket_path(self) -> pathlib.Path:
        return self.runtime_dir / "phosd.sock"

    def start(self):
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [str(self.phos), "daemon", "--runtime-dir", str(self.runtime_dir), "--pool", "1"],
                env=dict(self.env, PHOS_LOG="daemon:info"), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def answering():
            if self.process.poll() is not None:
                pytest.fail(f"phos daemon exited with {self.process.returncode}:\n{self.log()}")
            return self.request({"op": "ping"}) is not None

        wait_for(answering, START_TIMEOUT, f"phosd to answer on {self.socket_path}")
        return self

    def request(self, message: dict, timeout: float = 5):
        """One control-socket exchange; None when no daemon answers within `timeout` seconds."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(str(self.socket_path))
                s.sendall((json.dumps(message) + "\n").encode())
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
        except (FileNotFoundError, ConnectionRefusedError, socket.timeout):
            return None
        return json.loads(answer) if answer else None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def client_env(self, **extra) -> dict:
        """The environment of a program run under this daemon (as `phos run` sets it up)."""
        env = dict(self.env)
        env["LD_PRELOAD"] = str(self.libphos)
        env["PHOS_RUNTIME_DIR"] = str(self.runtime_dir)
        # The test clients check that cu* calls resolve to this library.
        env["PHOS_TEST_SHIM"] = str(self.libphos)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def sessions(self) -> list:
        """`phos ps --json`, as a user would ask."""
        r = subprocess.run([str(self.phos), "ps", "--json", "--runtime-dir", str(self.runtime_dir)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def session_of(self, pid: int):
        return next((s for s in self.sessions() if s["pid"] == pid), None)

    def workers(self) -> list:
        """The daemon's worker processes: [{"pid", "state", "session"}] (ping)."""
        pong = self.request({"op": "ping"})
        assert pong is not None and pong["ok"] is True, pong
        self.known_workers.update(w["pid"] for w in pong["workers"])
        return pong["workers"]

    def kill(self):
        # Its workers die with it (PR_SET_PDEATHSIG); their files stay.
        self.workers()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            subprocess.run([str(self.phos), "daemon", "--stop", "--runtime-dir", str(self.runtime_dir)],
                           capture_output=True, timeout=STOP_TIMEOUT)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                pytest.fail(f"phosd did not stop within {STOP_TIMEOUT}s:\n{self.log()}")
        if self.process is not None:
            # A daemon that was killed could not remove its sessions' rings and
            # pinned memory (/dev/shm/phos-<worker pid>-<session>...).
            for pid in self.known_workers:
                for stale in pathlib.Path("/dev/shm").glob(f"phos-{pid}-*"):
                    stale.unlink(missing_ok=True)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
