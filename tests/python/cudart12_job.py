# SPDX-License-Identifier: Apache-2.0
"""A program of the CUDA 12 runtime (libcudart.so.12 from PyPI's
nvidia-cuda-runtime-cu12, the runtime PyTorch 2.8 and many installed stacks
load), through ctypes: it loads a fatbin with cudaLibraryLoadData, launches
its kernel with cudaLaunchKernel every step and prints a checksum of device
state, for tests/python/test_cudart_programs.py.

    cudart12_job.py LIBCUDART KERNELS.fatbin [--steps N] [--sleep-ms MS]
"""
import argparse
import ctypes
import hashlib
import sys
import time


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libcudart")
    ap.add_argument("fatbin")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sleep-ms", type=int, default=0)
    args = ap.parse_args()

    rt = ctypes.CDLL(args.libcudart)
    rt.cudaGetErrorName.restype = ctypes.c_char_p

    def check(what, r):
        if r != 0:
            raise SystemExit(f"{what}: {rt.cudaGetErrorName(r).decode()}")

    version = ctypes.c_int()
    check("cudaRuntimeGetVersion", rt.cudaRuntimeGetVersion(ctypes.byref(version)))
    count = ctypes.c_int()
    check("cudaGetDeviceCount", rt.cudaGetDeviceCount(ctypes.byref(count)))
    print(f"runtime {version.value // 1000}.{version.value % 1000 // 10}, {count.value} device(s)", flush=True)

    image = open(args.fatbin, "rb").read()
    library = ctypes.c_void_p()
    check("cudaLibraryLoadData", rt.cudaLibraryLoadData(ctypes.byref(library), image, None, None, 0, None, None, 0))
    kernel = ctypes.c_void_p()
    check("cudaLibraryGetKernel", rt.cudaLibraryGetKernel(ctypes.byref(kernel), library, b"scale_add"))

    n = 5000
    x = (ctypes.c_float * n)(*[0.5 * (i % 97) for i in range(n)])
    y = (ctypes.c_float * n)(*[float(i % 13) - 6.0 for i in range(n)])
    dx, dy = ctypes.c_void_p(), ctypes.c_void_p()
    check("cudaMalloc", rt.cudaMalloc(ctypes.byref(dx), ctypes.c_size_t(4 * n)))
    check("cudaMalloc", rt.cudaMalloc(ctypes.byref(dy), ctypes.c_size_t(4 * n)))
    check("cudaMemcpy", rt.cudaMemcpy(dx, x, ctypes.c_size_t(4 * n), 1))  # host to device
    check("cudaMemcpy", rt.cudaMemcpy(dy, y, ctypes.c_size_t(4 * n), 1))
    out = (ctypes.c_float * n)()
    for step in range(args.steps):
        a, count_ = ctypes.c_float(1.0 + 0.25 * step), ctypes.c_int(n)
        params = (ctypes.c_void_p * 4)(ctypes.addressof(dy), ctypes.addressof(dx), ctypes.addressof(a),
                                       ctypes.addressof(count_))
        # A cudaKernel_t "can be passed to cudaLaunchKernel".
        check("cudaLaunchKernel", rt.cudaLaunchKernel(kernel, Dim3((n + 127) // 128, 1, 1), Dim3(128, 1, 1),
                                                      params, ctypes.c_size_t(0), None))
        check("cudaDeviceSynchronize", rt.cudaDeviceSynchronize())
        check("cudaMemcpy", rt.cudaMemcpy(out, dy, ctypes.c_size_t(4 * n), 2))  # device to host
        print(f"step {step} state {hashlib.sha256(bytes(out)).hexdigest()[:16]} y[4999] {out[n - 1]:.3f}",
              flush=True)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
    check("cudaFree", rt.cudaFree(dx))
    check("cudaFree", rt.cudaFree(dy))
    check("cudaLibraryUnload", rt.cudaLibraryUnload(library))
    print("cudart12 OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
