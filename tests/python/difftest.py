# SPDX-License-Identifier: Apache-2.0
"""The differential checkpoint/restore tester (docs/checkpoint.md "Differential testing").

phos-difftest-job (tests/difftest) plans a random Driver API program from a
seed and prints one checksum line per step ("step K HASH") and a final one. A
case runs it uninterrupted directly on vgpu (the ground truth), then under
`phos run`, checkpoints it at steps and with protocols chosen from the same
seed (stop, cow, recopy; with and without --leave-running; restored eagerly or
concurrently, from a daemon whose copies are fast or slowed), restores each
image in the background, checkpoints the restored job again at the next
point, and so on. Every segment's lines must be the ground truth's byte for
byte: the first from line 1, a job left running to its end, a restored one
from a line within its checkpoint's window (asked .. printed when the
checkpoint returned), the last one to the final line. A divergence is run
again with --explain, which names the items (buffers, module globals,
streams, pools, host state) whose hashes differ.

  difftest.py --seed S [--steps N] [--at STEP:MODE[,leave][,eager][,slow] ...]
              [--features LIST] [--build-dir B] [--job PATH] [--keep DIR]
  difftest.py --soak [--hours H] [--seed S] [--failures FILE] [--build-dir B]

The first form runs one case (its plan printed first) and exits 1 if it
diverges; the second runs seeds S, S+1, ... (scripts/soak) until H hours have
passed or it is interrupted, appends each failing case to FILE with its
one-line reproduction, and prints a summary. tests/python/test_difftest.py
runs a few fixed seeds in CI.
"""
import argparse
import dataclasses
import datetime
import os
import pathlib
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from job_output import lines as read_lines, wait_for  # noqa: E402
from private_daemon import PrivateDaemon  # noqa: E402
from test_checkpoint_phos import Job, checkpoint, job_env  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 120
MODES = ("stop", "cow", "recopy")
# Copies take this many times their modelled time on a "slow" daemon: a
# concurrent restore then runs the job while its memory loads, and a
# copy-on-write or recopy checkpoint while its memory is copied.
SLOW_SCALE = 300
# What fails a case: a check, a timeout, a program that cannot run, and the
# helpers' pytest.fail (pytest's outcome exception is not an Exception).
FAILURES = (Exception, pytest.fail.Exception)


@dataclasses.dataclass(frozen=True)
class Point:
    """A checkpoint once the running segment has printed `step` lines, and the restore of its image."""
    step: int
    mode: str = "stop"
    leave_running: bool = False
    eager: bool = False

    def spec(self) -> str:
        return ",".join([f"{self.step}:{self.mode}"] + (["leave"] if self.leave_running else []) +
                        (["eager"] if self.eager else []))

    @classmethod
    def parse(cls, text: str) -> "Point":
        m = re.fullmatch(r"(\d+):(stop|cow|recopy)((?:,(?:leave|eager))*)", text)
        if not m:
            raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: STEP:MODE[,leave][,eager]")
        flags = m.group(3).split(",")
        return cls(int(m.group(1)), m.group(2), "leave" in flags, "eager" in flags)


@dataclasses.dataclass
class Case:
    seed: int
    steps: int
    sleep_ms: int
    slow: bool  # the daemon's copies are slowed (SLOW_SCALE)
    points: list
    features: str = ""

    @classmethod
    def plan(cls, seed: int, steps: int = 0, points=None, features: str = "", slow=None, sleep_ms=None) -> "Case":
        """Everything a case does, from its seed (what is given is kept)."""
        rng = random.Random(f"difftest {seed}")
        steps = steps or rng.randint(6, 16)
        planned_sleep = rng.choice([30, 80, 150])
        planned_slow = rng.random() < 0.4
        if points is None:
            count = min(rng.choice([1, 1, 2, 2, 3]), steps - 1)
            at = sorted(rng.sample(range(1, steps), count))
            points = [Point(k, rng.choice(MODES), rng.random() < 0.5, rng.random() < 0.4) for k in at]
        return cls(seed, steps, planned_sleep if sleep_ms is None else sleep_ms,
                   planned_slow if slow is None else slow, list(points), features)

    def job_args(self, explain=False, sleep=True) -> list:
        args = ["--seed", str(self.seed), "--steps", str(self.steps)]
        if sleep:
            args += ["--sleep-ms", str(self.sleep_ms)]
        if self.features:
            args += ["--features", self.features]
        return args + (["--explain"] if explain else [])

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.steps} steps, sleep {self.sleep_ms} ms, "
                f"{'slow' if self.slow else 'fast'} copies, checkpoints "
                + (" ".join(p.spec() for p in self.points) or "none")
                + (f", features {self.features}" if self.features else ""))

    def reproduce(self, build_dir, job=None) -> str:
        """The one-line command that runs this case again."""
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--build-dir", str(build_dir)]
        if job:
            cmd += ["--job", str(job)]
        cmd += ["--seed", str(self.seed), "--steps", str(self.steps), "--sleep-ms", str(self.sleep_ms),
               "--slow" if self.slow else "--fast"]
        for p in self.points:
            cmd += ["--at", p.spec()]
        if not self.points:
            cmd += ["--no-checkpoint"]
        if self.features:
            cmd += ["--features", self.features]
        return shlex.join(cmd)


def progress(line: str, steps: int) -> int:
    """How many lines of the uninterrupted run end with this one."""
    if line.startswith("final "):
        return steps + 1
    m = re.match(r"step (\d+) ", line)
    if not m:
        raise AssertionError(f"not a line of phos-difftest-job: {line!r}")
    return int(m.group(1))


@dataclasses.dataclass
class Segment:
    """One process of a case: the job under phos run, or a restore of an image."""
    name: str
    proc: subprocess.Popen
    out: pathlib.Path
    err: pathlib.Path
    window: tuple  # (lo, hi): the line its first line must continue from
    restore: bool = False
    checkpointed: str = ""  # how its run ended: "" (by itself), "killed", "left running"

    def lines(self):
        return read_lines(self.out)

    def rolled_back(self) -> bool:
        return self.restore and "restored again" in self.err.read_text(errors="replace")


@dataclasses.dataclass
class Outcome:
    case: Case
    checkpoints: int = 0   # taken
    skipped: int = 0       # asked after the job had ended
    rollbacks: int = 0     # concurrent restores that phos restored again eagerly
    failure: str = ""
    explanation: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


def parse_explain(text: str) -> dict:
    """{step: {item: hash}} from the --explain lines of a job's stderr."""
    items = {}
    for line in text.splitlines():
        m = re.match(r"difftest: step (\d+) (\S+) ([0-9a-f]{16})$", line)
        if m:
            items.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    return items


class Runner:
    """Runs cases against private daemons of one build (started on first use)."""

    def __init__(self, build_dir, workdir, job=None, keep=False):
        self.build_dir = pathlib.Path(build_dir)
        self.phos = self.build_dir / "cli" / "phos"
        self.custom_job = job
        self.job = pathlib.Path(job) if job else self.build_dir / "tests" / "difftest" / "phos-difftest-job"
        if not self.job.exists():
            raise FileNotFoundError(f"{self.job} was not built (meson compile -C {self.build_dir} difftest)")
        self.workdir = pathlib.Path(workdir)
        self.keep = keep
        self.env = job_env(self.build_dir)
        self.daemons = {}
        self.truths = {}
        self.before_checkpoint = None  # called with the checkpoint's number (tests)

    def close(self):
        for d in self.daemons.values():
            d.stop()
        self.daemons.clear()

    def daemon(self, slow: bool) -> PrivateDaemon:
        if slow not in self.daemons:
            env = {"PHOS_VGPU_BANDWIDTH_SCALE": SLOW_SCALE} if slow else {}
            self.daemons[slow] = PrivateDaemon(self.phos, self.build_dir, env).start()
        return self.daemons[slow]

    def truth(self, case: Case, explain=False):
        """The uninterrupted run directly on vgpu: (lines, its --explain items)."""
        key = (tuple(case.job_args(explain, sleep=False)))
        if key not in self.truths:
            r = subprocess.run([str(self.job), *key], env=self.env, capture_output=True, text=True, timeout=TIMEOUT)
            assert r.returncode == 0, f"the job failed directly on vgpu ({r.returncode}):\n{r.stderr[-3000:]}"
            out = r.stdout.splitlines()
            assert len(out) == case.steps + 1 and out[-1].startswith("final "), r.stdout
            self.truths[key] = (out, parse_explain(r.stderr))
        return self.truths[key]

    def run(self, case: Case, explain_failures=True) -> Outcome:
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"seed-{case.seed}-", dir=self.workdir))
        outcome = Outcome(case)
        try:
            self._check(case, self._run(case, work, outcome, explain=False, segments=[]))
        except FAILURES as e:
            outcome.failure = str(e).strip() or type(e).__name__
        if outcome.failure and explain_failures:
            outcome.explanation = self.explain(case, work)
        if not outcome.ok:
            outcome.failure += f"\n(files of the case: {work})"
        elif not self.keep:
            shutil.rmtree(work, ignore_errors=True)
        return outcome

    def explain(self, case: Case, work: pathlib.Path) -> str:
        """Runs the case again with --explain: which items differ, at which step, in which segment."""
        again = work / "explain"
        again.mkdir()
        outcome = Outcome(case)
        segments = []
        try:
            _, truth = self.truth(case, explain=True)
            self._check(case, self._run(case, again, outcome, explain=True, segments=segments))
        except FAILURES as e:
            outcome.failure = str(e).strip()[:2000]
        found = []
        for seg in segments:
            for step, items in sorted(parse_explain(seg.err.read_text(errors="replace")).items()):
                diff = [f"{name} {items.get(name, 'missing')} (vgpu: {truth[step].get(name, 'missing')})"
                        for name in sorted(set(items) | set(truth.get(step, {})))
                        if items.get(name) != truth.get(step, {}).get(name)]
                if diff:
                    found.append(f"{seg.name}, step {step}: " + "; ".join(diff))
                    break
        if not found:
            return "the --explain run: every item of every step is the uninterrupted run's" + \
                   (f" (but it failed: {outcome.failure})" if outcome.failure else "")
        return "the --explain run differs in " + "\n  ".join(found)

    def _run(self, case: Case, work: pathlib.Path, outcome: Outcome, explain: bool, segments: list) -> list:
        """Runs the case's processes; `segments` gets each as it starts."""
        self.truth(case)
        daemon = self.daemon(case.slow)
        job = Job(self.phos, daemon, [str(self.job), *case.job_args(explain)], self.env, work, "segment-0")
        pid = job.pid  # every restore brings the job back with this pid
        segments.append(Segment("segment 0 (phos run)", job.proc, job.out, job.err, (0, 0)))
        try:
            for n, point in enumerate(case.points, 1):
                seg = segments[-1]

                def reached():
                    got = seg.lines()
                    return seg.proc.poll() is not None or (got and progress(got[-1], case.steps) >= point.step)
                wait_for(reached, TIMEOUT, f"line {point.step} of {seg.name}")
                if seg.proc.poll() is not None:
                    outcome.skipped += 1
                    break
                if self.before_checkpoint is not None:
                    self.before_checkpoint(n)
                asked = progress(seg.lines()[-1], case.steps)
                image = work / f"image-{n}"
                extra = ["--mode", point.mode] + (["--leave-running"] if point.leave_running else [])
                try:
                    checkpoint(self.phos, daemon, pid, image, *extra)
                except FAILURES:
                    if seg.proc.poll() is not None and not image.exists():
                        outcome.skipped += 1  # the job ended meanwhile
                        break
                    # The helper wants device memory in the image; a job that
                    # reached its end has freed all of it.
                    if not ("'gpu_bytes': 0," in str(sys.exc_info()[1]) and (image / "manifest.json").exists()):
                        why = str(sys.exc_info()[1]).strip().splitlines() or [""]
                        raise AssertionError(f"checkpoint {point.spec()} of {seg.name} (asked at line {asked}) failed: "
                                             + "\n".join(why[:1] + why[1:][-30:]))
                outcome.checkpoints += 1
                if point.leave_running:
                    seg.checkpointed = "left running"
                    done = progress(seg.lines()[-1], case.steps)
                    code = seg.proc.wait(timeout=TIMEOUT)
                    assert code == 0, f"{seg.name}, left running by checkpoint {point.spec()}, exited with {code}:\n" \
                                      f"{seg.err.read_text(errors='replace')[-3000:]}"
                else:
                    seg.checkpointed = "killed"
                    seg.proc.wait(timeout=TIMEOUT)
                    done = progress(seg.lines()[-1], case.steps) if seg.lines() else 0
                segments.append(self._restore(daemon, image, point, work, n, (asked, done)))
            last = segments[-1]
            code = last.proc.wait(timeout=TIMEOUT)
            assert code == 0, f"{last.name} exited with {code}:\n{last.err.read_text(errors='replace')[-3000:]}"
        finally:
            for seg in segments:
                if seg.proc.poll() is None:
                    seg.proc.kill()
                    seg.proc.wait()
            # A restored job outlives a phos restore killed above.
            try:
                if self.job.name in pathlib.Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        outcome.rollbacks += sum(seg.rolled_back() for seg in segments)
        return segments

    def _restore(self, daemon, image, point, work, n, window) -> Segment:
        out, err = work / f"segment-{n}.out", work / f"segment-{n}.err"
        cmd = [str(self.phos), "restore", "--image", str(image), "--runtime-dir", str(daemon.runtime_dir), "--json"]
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(cmd + (["--eager"] if point.eager else []), env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
        return Segment(f"segment {n} (restored from checkpoint {point.spec()})", proc, out, err, window, True)

    def _check(self, case: Case, segments: list):
        """Each segment's lines are the uninterrupted run's, from where it may begin."""
        ref, _ = self.truth(case)
        for i, seg in enumerate(segments):
            got = seg.lines()
            if seg.rolled_back() and got:
                # The first attempt's lines stay before those of the eager restore.
                again = [j for j, line in enumerate(got) if j > 0 and line == got[0]]
                got = got[again[-1]:] if again else got
            first = progress(got[0], case.steps) - 1 if got else seg.window[1]
            lo, hi = seg.window
            assert lo <= first <= hi, \
                f"{seg.name} begins after line {first}, outside its checkpoint's window {lo}..{hi}:\n" + \
                "\n".join(got[:3])
            for j, line in enumerate(got):
                if line != ref[first + j]:
                    raise AssertionError(f"{seg.name}: line {first + j + 1} differs from the uninterrupted run's:\n"
                                         f"  got   {line}\n  truth {ref[first + j]}")
            if seg.checkpointed != "killed":
                assert first + len(got) == len(ref), \
                    f"{seg.name} ended after line {first + len(got)} of {len(ref)}"


def append_failure(path: pathlib.Path, outcome: Outcome, build_dir, job):
    case = outcome.case
    with open(path, "a") as f:
        f.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} {case.describe()}\n"
                f"  reproduce: {case.reproduce(build_dir, job)}\n"
                + "".join(f"  {line}\n" for line in outcome.failure.splitlines()[:40])
                + "".join(f"  {line}\n" for line in outcome.explanation.splitlines()[:20]))


class RoomyPids:
    """A raised pid_max for the run (test_stress_checkpoint.py's roomy_pids says why)."""
    PID_MAX = pathlib.Path("/proc/sys/kernel/pid_max")

    def __enter__(self):
        self.before = int(self.PID_MAX.read_text())
        if self.before < 4194304:
            try:
                self.PID_MAX.write_text("4194304")
            except OSError:
                pass
        return self

    def __exit__(self, *exc):
        if int(self.PID_MAX.read_text()) != self.before:
            self.PID_MAX.write_text(str(self.before))


def soak(args, runner: Runner) -> int:
    failures = pathlib.Path(args.failures)
    deadline = time.monotonic() + args.hours * 3600 if args.hours else None
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    totals = {"cases": 0, "checkpoints": 0, "skipped": 0, "rollbacks": 0, "failures": 0}
    start = time.monotonic()
    print(f"soak: seeds from {seed}, failures to {failures}" + (f", {args.hours} h" if args.hours else ""),
          flush=True)
    try:
        while deadline is None or time.monotonic() < deadline:
            case = Case.plan(seed, features=args.features)
            outcome = runner.run(case)
            totals["cases"] += 1
            for k in ("checkpoints", "skipped", "rollbacks"):
                totals[k] += getattr(outcome, k)
            if outcome.ok:
                print(f"ok    {case.describe()}", flush=True)
            else:
                totals["failures"] += 1
                append_failure(failures, outcome, runner.build_dir, runner.custom_job)
                print(f"FAIL  {case.describe()}\n  {outcome.failure.splitlines()[0]}\n"
                      f"  reproduce: {case.reproduce(runner.build_dir, runner.custom_job)}", flush=True)
            seed += 1
    except KeyboardInterrupt:
        print("soak: interrupted", flush=True)
    minutes = (time.monotonic() - start) / 60
    print(f"soak: {totals['cases']} cases, {totals['checkpoints']} checkpoints taken "
          f"({totals['skipped']} asked after the job ended, {totals['rollbacks']} concurrent restores redone "
          f"eagerly), {totals['failures']} failures in {minutes:.1f} min"
          + (f"; see {failures}" if totals["failures"] else ""), flush=True)
    return 1 if totals["failures"] else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.environ.get("PHOS_BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--job", help="phos-difftest-job (default: the build's)")
    p.add_argument("--seed", type=lambda s: int(s, 0))
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--sleep-ms", type=int)
    p.add_argument("--at", type=Point.parse, action="append", help="STEP:MODE[,leave][,eager] (repeatable)")
    p.add_argument("--no-checkpoint", action="store_true", help="only phos run, uninterrupted")
    p.add_argument("--slow", dest="slow", action="store_true", default=None)
    p.add_argument("--fast", dest="slow", action="store_false")
    p.add_argument("--features", default="", help="the job's --features")
    p.add_argument("--keep", action="store_true", help="keep the files of cases that pass")
    p.add_argument("--workdir", help="where cases write their images (default: a new directory under /tmp)")
    p.add_argument("--soak", action="store_true")
    p.add_argument("--hours", type=float, default=0)
    p.add_argument("--failures", default="difftest-failures.txt")
    args = p.parse_args(argv)
    if not args.soak and args.seed is None:
        p.error("--seed is required (or --soak)")
    workdir = pathlib.Path(args.workdir) if args.workdir else pathlib.Path(tempfile.mkdtemp(prefix="phos-difftest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runner = Runner(args.build_dir, workdir, args.job, args.keep)
    # A signal ends the run as Ctrl-C does: daemons stopped, summary printed
    # (SIGINT too when started in the background, where it is ignored).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with RoomyPids():
            if args.soak:
                return soak(args, runner)
            case = Case.plan(args.seed, args.steps, [] if args.no_checkpoint else args.at, args.features, args.slow,
                             args.sleep_ms)
            print(case.describe(), flush=True)
            outcome = runner.run(case)
            print(f"{outcome.checkpoints} checkpoints taken, {outcome.skipped} asked after the job ended, "
                  f"{outcome.rollbacks} concurrent restores redone eagerly")
            if outcome.ok:
                print("ok: every segment is the uninterrupted run's, byte for byte")
                return 0
            print(f"FAIL: {outcome.failure}\n{outcome.explanation}\n"
                  f"reproduce: {case.reproduce(runner.build_dir, runner.custom_job)}")
            return 1
    finally:
        runner.close()
        if not args.keep and not any(workdir.iterdir()):
            workdir.rmdir()


if __name__ == "__main__":
    sys.exit(main())
