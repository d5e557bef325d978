# SPDX-License-Identifier: Apache-2.0
"""The GoogleTest clients of tests/shim/clients, run under libphos.so against a private phosd.

shim_semantics_test: posted launches, synchronizing calls, deferred errors,
per-thread default streams, pinned and managed memory, large pageable copies (transfer lanes), generated out arrays, refused JIT options, what a capture refuses. shim_threads_test: eight threads
with their own or a shared context, and per-thread context stacks.
shim_pools_test: the stream-ordered allocator's pools, and shim_jit_test: JIT
options, their logs and the linker (both also run on vgpu alone by meson). The
assertions are in the C++ tests; here each program must run every one of its
tests (none skipped or filtered away) and pass.
"""
import re
import subprocess

import pytest

PROGRAMS = {
    "shim_semantics_test": 13,
    "shim_threads_test": 3,
    "shim_pools_test": 9,
    "shim_jit_test": 10,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_gtest_client_passes_under_phos(program, shim_clients, phosd):
    r = subprocess.run([str(shim_clients / program)], env=phosd.client_env(), capture_output=True, text=True,
                       timeout=120)
    report = r.stdout + r.stderr
    assert r.returncode == 0, report
    ran = re.search(r"^\[==========\] (\d+) tests? from \d+ test suites? ran", r.stdout, re.MULTILINE)
    assert ran and int(ran.group(1)) == PROGRAMS[program], report
    assert f"[  PASSED  ] {PROGRAMS[program]} test" in r.stdout, report
    assert "SKIPPED" not in r.stdout, report
    # libphos.so's own messages never reach the application's stderr.
    assert r.stderr == "", report


CONTEXT_QUERIES = r"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
ctx, dev = ctypes.c_void_p(), ctypes.c_int(-1)
flags, active = ctypes.c_uint(), ctypes.c_int()
def state():
    assert cuda.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0
    return active.value, flags.value
print("before", state())
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
for _ in range(1000):
    assert cuda.cuCtxGetDevice(ctypes.byref(dev)) == 0 and dev.value == 0
    assert cuda.cuCtxGetDevice_v2(ctypes.byref(dev), ctx) == 0 and dev.value == 0
    state()
print("retained", state())
assert cuda.cuDevicePrimaryCtxSetFlags_v2(0, 4) == 0
print("flags set", state())
assert cuda.cuDevicePrimaryCtxRelease_v2(0) == 0
print("released", state())
assert cuda.cuCtxGetDevice(None) != 0
"""


def test_context_queries_are_answered_in_the_shim_as_phosd_answers_them(phos, build_dir, tmp_path):
    """cuCtxGetDevice and cuDevicePrimaryCtxGetState, which the runtime asks on
    every operation (PyTorch: 65000 round trips in a 60-step job on an H200):
    the shim answers what phosd would, and phosd sees only the state queries
    after a change of the application's."""
    import os
    import sys
    env = dict(os.environ, LD_LIBRARY_PATH=str(build_dir / "vgpu"), PHOS_VGPU_BANDWIDTH_SCALE="0",
               PHOS_LOG="daemon:debug")
    for name in ("LD_PRELOAD", "PHOS_RUNTIME_DIR"):
        env.pop(name, None)
    direct = subprocess.run([sys.executable, "-c", CONTEXT_QUERIES], env=env, capture_output=True, text=True,
                            timeout=120)
    assert direct.returncode == 0, direct.stderr
    runtime = tmp_path / "phosd"
    try:
        under = subprocess.run([str(phos), "run", "--runtime-dir", str(runtime), "--", sys.executable, "-c",
                                CONTEXT_QUERIES], env=env, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run([str(phos), "daemon", "--stop", "--runtime-dir", str(runtime)], env=env, capture_output=True,
                       timeout=60)
    assert under.returncode == 0, under.stderr
    assert under.stdout == direct.stdout, (direct.stdout, under.stdout)
    served = (runtime / "phosd.log").read_text()
    assert len(re.findall(r": cuDevicePrimaryCtxGetState -> ", served)) == 4, served[-3000:]
    # The null pointer's error comes from phosd, as CUDA names it.
    assert len(re.findall(r": cuCtxGetDevice(_v2)? -> ", served)) == 1, served[-3000:]
