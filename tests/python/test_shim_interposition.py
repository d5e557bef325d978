# SPDX-License-Identifier: Apache-2.0
"""The three ways a program reaches the Driver API all lead through libphos.so to phosd.

interpose_client (tests/shim/clients) adds two vectors on the GPU after
finding the Driver API by direct linking, by dlopen("libcuda.so.1") + dlsym, or
by cuGetProcAddress_v2, and holds its session open while the test looks at it
in `phos ps`: a session of its pid, with the kernel launched, is the proof that
the calls went to phosd and not to the vgpu library the client is linked with.
"""
import os
import subprocess
import sys

import pytest

from job_output import wait_for

HOLD_TIMEOUT = 60


def parse(lines):
    """interpose_client's "key value..." lines, as key -> list of value lists."""
    facts = {}
    for line in lines:
        key, *values = line.split()
        facts.setdefault(key, []).append(values)
    return facts


def run_holding(client, mode, phosd):
    """Runs the client until it says "ready"; returns its facts and its session in `phos ps`."""
    proc = subprocess.Popen([str(client), mode, "--hold"], env=phosd.client_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    session = None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line == "ready\n":
                session = phosd.session_of(proc.pid)
                break
    finally:
        proc.stdin.close()
        rc = proc.wait(timeout=HOLD_TIMEOUT)
    lines += proc.stdout.read().splitlines()
    stderr = proc.stderr.read()
    assert rc == 0 and lines[-1] == "ready", "\n".join(lines) + "\n" + stderr
    # Nothing from libphos.so on the application's stderr.
    assert stderr == ""
    return parse(lines), session


@pytest.mark.parametrize("mode", ["direct", "dlopen", "procaddress"])
def test_each_interposition_path_reaches_phosd(mode, shim_clients, phosd):
    facts, session = run_holding(shim_clients / "interpose_client", mode, phosd)

    assert facts["add_vectors"] == [["ok"]]
    # Every function the client used is libphos.so's trampoline of that name.
    origins = {values[0]: values[1:] for values in facts["origin"]}
    assert len(origins) == 13
    for symbol, (found_name, library) in origins.items():
        assert library == str(phosd.libphos), f"{symbol} came from {library}"
        assert found_name == symbol
    if mode != "direct":
        assert facts["dlopen"] == [["ok"]]
    if mode == "dlopen":
        # libcuda.so, a full path and libcuda.so.1 all give libphos.so's handle.
        assert facts["dlopen_aliases"] == [["same"]]

    assert session is not None, f"no session of the client in phos ps: {phosd.sessions()}"
    assert session["launches"] == 1
    assert session["kernels"] == ["addVectors"]
    assert session["allocations"] == 3
    assert session["device_bytes"] == 3 * 1000 * 4
    assert session["modules"] == 1
    # The daemon frees the session once the client has exited.
    wait_for(lambda: phosd.session_of(session["pid"]) is None, 5, "the session to end")


def test_get_proc_address_answers(shim_clients, phosd):
    facts, _ = run_holding(shim_clients / "interpose_client", "procaddress", phosd)
    # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the _ptsz trampoline.
    (result, status, symbol, library), = facts["per_thread"]
    assert (result, status, symbol, library) == ("CUDA_SUCCESS", "0", "cuLaunchKernel_ptsz", str(phosd.libphos))
    # "CUDA_SUCCESS ... and set the returned pfn to NULL if ... the driver
    # symbol is invalid", with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (1).
    assert facts["unknown_symbol"] == [["CUDA_SUCCESS", "1", "null"]]
    # "If the specified CUDA version is greater than the driver version, the
    # API will return CUDA_ERROR_INVALID_VALUE."
    assert facts["version_too_new"] == [["CUDA_ERROR_INVALID_VALUE"]]


CLUSTER_QUERIES = r"""
from cuda.bindings import driver as cu

def ok(result):
    err, *values = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return values[0] if len(values) == 1 else values

ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
ptx = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n\0"
f = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(ptx)), b"k"))
config = cu.CUlaunchConfig()
config.gridDimX, config.gridDimY, config.gridDimZ = 16, 1, 1
config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
for query in (cu.cuOccupancyMaxActiveClusters, cu.cuOccupancyMaxPotentialClusterSize):
    err, value = query(f, config)
    print(query.__name__, int(err), value if err == cu.CUresult.CUDA_SUCCESS else None)
"""


def test_cluster_occupancy_queries_answer_as_the_driver_does(build_dir, phosd):
    """cuOccupancyMaxActiveClusters and cuOccupancyMaxPotentialClusterSize (cuBLAS asks them when it creates
    a handle) reach phosd's driver with their launch configuration: under PhOS they answer what the driver
    answers directly, and the shim never refuses them itself."""
    pytest.importorskip("cuda.bindings")
    direct_env = dict(os.environ, LD_LIBRARY_PATH=str(build_dir / "vgpu"))
    direct = subprocess.run([sys.executable, "-c", CLUSTER_QUERIES], env=direct_env, capture_output=True,
                            text=True, timeout=120)
    assert direct.returncode == 0, direct.stderr
    under = subprocess.run([sys.executable, "-c", CLUSTER_QUERIES], env=phosd.client_env(), capture_output=True,
                           text=True, timeout=120)
    assert under.returncode == 0, under.stderr
    assert under.stdout == direct.stdout and direct.stdout.count("\n") == 2, (direct.stdout, under.stdout)
    assert "not supported by PhOS" not in under.stderr, under.stderr
