# SPDX-License-Identifier: Apache-2.0
"""phos migrate between two test hosts (scripts/testhosts: network, pid and mount
namespaces of their own, each with its phosd listening with a shared key).

Each job runs under `phos run` on h1 and writes its lines into a file of the
shared filesystem; it is migrated mid-run and must finish, wherever it ends up,
with exactly the lines of the uninterrupted run directly on vgpu. The daemons'
copies are slowed (PHOS_VGPU_BANDWIDTH_SCALE) so that the pre-copy rounds span
several of the job's iterations, and a target daemon can be killed while the
GPU state streams to it.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest

from job_output import lines, wait_for
from test_checkpoint_phos import app_env, criu, programs, without_pause  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTHOSTS = ROOT / "scripts" / "testhosts"
STATE = pathlib.Path("/run/phos-testhosts")
TIMEOUT = 120
STEPS = 16
ADDRESS = {"h1": "10.231.0.1", "h2": "10.231.0.2"}

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and CRIU need root"),
    pytest.mark.skipif(shutil.which("tini") is None, reason="tini is not installed (scripts/setup)"),
    # The default set of test hosts is one per machine: its users run one at a time
    # (scripts/test runs the suite with pytest-xdist --dist loadgroup).
    pytest.mark.xdist_group("testhosts"),
]


def run_testhosts(*args, env=None, timeout=60):
    return subprocess.run([str(TESTHOSTS), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def on(host, *cmd, env=None, timeout=TIMEOUT):
    return run_testhosts("exec", host, "--", *cmd, env=env, timeout=timeout)


_references = {}


def reference(cmd, env):
    """The uninterrupted run's lines, directly on vgpu (memoized per command)."""
    key = tuple(map(str, without_pause(cmd)))
    if key not in _references:
        r = subprocess.run(list(key), env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        _references[key] = r.stdout.splitlines()
    return _references[key]


def daemon_log(host):
    path = STATE / host / "phosd.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def hosts(criu, phos, app_env):  # noqa: F811
    """h1 and h2, each with a phosd whose copies take 300 times their modelled time."""
    env = dict(app_env, PHOS_VGPU_BANDWIDTH_SCALE="300")
    r = run_testhosts("up", 2, "--daemon", phos, env=env)
    if r.returncode != 0:
        run_testhosts("down")
        pytest.fail(f"testhosts up 2 --daemon failed ({r.returncode}): {r.stderr}")
    yield env
    run_testhosts("down")


def restart_daemon(host, phos, env):
    """Starts h's phosd again (after a test killed it), as testhosts up does."""
    log = STATE / host / "phosd.log"
    key = STATE / "key"
    on(host, "sh", "-c", f"setsid -f {phos} daemon --runtime-dir /run/phos --listen {ADDRESS[host]}:7070 "
                         f"--key {key} >> {log} 2>&1 < /dev/null", env=env)
    wait_for(lambda: on(host, str(phos), "ps", timeout=10).returncode == 0, 20, f"phosd on {host}")


class HostJob:
    """A job under `phos run` started on a host in a session of its own (so
    that CRIU dumps it without --shell-job), its stdio opened inside the host.
    `setsid -f` hands it to the host's init, which reaps it once it ends."""

    def __init__(self, host, phos, cmd, env, tmp_path, name="job"):
        self.out = tmp_path / f"{name}.out"
        self.cmd = cmd
        shell = " ".join(map(str, cmd))
        r = on(host, "sh", "-c", f"exec setsid -f {phos} run -- {shell} > {self.out} 2> {tmp_path / name}.err "
                                 "< /dev/null", env=env)
        assert r.returncode == 0, r.stderr
        self.pid = None
        wait_for(lambda: self._find(host, phos), 30, f"the job's session on {host}")

    def _find(self, host, phos):
        r = on(host, str(phos), "ps", "--json", timeout=10)
        if r.returncode != 0:
            return False
        for s in json.loads(r.stdout):
            if s["command"].endswith(" ".join(map(str, self.cmd[1:]))):
                self.pid = s["pid"]
        return self.pid is not None

    def lines(self):
        return lines(self.out)

    def wait_line(self, n):
        wait_for(lambda: len(self.lines()) >= n, TIMEOUT, f"line {n} of the job")

    def wait_end(self, total):
        wait_for(lambda: len(self.lines()) >= total, TIMEOUT, "the end of the job")
        return self.lines()


def sessions_on(host, phos):
    r = on(host, str(phos), "ps", "--json", timeout=10)
    assert r.returncode == 0, r.stderr
    return [s["pid"] for s in json.loads(r.stdout)]


def migrate(phos, pid, source, target, *extra, env=None):
    r = on(source, str(phos), "migrate", "--pid", pid, "--to", ADDRESS[target], "--json", *extra, env=env)
    assert r.returncode == 0, f"phos migrate failed ({r.returncode}): {r.stderr}\n{daemon_log(source)[-3000:]}" \
                              f"\n{daemon_log(target)[-3000:]}"
    return json.loads(r.stdout)


def mlp(programs, steps=STEPS, state_mib=16):  # noqa: F811
    base = programs["mlp-train"]
    if isinstance(base, str):
        pytest.skip(base)
    return base + ["--iterations", str(steps), "--state-mib", str(state_mib), "--sleep-ms", "150"]


def test_example_migrates_mid_run_and_finishes_bit_identical(hosts, phos, programs, tmp_path):
    cmd = mlp(programs)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(3)
    report = migrate(phos, job.pid, "h1", "h2")
    m = report["migration"]
    assert report["protocol"] == "soft-recopy", report
    # Device memory went over while the job ran; at the end, chunks the job did
    # not write since were not sent again.
    assert report["recopy"]["rounds"] >= 1 and m["precopy_chunks"] >= report["recopy"]["round_chunks"][0], report
    assert 0 < m["cached_chunks"] < m["image_chunks"], report
    # What the job wrote after the last round (its weights, at least) went
    # after "go", while it ran on h2 (post-copy).
    assert m["late_chunks"] >= 1 and m["cached_chunks"] + m["late_chunks"] <= m["image_chunks"], report
    assert m["target_report"]["pid"] == job.pid, report
    assert 0 < m["downtime_seconds"] < report["total_seconds"], report
    # CRIU's dump sent the job's memory pages to the page server on h2.
    assert m["page_server_bytes"] > report["cpu_bytes"], report
    assert job.pid in sessions_on("h2", phos) or len(job.lines()) == len(ref)
    assert job.pid not in sessions_on("h1", phos)
    assert job.wait_end(len(ref)) == ref


def test_plain_criu_with_phos_plugin_restores_the_job_on_another_host(hosts, phos, programs, build_dir, tmp_path):
    """CRIU's own dump in h1 and restore in h2, with PhOS's plugin (docs/containers.md): no phos command."""
    cmd = mlp(programs)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(3)
    criu = os.environ.get("PHOS_CRIU", "/opt/phos/criu/bin/criu")
    plugin = build_dir / "criu" / "plugin"
    images = tmp_path / "images"
    images.mkdir()
    r = on("h1", criu, "dump", "-t", job.pid, "-D", images, "-o", "dump.log", "--libdir", plugin)
    assert r.returncode == 0, f"{r.stderr}\n{(images / 'dump.log').read_text()[-3000:]}\n{daemon_log('h1')[-3000:]}"
    assert (images / f"phos-{job.pid}" / "manifest.json").exists()
    wait_for(lambda: job.pid not in sessions_on("h1", phos), 20, "h1's phosd to end the dumped job's session")
    r = on("h2", criu, "restore", "-D", images, "-o", "restore.log", "--libdir", plugin, "--restore-detached")
    assert r.returncode == 0, f"{r.stderr}\n{(images / 'restore.log').read_text()[-3000:]}\n" \
                              f"{daemon_log('h2')[-3000:]}"
    assert f"pid {job.pid} adopted" in daemon_log("h2")
    assert job.wait_end(len(ref)) == ref


def test_stop_the_world_migration_for_comparison(hosts, phos, programs, tmp_path):
    cmd = mlp(programs)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(3)
    report = migrate(phos, job.pid, "h1", "h2", "--mode", "stop")
    m = report["migration"]
    assert report["protocol"] == "stop-the-world", report
    assert m["precopy_chunks"] == 0 and m["cached_chunks"] == 0, report
    assert m["target_report"]["eager"] is True, report
    assert job.wait_end(len(ref)) == ref


def test_migrated_there_and_back(hosts, phos, programs, tmp_path):
    cmd = mlp(programs, steps=24)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(3)
    migrate(phos, job.pid, "h1", "h2")
    at = len(job.lines())
    job.wait_line(at + 2)  # it runs on h2
    back = migrate(phos, job.pid, "h2", "h1")
    assert back["migration"]["target_report"]["pid"] == job.pid
    assert job.wait_end(len(ref)) == ref
    assert job.pid not in sessions_on("h2", phos)


def test_multithreaded_client_migrates(hosts, phos, programs, tmp_path):
    base = programs["client"]
    if isinstance(base, str):
        pytest.skip(base)
    cmd = base + ["--iterations", str(STEPS), "--threads", "3", "--sleep-ms", "150"]
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(3)
    report = migrate(phos, job.pid, "h1", "h2")
    assert report["migration"]["target_report"]["pid"] == job.pid
    assert job.wait_end(len(ref)) == ref


def test_killing_the_target_daemon_during_the_transfer_leaves_the_job_running(hosts, phos, programs, tmp_path):
    cmd = mlp(programs, steps=24, state_mib=192)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(2)
    seen = len(daemon_log("h2"))
    source = subprocess.Popen([str(TESTHOSTS), "exec", "h1", "--", str(phos), "migrate", "--pid", str(job.pid),
                               "--to", ADDRESS["h2"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=hosts)
    try:
        # The migration reached h2 (its page server's directory appears as the
        # source connects, before device memory streams).
        def reached():
            if source.poll() is not None:
                pytest.fail(f"phos migrate ended early ({source.returncode}): {source.communicate()}\n"
                            f"h2: {daemon_log('h2')[seen:][-3000:]}")
            return "pages-" in on("h2", "ls", "/run/phos/migrations", timeout=10).stdout
        wait_for(reached, 30, "the migration reaching h2")
        assert "connected" in daemon_log("h2")[seen:], daemon_log("h2")[seen:][-3000:]
        daemon = int(on("h2", "pgrep", "-o", "-f", "phos daemon").stdout.split()[0])
        on("h2", "kill", "-KILL", daemon)
        out, err = source.communicate(timeout=TIMEOUT)
    finally:
        if source.poll() is None:
            source.kill()
    assert source.returncode == 1, out + err
    assert "runs on here" in err, err
    assert job.pid in sessions_on("h1", phos)
    assert job.wait_end(len(ref)) == ref
    restart_daemon("h2", phos, hosts)


def test_target_without_room_for_the_image_leaves_the_job_running(hosts, phos, programs, tmp_path):
    cmd = mlp(programs, steps=24, state_mib=96)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(2)
    # h2's runtime directory, where migrated images arrive, gets 48 MiB.
    r = on("h2", "mount", "-o", "remount,size=48m", "/run/phos")
    assert r.returncode == 0, r.stderr
    try:
        r = on("h1", str(phos), "migrate", "--pid", job.pid, "--to", ADDRESS["h2"])
    finally:
        on("h2", "mount", "-o", "remount,size=50%", "/run/phos")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the target failed to take the image" in r.stderr and "runs on here" in r.stderr, r.stderr
    assert "No space left" in r.stderr, r.stderr
    assert job.pid in sessions_on("h1", phos) and job.pid not in sessions_on("h2", phos)
    assert job.wait_end(len(ref)) == ref
    leftovers = on("h2", "ls", "-A", "/run/phos/migrations").stdout.split()
    assert leftovers == [], leftovers


@pytest.mark.hostile
def test_peer_without_the_key_is_refused(hosts, phos, programs, tmp_path):
    cmd = mlp(programs)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(2)
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(os.urandom(32))
    seen = len(daemon_log("h2"))
    r = on("h1", str(phos), "migrate", "--pid", job.pid, "--to", ADDRESS["h2"], "--key", wrong, env=hosts)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "refused this daemon's key" in r.stderr and "runs on here" in r.stderr, r.stderr
    try:
        wait_for(lambda: "did not prove that it holds the key" in daemon_log("h2")[seen:], 30, "h2 logging the refusal")
    except BaseException:
        print(f"h2's log since the attempt:\n{daemon_log('h2')[seen:][-3000:]}")
        raise
    assert job.pid in sessions_on("h1", phos) and job.pid not in sessions_on("h2", phos)
    assert job.wait_end(len(ref)) == ref


def test_unreachable_target_and_bad_requests(hosts, phos, programs, tmp_path):
    cmd = mlp(programs, steps=8)
    ref = reference(cmd, hosts)
    job = HostJob("h1", phos, cmd, hosts, tmp_path)
    job.wait_line(1)
    r = on("h1", str(phos), "migrate", "--pid", job.pid, "--to", "10.231.0.2:7999")
    assert r.returncode == 1 and "cannot connect to 10.231.0.2:7999" in r.stderr and "runs on here" in r.stderr, \
        r.stderr
    r = on("h1", str(phos), "migrate", "--pid", job.pid, "--to", "10.231.0.2:notaport")
    assert r.returncode == 2 and "port" in r.stderr, r.stderr
    short = tmp_path / "short.key"
    short.write_text("short\n")
    r = on("h1", str(phos), "migrate", "--pid", job.pid, "--to", "10.231.0.2", "--key", short)
    assert r.returncode == 2 and "at least 16" in r.stderr, r.stderr
    r = on("h1", str(phos), "migrate", "--pid", 99999, "--to", "10.231.0.2")
    assert r.returncode == 2 and "no PhOS session" in r.stderr, r.stderr
    assert job.wait_end(len(ref)) == ref


def test_listen_needs_a_key(phos, tmp_path):
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", tmp_path / "rt", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--listen needs --key" in r.stderr, r.stderr
    missing = tmp_path / "nokey"
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", tmp_path / "rt", "--key", missing],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
