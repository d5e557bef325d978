#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The cost of API remoting: each client runs directly on vgpu and through libphos.so + phosd, in the same run.
"""Usage: shim_bench.py --phos PHOS --libphos LIBPHOS --launch LAUNCH_BENCH --h2d H2D_BENCH
                       --mlp MLP_TRAIN [--iterations N] [--pairs N] --out FILE

Measures, against direct vgpu as the baseline:
  - kernel launch latency: asynchronous enqueue and launch+synchronize round
    trip (bench/vgpu/launch_latency.cpp, bandwidth model off);
  - copy bandwidth between the device and pageable or pinned memory, both
    ways (h2d_bandwidth.cpp, bandwidth model on: PCIe 25 GB/s per direction);
  - slowdown of the C++ training example (examples/mlp), wall time of whole
    runs, direct and under PhOS alternating, and that both print the same.
Prints the figures and writes them as JSON to --out.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


class Daemon:
    """A private phosd with its own runtime directory and vgpu settings."""

    def __init__(self, phos, env):
        self.dir = tempfile.mkdtemp(prefix="phos-bench-")
        self.env = dict(os.environ, **env, PHOS_RUNTIME_DIR=self.dir)
        self.log = open(os.path.join(self.dir, "phosd.log"), "w")
        self.proc = subprocess.Popen([phos, "daemon", "--runtime-dir", self.dir, "--pool", "1"],
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if subprocess.run([phos, "ps", "--runtime-dir", self.dir], env=self.env,
                              capture_output=True).returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        sys.exit(f"shim_bench: phosd did not start (log: {self.log.name})")

    def client_env(self, libphos):
        return dict(self.env, LD_PRELOAD=libphos)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def run_json(cmd, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    subprocess.run(cmd + ["--out", path], env=env, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    return data


def timed(cmd, env):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t0, out


def main():
    p = argparse.ArgumentParser()
    for name in ("phos", "libphos", "launch", "h2d", "mlp", "out"):
        p.add_argument("--" + name, required=True)
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--pairs", type=int, default=5)
    a = p.parse_args()
    results = {"benchmark": "shim"}

    # Launch latency, bandwidth model off on both sides.
    model_off = {"PHOS_VGPU_BANDWIDTH_SCALE": "0"}
    d = Daemon(a.phos, model_off)
    try:
        direct = run_json([a.launch], dict(os.environ, **model_off))
        shim = run_json([a.launch], d.client_env(a.libphos))
    finally:
        d.stop()
    launch = []
    print("launch latency (microseconds, median)        direct      phos     ratio")
    for dr, sr in zip(direct["operations"], shim["operations"]):
        row = {"operation": dr["operation"]}
        for key in ("enqueue", "batch_per_op", "round_trip"):
            dv, sv = dr[key]["median_us"], sr[key]["median_us"]
            row[key] = {"direct_us": dv, "phos_us": sv, "ratio": sv / dv if dv else None}
            print(f"  {dr['operation'][:30]:30} {key:12} {dv:9.2f} {sv:9.2f} {sv / dv if dv else 0:8.2f}x")
        launch.append(row)
    results["launch"] = launch

    # Copy bandwidth and the training example, bandwidth model on (defaults).
    d = Daemon(a.phos, {})
    try:
        direct = run_json([a.h2d], dict(os.environ))
        shim = run_json([a.h2d], d.client_env(a.libphos))
        results["h2d"] = {
            kind: {"direct_gbps": direct[kind], "phos_gbps": shim[kind], "ratio": shim[kind] / direct[kind]}
            for kind in ("pageable_gbps", "pinned_gbps", "d2h_pageable_gbps", "d2h_pinned_gbps")
        }
        print("copy bandwidth (GB/s)                        direct      phos     ratio")
        names = {"pageable_gbps": "to the device from pageable", "pinned_gbps": "to the device from pinned",
                 "d2h_pageable_gbps": "from the device to pageable", "d2h_pinned_gbps": "from the device to pinned"}
        for kind, r in results["h2d"].items():
            print(f"  {names[kind]:43} {r['direct_gbps']:9.2f} {r['phos_gbps']:9.2f} {r['ratio']:8.3f}")

        cmd = [a.mlp, "--iterations", str(a.iterations)]
        direct_times, shim_times = [], []
        outputs = set()
        for _ in range(a.pairs):
            t, out = timed(cmd, dict(os.environ))
            direct_times.append(t)
            outputs.add(out)
            t, out = timed(cmd, d.client_env(a.libphos))
            shim_times.append(t)
            outputs.add(out)
    finally:
        d.stop()
    dm, sm = statistics.median(direct_times), statistics.median(shim_times)
    results["mlp_train"] = {
        "iterations": a.iterations, "pairs": a.pairs,
        "direct_s": direct_times, "phos_s": shim_times,
        "direct_median_s": dm, "phos_median_s": sm, "slowdown": sm / dm - 1,
        "identical_output": len(outputs) == 1,
    }
    print(f"mlp-train --iterations {a.iterations}, {a.pairs} pairs: direct {dm:.3f} s, phos {sm:.3f} s, "
          f"slowdown {100 * (sm / dm - 1):+.1f}% (aim: <= 3%); outputs identical: {len(outputs) == 1}")
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    return 0 if len(outputs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
