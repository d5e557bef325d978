# SPDX-License-Identifier: Apache-2.0
"""A numba-cuda job for scripts/gpu-check: logistic regression by gradient
descent with numba kernels (a per-sample forward pass, a per-weight gradient
summed over the samples in order, an update), printing its loss and a digest
of its weights every step. Deterministic (no atomics, fixed summation order),
so a restored run prints the same lines as an uninterrupted one.

    numba_job.py [--steps N] [--sleep-ms MS]
"""
import argparse
import hashlib
import math
import sys
import time

import numpy as np

if not hasattr(np, "row_stack"):
    # numba-cuda 0.68 registers an overload for np.row_stack, which numpy 2.5
    # removed (the GPU host's image has both): numba.cuda does not import there.
    np.row_stack = np.vstack
from numba import cuda  # noqa: E402


@cuda.jit
def forward(x, w, b, y, err, losses):
    i = cuda.grid(1)
    if i < y.size:
        z = b[0]
        for k in range(w.size):
            z += x[i, k] * w[k]
        p = 1.0 / (1.0 + math.exp(-z))
        err[i] = p - y[i]
        losses[i] = -(y[i] * math.log(p + 1e-7) + (1.0 - y[i]) * math.log(1.0 - p + 1e-7))


@cuda.jit
def gradient(x, err, grad):
    k = cuda.grid(1)
    if k < grad.size:
        s = 0.0
        for i in range(err.size):
            s += (x[i, k] if k < grad.size - 1 else 1.0) * err[i]
        grad[k] = s / err.size


@cuda.jit
def update(w, b, grad, lr):
    k = cuda.grid(1)
    if k < w.size:
        w[k] -= lr * grad[k]
    elif k == w.size:
        b[0] -= lr * grad[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sleep-ms", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(11)
    n, d, lr = 1024, 32, 0.5
    x = rng.normal(size=(n, d))
    y = (x @ rng.normal(size=d) + 0.1 * rng.normal(size=n) > 0).astype(np.float64)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    dw, db = cuda.to_device(np.zeros(d)), cuda.to_device(np.zeros(1))
    derr, dlosses, dgrad = cuda.device_array(n), cuda.device_array(n), cuda.device_array(d + 1)
    for step in range(args.steps):
        forward[(n + 127) // 128, 128](dx, dw, db, dy, derr, dlosses)
        gradient[1, 64](dx, derr, dgrad)
        update[1, 64](dw, db, dgrad, lr)
        losses = dlosses.copy_to_host()
        weights = np.concatenate([dw.copy_to_host(), db.copy_to_host()])
        loss = math.fsum(losses) / n  # summed on the host in a fixed order
        print(f"step {step} loss {loss:.17g} weights {hashlib.sha256(weights.tobytes()).hexdigest()[:16]}", flush=True)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
