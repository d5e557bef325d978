# SPDX-License-Identifier: Apache-2.0
"""What the tests' small Driver API clients (cuda-bindings + NVRTC) share.

A client is a Python program run under `phos run`: PRELUDE followed by its own
code, which may call ok() (checks a CUresult, returns the values) and
compile_ptx(source) (NVRTC, compute_80).
"""

PRELUDE = r'''
import json, os, subprocess, sys
import numpy as np
from cuda.bindings import driver as cu, nvrtc

def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    assert err == cu.CUresult.CUDA_SUCCESS, err
    rest = result[1:] if isinstance(result, tuple) else ()
    return rest[0] if len(rest) == 1 else rest

def compile_ptx(source):
    err, prog = nvrtc.nvrtcCreateProgram(source, b"k.cu", 0, [], [])
    assert nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_80"])[0] == \
        nvrtc.nvrtcResult.NVRTC_SUCCESS
    ptx = b" " * nvrtc.nvrtcGetPTXSize(prog)[1]
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx
'''
