# SPDX-License-Identifier: Apache-2.0
"""cuda-bindings (NVIDIA's Python Driver API bindings) running unmodified on vgpu's libcuda.so.1.

Each client runs in its own interpreter with LD_LIBRARY_PATH pointing at the
built vgpu, so cuda-bindings' dlopen("libcuda.so.1") and cuGetProcAddress
lookups reach vgpu and nothing else.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cuda.bindings")


PRELUDE = """
import numpy as np
from cuda.bindings import driver as cu

def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    assert err == cu.CUresult.CUDA_SUCCESS, err
    rest = result[1:] if isinstance(result, tuple) else ()
    return rest[0] if len(rest) == 1 else rest

ok(cu.cuInit(0))
dev = ok(cu.cuDeviceGet(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
"""


def run_client(build_dir, source: str) -> str:
    libdir = build_dir / "vgpu"
    if not (libdir / "libcuda.so.1").exists():
        pytest.skip(f"vgpu was not built in {build_dir}")
    env = dict(os.environ)
    paths = [str(libdir), "/usr/local/cuda/lib64"]  # NVRTC comes from the toolkit
    env["LD_LIBRARY_PATH"] = ":".join(paths + [env.get("LD_LIBRARY_PATH", "")])
    env["PHOS_VGPU_BANDWIDTH_SCALE"] = "0"
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(source)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout




def test_devices_and_versions(build_dir):
    out = run_client(build_dir, """
    assert ok(cu.cuDriverGetVersion()) == 13000
    assert ok(cu.cuDeviceGetCount()) == 1
    name = ok(cu.cuDeviceGetName(64, dev))
    assert b"PhOS vGPU" in name, name
    major = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    assert (major, minor) == (12, 0)  # vgpu's default profile
    err, _ = cu.cuDeviceGet(5)
    assert err == cu.CUresult.CUDA_ERROR_INVALID_DEVICE, err
    print("devices ok")
    """)
    assert "devices ok" in out


def test_memory_streams_and_events(build_dir):
    out = run_client(build_dir, """
    n = 1 << 16
    x = np.arange(n, dtype=np.float32)
    d = ok(cu.cuMemAlloc(x.nbytes))
    stream = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    start = ok(cu.cuEventCreate(0))
    stop = ok(cu.cuEventCreate(0))
    ok(cu.cuEventRecord(start, stream))
    ok(cu.cuMemcpyHtoDAsync(d, x.ctypes.data, x.nbytes, stream))
    ok(cu.cuMemsetD32Async(d, 0, 16, stream))
    y = np.empty_like(x)
    ok(cu.cuMemcpyDtoHAsync(y.ctypes.data, d, y.nbytes, stream))
    ok(cu.cuEventRecord(stop, stream))
    ok(cu.cuStreamSynchronize(stream))
    assert (y[:16] == 0).all() and (y[16:] == x[16:]).all()
    assert ok(cu.cuEventElapsedTime(start, stop)) >= 0
    ok(cu.cuMemFree(d))
    err = cu.cuMemFree(d)[0]
    assert err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, err
    ok(cu.cuStreamDestroy(stream))
    print("memory ok")
    """)
    assert "memory ok" in out


def test_nvrtc_kernel_runs_on_the_engine(build_dir):
    pytest.importorskip("cuda.bindings.nvrtc")
    out = run_client(build_dir, """
    from cuda.bindings import nvrtc
    src = b'''extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }'''
    try:
        err, prog = nvrtc.nvrtcCreateProgram(src, b"saxpy.cu", 0, [], [])
    except RuntimeError as e:  # libnvrtc not installed
        print("skip: " + str(e)); raise SystemExit(0)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_80"])[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    size = nvrtc.nvrtcGetPTXSize(prog)[1]
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(prog, ptx)
    err, module = cu.cuModuleLoadData(ptx)
    if err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED:
        print("skip: vgpu was built without its PTX engine"); raise SystemExit(0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    f = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    assert ok(cu.cuFuncGetParamInfo(f, 1)) == (8, 8)
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    dx = ok(cu.cuMemAlloc(x.nbytes))
    dy = ok(cu.cuMemAlloc(y.nbytes))
    ok(cu.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes))
    ok(cu.cuMemcpyHtoD(dy, y.ctypes.data, y.nbytes))
    a = np.array([2.0], dtype=np.float32)
    count = np.array([n], dtype=np.int32)
    pdx = np.array([int(dx)], dtype=np.uint64)
    pdy = np.array([int(dy)], dtype=np.uint64)
    args = np.array([a.ctypes.data, pdx.ctypes.data, pdy.ctypes.data, count.ctypes.data], dtype=np.uint64)
    ok(cu.cuLaunchKernel(f, (n + 127) // 128, 1, 1, 128, 1, 1, 0, 0, args.ctypes.data, 0))
    ok(cu.cuCtxSynchronize())
    out = np.zeros(n, dtype=np.float32)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, dy, out.nbytes))
    assert np.allclose(out, 2 * x + 1)
    print("kernel ok")
    """)
    assert "kernel ok" in out or "skip:" in out


def test_cuda_core_kernel_with_pool_allocation(build_dir):
    pytest.importorskip("cuda.core")
    out = run_client(build_dir, """
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    code = 'extern "C" __global__ void scale(float* x, float a, int n) {' \\
           ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }'
    try:
        kernel = Program(code, code_type="c++", options=ProgramOptions(arch="compute_80")) \\
            .compile("ptx").get_kernel("scale")
    except Exception as e:  # NVRTC missing, or vgpu without its engine
        print("skip: " + str(e)); raise SystemExit(0)
    n = 256
    buf = device.memory_resource.allocate(n * 4, stream=stream)  # cuMemAllocFromPoolAsync
    host = np.arange(n, dtype=np.float32)
    ok(cu.cuMemcpyHtoDAsync(int(buf.handle), host.ctypes.data, host.nbytes, int(stream.handle)))
    launch(stream, LaunchConfig(grid=2, block=128), kernel, buf, np.float32(3.0), np.int32(n))
    out = np.zeros_like(host)
    ok(cu.cuMemcpyDtoHAsync(out.ctypes.data, int(buf.handle), out.nbytes, int(stream.handle)))
    stream.sync()
    assert np.allclose(out, host * 3)
    buf.close(stream)
    stream.sync()
    print("core ok")
    """)
    assert "core ok" in out or "skip:" in out
