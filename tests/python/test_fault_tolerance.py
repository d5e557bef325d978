# SPDX-License-Identifier: Apache-2.0
"""phos run --ft: a training job kept checkpointed and restored after it, or its
daemon, is killed; it must finish exactly as the uninterrupted run does.

The job's output after a recovery is the uninterrupted run's lines up to where
it died, then the same lines again from the checkpoint it was restored from:
the restored run repeats the steps since that checkpoint, bit for bit.
"""
import os
import pathlib
import shutil
import signal
import subprocess

import pytest

from job_output import wait_for
from test_checkpoint_phos import app_env, criu, programs  # noqa: F401

TIMEOUT = 120
STEPS = 40


def job(programs):  # noqa: F811
    base = programs["mlp-train"]
    if isinstance(base, str):
        pytest.skip(base)
    return base + ["--iterations", str(STEPS), "--state-mib", "8"]


@pytest.fixture
def reference(programs, app_env):  # noqa: F811
    r = subprocess.run(job(programs), env=app_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


class Supervised:
    """`phos run --ft` of the job against the test's daemon, its output in files."""

    def __init__(self, phos, phosd, programs, env, tmp_path, *extra, job_args=()):  # noqa: F811
        self.out, self.err = tmp_path / "job.out", tmp_path / "job.err"
        self.levels = tmp_path / "levels"
        self.levels.mkdir()
        self.phos, self.phosd = phos, phosd
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--ft", str(self.levels), *extra, "--",
                 *job(programs), "--sleep-ms", "150", *map(str, job_args)],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)

    def lines(self):
        return self.out.read_text().splitlines()

    def log(self):
        return self.err.read_text()

    def wait_checkpoints(self, n):
        wait_for(lambda: self.log().count("phos run --ft: checkpoint ") >= n, TIMEOUT, f"checkpoint {n}")

    def job_pid(self):
        sessions = self.phosd.sessions()
        assert len(sessions) == 1, sessions
        return sessions[0]["pid"]

    def finish(self):
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"phos run --ft did not finish:\n{self.log()}")


def replayed(out, ref):
    """Checks that `out` is ref's lines up to some point, then ref's again from an earlier one to the end
    (or from that point itself: a job killed before it printed a line after its last checkpoint)."""
    died = 0
    while died < min(len(out), len(ref)) and out[died] == ref[died]:
        died += 1
    if out == ref:
        return died, died
    rest = out[died:]
    assert rest and len(rest) <= len(ref), "\n".join(out)
    resumed = len(ref) - len(rest)
    assert resumed <= died, f"the restored run began at line {resumed}, after the job died at line {died}"
    assert rest == ref[resumed:]
    return died, resumed


@pytest.fixture
def ft_env(app_env, phos, phosd):  # noqa: F811
    yield app_env
    # A daemon that a restore started in the test's runtime directory.
    subprocess.run([str(phos), "daemon", "--stop", "--runtime-dir", str(phosd.runtime_dir)], capture_output=True)


def test_killed_job_is_restored_and_finishes_as_the_uninterrupted_run(criu, phos, phosd, programs, ft_env,  # noqa: F811
                                                                      reference, tmp_path):
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-interval", "1")
    run.wait_checkpoints(3)
    pid = run.job_pid()
    os.kill(pid, signal.SIGKILL)
    assert run.finish() == 0, run.log()
    log = run.log()
    assert f"pid {pid} was killed by signal 9" in log and f"pid {pid} runs again from checkpoint" in log, log
    died, resumed = replayed(run.lines(), reference)
    assert died >= resumed > 0
    # Checkpoint 4 was copied to the disk level (until both levels' costs are
    # measured, every 4th is), which keeps its newest; from then on the
    # multi-level model sets how many make one on disk. The host-memory level
    # goes with the job.
    assert "checkpoint 4 of pid" in log and "copied to disk" in log, log
    assert "(multi-level model: every 1/" in log, log
    assert list(run.levels.glob(f"phos-ft-{run.proc.pid}/checkpoint-*")), "no checkpoint reached the disk level"
    assert not pathlib.Path(f"/dev/shm/phos-ft-{run.proc.pid}").exists(), "the host-memory level was not removed"


def test_host_memory_lost_restores_from_the_next_level(criu, phos, phosd, programs, ft_env, reference,  # noqa: F811
                                                       tmp_path):
    # dram, the test's directory, and a third one standing for remote storage;
    # every second checkpoint goes one level up.
    remote = tmp_path / "remote"
    remote.mkdir()
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-interval", "1", "--ft-promote-every", "2",
                     "--ft-levels", f"dram,disk,dir:{remote}")
    wait_for(lambda: "copied to disk, copied to dir:" in run.log(), TIMEOUT, "a checkpoint reaching the third level")
    pid = run.job_pid()
    # The machine's memory is lost with the job: only the disk and remote levels remain.
    dram = pathlib.Path(f"/dev/shm/phos-ft-{run.proc.pid}")
    os.kill(pid, signal.SIGKILL)
    shutil.rmtree(dram)
    assert run.finish() == 0, run.log()
    log = run.log()
    # The newest image left is the disk level's (every second checkpoint).
    assert f"pid {pid} runs again from checkpoint" in log and "(disk)," in log, log
    replayed(run.lines(), reference)
    assert list(remote.glob(f"phos-ft-{run.proc.pid}/checkpoint-*"))


def test_job_is_restored_after_its_daemon_is_killed(criu, phos, phosd, programs, ft_env, reference,  # noqa: F811
                                                    tmp_path):
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-interval", "1")
    run.wait_checkpoints(2)
    pid = run.job_pid()
    phosd.kill()
    assert run.finish() == 0, run.log()
    log = run.log()
    assert f"pid {pid} exited with 1 after its daemon went away" in log, log
    assert f"pid {pid} runs again from checkpoint" in log, log
    replayed(run.lines(), reference)


def test_the_jobs_own_checkpoint_request_is_a_hint_to_the_supervisor(criu, phos, phosd, programs, ft_env,  # noqa: F811
                                                                     reference, tmp_path):
    # No periodic checkpoint for 10 minutes: the job asks for one after step 3
    # (the application SDK: mlp-train --checkpoint-at), with recopy.
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-first-interval", "600",
                     job_args=["--checkpoint-at", 3, "--checkpoint-image", tmp_path / "unused",
                               "--checkpoint-mode", "recopy"])
    run.wait_checkpoints(1)
    assert "(recopy, asked by the job;" in run.log(), run.log()
    pid = run.job_pid()
    wait_for(lambda: len(run.lines()) >= 8, TIMEOUT, "line 8")
    os.kill(pid, signal.SIGKILL)
    assert run.finish() == 0, run.log()
    assert f"pid {pid} runs again from checkpoint 1" in run.log(), run.log()
    died, resumed = replayed(run.lines(), reference)
    # The hint is asynchronous and a recopy image is the state when its copy ends: the job may
    # have run a step or more on (150 ms each) by then, never fewer than the 4 lines before it.
    assert resumed >= 4, f"restored at line {resumed}: the hint came after step 3"
    assert not (tmp_path / "unused").exists()


def test_job_killed_before_any_checkpoint_ends_with_its_signal(criu, phos, phosd, programs, ft_env,  # noqa: F811
                                                               tmp_path):
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-first-interval", "600")
    wait_for(lambda: len(run.lines()) >= 2, TIMEOUT, "the job's second line")
    os.kill(run.job_pid(), signal.SIGKILL)
    assert run.finish() == 128 + signal.SIGKILL
    assert "no checkpoint was taken yet: nothing to restore" in run.log()


def test_a_job_that_ends_by_itself_keeps_its_exit_code(criu, phos, phosd, programs, ft_env, reference,  # noqa: F811
                                                       tmp_path):
    run = Supervised(phos, phosd, programs, ft_env, tmp_path, "--ft-interval", "2", "--ft-levels", "dram")
    assert run.finish() == 0, run.log()
    assert run.lines() == reference
    assert "checkpoint 1 of pid" in run.log()


def test_bad_levels_are_refused(phos, phosd, programs, ft_env, tmp_path):  # noqa: F811
    r = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--ft", str(tmp_path),
                        "--ft-levels", "dram,tape", "--", *job(programs)],
                       env=ft_env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "unknown level \"tape\"" in r.stderr, r.stderr
