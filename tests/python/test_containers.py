# SPDX-License-Identifier: Apache-2.0
"""A PhOS job in a Podman container, checkpointed with `podman container checkpoint --export`
and restored from that archive with `podman container restore --import` (issue 28).

The container runs from an image made here (the libraries of the job's programs,
`podman image import`; nothing is pulled), with phosd's runtime directory and
session directory mounted (docs/containers.md); phosd runs on the host. Podman
runs the OCI runtime, which runs CRIU with PhOS's plugin: no phos command
takes part in the checkpoint or the restore. The restored container's output
must be the job's uninterrupted run, line for line, and its process gets a new
host pid, which phosd's session follows.
"""
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
import uuid

import pytest

from job_output import wait_for
from test_checkpoint_phos import app_env, command, criu, programs, reference  # noqa: F401 (fixtures)

TIMEOUT = 120


def podman_runtime_or_skip(runtime):
    if os.geteuid() != 0:
        pytest.skip("Podman's checkpoints need root")
    for tool in ("podman", runtime):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs it)")
    if runtime == "crun":
        version = subprocess.run(["crun", "--version"], capture_output=True, text=True).stdout
        if "+CRIU" not in version:
            pytest.skip("this crun is built without CRIU (no +CRIU in `crun --version`; Debian 12's 1.8.1): "
                        "Podman says 'configured runtime does not support checkpoint/restore'")


@pytest.fixture(scope="module")
def job_image(build_dir, programs):
    """A local image holding the shared libraries the job's programs load; the build is mounted."""
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs root and podman")
    binaries = [build_dir / "cli" / "phos", build_dir / "shim" / "libphos.so", build_dir / "vgpu" / "libcuda.so.1"]
    binaries += [pathlib.Path(programs[p][0]) for p in ("mlp-train", "client") if isinstance(programs[p], list)]
    libraries = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for found in re.findall(r"(/\S+) \(0x", out):
            path = os.path.normpath(found)
            if not path.startswith(str(build_dir)):
                libraries.add(path)
    work = pathlib.Path(tempfile.mkdtemp(prefix="phos-image-"))
    root_tar = work / "root.tar"
    with tarfile.open(root_tar, "w") as tar:
        for d in ("tmp", "dev", "proc", "sys", "run", "etc"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        added = set()
        for library in sorted(libraries):
            for name in sorted({library, os.path.realpath(library)}):
                if name not in added:
                    added.add(name)
                    tar.add(os.path.realpath(library), arcname=name.lstrip("/"), recursive=False)
    tag = f"localhost/phos-test-job:{uuid.uuid4().hex[:12]}"
    r = subprocess.run(["podman", "image", "import", str(root_tar), tag], capture_output=True, text=True,
                       timeout=TIMEOUT)
    shutil.rmtree(work, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    yield tag
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, timeout=TIMEOUT)


@pytest.fixture
def podman_env(build_dir, tmp_path):
    """Podman's environment: the OCI runtime finds CRIU on PATH; this `criu` loads the plugin from the build.

    (An administrator installs the plugin in /usr/lib/criu/ instead: runc gives CRIU no environment of
    ours, so CRIU_LIBS_DIR is set here, in the wrapper.)
    """
    real = os.environ.get("PHOS_CRIU", "/opt/phos/criu/bin/criu")
    wrap = tmp_path / "criu-bin"
    wrap.mkdir()
    script = wrap / "criu"
    script.write_text(f"#!/bin/sh\nexport CRIU_LIBS_DIR={build_dir / 'criu' / 'plugin'}\nexec {real} \"$@\"\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_") and k != "LD_PRELOAD"}
    env["PATH"] = f"{wrap}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


def podman(env, *args, check=True, timeout=TIMEOUT):
    r = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stdout}{r.stderr}"
    return r


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("job", ["client-events", "mlp-train"])
def test_a_container_checkpointed_to_an_archive_restores_bit_identically(
        criu, runtime, job, build_dir, phos, start_phosd, app_env, programs, job_image, podman_env, tmp_path):
    podman_runtime_or_skip(runtime)
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    # Session files where the container can see them: its /dev/shm is its own.
    sessions = pathlib.Path(tempfile.mkdtemp(prefix="phos-sessions-", dir="/tmp"))
    daemon = start_phosd(PHOS_SESSION_DIR=str(sessions))
    name = f"phos-test-{uuid.uuid4().hex[:10]}"
    archive = tmp_path / "checkpoint.tar"
    rt = str(daemon.runtime_dir)
    try:
        podman(podman_env, "--runtime", runtime, "run", "-d", "--network", "none", "--name", name,
               "-v", f"{rt}:{rt}", "-v", f"{sessions}:{sessions}", "-v", f"{build_dir}:{build_dir}:ro",
               "-e", f"LD_LIBRARY_PATH={build_dir / 'vgpu'}", "-e", "PHOS_VGPU_BANDWIDTH_SCALE=0",
               job_image, str(pathlib.Path(phos).resolve()), "run", "--runtime-dir", rt, "--", *cmd)

        def output(container):
            return podman(podman_env, "logs", container).stdout.splitlines()
        wait_for(lambda: len(output(name)) >= 3, TIMEOUT, "line 3 of the job in the container")
        podman(podman_env, "--runtime", runtime, "container", "checkpoint", "--export", str(archive),
               "--compress", "none", name)
        with tarfile.open(archive) as tar:
            gpu = [m.name for m in tar.getmembers() if re.fullmatch(r"checkpoint/phos-\d+/manifest.json", m.name)]
        assert len(gpu) == 1, "the archive holds no GPU image"
        done = len(output(name))
        assert done < len(ref), "the job ended before its checkpoint"
        podman(podman_env, "rm", name)
        # The archive is all the restore has: another container, from it alone.
        restored = name + "-restored"
        podman(podman_env, "--runtime", runtime, "container", "restore", "--import", str(archive),
               "--name", restored)
        name = restored
        code = podman(podman_env, "wait", restored).stdout.strip()
        assert code == "0", f"the restored job exited with {code}: {output(restored)[-3:]}\n{daemon.log()[-3000:]}"
        assert output(restored) == ref, f"checkpointed after line {done}"
        assert re.search(r"restored as pid \d+ \(pid \d+ when it was saved\)", daemon.log()), \
            "the restored process kept its host pid: this test no longer shows that the session follows it"
    finally:
        podman(podman_env, "rm", "-f", name, check=False)
        shutil.rmtree(sessions, ignore_errors=True)


def test_phosd_refuses_a_session_directory_it_cannot_use(phos, tmp_path):
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", str(tmp_path), "--session-dir", "relative/dir"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--session-dir must be an existing directory" in r.stderr, r.stderr
    r = subprocess.run([str(phos), "daemon", "--runtime-dir", str(tmp_path), "--session-dir",
                        str(tmp_path / "missing")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "missing" in r.stderr, r.stderr
