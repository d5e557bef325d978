# SPDX-License-Identifier: Apache-2.0
"""Concurrent requests on one image or one job are refused or serialised cleanly (issue 30, item 5).

Reported: two restores of one image at once, and the loser's worker died of
SIGBUS while its client was told "phosd stopped answering" (both re-created the
same session files; here the winner's job then failed with
CUDA_ERROR_DEVICE_UNAVAILABLE). Now phosd starts a second restore of an image
only once the first has handed its session over (or ended), and a restore of a
copy finds the session's ring held. Each run that succeeds equals the
uninterrupted one; one that does not names why.
"""
import shutil
import subprocess
import threading

import pytest

from job_output import lines, wait_for
from test_checkpoint_phos import (TIMEOUT, Job, after_checkpoint, app_env, command, criu, jobs,  # noqa: F401
                                  programs)
from test_image_trust import root_image  # noqa: F401

pytestmark = pytest.mark.hostile


def start_restore(phos, daemon, image, env):
    return subprocess.Popen([str(phos), "restore", "--image", str(image), "--runtime-dir", str(daemon.runtime_dir)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.parametrize("second", ["same image", "a copy"])
def test_two_restores_at_once_one_wins_cleanly(phos, phosd, app_env, root_image, tmp_path, second):
    image, before, ref = root_image
    other = image
    if second == "a copy":
        other = tmp_path / "copy"
        shutil.copytree(image, other, symlinks=True)
    first = start_restore(phos, phosd, image, app_env)
    racer = start_restore(phos, phosd, other, app_env)
    results = {}

    def finish(name, proc):
        results[name] = (*proc.communicate(timeout=TIMEOUT), proc.returncode)
    threads = [threading.Thread(target=finish, args=(n, p)) for n, p in (("first", first), ("racer", racer))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Serialised: the second restore waits for the first to hand its session
    # over, then either finds the job running (refused, naming why) or, if it
    # has ended meanwhile, restores it again from the start of the image.
    winners = [n for n, (_, _, code) in results.items() if code == 0]
    assert winners, results
    for name in winners:
        after_checkpoint(ref, results[name][0].splitlines(), len(before), len(before))
    for name in set(results) - set(winners):
        _, err, code = results[name]
        assert "is in use" in err or "pid is taken" in err or "another session (or a restore of it)" in err, err
        assert "stopped answering" not in err
    log = phosd.log()
    assert "SIGBUS" not in log and "signal 7" not in log
    wait_for(lambda: phosd.request({"op": "ps"})["sessions"] == [], 10, "no session left")


def test_a_restore_of_an_image_still_being_written_is_refused(criu, phos, phosd, app_env, programs, jobs, tmp_path):
    cmd = command(programs, "client-threads")
    job = Job(phos, phosd, cmd, app_env, tmp_path)
    jobs.append(job)
    job.wait_line(2)
    image = tmp_path / "image"
    writing = subprocess.Popen([str(phos), "checkpoint", "--pid", str(job.pid), "--image", str(image),
                                "--runtime-dir", str(phosd.runtime_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.run([str(phos), "restore", "--image", str(image), "--runtime-dir", str(phosd.runtime_dir)],
                       env=app_env, capture_output=True, text=True, timeout=TIMEOUT)
    writing.communicate(timeout=TIMEOUT)
    assert writing.returncode == 0
    if r.returncode == 0:
        pytest.skip("the checkpoint was published before the restore looked")
    assert r.returncode == 2, r.stderr
    assert "no such image directory" in r.stderr, r.stderr
    assert lines(job.out)
