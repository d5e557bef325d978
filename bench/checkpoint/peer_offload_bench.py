#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# What peer offload buys a multi-GPU copy-on-write checkpoint: the job's stall per scheduler.
"""Usage: peer_offload_bench.py --phos PHOS --mlp MLP_TRAIN --out FILE
                                [--repeats N] [--iterations N] [--sleep-ms MS] [--at STEP] [--scale S]

A vgpu platform of four devices of --memory-mib MiB, NVLink between every pair
(48 GB/s) and PCIe to the host (12 GB/s), the DGX-1's figures, every copy
taking --scale times its modelled time. mlp-train --devices 4 keeps its state
unevenly: --state-mib 192,128,32,32 by default, so device 0 has little memory
left for copy-on-write shadows and devices 2 and 3 have plenty; each device
rewrites --dirty-mib of it per step. In one run, against a private phosd
started by `phos run`:

  1. the job uninterrupted: its lines (the reference) and its median step;
  2. --repeats rounds, each checkpointing the job (`phos checkpoint
     --leave-running --mode cow --peer-offload P`, once line --at has printed)
     with P = baseline (no peer offload: a write that finds its device's
     reserve full waits for the copy to the image), greedy and exact, in a
     rotating order; per run the stall the job shows (the longest gap between
     its step lines from the request to the answer, less the median step),
     how long phosd made its GPU calls wait (copy_on_write.waited_seconds),
     the chunks shadowed on peers, and the plan's modelled blocking time. Every
     job must finish with the reference's lines.

Prints medians and the ratios to the baseline, writes everything as JSON to
--out; exits 1 if an output differs, 77 (skipped) without CRIU or root.
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
from checkpoint_bench import Failure, Job, can_checkpoint, fail_run, step_gaps, write_results  # noqa: E402
from protocols_bench import stall_around  # noqa: E402

SCHEDULERS = ["baseline", "greedy", "exact"]
MIB = 1 << 20


def checkpoint_once(a, run, env, runtime_dir, image, scheduler, reference, gap):
    job = Job(run, env)
    job.wait_lines(a.at, a.timeout)
    asked = time.monotonic()
    r = subprocess.run([a.phos, "checkpoint", "--pid", str(job.proc.pid), "--image", str(image), "--leave-running",
                        "--mode", "cow", "--peer-offload", scheduler, "--compress", "none", "--json",
                        "--runtime-dir", str(runtime_dir)],
                       env=env, capture_output=True, text=True, timeout=a.timeout)
    answered = time.monotonic()
    if r.returncode != 0:
        job.proc.kill()
        fail_run(f"phos checkpoint --peer-offload {scheduler} failed ({r.returncode}): {r.stderr}")
    report = json.loads(r.stdout)
    if job.finish(a.timeout) != 0 or job.texts() != reference:
        fail_run(f"the job checkpointed with --peer-offload {scheduler} did not finish as the uninterrupted run:\n"
                 f"{job.stderr}")
    cow = report.get("copy_on_write") or {}
    if report.get("protocol") != "soft-copy-on-write" or "peer_offload" not in cow:
        fail_run(f"not a multi-device copy-on-write checkpoint: {json.dumps(report)[:2000]}")
    plan = cow["peer_offload"]
    return {"stall_s": stall_around(job, asked, answered, gap), "waited_s": cow["waited_seconds"],
            "waited_calls": cow["waited_calls"], "shadowed_chunks": cow["shadowed_chunks"],
            "peer_shadowed_chunks": cow["peer_shadowed_chunks"], "copy_s": cow["copy_seconds"],
            "gpu_stall_s": report.get("gpu_stall_seconds"), "total_s": report.get("total_seconds"),
            "modelled_blocking_s": plan.get("blocking_seconds"), "plan": plan}


def median(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phos", required=True)
    p.add_argument("--mlp", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--sleep-ms", type=int, default=20)
    p.add_argument("--at", type=int, default=6)
    p.add_argument("--memory-mib", type=int, default=256)
    p.add_argument("--state-mib", default="192,128,32,32")
    p.add_argument("--dirty-mib", type=int, default=8)
    p.add_argument("--scale", type=float, default=float(os.environ.get("PHOS_VGPU_BANDWIDTH_SCALE", "100")))
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    if not can_checkpoint(a.phos, "peer_offload_bench"):
        return 77

    devices = len(a.state_mib.split(","))
    runtime_dir = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-offload-", dir="/tmp"))
    work = pathlib.Path(tempfile.mkdtemp(prefix="phos-bench-offload-images-"))
    platform = {"pcie_gbps": 12.0, "nvlink_gbps": 48.0, "devices": [{"memory": a.memory_mib * MIB}] * devices}
    config = work / "vgpu.json"
    config.write_text(json.dumps(platform))
    env = dict(os.environ, PHOS_RUNTIME_DIR=str(runtime_dir), PHOS_VGPU_CONFIG=str(config),
               PHOS_VGPU_BANDWIDTH_SCALE=str(a.scale))
    for name in ("LD_PRELOAD", "PHOS_LOG_STDERR"):
        env.pop(name, None)
    run = [a.phos, "run", "--runtime-dir", str(runtime_dir), "--", a.mlp, "--iterations", str(a.iterations),
           "--sleep-ms", str(a.sleep_ms), "--devices", str(devices), "--state-mib", a.state_mib,
           "--state-tensors", "8", "--dirty-mib", str(a.dirty_mib), "--dirty-spread"]
    results = {"benchmark": "peer_offload", "platform": platform, "bandwidth_scale": a.scale,
               "state_mib": a.state_mib, "dirty_mib_per_step": a.dirty_mib, "iterations": a.iterations,
               "sleep_ms": a.sleep_ms, "at_line": a.at, "repeats": a.repeats, "schedulers": {}}
    failure = None
    try:
        base = Job(run, env)
        if base.finish(a.timeout) != 0:
            fail_run(f"the uninterrupted job failed:\n{base.stderr}")
        reference = base.texts()
        gap = statistics.median(step_gaps(base.lines))
        results["median_step_s"] = gap
        runs = {s: [] for s in SCHEDULERS}
        for k in range(a.repeats):
            for scheduler in SCHEDULERS[k % len(SCHEDULERS):] + SCHEDULERS[:k % len(SCHEDULERS)]:
                image = work / "image"
                shutil.rmtree(image, ignore_errors=True)
                print(f"round {k + 1}: --peer-offload {scheduler} ...", flush=True)
                runs[scheduler].append(checkpoint_once(a, run, env, runtime_dir, image, scheduler, reference, gap))
        for s in SCHEDULERS:
            results["schedulers"][s] = {key: median(runs[s], key) for key in
                                        ("stall_s", "waited_s", "peer_shadowed_chunks", "shadowed_chunks",
                                         "modelled_blocking_s", "copy_s", "total_s")}
            results["schedulers"][s]["runs"] = runs[s]
        first = SCHEDULERS[0]
        for s in SCHEDULERS:
            for key in ("stall_s", "waited_s"):
                b, m = results["schedulers"][first][key], results["schedulers"][s][key]
                results["schedulers"][s][f"{key[:-2]}_ratio_to_baseline"] = m / b if b else None
    except Failure as e:
        failure = str(e)
    finally:
        subprocess.run([a.phos, "daemon", "--stop", "--runtime-dir", str(runtime_dir)], env=env,
                       capture_output=True, timeout=60)
        shutil.rmtree(runtime_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"mlp-train --devices {devices} --state-mib {a.state_mib} --dirty-mib {a.dirty_mib} on {devices} x "
          f"{a.memory_mib} MiB, NVLink 48 GB/s, PCIe 12 GB/s, copies x{a.scale:g}; cow checkpoint after line {a.at}, "
          f"medians of {a.repeats}; median step {results.get('median_step_s', 0):.3f} s")
    print(f"{'scheduler':>9} {'job stall':>10} {'/baseline':>10} {'calls wait':>11} {'/baseline':>10} "
          f"{'peer shadows':>13} {'model blocking':>15} {'copy':>7}")

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for s, r in results["schedulers"].items():
        print(f"{s:>9} {fmt(r['stall_s'], '>9.3f')}s {fmt(r.get('stall_ratio_to_baseline'), '>10.2f')} "
              f"{fmt(r['waited_s'], '>10.3f')}s {fmt(r.get('waited_ratio_to_baseline'), '>10.2f')} "
              f"{fmt(r['peer_shadowed_chunks'], '>13.0f')} {fmt(r['modelled_blocking_s'], '>14.4f')}s "
              f"{fmt(r['copy_s'], '>6.2f')}s")
    return write_results(results, a.out, failure, "every checkpointed run printed the uninterrupted run's lines")


if __name__ == "__main__":
    sys.exit(main())
