# SPDX-License-Identifier: Apache-2.0
"""A CuPy job for tests/python/test_cupy.py: logistic regression by gradient
descent on CuPy arrays (elementwise kernels and reductions, which CuPy
compiles with NVRTC at run time; products as reductions, not cuBLAS),
printing its loss and a checksum of its weights every step, checked against
the same computation in NumPy.
Deterministic, so a restored run prints the same lines as an uninterrupted
one.

    cupy_job.py [--steps N] [--sleep-ms MS]
"""
import argparse
import hashlib
import sys
import time

import cupy as cp
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sleep-ms", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(7)
    n, features = 512, 16
    x_host = rng.standard_normal((n, features)).astype(np.float32)
    truth = rng.standard_normal(features).astype(np.float32)
    y_host = (x_host @ truth > 0).astype(np.float32)
    x, y = cp.asarray(x_host), cp.asarray(y_host)
    w = cp.zeros(features, dtype=cp.float32)
    w_check = np.zeros(features, dtype=np.float32)
    lr = np.float32(0.5)
    for step in range(args.steps):
        z = (x * w).sum(axis=1)
        p = 1 / (1 + cp.exp(-z))
        loss = -cp.mean(y * cp.log(p + 1e-7) + (1 - y) * cp.log(1 - p + 1e-7))
        grad = (x * (p - y)[:, None]).sum(axis=0) / n
        w -= lr * grad
        # The same step in NumPy: the GPU's result must agree to rounding.
        p_check = 1 / (1 + np.exp(-(x_host @ w_check)))
        w_check -= lr * (x_host.T @ (p_check - y_host) / n)
        w_host = cp.asnumpy(w)
        if not np.allclose(w_host, w_check, rtol=1e-4, atol=1e-5):
            print(f"step {step}: the weights differ from NumPy's by {np.abs(w_host - w_check).max()}", flush=True)
            return 1
        digest = hashlib.sha256(w_host.tobytes()).hexdigest()[:16]
        print(f"step {step} loss {float(loss):.9g} weights {digest} max {float(cp.max(cp.abs(w))):.9g} "
              f"argmax {int(cp.argmax(w))}", flush=True)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
    print(f"accuracy {float(cp.mean(((x * w).sum(axis=1) > 0) == (y > 0.5))):.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
