#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Checkpoint stall, image size, restore time and checkpoint throughput of the example job, per model size.
"""Usage: checkpoint_bench.py --phos PHOS --mlp MLP_TRAIN --out FILE
                             [--sizes MIB,MIB,...] [--large] [--iterations N] [--sleep-ms MS]
                             [--at STEP] [--compress none|zstd|lz4] [--work-dir DIR]

For each state size (mlp-train --state-mib: device memory standing in for
optimizer state; default sizes 0,256,1024, --large adds 2048, or
$PHOS_BENCH_CHECKPOINT_SIZES), against a private phosd that `phos run`
starts in a temporary PHOS_RUNTIME_DIR (bandwidth model on, as configured):

  1. baseline: the job runs uninterrupted under phos run; its step rate
     (median time between step lines) and final checksum;
  2. `phos checkpoint --leave-running --json` once step --at has printed: the
     report's freeze_seconds and total_seconds, and the stall the job shows
     (the longest gap between step lines around the checkpoint, less the
     baseline's median gap); the image's size on disk (du);
  3. phosd's figures in that report: gpu_copy_seconds (device memory copied
     into host memory, while the job's GPU calls wait; the chunks are written
     after it resumes) and gpu_stall_seconds (how long its GPU calls waited);
     the checkpoint throughput gpu_bytes / gpu_copy_seconds, as a fraction of
     the modelled PCIe bandwidth and of a plain write() of the same bytes into
     the image's filesystem; end to end, gpu_bytes / total_seconds against the
     same write followed by fsync() (baselines measured in the same run: this
     machine is noisy);
  4. once the original has finished (its checksum must be the baseline's),
     `phos restore --json` of the first image, in the foreground: its
     restore_seconds, and the time from starting phos restore until the next
     step line; the restored output must complete the original's to the
     baseline's, bit for bit.

Prints the figures and writes them as JSON to --out; exits 1, saying so, if any
run's output differs from the baseline; 77 (skipped) without CRIU or root.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
DEFAULT_SIZES = [0, 256, 1024]
LARGE_SIZE = 2048
# docs/vgpu.md "Configuration": PCIe 25 GB/s per direction per device unless
# PHOS_VGPU_CONFIG's "pcie_gbps" says otherwise; PHOS_VGPU_BANDWIDTH_SCALE
# multiplies the modelled copy time.
DEFAULT_PCIE_GBPS = 25.0


class Job:
    """A process whose stdout lines are timestamped as they arrive."""

    def __init__(self, cmd, env):
        self.lines = []  # (monotonic time, text)
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.stderr = ""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_err, daemon=True)
        self.err_reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _read_err(self):
        self.stderr = self.proc.stderr.read()

    def wait_lines(self, n, timeout):
        deadline = time.monotonic() + timeout
        while len(self.lines) < n:
            if self.proc.poll() is not None and not self.reader.is_alive():
                fail_run(f"the job exited with {self.proc.returncode} after {len(self.lines)} lines:\n"
                         f"{self.stderr}")
            if time.monotonic() > deadline:
                fail_run(f"timed out waiting for line {n} of the job")
            time.sleep(0.005)
        return self.lines[n - 1][0]

    def finish(self, timeout):
        code = self.proc.wait(timeout)
        self.reader.join(timeout)
        self.err_reader.join(timeout)
        return code

    def texts(self):
        return [text for _, text in self.lines]


class Failure(Exception):
    pass


def fail_run(message):
    raise Failure(message)


def step_gaps(lines):
    """Times between consecutive step lines."""
    times = [t for t, text in lines if text.startswith("step ")]
    return [b - a for a, b in zip(times, times[1:])]


def disk_usage(path: pathlib.Path):
    """(bytes on disk, apparent bytes) of a directory tree, as du and du -b count them."""
    used = apparent = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def write_baseline(directory: pathlib.Path, nbytes: int):
    """Seconds to write `nbytes` into a new file with write(), and with the fsync() after, as dd conv=fsync."""
    path = directory / "write-baseline.bin"
    block = os.urandom(8 * MIB)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, block[:min(left, len(block))])
        written = time.perf_counter() - t0
        os.fsync(fd)
    finally:
        os.close(fd)
    synced = time.perf_counter() - t0
    path.unlink()
    return written, synced


def modelled_pcie_bytes_per_s(env):
    """vgpu's modelled PCIe rate per direction, from the configuration phosd reads (docs/vgpu.md)."""
    gbps, source = DEFAULT_PCIE_GBPS, "docs/vgpu.md default"
    config = env.get("PHOS_VGPU_CONFIG")
    if config:
        with open(config) as f:
            doc = json.load(f)
        if "pcie_gbps" in doc:
            gbps, source = float(doc["pcie_gbps"]), config
    scale = float(env.get("PHOS_VGPU_BANDWIDTH_SCALE", "1"))
    if scale <= 0:
        return None, gbps, scale, source
    return gbps * 1e9 / scale, gbps, scale, source


def phos_cmd(a, runtime_dir, *args):
    return [a.phos, *args, "--runtime-dir", str(runtime_dir)]


def measure(a, size, runtime_dir, work, env, pcie):
    train = [a.mlp, "--iterations", str(a.iterations), "--sleep-ms", str(a.sleep_ms),
             "--state-mib", str(size)]
    run = [a.phos, "run", "--runtime-dir", str(runtime_dir), "--"] + train
    row = {"state_mib": size}

    # 1. Uninterrupted.
    t0 = time.monotonic()
    base = Job(run, env)
    if base.finish(a.timeout) != 0:
        fail_run(f"the uninterrupted job failed:\n{base.stderr}")
    reference = base.texts()
    if len(reference) != a.iterations + 1 or not reference[-1].startswith("weights checksum "):
        fail_run(f"the uninterrupted job printed {len(reference)} lines:\n" + "\n".join(reference[-3:]))
    gap = statistics.median(step_gaps(base.lines))
    row["baseline"] = {"wall_s": time.monotonic() - t0, "median_step_s": gap, "steps_per_s": 1 / gap,
                       "checksum": reference[-1].split()[-1]}

    # 2. The measured checkpoint, through the CLI, the job left running.
    image = work / f"image-{size}"
    job = Job(run, env)
    job.wait_lines(a.at, a.timeout)
    asked = time.monotonic()
    lines_when_asked = len(job.lines)
    r = subprocess.run(phos_cmd(a, runtime_dir, "checkpoint", "--pid", str(job.proc.pid), "--image", str(image),
                                "--leave-running", "--compress", a.compress, "--json"),
                       env=env, capture_output=True, text=True, timeout=a.timeout)
    answered = time.monotonic()
    if r.returncode != 0:
        fail_run(f"phos checkpoint failed ({r.returncode}): {r.stderr}")
    report = json.loads(r.stdout)
    if report.get("gpu_session") is False:
        fail_run(f"phos checkpoint saved no GPU state: {report.get('gpu_note')}")
    lines_at_checkpoint = len(job.lines)
    manifest = json.loads((image / "manifest.json").read_text())
    sessions = manifest.get("state", {}).get("gpu", {}).get("sessions", [])
    if not sessions:
        fail_run(f"the image {image} holds no GPU session (state.gpu.sessions is empty)")
    used, apparent = disk_usage(image)

    # 3. phosd's own figures: how long the device copy took (into host
    # memory, before the application runs again) and how long its GPU calls
    # waited.
    copy_s = report.get("gpu_copy_seconds")
    timed_report = report
    if job.finish(a.timeout) != 0:
        fail_run(f"the checkpointed job (left running) failed:\n{job.stderr}")
    if job.texts() != reference:
        fail_run("the job left running after its checkpoints printed other lines than the uninterrupted run")
    # The stall the job shows: the longest gap between step lines around the
    # checkpoint (the one in flight when it was asked, to the first after it),
    # less an ordinary step.
    around = [(t, text) for t, text in job.lines if text.startswith("step ")]
    before = max((i for i, (t, _) in enumerate(around) if t <= asked), default=0)
    after = next((i for i, (t, _) in enumerate(around) if t >= answered), len(around) - 1)
    stall = max((around[i + 1][0] - around[i][0] for i in range(before, after)), default=0.0) - gap

    # The gpu-memory phase copies and writes the chunks; the image is synced
    # later, when phosd commits it: compare with the write alone, and show
    # the write with its fsync (the disk's own rate) too.
    baseline_bytes = max(report["gpu_bytes"], MIB)
    write_s, synced_s = write_baseline(work, baseline_bytes)
    disk_bps = baseline_bytes / write_s
    gpu_bps = report["gpu_bytes"] / copy_s if copy_s and report["gpu_bytes"] else None
    row["checkpoint"] = {
        "freeze_s": report["freeze_seconds"], "total_s": report["total_seconds"],
        "cli_wall_s": answered - asked, "stall_s": max(stall, 0.0),
        "gpu_bytes": report["gpu_bytes"], "cpu_bytes": report["cpu_bytes"],
        "image_bytes": used, "image_apparent_bytes": apparent,
        "timed": {"freeze_s": timed_report["freeze_seconds"], "total_s": timed_report["total_seconds"],
                  "gpu_bytes": timed_report["gpu_bytes"], "gpu_copy_s": copy_s,
                  "gpu_stall_s": timed_report.get("gpu_stall_seconds")},
        "gpu_copy_bytes_per_s": gpu_bps,
        "fraction_of_pcie": gpu_bps / pcie if gpu_bps and pcie else None,
        "write_baseline_bytes_per_s": disk_bps,
        "write_fsync_baseline_bytes_per_s": baseline_bytes / synced_s,
        "ratio_to_write_baseline": gpu_bps / disk_bps if gpu_bps else None,
        "end_to_end_bytes_per_s": report["gpu_bytes"] / report["total_seconds"],
        "end_to_end_ratio_to_write_fsync": report["gpu_bytes"] / report["total_seconds"] / (baseline_bytes / synced_s),
    }

    # 4. Restore (the original has exited: its pid is free), in the foreground.
    # phosd may still be ending the original's session (its worker holds the
    # session's shared memory a moment after the process is gone) and then
    # refuses the restore; that is retried, counted and reported, not timed.
    retries = 0
    while True:
        started = time.monotonic()
        restored = Job(phos_cmd(a, runtime_dir, "restore", "--image", str(image), "--json"), env)
        code = restored.finish(a.timeout)
        if code == 0 or "is in use by phosd worker" not in restored.stderr or retries >= 50:
            break
        retries += 1
        time.sleep(0.1)
    if retries:
        print(f"  warning: phosd refused {retries} restore(s) while it still held the original's session",
              file=sys.stderr)
    if code != 0:
        fail_run(f"phos restore exited with {code}:\n{restored.stderr}")
    if not restored.lines:
        fail_run(f"the restored job printed nothing:\n{restored.stderr}")
    first = restored.lines[0][0]  # stamped as it arrived
    try:
        restore_report = json.loads(restored.stderr.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        fail_run(f"phos restore --json printed no report:\n{restored.stderr}")
    prefix = reference[:len(reference) - len(restored.lines)]
    if not lines_when_asked <= len(prefix) <= lines_at_checkpoint or \
            prefix + restored.texts() != reference:
        fail_run(f"the restored job's output does not complete the original's to the uninterrupted run's "
                 f"({len(restored.lines)} lines, last: {restored.texts()[-1:]}, expected {reference[-1]})")
    row["restore"] = {"restore_s": restore_report.get("restore_seconds"),
                      "total_s": restore_report.get("total_seconds"),
                      "until_next_step_s": first - started,
                      "gpu_session": restore_report.get("gpu_session"), "refused_while_session_ended": retries}
    row["checksum_ok"] = True
    shutil.rmtree(image, ignore_errors=True)
    return row


def parse_sizes(text):
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of MiB counts: {text}")
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"not a list of MiB counts: {text}")
    return sizes


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def can_checkpoint(phos, name):
    """Whether CRIU can run here (root, and phos doctor finds it usable); says why not on stderr."""
    if os.geteuid() != 0:
        print(f"{name}: skipped: CRIU needs root", file=sys.stderr)
        return False
    doctor = subprocess.run([phos, "doctor", "--json"], capture_output=True, text=True)
    try:
        checks = json.loads(doctor.stdout).get("checks", [])
        if any(c.get("name") == "criu" and c.get("ok") for c in checks):
            return True
    except json.JSONDecodeError:
        pass
    print(f"{name}: skipped: phos doctor finds no usable CRIU:\n{doctor.stdout}{doctor.stderr}", file=sys.stderr)
    return False


def write_results(results, out, failure, all_good):
    """Writes `results` (with "ok") to `out` and says whether the figures stand; the exit code."""
    results["ok"] = failure is None
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    if failure:
        print(f"\n*** WRONG RESULT: {failure}\n*** the figures above are not valid", file=sys.stderr)
        return 1
    print(all_good)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phos", required=True)
    p.add_argument("--mlp", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", type=parse_sizes,
                   default=parse_sizes(os.environ.get("PHOS_BENCH_CHECKPOINT_SIZES", "")) if
                   os.environ.get("PHOS_BENCH_CHECKPOINT_SIZES") else DEFAULT_SIZES)
    p.add_argument("--large", action="store_true", help=f"add the {LARGE_SIZE} MiB point")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--sleep-ms", type=int, default=50)
    p.add_argument("--at", type=int, default=8, help="checkpoint once this many lines have printed")
    p.add_argument("--compress", default="none", choices=["none", "zstd", "lz4"])
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--work-dir", default=None, help="where images go (default: a temporary directory)")
    a = p.parse_args()
    sizes = sorted(set(a.sizes + ([LARGE_SIZE] if a.large else [])))
    if a.at + 4 >= a.iterations:
        p.error("--at must leave at least 4 steps after the checkpoint")

    if not can_checkpoint(a.phos, "checkpoint_bench"):
        return 77

    runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-ckpt-", dir="/tmp"))
    work = pathlib.Path(a.work_dir).resolve() if a.work_dir else pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-images-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PHOS_RUNTIME_DIR=str(runtime_dir))
    for name in ("LD_PRELOAD", "PHOS_LOG_STDERR"):
        env.pop(name, None)
    pcie, pcie_gbps, scale, source = modelled_pcie_bytes_per_s(env)
    results = {"benchmark": "checkpoint", "iterations": a.iterations, "sleep_ms": a.sleep_ms, "at_line": a.at,
               "compress": a.compress, "pcie_gbps": pcie_gbps, "bandwidth_scale": scale, "pcie_source": source,
               "image_dir": str(work), "sizes": []}
    failure = None
    try:
        for size in sizes:
            print(f"state {size} MiB ...", flush=True)
            try:
                results["sizes"].append(measure(a, size, runtime_dir, work, env, pcie))
            except Failure as e:
                failure = f"state {size} MiB: {e}"
                results["sizes"].append({"state_mib": size, "checksum_ok": False, "error": str(e)})
                break
    finally:
        subprocess.run([a.phos, "daemon", "--stop", "--runtime-dir", str(runtime_dir)], env=env,
                       capture_output=True, timeout=60)
        shutil.rmtree(runtime_dir, ignore_errors=True)
        if not a.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"mlp-train --iterations {a.iterations} --sleep-ms {a.sleep_ms}, checkpoint after line {a.at}, "
          f"compress {a.compress}; modelled PCIe {pcie_gbps:g} GB/s x 1/{scale:g} ({source})")
    print(f"{'state':>7} {'steps/s':>8} {'freeze':>7} {'total':>7} {'stall':>7} {'image':>9} {'gpu copy':>9} "
          f"{'GB/s':>6} {'%PCIe':>6} {'/write':>6} {'e2e/sync':>8} {'restore':>8} {'to step':>8}")
    for row in results["sizes"]:
        if "error" in row:
            continue
        c, r = row["checkpoint"], row["restore"]
        gbps = c["gpu_copy_bytes_per_s"] / 1e9 if c["gpu_copy_bytes_per_s"] else None
        pct = 100 * c["fraction_of_pcie"] if c["fraction_of_pcie"] else None
        print(f"{row['state_mib']:>4} MiB {row['baseline']['steps_per_s']:>8.2f} {c['freeze_s']:>6.2f}s "
              f"{c['total_s']:>6.2f}s {c['stall_s']:>6.2f}s {c['image_bytes'] / MIB:>6.0f}MiB "
              f"{fmt(c['timed']['gpu_copy_s'], '>8.3f')}s {fmt(gbps, '>6.2f')} {fmt(pct, '>5.1f')}% "
              f"{fmt(c['ratio_to_write_baseline'], '>6.2f')} {c['end_to_end_ratio_to_write_fsync']:>8.2f} "
              f"{fmt(r['restore_s'], '>7.2f')}s "
              f"{r['until_next_step_s']:>7.2f}s")
    return write_results(results, a.out, failure,
                         "every restored and left-running run printed the uninterrupted run's lines and checksum")


if __name__ == "__main__":
    sys.exit(main())
