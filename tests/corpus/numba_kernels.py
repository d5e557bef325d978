# SPDX-License-Identifier: Apache-2.0
"""Corpus: numba-cuda kernels compiled to PTX with NVVM, without a GPU.

usage: numba_kernels.py KERNEL OUTPUT.ptx [--cc 8.0] [--debug | --lineinfo]

numba emits one module per compile_ptx call, so each kernel is its own corpus file.
"""
import argparse
import math
import sys

from numba import cuda, float32, float64, int32, uint64, void


def axpy(r, a, x, y):
    i = cuda.grid(1)
    if i < r.size:
        r[i] = a * x[i] + y[i]


def block_sum(x, out):
    # Shared-memory tree reduction, then one atomic per block.
    buf = cuda.shared.array(128, dtype=float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf[t] = x[i] if i < x.size else float32(0)
    cuda.syncthreads()
    s = 64
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        cuda.atomic.add(out, 0, buf[0])


def math_2d(a, out, scale):
    i, j = cuda.grid(2)
    if i < a.shape[0] and j < a.shape[1]:
        v = a[i, j] * scale
        # No @cuda.jit(device=True) helper: compiling one asks the driver for the
        # current device's compute capability, and this host has no driver.
        gelu = 0.5 * v * (1.0 + math.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))
        out[i, j] = gelu + math.exp(-v) + math.sqrt(abs(v)) + math.log1p(abs(v))


def histogram(data, bins, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        cuda.atomic.add(bins, data[i] % bins.size, 1)
    mask = cuda.ballot_sync(0xFFFFFFFF, cuda.grid(1) < n)
    if cuda.laneid == 0 and mask == 0:
        cuda.atomic.max(bins, 0, int32(-1))


KERNELS = {
    "axpy": (axpy, void(float32[:], float32, float32[:], float32[:])),
    "block_sum": (block_sum, void(float32[:], float32[:])),
    "math_2d": (math_2d, void(float64[:, :], float64[:, :], float64)),
    "histogram": (histogram, void(uint64[:], int32[:], int32)),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kernel", choices=sorted(KERNELS))
    p.add_argument("output")
    p.add_argument("--cc", default="8.0")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--debug", action="store_true")
    g.add_argument("--lineinfo", action="store_true")
    args = p.parse_args()
    fn, sig = KERNELS[args.kernel]
    major, minor = (int(v) for v in args.cc.split("."))
    opts = {"cc": (major, minor)}
    if args.debug:
        opts.update(debug=True, opt=False)
    elif args.lineinfo:
        opts["lineinfo"] = True
    ptx, _ = cuda.compile_ptx(fn, sig, **opts)
    with open(args.output, "w") as f:
        f.write(ptx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
