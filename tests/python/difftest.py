# SPDX-License-Identifier: Apache-2.0
"""The differential checkpoint/restore tester (docs/checkpoint.md "Differential testing").

phos-difftest-job (tests/difftest) plans a random Driver API program from a
seed and prints one checksum line per step ("step K HASH") and a final one. A
case runs it uninterrupted directly on vgpu (the ground truth), then under
`phos run`, checkpoints it at steps and with protocols chosen from the same
seed (stop, cow, recopy; with and without --leave-running; restored eagerly or
concurrently, from a daemon whose copies are fast or slowed), restores each
image in the background, checkpoints the restored job again at the next
point, and so on. A point may instead be a live migration (`phos migrate`,
pre-copy or stop-the-world): such a case runs in two test hosts of its own
(scripts/testhosts), the job starting in h1; a migration moves it to the other
host, where it goes on, and later points apply to it there (it may migrate
back). Every segment's lines must be the ground truth's byte for byte: the
first from line 1, a job left running to its end, a restored or migrated one
from a line within its window (asked .. printed when the checkpoint or
migration returned), the last one to the final line. A divergence is run
again with --explain, which names the items (buffers, module globals,
streams, pools, host state) whose hashes differ.

  difftest.py --seed S [--steps N] [--at STEP:MODE[,leave][,eager] | --at STEP:migrate[,stop] ...]
              [--features LIST] [--migrate auto|yes|no] [--build-dir B] [--job PATH] [--keep]
  difftest.py --soak [--hours H] [--seed S] [--failures FILE] [--migrate auto|yes|no] [--build-dir B]

The first form runs one case (its plan printed first) and exits 1 if it
diverges; the second runs seeds S, S+1, ... (scripts/soak) until H hours have
passed or it is interrupted, appends each failing case to FILE with its
one-line reproduction, and prints a summary. Planned points are migrations
only when the test hosts can be set up (root, ip netns, tini): otherwise the
run says why and plans none, or with --migrate yes (and for an explicit --at
STEP:migrate) exits 2 naming why. tests/python/test_difftest.py runs a few
fixed seeds in CI.
"""
import argparse
import dataclasses
import datetime
import json
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
# A planned checkpoint point is a migration to the other test host with this
# probability (about one case in three then migrates), stop-the-world in
# MIGRATE_STOP of those. They are drawn from a generator of their own, so that
# a seed's other choices are the same with and without test hosts.
MIGRATE = 0.2
MIGRATE_STOP = 0.3
# What fails a case: a check, a timeout, a program that cannot run, and the
# helpers' pytest.fail (pytest's outcome exception is not an Exception).
FAILURES = (Exception, pytest.fail.Exception)


POINT_SYNTAX = "STEP:MODE[,leave][,eager] (MODE: stop, cow, recopy) or STEP:migrate[,stop]"


@dataclasses.dataclass(frozen=True)
class Point:
    """A checkpoint once the running segment has printed `step` lines, and the
    restore of its image; or (mode "migrate") the job's live migration to the
    other test host (`phos migrate`, pre-copy, or stop-the-world with `stop`)."""
    step: int
    mode: str = "stop"
    leave_running: bool = False
    eager: bool = False
    stop_the_world: bool = False  # migrate only: phos migrate --mode stop

    @property
    def migrate(self) -> bool:
        return self.mode == "migrate"

    def spec(self) -> str:
        return ",".join([f"{self.step}:{self.mode}"] + (["leave"] if self.leave_running else []) +
                        (["eager"] if self.eager else []) + (["stop"] if self.stop_the_world else []))

    @classmethod
    def parse(cls, text: str) -> "Point":
        m = re.fullmatch(r"(\d+):([a-z]+)((?:,[a-z]*)*)", text)
        if not m:
            raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: {POINT_SYNTAX}")
        step, mode, flags = int(m.group(1)), m.group(2), m.group(3).split(",")[1:]
        if mode not in MODES + ("migrate",):
            raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: no mode {mode!r} ({POINT_SYNTAX})")
        if step < 1:
            raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: STEP counts the job's lines from 1")
        allowed = ("stop",) if mode == "migrate" else ("leave", "eager")
        for flag in flags:
            if flags.count(flag) > 1:
                raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: {flag!r} twice")
            if flag in allowed:
                continue
            if mode == "migrate" and flag == "leave":
                why = "a migration ends the job here once it runs on the other host: none is left running"
            elif mode == "migrate" and flag == "eager":
                why = "phos migrate chooses how the target restores (concurrently, or eagerly for STEP:migrate,stop)"
            elif flag == "stop":
                why = f"stop is a flag of migrate only (a stop-the-world checkpoint is {step}:stop)"
            else:
                why = "no such flag"
            raise argparse.ArgumentTypeError(f"bad checkpoint {text!r}: flag {flag!r}: {why} "
                                             f"({POINT_SYNTAX})")
        if mode == "migrate":
            return cls(step, mode, stop_the_world="stop" in flags)
        return cls(step, mode, "leave" in flags, "eager" in flags)


@dataclasses.dataclass
class Case:
    seed: int
    steps: int
    sleep_ms: int
    slow: bool  # the daemon's copies are slowed (SLOW_SCALE)
    points: list
    features: str = ""

    @classmethod
    def plan(cls, seed: int, steps: int = 0, points=None, features: str = "", slow=None, sleep_ms=None,
             migrate=False) -> "Case":
        """Everything a case does, from its seed (what is given is kept);
        planned points may be migrations only with `migrate`."""
        rng = random.Random(f"difftest {seed}")
        steps = steps or rng.randint(6, 16)
        planned_sleep = rng.choice([30, 80, 150])
        planned_slow = rng.random() < 0.4
        if points is None:
            count = min(rng.choice([1, 1, 2, 2, 3]), steps - 1)
            at = sorted(rng.sample(range(1, steps), count))
            points = [Point(k, rng.choice(MODES), rng.random() < 0.5, rng.random() < 0.4) for k in at]
            if migrate:
                moves = random.Random(f"difftest {seed} migrate")
                points = [Point(p.step, "migrate", stop_the_world=moves.random() < MIGRATE_STOP)
                          if moves.random() < MIGRATE else p for p in points]
        return cls(seed, steps, planned_sleep if sleep_ms is None else sleep_ms,
                   planned_slow if slow is None else slow, list(points), features)

    @property
    def migrates(self) -> bool:
        """It runs on the test hosts: a point is a migration."""
        return any(p.migrate for p in self.points)

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
                + (f", features {self.features}" if self.features else "")
                + (", on test hosts" if self.migrates else ""))

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


# How a segment's run ended is not seen when nothing here is its parent (a job
# in a test host, reaped by the host's init).
UNSEEN = "unseen"
JOB_LINE = re.compile(r"(step \d+|final) ")


@dataclasses.dataclass
class Segment:
    """One process of a case: the job under phos run, a restore of an image, or the job migrated to another host."""
    name: str
    proc: object  # subprocess.Popen, or HostProcess
    out: pathlib.Path
    err: pathlib.Path
    window: tuple  # (lo, hi): the line its first line must continue from
    restore: bool = False
    checkpointed: str = ""  # how its run ended: "" (by itself), "killed", "left running", "migrated"
    host: str = ""  # the test host it runs in ("": this machine)
    mixed: bool = False  # out is both its stdout and stderr (a migrated job's file on the target)

    def lines(self):
        got = read_lines(self.out)
        return [line for line in got if JOB_LINE.match(line)] if self.mixed else got

    def stderr(self) -> str:
        if not self.err.exists():
            return ""
        text = self.err.read_text(errors="replace")
        if self.mixed:
            text = "".join(line + "\n" for line in text.splitlines() if not JOB_LINE.match(line))
        return text

    def rolled_back(self) -> bool:
        return self.restore and "restored again" in self.stderr()


@dataclasses.dataclass
class Outcome:
    case: Case
    checkpoints: int = 0   # taken (migrations included)
    migrations: int = 0    # of those, migrations to the other test host
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


TESTHOSTS = ROOT / "scripts" / "testhosts"
HOST_ADDRESS = {"h1": "10.231.0.1", "h2": "10.231.0.2"}


class HostsUnavailable(Exception):
    """The test hosts cannot be set up here (the message says why)."""


class TestHosts:
    """h1 and h2 of scripts/testhosts (network, pid and mount namespaces of
    their own, each with a phosd listening with a shared key), as a set of this
    run's own (PHOS_TESTHOSTS_SET): the suite's test_migration.py and other
    runs keep theirs. Their daemons' copies are fast or slowed (SLOW_SCALE).
    Each host has a private /dev/shm and /run/phos; the rest of the file system
    is shared. A case's files in a host are seen here through
    /proc/PID1/root (`view`)."""
    __test__ = False  # not a pytest class

    def __init__(self, phos, env, slow: bool):
        self.phos = pathlib.Path(phos)
        self.name = f"dt{os.getpid()}{'s' if slow else 'f'}"
        self.env = dict(env, PHOS_TESTHOSTS_SET=self.name)
        self.daemon_env = dict(self.env, PHOS_VGPU_BANDWIDTH_SCALE=str(SLOW_SCALE if slow else 0))
        self.state = pathlib.Path(f"/run/phos-testhosts-{self.name}")
        self.is_up = False

    @staticmethod
    def missing() -> str:
        """Why test hosts cannot be made on this machine ("" when nothing is missing)."""
        if os.geteuid() != 0:
            return "test hosts need root (network, pid and mount namespaces)"
        for tool in ("ip", "nsenter", "unshare", "tini"):
            if shutil.which(tool) is None:
                return f"test hosts need {tool}, which is not on PATH (scripts/setup installs it)"
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return f"test hosts need network namespaces: `ip netns list` failed: {r.stderr.strip()}"
        return ""

    def testhosts(self, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run([str(TESTHOSTS), *map(str, args)], env=env or self.env, capture_output=True,
                              text=True, timeout=timeout)

    def up(self) -> "TestHosts":
        if self.is_up:
            return self
        why = self.missing()
        if why:
            raise HostsUnavailable(why)
        # The name has this process's pid: a set by that name is a dead run's.
        self.testhosts("down")
        r = self.testhosts("up", 2, "--daemon", self.phos, env=self.daemon_env)
        if r.returncode != 0:
            self.testhosts("down")
            raise HostsUnavailable(f"scripts/testhosts up 2 --daemon failed ({r.returncode}): {r.stderr.strip()}")
        self.is_up = True
        return self

    def down(self):
        if self.is_up:
            self.testhosts("down")
            self.is_up = False

    def prefix(self, host) -> list:
        """What runs a command in `host`."""
        return ["env", f"PHOS_TESTHOSTS_SET={self.name}", str(TESTHOSTS), "exec", host, "--"]

    def on(self, host, *cmd, timeout=TIMEOUT) -> subprocess.CompletedProcess:
        return self.testhosts("exec", host, "--", *cmd, timeout=timeout)

    def view(self, host, path) -> pathlib.Path:
        """A path of `host`'s file system, as seen from here."""
        return pathlib.Path(f"/proc/{int((self.state / host / 'pid').read_text())}/root") / str(path).lstrip("/")

    def alive(self, host, pid) -> bool:
        try:
            stat = self.view(host, f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(") ", 1)[1][:1] not in ("Z", "X")

    def log(self, host) -> str:
        path = self.state / host / "phosd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def daemon(self, host) -> "HostDaemon":
        return HostDaemon(self, host)

    def run_job(self, host, cmd, files, name):
        """`phos run -- cmd` started in `host` as test_migration.py's HostJob
        starts it (a session of its own, the host's init its parent, its stdio
        files of the host's own); returns its pid there."""
        q = shlex.quote
        pidfile = f"{files}/{name}.pid"
        inner = (f"echo $$ > {q(pidfile)}; exec {shlex.join([str(self.phos), 'run', '--', *map(str, cmd)])} "
                 f"> {q(files + '/' + name + '.out')} 2> {q(files + '/' + name + '.err')} < /dev/null")
        r = self.on(host, "sh", "-c", f"mkdir -p {q(files)} && exec setsid -f sh -c {q(inner)}")
        assert r.returncode == 0, f"could not start the job in {host}: {r.stderr}"
        wait_for(lambda: self.view(host, pidfile).exists() and self.view(host, pidfile).read_text().strip(),
                 30, f"the job to start in {host}")
        return int(self.view(host, pidfile).read_text())

    def restore(self, host, image, eager, files, name, log) -> subprocess.Popen:
        """A foreground `phos restore` in `host` (its stdout the restored job's), in a session of its own."""
        q = shlex.quote
        cmd = [str(self.phos), "restore", "--image", str(image), "--json"] + (["--eager"] if eager else [])
        script = (f"mkdir -p {q(files)} && exec setsid -w {shlex.join(cmd)} > {q(files + '/' + name + '.out')} "
                  f"2> {q(files + '/' + name + '.err')} < /dev/null")
        with open(log, "w") as e:
            return subprocess.Popen([str(TESTHOSTS), "exec", host, "--", "sh", "-c", script], env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=e, stderr=e, start_new_session=True)

    def migrate(self, pid, source, target, stop_the_world) -> subprocess.CompletedProcess:
        return self.on(source, str(self.phos), "migrate", "--pid", str(pid), "--to", HOST_ADDRESS[target], "--json",
                       *(["--mode", "stop"] if stop_the_world else []))


@dataclasses.dataclass
class HostDaemon:
    """A test host's phosd, as test_checkpoint_phos.checkpoint wants a daemon."""
    hosts: TestHosts
    host: str
    runtime_dir: str = "/run/phos"

    def log(self) -> str:
        return self.hosts.log(self.host)


class HostProcess:
    """A job in a test host that is nobody's child here: when it ends is seen,
    its exit status is not (its poll and wait give UNSEEN)."""

    def __init__(self, hosts: TestHosts, host: str, pid: int):
        self.hosts, self.host, self.pid = hosts, host, pid

    def poll(self):
        return None if self.hosts.alive(self.host, self.pid) else UNSEEN

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout or 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid} in {self.host}", timeout)
            time.sleep(0.05)
        return UNSEEN

    def kill(self):
        self.hosts.on(self.host, "kill", "-KILL", str(self.pid), timeout=30)


class Runner:
    """Runs cases against private daemons of one build, or (cases that
    migrate) in two test hosts with daemons of their own; both started on
    first use."""

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
        self.hostsets = {}
        self.truths = {}
        self.before_checkpoint = None  # called with the checkpoint's number (tests)

    def close(self):
        for d in self.daemons.values():
            d.stop()
        self.daemons.clear()
        for h in self.hostsets.values():
            h.down()
        self.hostsets.clear()

    def daemon(self, slow: bool) -> PrivateDaemon:
        if slow not in self.daemons:
            env = {"PHOS_VGPU_BANDWIDTH_SCALE": SLOW_SCALE} if slow else {}
            self.daemons[slow] = PrivateDaemon(self.phos, self.build_dir, env).start()
        return self.daemons[slow]

    def test_hosts(self, slow: bool) -> TestHosts:
        """The test hosts whose daemons' copies are fast or slowed, up (or HostsUnavailable)."""
        if slow not in self.hostsets:
            self.hostsets[slow] = TestHosts(self.phos, self.env, slow)
        return self.hostsets[slow].up()

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
        if outcome.failure:
            self.keep_daemon_logs(case, work)
        if outcome.failure and explain_failures:
            outcome.explanation = self.explain(case, work)
        if not outcome.ok:
            outcome.failure += f"\n(files of the case: {work})"
        elif not self.keep:
            shutil.rmtree(work, ignore_errors=True)
        return outcome

    def keep_daemon_logs(self, case: Case, work: pathlib.Path):
        """The test hosts' phosd logs beside a failed case's files (the hosts,
        and their logs, go at the end of the run)."""
        hosts = self.hostsets.get(case.slow)
        if hosts is None or not hosts.is_up:
            return
        for host in ("h1", "h2"):
            try:
                shutil.copyfile(hosts.state / host / "phosd.log", work / f"phosd.{host}.log")
            except OSError:
                pass  # a host that did not start has no log

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
        cmd = [str(self.job), *case.job_args(explain)]
        if case.migrates:
            # Every segment runs in a test host, where the job is; its files
            # are the host's own (a migrated job's then go to a file of the
            # target's: the next segment), copied into `work` at the end.
            hosts = self.test_hosts(case.slow)
            where = "h1"
            files = f"/dev/shm/difftest-{os.getpid()}-{work.parent.name}-{work.name}"
            pid = hosts.run_job(where, cmd, files, "segment-0")
            segments.append(Segment(f"segment 0 (phos run in {where})", HostProcess(hosts, where, pid),
                                    hosts.view(where, f"{files}/segment-0.out"),
                                    hosts.view(where, f"{files}/segment-0.err"), (0, 0), host=where))
        else:
            hosts = where = files = None
            daemon = self.daemon(case.slow)
            job = Job(self.phos, daemon, cmd, self.env, work, "segment-0")
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
                if point.migrate:
                    moved = self._migrate(hosts, pid, where, point, seg, n, asked, outcome, case.steps)
                    if moved is None:
                        break
                    segments.append(moved)
                    where = moved.host
                    continue
                image = work / f"image-{n}"
                extra = ["--mode", point.mode] + (["--leave-running"] if point.leave_running else [])
                try:
                    if hosts:
                        checkpoint(self.phos, hosts.daemon(where), pid, image, *extra, prefix=hosts.prefix(where))
                    else:
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
                    self._ended_well(seg, seg.proc.wait(timeout=TIMEOUT),
                                     f", left running by checkpoint {point.spec()},")
                else:
                    seg.checkpointed = "killed"
                    seg.proc.wait(timeout=TIMEOUT)
                    done = progress(seg.lines()[-1], case.steps) if seg.lines() else 0
                if hosts:
                    segments.append(self._restore_in(hosts, where, files, image, point, work, n, (asked, done)))
                else:
                    segments.append(self._restore(daemon, image, point, work, n, (asked, done)))
            last = segments[-1]
            self._ended_well(last, last.proc.wait(timeout=TIMEOUT), "")
        finally:
            if hosts:
                for host in HOST_ADDRESS:
                    if hosts.alive(host, pid):
                        hosts.on(host, "kill", "-KILL", str(pid), timeout=30)
            for seg in segments:
                if seg.proc.poll() is None:
                    seg.proc.kill()
                    seg.proc.wait(timeout=TIMEOUT)
            if hosts:
                self._fetch(hosts, files, segments, work)
            else:
                # A restored job outlives a phos restore killed above.
                try:
                    if self.job.name in pathlib.Path(f"/proc/{pid}/cmdline").read_text():
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        outcome.rollbacks += sum(seg.rolled_back() for seg in segments)
        return segments

    @staticmethod
    def _ended_well(seg: Segment, code, how: str):
        """The segment's process exited with 0; where its exit status is not
        seen (a job in a test host), its stderr holds nothing but --explain's lines."""
        if code == UNSEEN:
            said = [line for line in seg.stderr().splitlines() if not line.startswith("difftest: ")]
            assert not said, f"{seg.name}{how} wrote to stderr:\n" + "\n".join(said[-40:])
        else:
            assert code == 0, f"{seg.name}{how} exited with {code}:\n{seg.stderr()[-3000:]}"

    def _migrate(self, hosts: TestHosts, pid, source, point, seg, n, asked, outcome, steps):
        """phos migrate of the job from `source` to the other host: the segment
        that goes on there, or None when the job had ended."""
        target = "h2" if source == "h1" else "h1"
        r = hosts.migrate(pid, source, target, point.stop_the_world)
        if r.returncode != 0:
            ended = seg.proc.poll() is not None
            if not ended and "has no PhOS session" in r.stderr:
                # The session closes as the job exits: asked at its last
                # lines, the process may still be on its way out.
                try:
                    seg.proc.wait(timeout=10)
                    ended = True
                except subprocess.TimeoutExpired:
                    pass
            if ended:
                outcome.skipped += 1  # the job ended meanwhile (its lines say whether it ended well)
                return None
            raise AssertionError(f"migration {point.spec()} of {seg.name} from {source} to {target} (asked at line "
                                 f"{asked}) failed ({r.returncode}): {r.stderr.strip()}\n"
                                 f"{source}'s phosd: {hosts.log(source)[-2000:]}\n"
                                 f"{target}'s phosd: {hosts.log(target)[-2000:]}")
        report = json.loads(r.stdout)
        there = report["migration"]["target_report"]
        assert there["pid"] == pid, f"migration {point.spec()}: pid {there['pid']} on {target}, not {pid}: {report}"
        outcome.checkpoints += 1
        outcome.migrations += 1
        seg.checkpointed = "migrated"
        # The job stopped for the dump is ended on the source.
        wait_for(lambda: seg.proc.poll() is not None and not hosts.alive(source, pid), 30,
                 f"{seg.name} to end on {source} after migration {point.spec()}")
        done = progress(seg.lines()[-1], steps) if seg.lines() else 0
        # Its stdio were files of the source's own: they go on in a file of the
        # target's runtime directory, the migrated image's name with .out.
        out = hosts.view(target, there["image"] + ".out")
        assert out.exists(), f"migration {point.spec()}: the job's output is not in {target}:{there['image']}.out"
        return Segment(f"segment {n} (migrated to {target} by {point.spec()})", HostProcess(hosts, target, pid),
                       out, out, (asked, done), host=target, mixed=True)

    def _restore(self, daemon, image, point, work, n, window) -> Segment:
        out, err = work / f"segment-{n}.out", work / f"segment-{n}.err"
        cmd = [str(self.phos), "restore", "--image", str(image), "--runtime-dir", str(daemon.runtime_dir), "--json"]
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(cmd + (["--eager"] if point.eager else []), env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
        return Segment(f"segment {n} (restored from checkpoint {point.spec()})", proc, out, err, window, True)

    def _restore_in(self, hosts, host, files, image, point, work, n, window) -> Segment:
        proc = hosts.restore(host, image, point.eager, files, f"segment-{n}", work / f"segment-{n}.exec.log")
        return Segment(f"segment {n} (restored in {host} from checkpoint {point.spec()})", proc,
                       hosts.view(host, f"{files}/segment-{n}.out"), hosts.view(host, f"{files}/segment-{n}.err"),
                       window, True, host=host)

    @staticmethod
    def _fetch(hosts: TestHosts, files, segments, work):
        """Copies the segments' files out of the test hosts into `work` (the
        segments then name the copies) and removes them there."""
        for i, seg in enumerate(segments):
            if not seg.host:
                continue
            names = [(seg.out, work / f"segment-{i}.{seg.host}.out")]
            if seg.err != seg.out:
                names.append((seg.err, work / f"segment-{i}.{seg.host}.err"))
            for there, here in names:
                try:
                    shutil.copyfile(there, here)
                    there.unlink()
                except OSError:
                    here.touch()
            seg.out = names[0][1]
            seg.err = names[-1][1]
        for host in HOST_ADDRESS:
            try:
                shutil.rmtree(hosts.view(host, files), ignore_errors=True)
            except OSError:
                pass

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
                f"{seg.name} begins after line {first}, outside its window {lo}..{hi} (lines when the checkpoint " \
                f"or migration was asked .. when it returned):\n" + \
                "\n".join(got[:3])
            for j, line in enumerate(got):
                if line != ref[first + j]:
                    raise AssertionError(f"{seg.name}: line {first + j + 1} differs from the uninterrupted run's:\n"
                                         f"  got   {line}\n  truth {ref[first + j]}")
            if seg.checkpointed not in ("killed", "migrated"):
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


def plan_migrations(runner: Runner, args, slows=(False, True)) -> str:
    """Whether planned points may be migrations (--migrate): "" if so, else
    why not. The test hosts are set up here; with --migrate yes, a reason is
    an error (HostsUnavailable)."""
    if args.migrate == "no":
        return "--migrate no"
    try:
        for slow in slows:
            runner.test_hosts(slow)
    except HostsUnavailable as e:
        if args.migrate == "yes":
            raise
        return str(e)
    return ""


def soak(args, runner: Runner) -> int:
    failures = pathlib.Path(args.failures)
    deadline = time.monotonic() + args.hours * 3600 if args.hours else None
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    totals = {"cases": 0, "checkpoints": 0, "migrations": 0, "skipped": 0, "rollbacks": 0, "failures": 0}
    start = time.monotonic()
    try:
        no_migrations = plan_migrations(runner, args)
    except HostsUnavailable as e:
        print(f"soak: --migrate yes, but the test hosts cannot be set up: {e}", file=sys.stderr)
        return 2
    print(f"soak: seeds from {seed}, failures to {failures}" + (f", {args.hours} h" if args.hours else "")
          + (f"; no migrations ({no_migrations})" if no_migrations else "; migrations between test hosts"),
          flush=True)
    try:
        while deadline is None or time.monotonic() < deadline:
            case = Case.plan(seed, features=args.features, migrate=not no_migrations)
            outcome = runner.run(case)
            totals["cases"] += 1
            for k in ("checkpoints", "migrations", "skipped", "rollbacks"):
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
          f"({totals['migrations']} of them migrations, {totals['skipped']} asked after the job ended, "
          f"{totals['rollbacks']} concurrent restores redone eagerly), {totals['failures']} failures in "
          f"{minutes:.1f} min" + (f"; see {failures}" if totals["failures"] else ""), flush=True)
    return 1 if totals["failures"] else 0


MIGRATE_HELP = """\
where planned checkpoint points may be migrations between two test hosts
(scripts/testhosts, a set of this run's own; they need root, ip netns and
tini). auto (default): when the hosts can be set up; when they cannot, the
plans have none and the run says why at its start. yes: fail (exit 2) when
they cannot. no: never. An explicit --at STEP:migrate needs the hosts whatever
this says: the run fails (exit 2) naming why when they cannot be set up."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.environ.get("PHOS_BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--job", help="phos-difftest-job (default: the build's)")
    p.add_argument("--seed", type=lambda s: int(s, 0))
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--sleep-ms", type=int)
    p.add_argument("--at", type=Point.parse, action="append",
                   help="STEP:MODE[,leave][,eager] (MODE: stop, cow, recopy), or STEP:migrate[,stop]: the job's "
                        "live migration to the other test host (stop: stop-the-world) (repeatable)")
    p.add_argument("--no-checkpoint", action="store_true", help="only phos run, uninterrupted")
    p.add_argument("--slow", dest="slow", action="store_true", default=None)
    p.add_argument("--fast", dest="slow", action="store_false")
    p.add_argument("--features", default="", help="the job's --features")
    p.add_argument("--migrate", choices=("auto", "yes", "no"), default="auto", help=MIGRATE_HELP)
    p.add_argument("--keep", action="store_true", help="keep the files of cases that pass")
    p.add_argument("--workdir", help="where cases write their images (default: a new directory under /tmp)")
    p.add_argument("--soak", action="store_true")
    p.add_argument("--hours", type=float, default=0)
    p.add_argument("--failures", default="difftest-failures.txt")
    args = p.parse_args(argv)
    if not args.soak and args.seed is None:
        p.error("--seed is required (or --soak)")
    explicit = [pt.spec() for pt in args.at or [] if pt.migrate]
    if args.soak and args.at:
        p.error("--at is for one case (--seed); a soak plans its points from each seed")
    if args.no_checkpoint and args.at:
        p.error("--no-checkpoint and --at contradict each other")
    if explicit and args.migrate == "no":
        p.error(f"--at {explicit[0]} is a migration, but --migrate no")
    workdir = pathlib.Path(args.workdir) if args.workdir else pathlib.Path(tempfile.mkdtemp(prefix="phos-difftest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runner = Runner(args.build_dir, workdir, args.job, args.keep)
    # A signal ends the run as Ctrl-C does: daemons stopped, summary printed
    # (SIGINT too when started in the background, where it is ignored).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with RoomyPids():
            try:
                return soak(args, runner) if args.soak else one_case(args, runner, explicit)
            finally:
                runner.close()
    finally:
        if not args.keep and not any(workdir.iterdir()):
            workdir.rmdir()


def one_case(args, runner: Runner, explicit: list) -> int:
    def plan(migrate):
        return Case.plan(args.seed, args.steps, [] if args.no_checkpoint else args.at, args.features, args.slow,
                         args.sleep_ms, migrate)
    case = plan(args.migrate != "no")
    if case.migrates:
        try:
            why = plan_migrations(runner, args, [case.slow])
        except HostsUnavailable as e:
            why = str(e)
        if why and (explicit or args.migrate == "yes"):
            print(f"difftest: {' '.join('--at ' + s for s in explicit) or 'the plan'} migrates, but the test hosts "
                  f"cannot be set up: {why}", file=sys.stderr)
            return 2
        if why:
            print(f"difftest: no migrations in the plan: {why}", flush=True)
            case = plan(False)
    print(case.describe(), flush=True)
    outcome = runner.run(case)
    print(f"{outcome.checkpoints} checkpoints taken ({outcome.migrations} of them migrations), {outcome.skipped} "
          f"asked after the job ended, {outcome.rollbacks} concurrent restores redone eagerly")
    if outcome.ok:
        print("ok: every segment is the uninterrupted run's, byte for byte")
        return 0
    print(f"FAIL: {outcome.failure}\n{outcome.explanation}\n"
          f"reproduce: {case.reproduce(runner.build_dir, runner.custom_job)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
