# SPDX-License-Identifier: Apache-2.0
"""A few fixed cases of the differential checkpoint/restore tester (difftest.py):
random Driver API programs of phos-difftest-job, checkpointed and restored with
each protocol (and migrated between test hosts), every segment's lines the
uninterrupted run's byte for byte.
scripts/soak runs the same without end; these keep CI to a few seconds each
(small step counts, short pauses).
"""
import pytest

import difftest
from difftest import Case, Point, Runner, TestHosts
from private_daemon import PrivateDaemon
from test_checkpoint_phos import criu  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def runner(build_dir, tmp_path_factory):
    job = build_dir / "tests" / "difftest" / "phos-difftest-job"
    if not job.exists():
        pytest.skip(f"{job} was not built (it needs nvcc and vgpu)")
    r = Runner(build_dir, tmp_path_factory.mktemp("difftest"))
    yield r
    r.close()


def passes(runner, case):
    outcome = runner.run(case)
    assert outcome.ok, f"{case.describe()}: {outcome.failure}\n{outcome.explanation}\n" \
                       f"reproduce: {case.reproduce(runner.build_dir)}"
    return outcome


# Each protocol once, chained: a restored job is checkpointed again. A case:
# (seed, slowed copies, checkpoints) of a 9-step job: the last checkpoint
# leaves it 4 steps (240 ms) to run, which a loaded machine's checkpoint
# needs (with 2, a run beside a soak ended first and its checkpoint was skipped).
CASES = {
    "stop, then cow left running, restored eagerly": (7, False, [Point(2, "stop"), Point(4, "cow", True, True)]),
    "recopy left running, then stop, restored while memory loads": (8, True, [Point(2, "recopy", True),
                                                                             Point(5, "stop")]),
    "cow, then recopy left running and restored eagerly": (11, True, [Point(2, "cow"), Point(4, "recopy", True, True)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_restored_runs_are_the_uninterrupted_run(criu, runner, name):  # noqa: F811
    seed, slow, points = CASES[name]
    outcome = passes(runner, Case(seed, steps=9, sleep_ms=60, slow=slow, points=points))
    assert outcome.checkpoints == len(points), outcome


def test_a_function_attribute_set_after_a_restore_holds(criu, runner):  # noqa: F811
    """Seed 123 sets reduce_shared's dynamic shared memory opt-in through its
    CUkernel in step 2 and lowers it in step 5. The restore set the kernel's
    value again (cuKernelSetAttribute), which vgpu applied over the function's
    own at every lookup: step 5 read the old value back."""
    passes(runner, Case(123, steps=5, sleep_ms=60, slow=False, points=[Point(2, "stop")]))


def test_a_kernel_function_attribute_survives_a_second_restore(criu, runner):  # noqa: F811
    """Seed 4204 launches a library kernel through its CUkernel handle and, after
    the first restore, opts that function into more dynamic shared memory with
    cuFuncSetAttribute. The engine saved only the kernel-level value
    (cuKernelGetAttribute), so the second restore gave the function the value
    the first restore had set, and a later step read the old opt-in back."""
    passes(runner, Case(4204, steps=14, sleep_ms=60, slow=True, points=[Point(3, "stop", eager=True),
                                                                        Point(13, "recopy")]))


def test_a_kernel_opted_into_more_shared_memory_runs_while_a_checkpoint_copies(criu, runner):  # noqa: F811
    """Seed 2003 launches reduce_shared with 94 KiB of dynamic shared memory
    (opted in with cuFuncSetAttribute) in step 5, while a copy-on-write
    checkpoint copies its memory slowly: the launch runs as the kernel's twin,
    which had no opt-in, and failed (the next synchronize returned
    CUDA_ERROR_INVALID_VALUE to the job left running)."""
    passes(runner, Case(2003, steps=6, sleep_ms=30, slow=True, points=[Point(4, "cow", True)]))


def test_a_launch_whose_bounds_ask_for_themselves_is_speculated(criu, runner):  # noqa: F811
    """Seed 50248 launches kernels in the window of its third checkpoint (a recopy of a
    restored job) whose access bounds asked, through the branches of a loop, for a
    register's value while finding that value: the analysis recursed until the worker's
    stack overflowed (signal 11, the session lost), in about half the runs, as a launch
    fell in the window. Such a value is now unbounded (instrument/src/access_bounds.cpp).
    16 steps, not the 14 it was found with: a step's work depends on its seed and index only,
    and with 14 a loaded CI host reached the job's teardown (its memory freed) before the
    checkpoint at line 13 began."""
    passes(runner, Case(50248, steps=16, sleep_ms=150, slow=False,
                        points=[Point(4, "stop", True), Point(10, "recopy"), Point(13, "recopy", eager=True)]))


def test_captured_graphs_launched_across_restores_are_the_uninterrupted_run(criu, runner):  # noqa: F811
    """Seed 11 with graphs (not a default feature): executable graphs captured in steps 1 and 3 are
    launched on the legacy, per-thread and a created stream in every later step, across a recopy
    left running and a stop-the-world checkpoint restored while its memory loads slowly."""
    passes(runner, Case(11, steps=10, sleep_ms=60, slow=True, points=[Point(4, "recopy", True), Point(7, "stop")],
                        features="+graphs"))


def test_executable_graphs_changed_between_launches_are_restored_as_changed(criu, runner):  # noqa: F811
    """Seeds 19 and 36 with graphs: a kernel node takes a new argument in the executable graph only
    (seed 19, steps 1 and 4), or in its graph and then the executable graph by cuGraphExecUpdate, and
    a node is disabled (seed 36, step 5); the checkpoints after those steps must restore each executable
    graph as the job changed it, not as it was instantiated, and later changes apply to it."""
    passes(runner, Case(19, steps=10, sleep_ms=60, slow=False, points=[Point(5, "stop"), Point(8, "recopy", True)],
                        features="+graphs"))
    passes(runner, Case(36, steps=10, sleep_ms=60, slow=False, points=[Point(6, "cow", True), Point(8, "stop")],
                        features="+graphs"))


def test_buffers_of_the_programs_own_vmm_are_restored_at_their_addresses(criu, runner):  # noqa: F811
    """Seed 8 with vmm (not a default feature): buffers of the job's own VMM (reserved, created,
    mapped, granted; the handle released at once or kept) live in steps 3 to 9, each replaced by
    another at a new range; a copy-on-write checkpoint left running and a stop-the-world one must
    restore them at their addresses with their bytes, and the restored job frees them as it would."""
    passes(runner, Case(8, steps=10, sleep_ms=60, slow=False, points=[Point(4, "cow", True), Point(7, "stop")],
                        features="+vmm"))


def test_arrays_and_texture_objects_are_restored_as_the_job_left_them(criu, runner):  # noqa: F811
    """Seed 3 with arrays (not a default feature): CUDA arrays sampled through texture objects,
    written through surface objects and copied to and from buffers and pageable memory, made and
    destroyed between the checkpoints; a copy-on-write checkpoint left running with slow copies and
    a stop-the-world one restored while its memory loads must give back every array's texels and
    every object under the handle the job's kernels are passed."""
    outcome = passes(runner, Case(3, steps=10, sleep_ms=60, slow=True,
                                  points=[Point(3, "cow", True), Point(6, "stop")], features="+arrays"))
    assert outcome.checkpoints == 2, outcome


def test_files_of_a_restored_session_outlive_a_starting_phosd(criu, runner):  # noqa: F811
    """Seed 13 (no threads) runs its first host function in step 4, after its
    first restore: the session's host-call queue was named after its worker,
    while its ring kept the image's name. Restored again, the queue's name
    named a worker that was gone and a ring nobody held, so a phosd starting
    then took it for a dead session's file and removed it. The next
    checkpoint saved the job's mapping of the removed file (CRIU's
    link-remap), and after that restore the job and phosd used two different
    queues: the next host function never ran and the job hung (seed 1006)."""
    def start_a_daemon(n):
        if n == 3:
            PrivateDaemon(runner.phos, runner.build_dir, {}).start().stop()

    runner.before_checkpoint = start_a_daemon
    try:
        passes(runner, Case(13, steps=8, sleep_ms=60, slow=False, points=[Point(2, "stop"), Point(4, "stop"), Point(6, "stop")],
                            features="-threads"))
    finally:
        runner.before_checkpoint = None


def test_a_job_migrated_there_and_back_is_the_uninterrupted_run(criu, runner, tmp_path, capsys):  # noqa: F811
    """Live migration as a protocol (first: what makes no sense is refused,
    naming why). Seed 8 runs on test host h1, is migrated
    to h2 with pre-copy while its memory is copied slowly, checkpointed there
    copy-on-write (left running, restored in h2), and the restored job is
    migrated back to h1 stop-the-world. Each migrated segment (the job's lines
    in a file of the target's) must go on from a line within its migration's
    window, byte for byte. Then --explain against a ground truth whose step 7
    has one item changed names that item in a migrated segment: the items are
    read from the target's file too."""
    for argv, said in ((["--at", "3:migrate,eager"], "phos migrate chooses how the target restores"),
                       (["--at", "3:migrate,leave"], "a migration ends the job here"),
                       (["--at", "3:cow,stop"], "stop is a flag of migrate only"),
                       (["--at", "3:migrate", "--migrate", "no"], "--at 3:migrate is a migration, but --migrate no")):
        with pytest.raises(SystemExit) as exited:
            difftest.main(["--seed", "8", *argv])
        assert exited.value.code == 2 and said in capsys.readouterr().err, argv
    why = TestHosts.missing()
    if why:
        pytest.skip(why)
    points = [Point(2, "migrate"), Point(4, "cow", True), Point(6, "migrate", stop_the_world=True)]
    # 120 ms a step, and 14 steps: the pre-copy of the first migration (slowed
    # copies) must end, under a loaded CI host too, well before the job's
    # last step, or the later points come after the job has ended (with 8
    # steps, a loaded CI host skipped the last point).
    case = Case(8, steps=14, sleep_ms=120, slow=True, points=points)
    outcome = passes(runner, case)
    assert (outcome.checkpoints, outcome.migrations) == (3, 2), outcome
    try:
        lines, items = runner.truth(case, explain=True)
        item = sorted(items[7])[0]
        runner.truths[tuple(case.job_args(True, sleep=False))] = (lines, {**items, 7: {**items[7], item: "0" * 16}})
        explanation = runner.explain(case, tmp_path)
    finally:
        runner.truths.clear()
    assert "(migrated to h" in explanation and f"step 7: {item} " in explanation, explanation


def test_a_divergence_is_found_and_named(runner):
    """The tester itself: another program's lines as the ground truth fail the
    first step, and --explain names the items that differ."""
    case = Case(5, steps=3, sleep_ms=0, slow=False, points=[])
    other = Case(6, steps=3, sleep_ms=0, slow=False, points=[])
    for explain in (False, True):
        runner.truths[tuple(case.job_args(explain, sleep=False))] = runner.truth(other, explain)
    outcome = runner.run(case)
    try:
        assert not outcome.ok and "line 1 differs" in outcome.failure, outcome
        assert "step 1:" in outcome.explanation and "buffer#0(" in outcome.explanation, outcome.explanation
    finally:
        runner.truths.clear()
