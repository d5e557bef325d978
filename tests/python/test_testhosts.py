# SPDX-License-Identifier: Apache-2.0
"""scripts/testhosts: two test hosts on this machine, each with its own network,
pid and mount namespaces; they reach each other over TCP and share nothing else
but the filesystem."""
import os
import pathlib
import shutil
import subprocess
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTHOSTS = ROOT / "scripts" / "testhosts"
STATE = pathlib.Path("/run/phos-testhosts")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root"),
    pytest.mark.skipif(shutil.which("tini") is None, reason="tini is not installed (scripts/setup)"),
    # The default set of test hosts is one per machine: its users run one at a time
    # (scripts/test runs the suite with pytest-xdist --dist loadgroup).
    pytest.mark.xdist_group("testhosts"),
]


def run_testhosts(*args, **kw):
    kw.setdefault("timeout", 30)
    return subprocess.run([str(TESTHOSTS), *map(str, args)], capture_output=True, text=True, **kw)


def on(host, *cmd, **kw):
    return run_testhosts("exec", host, "--", *cmd, **kw)


def phos_netns() -> list:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("phos-")]


def pids_seen_in(host) -> list:
    r = on(host, "ls", "/proc")
    assert r.returncode == 0, r.stderr
    return sorted(int(name) for name in r.stdout.split() if name.isdigit())


@pytest.fixture(scope="module")
def hosts():
    r = run_testhosts("up", 2)
    if r.returncode != 0:
        pytest.fail(f"testhosts up 2 failed ({r.returncode}): {r.stderr}")
    assert r.stdout.splitlines() == ["h1 10.231.0.1", "h2 10.231.0.2"]
    yield {"h1": "10.231.0.1", "h2": "10.231.0.2"}
    run_testhosts("down")


SERVER = """
import socket, sys
s = socket.socket()
s.bind(("10.231.0.2", 7399))
s.listen(1)
print("listening", flush=True)
conn, peer = s.accept()
data = conn.recv(100)
conn.sendall(b"h2 got " + data)
conn.close()
print(peer[0], data.decode())
"""

CLIENT = """
import socket
c = socket.create_connection(("10.231.0.2", 7399), timeout=5)
c.sendall(b"hello")
print(c.recv(100).decode())
"""


def test_hosts_reach_each_other_over_tcp(hosts):
    server = subprocess.Popen([str(TESTHOSTS), "exec", "h2", "--", "python3", "-c", SERVER],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening", server.stderr.read()
        client = on("h1", "python3", "-c", CLIENT)
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "h2 got hello"
        out, err = server.communicate(timeout=10)
        assert server.returncode == 0, err
        # The server saw the connection come from h1's own address.
        assert out.strip() == "10.231.0.1 hello"
    finally:
        server.kill()


def test_dev_shm_and_run_phos_are_private_per_host(hosts):
    name = f"testhosts-{uuid.uuid4().hex}"
    r = on("h1", "sh", "-c", f"echo one > /dev/shm/{name} && echo one > /run/phos/{name}")
    assert r.returncode == 0, r.stderr
    assert on("h1", "cat", f"/dev/shm/{name}", f"/run/phos/{name}").stdout == "one\none\n"
    for directory in ("/dev/shm", "/run/phos"):
        r = on("h2", "ls", "-A", directory)
        assert r.returncode == 0, r.stderr
        assert name not in r.stdout.split()
        assert not (pathlib.Path(directory) / name).exists(), f"{directory}/{name} leaked into the root namespace"
    # The rest of the filesystem is shared.
    shared = pathlib.Path("/tmp") / name
    try:
        assert on("h1", "sh", "-c", f"echo shared > {shared}").returncode == 0
        assert on("h2", "cat", str(shared)).stdout == "shared\n"
    finally:
        shared.unlink(missing_ok=True)


def test_pids_are_per_host_and_hosts_do_not_see_each_other(hosts):
    r1, r2 = on("h1", "sh", "-c", "echo $$"), on("h2", "sh", "-c", "echo $$")
    assert 100000 <= int(r1.stdout) < 200000, r1.stdout + r1.stderr
    assert 200000 <= int(r2.stdout) < 300000, r2.stdout + r2.stderr
    sleeper = subprocess.Popen([str(TESTHOSTS), "exec", "h1", "--", "sleep", "47"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            seen = on("h1", "ps", "-eo", "pid=,args=").stdout
            mine = [line.split()[0] for line in seen.splitlines() if line.split()[1:] == ["sleep", "47"]]
            if mine:
                break
        assert len(mine) == 1, seen
        pid = int(mine[0])
        assert 100000 <= pid < 200000
        assert "sleep 47" not in on("h2", "ps", "-eo", "args=").stdout
        in_h2 = pids_seen_in("h2")
        assert pid not in in_h2
        # h2's /proc holds its pid 1 (tini) and its own pids only.
        assert in_h2[0] == 1 and all(200000 <= p < 300000 for p in in_h2[1:]), in_h2
        assert on("h2", "cat", "/proc/1/comm").stdout == "tini\n"
    finally:
        if mine:
            on("h1", "kill", mine[0])
        sleeper.kill()
        sleeper.wait()


def test_exec_passes_stdio_status_and_cwd(hosts):
    r = on("h2", "sh", "-c", 'cat; pwd; echo "$PHOS_RUNTIME_DIR"; exit 3', input="to h2\n", cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["to h2", str(ROOT), "/run/phos"]


def test_exec_of_an_unknown_host_names_it(hosts):
    r = on("h7", "true")
    assert r.returncode == 2
    assert "'h7'" in r.stderr and "h1 h2" in r.stderr, r.stderr


def test_list_and_up_while_up_is_refused(hosts):
    r = run_testhosts("up", 1)
    assert r.returncode == 1
    assert "down" in r.stderr, r.stderr
    # The refusal left the running hosts alone.
    listed = run_testhosts("list")
    assert listed.returncode == 0 and listed.stdout.splitlines() == ["h1 10.231.0.1", "h2 10.231.0.2"]
    assert on("h1", "true").returncode == 0


def test_down_twice_then_up_again(hosts):
    pid1s = [int((STATE / h / "pid").read_text()) for h in ("h1", "h2")]
    for _ in range(2):
        r = run_testhosts("down")
        assert r.returncode == 0, r.stderr
        assert phos_netns() == []
        assert not STATE.exists()
        assert run_testhosts("list").stdout == ""
    for pid in pid1s:
        stat = pathlib.Path(f"/proc/{pid}/stat")
        # Gone, or at most a zombie about to be reaped by init.
        assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"), pid
    # Bring the module's hosts back for whatever runs after this test.
    r = run_testhosts("up", 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["h1 10.231.0.1", "h2 10.231.0.2"]
