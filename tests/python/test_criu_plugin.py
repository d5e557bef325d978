# SPDX-License-Identifier: Apache-2.0
"""PhOS jobs checkpointed and restored by plain `criu` with PhOS's CRIU plugin (issue 28).

No `phos` command takes part: CRIU, run as a user or a container runtime would
run it, loads build/criu/plugin/phos_criu_plugin.so (`--libdir`), which has
phosd save the GPU half into CRIU's image directory (`phos-PID/`) and re-create
it at restore. Every restored run is compared with the job's uninterrupted run
directly on vgpu, line for line. The refusals: no phosd, a phosd without the
job's session, an image directory phosd cannot use, an image without its GPU
half, a restore without the plugin or without phosd; each leaves the job
running (dump) or nothing running (restore), and says why.
"""
import json
import os
import pathlib
import socket
import subprocess

import pytest

from job_output import wait_for
from test_checkpoint_phos import Job, app_env, command, criu, jobs, programs, reference  # noqa: F401 (fixtures)

TIMEOUT = 120


@pytest.fixture(scope="module")
def criu_binary(criu):
    return os.environ.get("PHOS_CRIU", "/opt/phos/criu/bin/criu")


@pytest.fixture(scope="module")
def plugin_dir(build_dir):
    plugin = build_dir / "criu" / "plugin" / "phos_criu_plugin.so"
    assert plugin.exists(), f"{plugin} was not built"
    return plugin.parent


def plain_criu(criu_binary, plugin_dir, runtime_dir, *args, libdir=True):
    """CRIU as anyone runs it: no PhOS variable but the daemon's directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOS_") and k != "LD_PRELOAD"}
    env["PHOS_RUNTIME_DIR"] = str(runtime_dir)
    line = [criu_binary, *args] + (["--libdir", str(plugin_dir)] if libdir else [])
    return subprocess.run(line, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def log_of(images, name):
    path = pathlib.Path(images) / name
    return path.read_text() if path.exists() else ""


def dump(criu_binary, plugin_dir, runtime_dir, pid, images, *extra):
    images.mkdir(exist_ok=True)
    return plain_criu(criu_binary, plugin_dir, runtime_dir, "dump", "-t", str(pid), "-D", str(images),
                      "-o", "dump.log", *extra)


def restore(criu_binary, plugin_dir, runtime_dir, images, libdir=True):
    return plain_criu(criu_binary, plugin_dir, runtime_dir, "restore", "-D", str(images), "-o", "restore.log",
                      "--restore-detached", libdir=libdir)


def process_gone(pid):
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def start(phos, phosd, programs, app_env, tmp_path, job="client-events", at=3):
    cmd = command(programs, job)
    ref = reference(cmd, app_env)
    j = Job(phos, phosd, cmd, app_env, tmp_path)
    j.wait_line(at)
    return j, ref


@pytest.mark.parametrize("job", ["client-events", "client-pinned", "mlp-train"])
def test_plain_criu_dumps_and_restores_a_phos_job_bit_identically(criu, criu_binary, plugin_dir, phos, phosd,
                                                                  app_env, programs, jobs, tmp_path, job):
    j, ref = start(phos, phosd, programs, app_env, tmp_path, job)
    jobs.append(j)
    images = tmp_path / "images"
    r = dump(criu_binary, plugin_dir, phosd.runtime_dir, j.pid, images)
    assert r.returncode == 0, f"criu dump: {r.stderr}\n{log_of(images, 'dump.log')[-3000:]}\n{phosd.log()[-3000:]}"
    j.proc.wait(timeout=TIMEOUT)  # CRIU ended it, as a dump without --leave-running does
    done = len(j.lines())
    assert done < len(ref), "the job ended before the dump"
    gpu = images / f"phos-{j.pid}"
    assert (images / f"phos-{j.pid}.required").exists()
    # The GPU half is a PhOS image: phos verify and inspect read it.
    v = subprocess.run([str(phos), "verify", str(gpu)], capture_output=True, text=True, timeout=TIMEOUT)
    assert v.returncode == 0 and "intact" in v.stdout, v.stdout + v.stderr
    i = subprocess.run([str(phos), "inspect", str(gpu)], capture_output=True, text=True, timeout=TIMEOUT)
    assert "dumped by CRIU with PhOS's plugin" in i.stdout, i.stdout
    # phos restore points at CRIU for it.
    p = subprocess.run([str(phos), "restore", "--image", str(gpu), "--runtime-dir", str(phosd.runtime_dir)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 2 and f"criu restore -D {images}" in p.stderr, p.stderr

    r = restore(criu_binary, plugin_dir, phosd.runtime_dir, images)
    assert r.returncode == 0, f"criu restore: {r.stderr}\n{log_of(images, 'restore.log')[-3000:]}\n" \
                              f"{phosd.log()[-3000:]}"
    assert f"pid {j.pid} adopted" in phosd.log()
    wait_for(lambda: process_gone(j.pid), TIMEOUT, f"the restored pid {j.pid} to finish")
    # The restored process wrote on where the original stopped, into the same file.
    assert j.lines() == ref, f"dumped after line {done}; {j.err.read_text()}\n{phosd.log()[-3000:]}"


def test_a_dump_left_running_lets_the_job_finish_identically(criu, criu_binary, plugin_dir, phos, phosd, app_env,
                                                             programs, jobs, tmp_path):
    j, ref = start(phos, phosd, programs, app_env, tmp_path)
    jobs.append(j)
    images = tmp_path / "images"
    r = dump(criu_binary, plugin_dir, phosd.runtime_dir, j.pid, images, "--leave-running")
    assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'dump.log')[-3000:]}\n{phosd.log()[-3000:]}"
    assert j.proc.wait(timeout=TIMEOUT) == 0, j.err.read_text()
    assert j.lines() == ref
    v = subprocess.run([str(phos), "verify", str(images / f"phos-{j.pid}")], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert v.returncode == 0, v.stdout + v.stderr


def refused_dump_leaves_the_job_running(r, j, ref, images, why):
    assert r.returncode != 0, "CRIU dumped the job"
    log = log_of(images, "dump.log")
    assert why in log, log[-3000:]
    # CRIU gave up before freezing it; no GPU image, no marker.
    assert not any(p.name.startswith("phos-") for p in images.iterdir()), list(images.iterdir())
    assert j.proc.wait(timeout=TIMEOUT) == 0, j.err.read_text()
    assert j.lines() == ref


def test_a_dump_without_phosd_fails_and_the_job_runs_on(criu, criu_binary, plugin_dir, phos, phosd, app_env,
                                                        programs, jobs, tmp_path):
    j, ref = start(phos, phosd, programs, app_env, tmp_path)
    jobs.append(j)
    images = tmp_path / "images"
    nobody = tmp_path / "no-daemon"
    nobody.mkdir()
    r = dump(criu_binary, plugin_dir, nobody, j.pid, images)
    refused_dump_leaves_the_job_running(r, j, ref, images, f"pid {j.pid} is a PhOS job")
    assert "no phosd answers at" in log_of(images, "dump.log")


def test_a_dump_through_a_phosd_without_the_session_fails(criu, criu_binary, plugin_dir, phos, start_phosd,
                                                          app_env, programs, jobs, tmp_path):
    serving, other = start_phosd(), start_phosd()
    j, ref = start(phos, serving, programs, app_env, tmp_path)
    jobs.append(j)
    images = tmp_path / "images"
    r = dump(criu_binary, plugin_dir, other.runtime_dir, j.pid, images)
    refused_dump_leaves_the_job_running(r, j, ref, images, f"pid {j.pid} has no PhOS session in this phosd")


def test_a_dump_whose_gpu_image_cannot_be_written_fails(criu, criu_binary, plugin_dir, phos, phosd, app_env,
                                                        programs, jobs, tmp_path):
    j, ref = start(phos, phosd, programs, app_env, tmp_path)
    jobs.append(j)
    images = tmp_path / "images"
    images.mkdir()
    (images / f"phos-{j.pid}").write_text("in the way")
    r = dump(criu_binary, plugin_dir, phosd.runtime_dir, j.pid, images)
    assert r.returncode != 0
    assert f"phosd did not checkpoint pid {j.pid}" in log_of(images, "dump.log")
    assert (images / f"phos-{j.pid}").read_text() == "in the way"
    assert not (images / f"phos-{j.pid}.required").exists()
    assert j.proc.wait(timeout=TIMEOUT) == 0, j.err.read_text()
    assert j.lines() == ref


def test_a_process_without_phos_is_dumped_as_criu_alone_would(criu, criu_binary, plugin_dir, tmp_path):
    out = tmp_path / "count.out"
    with open(out, "w") as f:
        proc = subprocess.Popen(["python3", "-c", "import time\nfor i in range(200):\n print(i, flush=True)\n"
                                 " time.sleep(0.05)"], stdout=f, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: out.read_text().count("\n") >= 3, TIMEOUT, "the counter")
        images = tmp_path / "images"
        # No phosd anywhere: the plugin has nothing to do with this process.
        r = dump(criu_binary, plugin_dir, tmp_path / "no-daemon", proc.pid, images)
        assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'dump.log')[-3000:]}"
        proc.wait(timeout=TIMEOUT)
        assert not any(p.name.startswith("phos-") for p in images.iterdir())
        r = restore(criu_binary, plugin_dir, tmp_path / "no-daemon", images)
        assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'restore.log')[-3000:]}"
        wait_for(lambda: process_gone(proc.pid), TIMEOUT, "the restored counter")
        assert out.read_text().split() == [str(i) for i in range(200)]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def dumped(criu, criu_binary, plugin_dir, phos, phosd, app_env, programs, jobs, tmp_path):
    """A PhOS job dumped (and ended) by plain CRIU: (job, reference lines, images)."""
    j, ref = start(phos, phosd, programs, app_env, tmp_path)
    jobs.append(j)
    j.ring = next(line.split()[-1] for line in pathlib.Path(f"/proc/{j.pid}/maps").read_text().splitlines()
                  if "/dev/shm/phos-" in line)
    images = tmp_path / "images"
    r = dump(criu_binary, plugin_dir, phosd.runtime_dir, j.pid, images)
    assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'dump.log')[-3000:]}"
    j.proc.wait(timeout=TIMEOUT)
    return j, ref, images


def refused_restore(r, j, images, why):
    assert r.returncode != 0, "CRIU restored it"
    log = log_of(images, "restore.log")
    assert why in log, log[-3000:]
    assert process_gone(j.pid), "the process runs"


def test_a_restore_without_the_plugin_is_refused(dumped, criu_binary, plugin_dir, phosd, tmp_path):
    j, _, images = dumped
    # A plugin directory without PhOS's: CRIU's inventory names the plugin the dump used.
    empty = tmp_path / "other-plugins"
    empty.mkdir()
    r = restore(criu_binary, empty, phosd.runtime_dir, images)
    refused_restore(r, j, images, "Missing required plugin: phos")


@pytest.mark.skipif(pathlib.Path("/usr/lib/criu").exists(), reason="CRIU has a plugin directory here")
def test_a_restore_with_no_plugin_directory_finds_no_session_files(dumped, criu_binary, plugin_dir, phosd):
    # With no plugin directory CRIU checks no inventory (CRIU 4.1); what
    # stops it is that the job's session files went with its session.
    j, _, images = dumped
    wait_for(lambda: not pathlib.Path(j.ring).exists(), TIMEOUT, f"phosd to remove {j.ring}")
    r = restore(criu_binary, plugin_dir, phosd.runtime_dir, images, libdir=False)
    refused_restore(r, j, images, f"Can't open file {j.ring[1:]}")


def test_a_restore_without_the_gpu_half_is_refused(dumped, criu_binary, plugin_dir, phosd):
    j, _, images = dumped
    gpu = images / f"phos-{j.pid}"
    gpu.rename(images / "elsewhere")
    r = restore(criu_binary, plugin_dir, phosd.runtime_dir, images)
    refused_restore(r, j, images, f"the GPU state of pid {j.pid} was not saved")


def test_a_restore_without_phosd_is_refused_and_can_be_done_again(dumped, criu_binary, plugin_dir, phosd,
                                                                   tmp_path):
    j, ref, images = dumped
    nobody = tmp_path / "no-daemon"
    nobody.mkdir()
    r = restore(criu_binary, plugin_dir, nobody, images)
    refused_restore(r, j, images, "no phosd answers at")
    assert f"start one (`phos daemon --runtime-dir {nobody}`)" in log_of(images, "restore.log")
    # Nothing was spent: with its phosd the same image restores.
    r = restore(criu_binary, plugin_dir, phosd.runtime_dir, images)
    assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'restore.log')[-3000:]}"
    wait_for(lambda: process_gone(j.pid), TIMEOUT, "the restored job")
    assert j.lines() == ref


def test_phos_checkpoint_is_unchanged_where_the_plugin_is_installed(criu, plugin_dir, phos, start_phosd, app_env,
                                                                      programs, jobs, tmp_path):
    # CRIU_LIBS_DIR stands for the plugin in CRIU's default directory: PhOS's
    # own CRIU runs load it, and it stands aside for them.
    daemon = start_phosd(CRIU_LIBS_DIR=str(plugin_dir))
    j, ref = start(phos, daemon, programs, app_env, tmp_path)
    jobs.append(j)
    image = tmp_path / "image"
    r = subprocess.run([str(phos), "checkpoint", "--pid", str(j.pid), "--image", str(image), "--runtime-dir",
                        str(daemon.runtime_dir), "--leave-running"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    # Had the plugin not stood aside, it would have asked this phosd for a
    # second checkpoint of the job while the first ran, and CRIU would have
    # failed; nor did it leave anything beside CRIU's images.
    assert r.returncode == 0, r.stderr + daemon.log()[-3000:]
    assert not any(p.name.startswith("phos-") for p in (image / "cpu").iterdir())
    assert j.proc.wait(timeout=TIMEOUT) == 0
    assert j.lines() == ref


def test_phosd_refuses_bad_plugin_requests_and_the_job_runs_on(criu, phos, phosd, app_env, programs, jobs,
                                                               tmp_path):
    j, ref = start(phos, phosd, programs, app_env, tmp_path)
    jobs.append(j)
    images = tmp_path / "images"
    images.mkdir()
    base = {"op": "checkpoint", "pid": j.pid, "image": str(images / f"phos-{j.pid}")}
    # Each asked the moment the answer before arrived: a session whose last
    # request was answered is free, never "busy, try again" (which CRIU's
    # plugin, unlike `phos checkpoint`, does not wait out).
    for extra, why in [({"criu_plugin": "yes"}, "criu_plugin must be true or false"),
                       ({"criu_plugin": True, "mode": "cow"}, "through CRIU's plugin is stop-the-world")] * 10:
        answer = phosd.request({**base, **extra}, timeout=30)
        assert answer is not None and answer.get("ok") is False and why in answer["error"], answer
    # A plugin that goes away after phosd cut the GPU state, before CRIU froze
    # the job: phosd resumes it and drops the image.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(phosd.socket_path))
        s.sendall((json.dumps({**base, "criu_plugin": True}) + "\n").encode())
        with s.makefile("r") as reader:
            answer = json.loads(reader.readline())
            while "progress" in answer:
                answer = json.loads(reader.readline())
    assert answer == {"step": "paused"}, answer
    wait_for(lambda: "CRIU's plugin closed the connection" in phosd.log(), TIMEOUT, "phosd to see the plugin go")
    assert j.proc.wait(timeout=TIMEOUT) == 0, j.err.read_text()
    assert j.lines() == ref
    assert list(images.iterdir()) == []


def test_a_garbled_marker_is_ignored_and_never_crashes_criu(dumped, criu_binary, plugin_dir, phosd):
    # The marker comes with the image: fields of the wrong type fall back to
    # CRIU's environment and the pid CRIU restores.
    j, ref, images = dumped
    (images / f"phos-{j.pid}.required").write_text(json.dumps({"ns_pid": "one", "runtime_dir": 7}))
    r = restore(criu_binary, plugin_dir, phosd.runtime_dir, images)
    assert r.returncode == 0, f"{r.stderr}\n{log_of(images, 'restore.log')[-3000:]}"
    wait_for(lambda: process_gone(j.pid), TIMEOUT, "the restored job")
    assert j.lines() == ref
