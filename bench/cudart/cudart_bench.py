#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The cost of PhOS for CUDA runtime programs: each runs directly on vgpu and under `phos run`, in the same run.
"""Usage: cudart_bench.py --phos PHOS --launch CUDART_LAUNCH --train TRAIN
                         [--cupy-job CUPY_JOB --python PYTHON] [--pairs N] --out FILE

Measures, against direct vgpu as the baseline (bandwidth model off):
  - launch latency of <<<>>> launches of an empty kernel from a plain nvcc
    program (cudart_launch.cu): asynchronous enqueue, sustained per launch,
    launch + synchronize;
  - wall time of whole runs of runtime programs, direct and under PhOS
    alternating (pairs), and that both print the same: tests/cudart's train
    (static cudart, nvcc's fatbin, module globals) and, when CuPy is
    importable, the CuPy job of tests/python (kernels compiled by NVRTC).
Prints the figures and writes them as JSON to --out.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def start_daemon(phos, env, runtime_dir):
    log = open(os.path.join(runtime_dir, "phosd.log"), "w")
    proc = subprocess.Popen([phos, "daemon", "--runtime-dir", runtime_dir, "--pool", "1"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if subprocess.run([phos, "ps", "--runtime-dir", runtime_dir], env=env, capture_output=True).returncode == 0:
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"cudart_bench: phosd did not start (log: {log.name})")


def launch_figures(cmd, env):
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


def paired(name, cmd, direct_env, phos_cmd, phos_env, pairs):
    direct, under, outputs = [], [], set()
    for _ in range(pairs):
        t, out = timed(cmd, direct_env)
        direct.append(t)
        outputs.add(out)
        t, out = timed(phos_cmd + cmd, phos_env)
        under.append(t)
        outputs.add(out)
    dm, pm = statistics.median(direct), statistics.median(under)
    print(f"{name}: direct {dm:.3f} s, phos {pm:.3f} s, ratio {pm / dm:.2f}; outputs identical: {len(outputs) == 1}")
    return {"command": cmd, "pairs": pairs, "direct_s": direct, "phos_s": under, "direct_median_s": dm,
            "phos_median_s": pm, "ratio": pm / dm, "identical_output": len(outputs) == 1}


def main():
    p = argparse.ArgumentParser()
    for name in ("phos", "launch", "train", "out"):
        p.add_argument("--" + name, required=True)
    p.add_argument("--cupy-job")
    p.add_argument("--python", help="a Python with CuPy (the project's .venv)")
    p.add_argument("--pairs", type=int, default=5)
    a = p.parse_args()
    vgpu_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.phos))), "vgpu")
    direct_env = dict(os.environ, PHOS_VGPU_BANDWIDTH_SCALE="0",
                      LD_LIBRARY_PATH=":".join([vgpu_dir, os.environ.get("LD_LIBRARY_PATH", "")]))
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR"):
        direct_env.pop(name, None)
    runtime_dir = tempfile.mkdtemp(prefix="phos-cudart-bench-")
    daemon = start_daemon(a.phos, direct_env, runtime_dir)
    phos_cmd = [a.phos, "run", "--runtime-dir", runtime_dir, "--"]
    results = {"benchmark": "cudart"}
    try:
        direct = launch_figures([a.launch], direct_env)
        under = launch_figures(phos_cmd + [a.launch], direct_env)
        print("cudart launch latency (microseconds, median)    direct      phos     ratio")
        results["launch"] = {}
        for key in ("enqueue_us", "batch_per_op_us", "round_trip_us"):
            d, u = direct[key], under[key]
            results["launch"][key] = {"direct": d, "phos": u, "ratio": u / d if d else None}
            print(f"  {key[:-3]:44} {d:9.2f} {u:9.2f} {u / d if d else 0:8.2f}x")
        results["train"] = paired("train --steps 200 (static cudart)", [a.train, "--steps", "200"], direct_env,
                                  phos_cmd, direct_env, a.pairs)
        have_cupy = a.cupy_job is not None and a.python is not None and os.path.exists(a.python) and \
            subprocess.run([a.python, "-c", "import cupy"], capture_output=True).returncode == 0
        if not have_cupy:
            print("cupy_job: skipped (no CuPy in --python)")
        else:
            cache = tempfile.mkdtemp(prefix="phos-cupy-cache-")
            cupy_env = dict(direct_env, CUPY_COMPILE_WITH_PTX="1", CUPY_ACCELERATORS="", CUPY_CACHE_DIR=cache)
            subprocess.run([a.python, a.cupy_job, "--steps", "1"], env=cupy_env, check=True,
                           capture_output=True)  # fills the kernel cache: both sides then load
            results["cupy"] = paired("cupy_job --steps 30", [a.python, a.cupy_job, "--steps", "30"], cupy_env,
                                     phos_cmd, cupy_env, a.pairs)
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(runtime_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    identical = all(r.get("identical_output", True) for r in results.values() if isinstance(r, dict))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
