#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Live migration: downtime and total time, pre-copy against stop-the-world, over a modelled link.
"""Usage: migration_bench.py --phos PHOS --mlp MLP_TRAIN --testhosts SCRIPT --out FILE --png FILE
                             [--rate RATE] [--sizes MIB,...] [--dirty MIB,...]

Two test hosts (scripts/testhosts up 2 --rate RATE: network, pid and mount
namespaces, each with its phosd, the link shaped by tc tbf, 1gbit by default).
For each model size (mlp-train --state-mib, in 4 MiB tensors; default 128,512 or
$PHOS_BENCH_MIGRATION_SIZES) and write rate (--dirty-mib: MiB of the state the
job writes per step; default 1,8), and each mode (recopy: pre-copy, the job
running on the target while the rest loads; stop: stop-the-world), in one run:
the job starts on h1, `phos migrate --compress none` (model weights hardly
compress) moves it to h2 once it has run 8 steps and 2 s, and it runs 2 s more there.

Figures per run: phosd's downtime (the final quiesce on h1 to the job running on
h2), the job's own view of it (the longest gap between its step lines around the
migration, less its median step time), the total migration time, and the bytes
sent while the job ran and while it was stopped. The ratio of downtimes
(stop-the-world / pre-copy) per size and write rate. The PNG shows the job's
throughput (steps per second) over time for both modes at the largest size and
lowest write rate, as the PhOS paper's figure 13 does. Exits 77 (skipped)
without root or tini.
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


def run(cmd, timeout=120, env=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)


class Hosts:
    def __init__(self, script, phos, rate, env):
        self.script, self.phos, self.env = script, phos, env
        run([script, "down"])
        r = run([script, "up", 2, "--rate", rate, "--daemon", phos], env=env)
        if r.returncode != 0:
            raise SystemExit(f"testhosts up failed: {r.stderr}")

    def on(self, host, *cmd, timeout=300):
        return run([self.script, "exec", host, "--", *cmd], timeout=timeout, env=self.env)

    def down(self):
        run([self.script, "down"])


class Timeline:
    """The job's step lines as it writes them (its output file, polled every 5 ms)."""

    def __init__(self, path):
        self.path, self.times, self.stop = path, [], False
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self):
        seen = 0
        while not self.stop:
            try:
                count = sum(1 for line in self.path.read_text().splitlines() if line.startswith("step "))
            except FileNotFoundError:
                count = 0
            now = time.monotonic()
            self.times.extend([now] * (count - seen))
            seen = max(seen, count)
            time.sleep(0.005)

    def steps(self):
        return len(self.times)

    def close(self):
        self.stop = True
        self.thread.join()


def one_migration(hosts, args, size, dirty, mode, work):
    out = work / f"job-{size}-{dirty}-{mode}.out"
    tensors = max(1, size // 4)
    job = (f"{args.mlp} --iterations 1000000 --state-mib {size} --state-tensors {tensors} --dirty-mib {dirty}")
    r = hosts.on("h1", "sh", "-c", f"exec setsid -f {args.phos} run -- {job} > {out} 2>&1 < /dev/null")
    if r.returncode != 0:
        raise SystemExit(f"cannot start the job: {r.stderr}")
    timeline = Timeline(out)
    deadline = time.monotonic() + 120
    # 8 steps, and 2 s of its steady pace for the timeline.
    while timeline.steps() < 8 or time.monotonic() - timeline.times[0] < 2.0:
        if time.monotonic() > deadline:
            raise SystemExit(f"the job did not run 8 steps: {out.read_text()[-2000:]}")
        time.sleep(0.05)
    sessions = json.loads(hosts.on("h1", args.phos, "ps", "--json").stdout)
    pid = sessions[0]["pid"]
    asked = time.monotonic()
    r = hosts.on("h1", args.phos, "migrate", "--pid", pid, "--to", "10.231.0.2", "--mode", mode,
                 "--compress", "none", "--json")
    answered = time.monotonic()
    if r.returncode != 0:
        raise SystemExit(f"phos migrate --mode {mode} failed: {r.stderr}")
    report = json.loads(r.stdout)
    time.sleep(2.0)
    timeline.close()
    hosts.on("h2", "kill", "-KILL", pid)
    times = timeline.times
    gaps = [b - a for a, b in zip(times, times[1:])]
    before = [b - a for a, b in zip(times, times[1:]) if b <= asked]
    step = statistics.median(before) if before else 0.0
    around = [b - a for a, b in zip(times, times[1:]) if b >= asked and a <= answered + 1.0]
    m = report["migration"]
    return {
        "size_mib": size, "dirty_mib_per_step": dirty, "mode": mode, "protocol": report["protocol"],
        "downtime_seconds": m.get("downtime_seconds"),
        # Its parts: the source's quiesce to the hand-over (CRIU's dump, the image written here), the hand-over
        # until "go", and on the target phos restore until the job is served.
        "downtime_parts": {"dump_seconds": m.get("dump_seconds"), "transfer_seconds": m.get("transfer_seconds"),
                           "target_running_seconds": m.get("target_report", {}).get("running_seconds")},
        "stall_parts": report.get("stall"),
        "job_gap_seconds": max(around) - step if around else None,
        "median_step_seconds": step,
        "total_seconds": answered - asked,
        "gpu_stall_seconds": report["gpu_stall_seconds"],
        "precopy_wire_bytes": m["precopy_wire_bytes"], "stopped_wire_bytes": m["image_wire_bytes"],
        "cached_chunks": m["cached_chunks"], "image_chunks": m["image_chunks"],
        "recopy": report.get("recopy", {}), "target": m.get("target_report", {}),
        "timeline": {"asked": asked, "answered": answered, "steps": times}, "max_gap_seconds": max(gaps) if gaps else 0,
    }


def plot(runs, png, rate):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), sharex=True)
    for ax, run_ in zip(axes if len(runs) > 1 else [axes], runs):
        t0 = run_["timeline"]["asked"]
        steps = [t - t0 for t in run_["timeline"]["steps"]]
        window = 0.5
        xs, ys = [], []
        x = max(-3.0, steps[0])
        while x <= steps[-1]:
            xs.append(x)
            ys.append(sum(1 for s in steps if x - window < s <= x) / window)
            x += 0.05
        ax.plot(xs, ys, lw=1.2)
        ax.axvline(0, color="grey", ls="--", lw=0.8)
        ax.axvline(run_["timeline"]["answered"] - t0, color="grey", ls=":", lw=0.8)
        ax.set_ylabel("steps/s")
        ax.set_title(f"{run_['protocol']}: downtime {run_['downtime_seconds']:.2f} s, "
                     f"total {run_['total_seconds']:.2f} s ({run_['size_mib']} MiB, "
                     f"{run_['dirty_mib_per_step']} MiB written per step, link {rate})", fontsize=9)
    (axes[-1] if len(runs) > 1 else axes).set_xlabel("seconds since phos migrate (dashed: asked; dotted: done)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phos", required=True)
    p.add_argument("--mlp", required=True)
    p.add_argument("--testhosts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--png", required=True)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--sizes", default=os.environ.get("PHOS_BENCH_MIGRATION_SIZES", "128,512"))
    p.add_argument("--dirty", default="1,8")
    args = p.parse_args()
    if os.geteuid() != 0 or shutil.which("tini") is None:
        print("migration bench: needs root and tini (scripts/setup); skipped")
        return 77
    sizes = [int(s) for s in args.sizes.split(",")]
    dirty = [int(d) for d in args.dirty.split(",")]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([str(pathlib.Path(args.phos).resolve().parents[1] / "vgpu"),
                                       env.get("LD_LIBRARY_PATH", "")])
    hosts = Hosts(args.testhosts, args.phos, args.rate, env)
    work = pathlib.Path(tempfile.mkdtemp(prefix="phos-migration-bench."))
    runs = []
    try:
        for size in sizes:
            for d in dirty:
                for mode in ["recopy", "stop"]:
                    r = one_migration(hosts, args, size, d, mode, work)
                    runs.append(r)
                    print(f"{size:5d} MiB  {d:2d} MiB/step  {mode:6s}  downtime {r['downtime_seconds']:.3f} s  "
                          f"(job saw {r['job_gap_seconds']:.3f} s)  total {r['total_seconds']:.2f} s  "
                          f"sent running {r['precopy_wire_bytes'] / 2**20:.0f} MiB, stopped "
                          f"{r['stopped_wire_bytes'] / 2**20:.0f} MiB", flush=True)
                    parts = r["downtime_parts"]
                    if all(v is not None for v in parts.values()):
                        print(f"{'':27s}downtime: dump {parts['dump_seconds']:.3f} s, hand-over "
                              f"{parts['transfer_seconds']:.3f} s, target restore {parts['target_running_seconds']:.3f} s",
                              flush=True)
    finally:
        hosts.down()
        shutil.rmtree(work, ignore_errors=True)
    ratios = []
    for size in sizes:
        for d in dirty:
            pre = next(r for r in runs if r["size_mib"] == size and r["dirty_mib_per_step"] == d and r["mode"] == "recopy")
            stw = next(r for r in runs if r["size_mib"] == size and r["dirty_mib_per_step"] == d and r["mode"] == "stop")
            ratios.append({"size_mib": size, "dirty_mib_per_step": d,
                           "downtime_ratio": stw["downtime_seconds"] / pre["downtime_seconds"],
                           "job_gap_ratio": stw["job_gap_seconds"] / max(pre["job_gap_seconds"], 1e-3),
                           "total_ratio": stw["total_seconds"] / pre["total_seconds"]})
            print(f"{size:5d} MiB  {d:2d} MiB/step  stop-the-world / pre-copy: downtime x{ratios[-1]['downtime_ratio']:.2f}"
                  f"  (job's view x{ratios[-1]['job_gap_ratio']:.2f}), total x{ratios[-1]['total_ratio']:.2f}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    shown = [r for r in runs if r["size_mib"] == max(sizes) and r["dirty_mib_per_step"] == min(dirty)]
    plot(shown, args.png, args.rate)
    pathlib.Path(args.out).write_text(json.dumps({"rate": args.rate, "runs": runs, "ratios": ratios}, indent=1))
    print(f"wrote {args.out} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
