# SPDX-License-Identifier: Apache-2.0
"""Users checkpoint and restore their own jobs through a root phosd (docs/security.md).

On a shared GPU server phosd runs as root and every user's job is its
client. The reported failure: a user's `phos checkpoint` of its own job made
CRIU fail with "Can't get rlimit 0: Operation not permitted" (this machine,
like a Docker container, has no CAP_SYS_RESOURCE, so root may not read another
uid's limits). phosd now runs CRIU's dump as the job's user with two
capabilities, and a user's `phos restore` runs the capability-carrying CRIU of
scripts/install-criu (group phos). Each run is compared with the
uninterrupted one, line for line; the image belongs to whoever asked for it,
and the restored process holds no capability.

Needs root, CRIU with /opt/phos/criu/bin/criu-user, setpriv and the user
phos-probe (created when missing); skips with the reason otherwise.
"""
import grp
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

import pytest

from test_checkpoint_phos import (TIMEOUT, Job, after_checkpoint, app_env, command, criu, programs,  # noqa: F401
                                  reference)
from test_image_trust import probe  # noqa: F401

# One worker runs the whole module: a test moves the probe user's own
# /tmp/phos-driver-UID aside, which would break that user's jobs in the
# other tests if they ran beside it.
pytestmark = [pytest.mark.hostile, pytest.mark.xdist_group("probe-user")]

USER_CRIU = pathlib.Path("/opt/phos/criu/bin/criu-user")


@pytest.fixture(scope="module")
def user(probe, build_dir):
    """The probe user, in group phos, able to reach the build's programs: (uid, gid)."""
    if not USER_CRIU.exists():
        pytest.skip(f"{USER_CRIU} is missing: scripts/install-criu makes it where file capabilities work")
    try:
        members = grp.getgrnam("phos").gr_mem
    except KeyError:
        pytest.skip("no group phos (scripts/install-criu creates it)")
    if "phos-probe" not in members:
        subprocess.run(["usermod", "-aG", "phos", "phos-probe"], check=True)
    # conftest.py lets other users pass through the directories above the
    # build for the whole run (a fresh clone in a mktemp directory).
    return probe


def as_user(user, argv):
    uid, gid = user
    # --init-groups: the user's groups, phos among them (as Job(as_user=) runs it).
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", *argv]


@pytest.fixture
def shared_phosd(phosd):
    """The test's root daemon, its runtime directory open to users as /run/phos is."""
    os.chmod(phosd.runtime_dir, 0o755)
    return phosd


@pytest.fixture
def home(user):
    """A directory of the user's own, removed afterwards."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="phos-user-", dir="/tmp"))
    os.chown(top, *user)
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def user_job(user, phos, shared_phosd, app_env, programs, home):
    cmd = command(programs, "client-threads")
    job = Job(phos, shared_phosd, cmd, app_env, home, as_user=user)
    yield job, reference(cmd, app_env)
    job.stop()


def owners(image):
    return {p.lstat().st_uid for p in [image, *image.rglob("*")]}


def capabilities(pid):
    """CapPrm, CapEff and CapAmb of a live process, and its uid."""
    status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
    caps = {k: int(status[k].strip(), 16) for k in ("CapPrm", "CapEff", "CapAmb")}
    return caps, int(status["Uid"].split()[0])


def restore_watching(argv, env, pid, cwd=None):
    """`phos restore --detach`: once it returns the process is restored; its capabilities and uid then, and
    the lines it prints until it exits (its stdout is the pipe phos restore had)."""
    proc = subprocess.Popen([*argv, "--detach"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.wait(timeout=TIMEOUT) == 0, proc.stderr.read()
    seen = capabilities(pid)
    out = proc.stdout.read()  # until the job exits
    return [line for line in out.splitlines() if not line.startswith("phos: ")], seen


def test_a_user_checkpoints_and_restores_its_own_job(user, phos, shared_phosd, app_env, user_job, home):
    job, ref = user_job
    job.wait_line(2)
    image = home / "image"
    r = subprocess.run(cwd=home, args=as_user(user, [str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image),
                                      "--runtime-dir", str(shared_phosd.runtime_dir), "--json"]),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{r.stderr}\n{shared_phosd.log()[-3000:]}"
    job.proc.wait(timeout=TIMEOUT)
    before = job.lines()
    assert owners(image) == {user[0]}, "every file of the user's image is the user's"
    assert stat.S_IMODE(image.stat().st_mode) == 0o700

    restored, seen = restore_watching(
        as_user(user, [str(phos), "restore", "--image", str(image), "--runtime-dir", str(shared_phosd.runtime_dir)]),
        app_env, job.pid, cwd=home)
    after_checkpoint(ref, restored, len(before), len(before))
    caps, uid = seen
    assert uid == user[0]
    assert caps == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}, caps


def test_roots_checkpoint_of_a_users_job_is_roots(user, phos, shared_phosd, app_env, user_job, home, tmp_path):
    job, ref = user_job
    job.wait_line(2)
    image = tmp_path / "image"
    r = subprocess.run([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image),
                        "--runtime-dir", str(shared_phosd.runtime_dir), "--json"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{r.stderr}\n{shared_phosd.log()[-3000:]}"
    job.proc.wait(timeout=TIMEOUT)
    before = job.lines()
    # CRIU wrote cpu/ as the user; the published image is root's throughout.
    assert owners(image) == {0}

    restored, seen = restore_watching(
        [str(phos), "restore", "--image", str(image), "--runtime-dir", str(shared_phosd.runtime_dir)],
        app_env, job.pid)
    after_checkpoint(ref, restored, len(before), len(before))
    assert seen[1] == user[0]


def test_a_user_without_the_capable_criu_is_told_why(user, phos, shared_phosd, app_env, user_job, home):
    """Outside group phos, the user's restore names the missing permission; nothing runs."""
    job, _ = user_job
    job.wait_line(2)
    image = home / "image"
    r = subprocess.run(cwd=home, args=as_user(user, [str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image),
                                      "--runtime-dir", str(shared_phosd.runtime_dir)]),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    job.proc.wait(timeout=TIMEOUT)
    uid, gid = user
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", str(phos), "restore",
                        "--image", str(image), "--runtime-dir", str(shared_phosd.runtime_dir)],
                       env=app_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0
    assert "CAP_CHECKPOINT_RESTORE" in r.stderr and "group phos" in r.stderr, r.stderr
    assert shared_phosd.request({"op": "ps"})["sessions"] == []


def test_a_driver_directory_planted_for_the_user_is_refused(user, phos, shared_phosd, app_env, programs, home):
    """A user's job may not write the root daemon's driver/ and links the shim in a private directory of its
    own; one that someone else made (with their libcuda.so.1 in it) is refused, and nothing runs."""
    own = pathlib.Path(f"/tmp/phos-driver-{user[0]}")
    aside = own.with_name(own.name + ".aside")
    if own.exists():
        own.rename(aside)
    try:
        own.mkdir(mode=0o755)  # root's, as another user's would be
        (own / "libcuda.so.1").write_text("not a driver")
        env = {k: v for k, v in app_env.items() if k != "XDG_RUNTIME_DIR"}
        r = subprocess.run(cwd=home, args=as_user(user, [str(phos), "run", "--runtime-dir", str(shared_phosd.runtime_dir), "--",
                                          *command(programs, "client-threads")]),
                           env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0
        assert f"{own} is not a private directory of uid {user[0]}" in r.stderr, r.stderr
        assert "iteration" not in r.stdout
    finally:
        shutil.rmtree(own, ignore_errors=True)
        if aside.exists():
            aside.rename(own)
