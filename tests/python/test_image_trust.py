# SPDX-License-Identifier: Apache-2.0
"""Images are untrusted input (docs/security.md): the attack of a local user on a root phosd.

The attack as reported: an unprivileged user copies a real image, writes its
own uid into the manifest, makes a blob a symbolic link to a root-only file
(with that file's checksum in the manifest, so that a followed link would
verify), and sends `restore` to the world-writable control socket. A root
phosd must refuse it before it opens anything outside the image: the error
names the link, prints no checksum, and the file's bytes go nowhere. An
inotify watch on the root-only file proves that nothing opened it. A forged
uid alone is refused too, as is a user's restore of root's image; root's own
image still restores as before.

Needs root, CRIU, setpriv and a user to act as (phos-probe, created with
`useradd -M` when missing); skips with the reason otherwise.
"""
import ctypes
import json
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import tempfile

import pytest

from test_checkpoint_phos import (Job, app_env, checkpoint, command, criu, jobs,  # noqa: F401
                                  programs, reference, restore)

pytestmark = pytest.mark.hostile

PROBE = "phos-probe"
SECRET = b"PHOS-SECRET-" + b"s" * 52  # 64 bytes, repeated to fill the blob


@pytest.fixture(scope="module")
def probe():
    """The unprivileged user: (uid, gid)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run a client as another user")
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3 for a client running as another user")
    try:
        entry = pwd.getpwnam(PROBE)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            pytest.skip(f"no user {PROBE} and no useradd to create one")
        r = subprocess.run([useradd, "-M", "-s", "/usr/sbin/nologin", PROBE], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot create user {PROBE}: {r.stderr.strip()}")
        entry = pwd.getpwnam(PROBE)
    return entry.pw_uid, entry.pw_gid


def as_probe(probe, argv, **kwargs):
    uid, gid = probe
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
                          capture_output=True, text=True, timeout=60, **kwargs)


def restore_as_probe(probe, daemon, image, eager=True):
    """`restore` on the control socket from the probe user: every line phosd answers, as text."""
    # The socket is 0666 for everyone; the test daemon's runtime directory is
    # a private mkdtemp one: let the user reach it, as /run/phos lets users.
    os.chmod(daemon.runtime_dir, 0o755)
    code = (
        "import json, socket\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.settimeout(30)\n"
        f"s.connect({str(daemon.socket_path)!r})\n"
        f"s.sendall((json.dumps({{'op': 'restore', 'image': {str(image)!r}, 'eager': {eager!r}}}) + '\\n').encode())\n"
        "out = b''\n"
        "while True:\n"
        "    data = s.recv(65536)\n"
        "    if not data or b'\"ok\"' in out + data:\n"
        "        out += data\n"
        "        break\n"
        "    out += data\n"
        "print(out.decode(errors='replace'))\n"
    )
    r = as_probe(probe, ["/usr/bin/python3", "-c", code])
    assert r.returncode == 0, r.stderr
    return r.stdout


def final_answer(text):
    answers = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
    finals = [a for a in answers if "ok" in a]
    assert finals, text
    return finals[-1]


class OpenWatch:
    """inotify on one file: whether anything opened or read it since."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0
        assert self.libc.inotify_add_watch(self.fd, str(path).encode(), self.IN_OPEN | self.IN_ACCESS) >= 0

    def opened(self):
        try:
            return len(os.read(self.fd, 4096)) > 0
        except BlockingIOError:
            return False

    def close(self):
        os.close(self.fd)


@pytest.fixture
def root_image(criu, phos, phosd, app_env, programs, jobs, tmp_path):
    """A real image of a GPU job, checkpointed by root (the job is gone): (image, its lines until then, the
    uninterrupted run's lines)."""
    cmd = command(programs, "client-threads")
    ref = reference(cmd, app_env)
    job = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    image = tmp_path / "image"
    checkpoint(phos, phosd, job.pid, image)
    job.proc.wait(timeout=30)
    return image, job.lines(), ref


@pytest.fixture
def probe_dir(probe):
    """A directory of the probe user's (under /tmp: phosd must reach it), removed afterwards."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="phos-trust-", dir="/tmp"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def copy_for_probe(probe, image, where):
    """The user's copy of an image, owned by it (as `cp -r` as that user makes it)."""
    copy = where / "stolen"
    shutil.copytree(image, copy, symlinks=True)
    for path in [copy, *copy.rglob("*")]:
        os.lchown(path, probe[0], probe[1])
    os.chmod(copy, 0o755)
    return copy


def edit_manifest(image, change):
    path = image / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    os.lchown(path, *image.stat()[4:6])


def gpu_blob(manifest):
    return next(b for b in manifest["blobs"] if b["kind"] == "gpu-memory")


def assert_no_session(daemon):
    sessions = daemon.request({"op": "ps"})["sessions"]
    assert sessions == [], sessions


def test_the_reported_attack_is_refused_before_the_link_is_opened(probe, root_image, phosd, phos, probe_dir):
    xxhash = pytest.importorskip("xxhash")
    image, _, _ = root_image
    secret = probe_dir / "secret"
    manifest = json.loads((image / "manifest.json").read_text())
    size = gpu_blob(manifest)["size"]
    secret.write_bytes((SECRET * (size // len(SECRET) + 1))[:size])
    os.chmod(secret, 0o600)  # root's only
    copy = copy_for_probe(probe, image, probe_dir)

    def forge(m):
        m["state"]["gpu"]["sessions"][0]["uid"] = probe[0]
        blob = gpu_blob(m)
        data = secret.read_bytes()
        cb = blob["chunk_bytes"]
        # The root-only file's own checksums: a followed link would verify.
        blob["chunks"] = [[i, len(data[i:i + cb]), "none", xxhash.xxh3_64_hexdigest(data[i:i + cb])]
                          for i in range(0, len(data), cb)]
        (copy / blob["file"]).unlink()
        os.symlink(secret, copy / blob["file"])
        os.lchown(copy / blob["file"], probe[0], probe[1])
    edit_manifest(copy, forge)
    link = gpu_blob(json.loads((copy / "manifest.json").read_text()))["file"]

    watch = OpenWatch(secret)
    try:
        for eager in (True, False):
            text = restore_as_probe(probe, phosd, copy, eager=eager)
            answer = final_answer(text)
            assert answer["ok"] is False, text
            assert f"{link} is a symbolic link" in answer["error"], answer
            assert not re.search(r"[0-9a-f]{16}", text), text  # no checksum, computed or recorded
            assert "PHOS-SECRET" not in text
            assert str(size) not in answer["error"], answer  # not even the file's size
        # phos verify / inspect, run by the user: the same refusal, from the same reader.
        for cmd in (["verify", str(copy)], ["inspect", str(copy)]):
            r = as_probe(probe, [str(phos), *cmd])
            assert r.returncode != 0, r.stdout
            assert f"{link} is a symbolic link" in r.stderr + r.stdout, r.stderr
            assert not re.search(r"[0-9a-f]{16}", r.stderr + r.stdout)
        assert not watch.opened(), "something opened the root-only file through the image's link"
    finally:
        watch.close()
    assert_no_session(phosd)


def test_a_forged_uid_alone_is_refused(probe, root_image, phosd, probe_dir):
    image, _, _ = root_image
    copy = copy_for_probe(probe, image, probe_dir)
    # The user's own copy, its files intact: only the manifest's uid is not its own.
    edit_manifest(copy, lambda m: m["state"]["gpu"]["sessions"][0].update(uid=4242))
    answer = final_answer(restore_as_probe(probe, phosd, copy))
    assert answer["ok"] is False
    assert "its manifest names uid 4242" in answer["error"] and f"uid {probe[0]} asks" in answer["error"], answer
    assert_no_session(phosd)


def test_a_user_may_not_restore_an_image_it_does_not_own(probe, root_image, phosd, probe_dir):
    image, _, _ = root_image
    os.chmod(image.parent, 0o755)
    edit_manifest(image, lambda m: m["state"]["gpu"]["sessions"][0].update(uid=probe[0]))
    answer = final_answer(restore_as_probe(probe, phosd, image))
    assert answer["ok"] is False
    assert f"uid {probe[0]} may not use the image" in answer["error"] and "belongs to uid 0" in answer["error"], answer
    # Its own copy, but writable by anyone: someone else could have swapped its files.
    copy = copy_for_probe(probe, image, probe_dir)
    os.chmod(copy, 0o777)
    answer = final_answer(restore_as_probe(probe, phosd, copy))
    assert answer["ok"] is False and "writable by anyone" in answer["error"], answer
    assert_no_session(phosd)


def test_roots_image_restores_as_before(root_image, phos, phosd, app_env):
    image, before, ref = root_image
    assert before + restore(phos, phosd, image, app_env) == ref
