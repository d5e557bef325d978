#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# What the concurrent protocols buy: the job's stall per checkpoint protocol, and its time to run again per restore.
"""Usage: protocols_bench.py --phos PHOS --mlp MLP_TRAIN --out FILE
                             [--sizes MIB,...] [--repeats N] [--iterations N] [--sleep-ms MS] [--at STEP]
                             [--tensors N,...] [--host-mib MIB] [--whole-buffers]

For each state size (mlp-train --state-mib; default 256,1024, or
$PHOS_BENCH_PROTOCOL_SIZES), held in one allocation and in 1 MiB allocations
(--state-tensors; --tensors chooses other counts; each step updates a 1 MiB
window of the state), against a private phosd started by `phos run` (bandwidth
model on, as configured), in one run:

  1. baseline: the job uninterrupted; its median time between step lines;
  2. per protocol (stop, cow, recopy), --repeats times: `phos checkpoint
     --leave-running --mode M` once step --at has printed; the stall the job
     shows (the longest gap between step lines around the checkpoint, less the
     baseline's median gap), phosd's gpu_stall_seconds (how long its GPU calls
     waited) and total_seconds; the job must finish as the uninterrupted run;
  3. per restore (eager, concurrent), --repeats times, of the stop-the-world
     image: the time from starting `phos restore` to the job's next step line,
     and what the concurrent loads did; the restored output must complete the
     uninterrupted run's;
  4. with --whole-buffers, cow and recopy again against a second phosd whose
     speculation stays per whole buffer (PHOS_SPECULATION_BOUNDS=0): the
     baseline of dirty tracking below the buffer (docs/speculation.md).

Prints medians and the ratios against stop-the-world and eager restore, writes
everything as JSON to --out and, per state shape, a timeline PNG beside it
(protocols-<MiB>mib-<allocations>.png): for the median run of each protocol and
restore, the job's steps over time with phosd's phases shaded (the checkpoint
report's "timeline", the restore report's gpu_rebuilt/running seconds and its
loads). Exits 1 if any output differs from the baseline, 77 (skipped) without
CRIU or root.
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
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from checkpoint_bench import (Failure, Job, can_checkpoint, fail_run, modelled_pcie_bytes_per_s, parse_sizes,  # noqa: E402
                              step_gaps, write_results)

PROTOCOLS = ["stop", "cow", "recopy"]
RESTORES = ["eager", "concurrent"]


def step_times(job, since):
    """The job's step lines, as seconds since `since`."""
    return [t - since for t, text in job.lines if text.startswith("step ")]


def stall_around(job, asked, answered, gap):
    """The longest gap between step lines from the one in flight at `asked` to the first after `answered`, less `gap`."""
    steps = [(t, text) for t, text in job.lines if text.startswith("step ")]
    before = max((i for i, (t, _) in enumerate(steps) if t <= asked), default=0)
    after = next((i for i, (t, _) in enumerate(steps) if t >= answered), len(steps) - 1)
    longest = max((steps[i + 1][0] - steps[i][0] for i in range(before, after)), default=0.0)
    return max(longest - gap, 0.0)


def checkpoint_once(a, run, env, runtime_dir, image, mode, reference, gap):
    job = Job(run, env)
    job.wait_lines(a.at, a.timeout)
    asked = time.monotonic()
    lines_asked = len(job.lines)
    r = subprocess.run([a.phos, "checkpoint", "--pid", str(job.proc.pid), "--image", str(image), "--leave-running",
                        "--mode", mode, "--json", "--runtime-dir", str(runtime_dir)],
                       env=env, capture_output=True, text=True, timeout=a.timeout)
    answered = time.monotonic()
    if r.returncode != 0:
        job.proc.kill()
        fail_run(f"phos checkpoint --mode {mode} failed ({r.returncode}): {r.stderr}")
    report = json.loads(r.stdout)
    lines_done = len(job.lines)
    if job.finish(a.timeout) != 0 or job.texts() != reference:
        fail_run(f"the job checkpointed with --mode {mode} did not finish as the uninterrupted run:\n{job.stderr}")
    # The copy engine's rate: device memory per second of copying (stop-the-world: into host memory, inside the
    # pause; copy-on-write: into the image, chunk by chunk, the job's own transfers given way to included).
    cow = report.get("copy_on_write") or {}
    copied = report.get("gpu_bytes")
    seconds = cow.get("copy_seconds") if mode == "cow" else report.get("gpu_copy_seconds")
    return {"stall_s": stall_around(job, asked, answered, gap), "gpu_stall_s": report.get("gpu_stall_seconds"),
            "copy_bytes_per_s": copied / seconds if copied and seconds else None,
            "total_s": report.get("total_seconds"), "cli_wall_s": answered - asked, "protocol": report.get("protocol"),
            "copy_on_write": report.get("copy_on_write"), "recopy": report.get("recopy"),
            "lines": (lines_asked, lines_done), "stall_parts": report.get("stall"),
            "timeline": report.get("timeline"), "steps_s": step_times(job, asked)}


def restore_once(a, env, runtime_dir, image, eager, reference, window):
    argv = [a.phos, "restore", "--image", str(image), "--json", "--runtime-dir", str(runtime_dir)]
    for _ in range(50):
        started = time.monotonic()
        job = Job(argv + (["--eager"] if eager else []), env)
        code = job.finish(a.timeout)
        # phosd may still be ending the previous session of this pid.
        if code == 0 or "is in use by phosd worker" not in job.stderr:
            break
        time.sleep(0.1)
    if code != 0 or not job.lines:
        fail_run(f"phos restore{' --eager' if eager else ''} exited with {code}:\n{job.stderr}")
    report = json.loads(job.stderr.strip().splitlines()[-1])
    prefix = reference[:len(reference) - len(job.lines)]
    if not window[0] <= len(prefix) <= window[1] or prefix + job.texts() != reference:
        fail_run("the restored job's output does not complete the uninterrupted run's")
    return {"until_next_step_s": job.lines[0][0] - started, "restore_s": report.get("restore_seconds"),
            "running_s": report.get("running_seconds"), "gpu_rebuilt_s": report.get("gpu_rebuilt_seconds"),
            "concurrent_load": report.get("concurrent_load"), "eager": report.get("eager"),
            "cpu_lazy": report.get("cpu_lazy"), "cpu_loaded_s": report.get("cpu_loaded_seconds"),
            "steps_s": step_times(job, started)}


def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def job_argv(a, runtime_dir, size, tensors):
    return [a.phos, "run", "--runtime-dir", str(runtime_dir), "--", a.mlp, "--iterations", str(a.iterations),
            "--sleep-ms", str(a.sleep_ms), "--state-mib", str(size), "--state-tensors", str(tensors),
            "--host-mib", str(a.host_mib)]


def measure_whole_buffers(a, row, runtime_dir, work, env):
    """cow and recopy of the same job against a phosd that speculates whole buffers (its env says so)."""
    run = job_argv(a, runtime_dir, row["state_mib"], row["state_tensors"])
    base = Job(run, env)
    if base.finish(a.timeout) != 0:
        fail_run(f"the uninterrupted job (whole buffers) failed:\n{base.stderr}")
    reference = base.texts()
    gap = statistics.median(step_gaps(base.lines))
    image = work / f"image-whole-{row['state_mib']}"
    out = {}
    for mode in ("cow", "recopy"):
        runs = []
        for _ in range(a.repeats):
            shutil.rmtree(image, ignore_errors=True)
            runs.append(checkpoint_once(a, run, env, runtime_dir, image, mode, reference, gap))
        shutil.rmtree(image, ignore_errors=True)
        stall = median(runs, "stall_s")
        ours = row["checkpoint"][mode]["median_stall_s"]
        out[mode] = {"median_stall_s": stall, "median_gpu_stall_s": median(runs, "gpu_stall_s"),
                     "median_total_s": median(runs, "total_s"),
                     "stall_ratio_to_stop": stall / row["checkpoint"]["stop"]["median_stall_s"]
                     if row["checkpoint"]["stop"]["median_stall_s"] else None,
                     "bounds_stall_ratio": ours / stall if stall else None, "runs": runs}
    return out


def measure(a, size, tensors, runtime_dir, work, env):
    run = job_argv(a, runtime_dir, size, tensors)
    base = Job(run, env)
    if base.finish(a.timeout) != 0:
        fail_run(f"the uninterrupted job failed:\n{base.stderr}")
    reference = base.texts()
    gap = statistics.median(step_gaps(base.lines))
    row = {"state_mib": size, "state_tensors": tensors, "median_step_s": gap, "checkpoint": {}, "restore": {}}
    window = None
    image = work / f"image-{size}"
    for mode in PROTOCOLS:
        runs = []
        for k in range(a.repeats):
            shutil.rmtree(image, ignore_errors=True)
            runs.append(checkpoint_once(a, run, env, runtime_dir, image, mode, reference, gap))
            if mode == "stop" and k == a.repeats - 1:
                window = runs[-1]["lines"]
                shutil.move(image, work / f"stop-{size}")
        row["checkpoint"][mode] = {"median_stall_s": median(runs, "stall_s"),
                                   "median_gpu_stall_s": median(runs, "gpu_stall_s"),
                                   "median_copy_bytes_per_s": median(runs, "copy_bytes_per_s"),
                                   "median_total_s": median(runs, "total_s"), "runs": runs}
        shutil.rmtree(image, ignore_errors=True)
    for kind in RESTORES:
        runs = [restore_once(a, env, runtime_dir, work / f"stop-{size}", kind == "eager", reference, window)
                for _ in range(a.repeats)]
        row["restore"][kind] = {"median_until_next_step_s": median(runs, "until_next_step_s"), "runs": runs}
    shutil.rmtree(work / f"stop-{size}", ignore_errors=True)
    stop = row["checkpoint"]["stop"]["median_stall_s"]
    for mode in ("cow", "recopy"):
        m = row["checkpoint"][mode]["median_stall_s"]
        row["checkpoint"][mode]["stall_ratio_to_stop"] = m / stop if stop else None
    eager = row["restore"]["eager"]["median_until_next_step_s"]
    row["restore"]["concurrent"]["ratio_to_eager"] = \
        row["restore"]["concurrent"]["median_until_next_step_s"] / eager if eager else None
    return row


# phosd's checkpoint phases, between the boundaries of its report's "timeline".
CHECKPOINT_PHASES = [("before_dump", "pause_asked", "before the pause (twins, staging; recopy: copies, CRIU pre-dump)",
                      "#cfe8cf"),
                     ("pause_asked", "paused", "quiesce", "#f6d55c"),
                     ("paused", "captured", "capture in the pause", "#ed553b"),
                     ("captured", "dumped", "CRIU freeze and dump", "#a05195"),
                     ("dumped", "resumed", "until the job runs again", "#665191"),
                     ("resumed", "saved", "saving while the job runs", "#3caea3")]
RESTORE_PHASES = [("GPU session re-created (eager: with its memory)", "#7eb0d5"),
                  ("CRIU restores the process", "#fd7f6f"),
                  ("device memory loads while the job runs (its launches run as restore twins)", "#b2e061")]


def median_run(runs, key):
    ordered = sorted((r for r in runs if r.get(key) is not None), key=lambda r: r[key])
    return ordered[len(ordered) // 2] if ordered else None


def draw_timelines(row, png):
    """One lane per protocol and restore: the job's steps (ticks) and phosd's phases (shaded), from the request."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lanes = []
    for mode in PROTOCOLS:
        run = median_run(row["checkpoint"][mode]["runs"], "stall_s")
        t = (run or {}).get("timeline") or {}
        spans = [(t[a], t[b], label, color) for a, b, label, color in CHECKPOINT_PHASES if a in t and b in t]
        lanes.append((f"checkpoint {mode}\nstall {run['stall_s']:.3f} s", run["steps_s"], spans))
    for kind in RESTORES:
        run = median_run(row["restore"][kind]["runs"], "until_next_step_s")
        rebuilt, running = run.get("gpu_rebuilt_s"), run.get("running_s")
        spans = []
        if rebuilt is not None and running is not None:
            spans += [(0.0, rebuilt, *RESTORE_PHASES[0]), (rebuilt, running, *RESTORE_PHASES[1])]
            load = (run.get("concurrent_load") or {}).get("load_seconds")
            if load:
                spans.append((running, running + load, *RESTORE_PHASES[2]))
        lanes.append((f"restore {kind}\nnext step {run['until_next_step_s']:.3f} s", run["steps_s"], spans))
    end = max([s[1] for _, _, spans in lanes for s in spans] + [0.0])
    end = max(end, max((steps[0] for _, steps, _ in lanes if steps), default=0.0)) + 2 * row["median_step_s"] + 0.2
    fig, ax = plt.subplots(figsize=(11, 0.9 * len(lanes) + 1.6))
    seen = set()
    for y, (name, steps, spans) in enumerate(reversed(lanes)):
        for a, b, label, color in spans:
            ax.broken_barh([(a, max(b - a, 1e-4))], (y - 0.35, 0.7), color=color,
                           label=None if label in seen else label)
            seen.add(label)
        xs = [x for x in steps if -1.0 <= x <= end]
        ax.vlines(xs, y - 0.4, y + 0.4, color="black", lw=0.8, label=None if "step" in seen else "a step of the job")
        seen.add("step")
    ax.set_yticks(range(len(lanes)), [name for name, _, _ in reversed(lanes)], fontsize=8)
    ax.set_xlim(-0.5, end)
    ax.axvline(0, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("seconds since phos checkpoint / phos restore started (phosd's phases from its receipt of the "
                  "request)", fontsize=8)
    ax.set_title(f"mlp-train, {row['state_mib']} MiB in {row['state_tensors']} allocation(s): "
                 f"median runs", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phos", required=True)
    p.add_argument("--mlp", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", type=parse_sizes,
                   default=parse_sizes(os.environ.get("PHOS_BENCH_PROTOCOL_SIZES", "256,1024")))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--sleep-ms", type=int, default=20)
    p.add_argument("--at", type=int, default=6)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--tensors", type=parse_sizes, default=None,
                   help="allocations the state is held in (default: 1 and one per MiB)")
    p.add_argument("--host-mib", type=int, default=int(os.environ.get("PHOS_BENCH_PROTOCOL_HOST_MIB", "0")),
                   help="host memory of the job, a data set a batch of which each step reads (mlp-train "
                        "--host-mib; default 0 or $PHOS_BENCH_PROTOCOL_HOST_MIB): what a restore loads on demand")
    p.add_argument("--whole-buffers", action="store_true",
                   help="also run cow and recopy with speculation per whole buffer (PHOS_SPECULATION_BOUNDS=0)")
    a = p.parse_args()
    if not can_checkpoint(a.phos, "protocols_bench"):
        return 77

    runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-proto-", dir="/tmp"))
    whole_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-proto-whole-", dir="/tmp"))
    work = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-proto-images-"))
    env = dict(os.environ, PHOS_RUNTIME_DIR=str(runtime_dir))
    for name in ("LD_PRELOAD", "PHOS_LOG_STDERR", "PHOS_SPECULATION_BOUNDS"):
        env.pop(name, None)
    whole_env = dict(env, PHOS_RUNTIME_DIR=str(whole_dir), PHOS_SPECULATION_BOUNDS="0")
    _, pcie_gbps, scale, source = modelled_pcie_bytes_per_s(env)
    results = {"benchmark": "protocols", "whole_buffers_baseline": a.whole_buffers, "iterations": a.iterations,
               "sleep_ms": a.sleep_ms, "at_line": a.at, "repeats": a.repeats, "host_mib": a.host_mib,
               "pcie_gbps": pcie_gbps,
               "bandwidth_scale": scale, "sizes": []}
    failure = None
    try:
        for size in a.sizes:
            for tensors in sorted({max(1, min(t, size)) for t in (a.tensors or [1, size])}):
                print(f"state {size} MiB in {tensors} allocation(s) ...", flush=True)
                try:
                    row = measure(a, size, tensors, runtime_dir, work, env)
                    if a.whole_buffers:
                        row["whole_buffers"] = measure_whole_buffers(a, row, whole_dir, work, whole_env)
                    results["sizes"].append(row)
                except Failure as e:
                    failure = f"state {size} MiB in {tensors} allocation(s): {e}"
                    break
            if failure:
                break
    finally:
        for d in (runtime_dir, whole_dir):
            subprocess.run([a.phos, "daemon", "--stop", "--runtime-dir", str(d)], env=env, capture_output=True,
                           timeout=60)
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"mlp-train --iterations {a.iterations} --sleep-ms {a.sleep_ms} --host-mib {a.host_mib}, checkpoint "
          f"(--leave-running) after line "
          f"{a.at}, medians of {a.repeats}; modelled PCIe {pcie_gbps:g} GB/s x 1/{scale:g} ({source})")
    print(f"{'state':>8} {'allocs':>6} {'protocol':>9} {'job stall':>10} {'GPU calls wait':>15} {'total':>7} "
          f"{'stall/stop':>11}")
    for row in results["sizes"]:
        for mode in PROTOCOLS:
            c = row["checkpoint"][mode]
            print(f"{row['state_mib']:>4} MiB {row['state_tensors']:>6} {mode:>9} {fmt(c['median_stall_s'], '>9.3f')}s "
                  f"{fmt(c['median_gpu_stall_s'], '>14.3f')}s {fmt(c['median_total_s'], '>6.2f')}s "
                  f"{fmt(c.get('stall_ratio_to_stop'), '>11.2f')}")
        for mode, c in row.get("whole_buffers", {}).items():
            print(f"{row['state_mib']:>4} MiB {row['state_tensors']:>6} {mode + '/whole':>9} "
                  f"{fmt(c['median_stall_s'], '>9.3f')}s {fmt(c['median_gpu_stall_s'], '>14.3f')}s "
                  f"{fmt(c['median_total_s'], '>6.2f')}s {fmt(c.get('stall_ratio_to_stop'), '>11.2f')}")
    link = pcie_gbps * 1e9 / scale if scale else None
    for row in results["sizes"]:
        rates = {mode: row["checkpoint"][mode].get("median_copy_bytes_per_s") for mode in ("stop", "cow")}
        if link and all(rates.values()):
            print(f"{row['state_mib']:>4} MiB {row['state_tensors']:>6} copy engine: stop {rates['stop'] / link:.0%}, "
                  f"cow {rates['cow'] / link:.0%} of the modelled link ({link / 1e9:.2f} GB/s)")
    print(f"{'state':>8} {'allocs':>6} {'restore':>11} {'to next step':>13} {'/eager':>7}")
    for row in results["sizes"]:
        for kind in RESTORES:
            r = row["restore"][kind]
            print(f"{row['state_mib']:>4} MiB {row['state_tensors']:>6} {kind:>11} "
                  f"{fmt(r['median_until_next_step_s'], '>12.3f')}s "
                  f"{fmt(r.get('ratio_to_eager'), '>7.2f')}")
    for row in results["sizes"]:
        png = pathlib.Path(a.out).with_name(f"protocols-{row['state_mib']}mib-{row['state_tensors']}.png")
        draw_timelines(row, png)
        print(f"timeline: {png}")
    return write_results(results, a.out, failure,
                         "every checkpointed and restored run printed the uninterrupted run's lines")


if __name__ == "__main__":
    sys.exit(main())
