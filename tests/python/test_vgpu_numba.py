# SPDX-License-Identifier: Apache-2.0
"""numba-cuda kernels, and a training loop written with them, on vgpu.

numba-cuda links its kernels with nvJitLink (LTO-IR by default) through
cuda.core and loads the "cubin". vgpu's libnvJitLink.so.13, next to its
libcuda.so.1, links to PTX instead (LTO-IR by NVIDIA's nvJitLink with -lto
-ptx), which vgpu runs. Each client runs in its own interpreter with
LD_LIBRARY_PATH pointing at the built vgpu, as a user's would.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba.cuda")
pytest.importorskip("cuda.bindings.nvjitlink")


def run_client(build_dir, source: str, **env_extra) -> subprocess.CompletedProcess:
    libdir = build_dir / "vgpu"
    if not (libdir / "libnvJitLink.so.13").exists():
        pytest.skip(f"vgpu was not built in {build_dir}")
    env = dict(os.environ, PHOS_VGPU_BANDWIDTH_SCALE="0", **env_extra)
    env["LD_LIBRARY_PATH"] = ":".join([str(libdir), env.get("LD_LIBRARY_PATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_numba_kernel_runs_on_vgpu(build_dir):
    r = run_client(build_dir, """
    import numpy as np
    from numba import cuda

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    x = np.arange(1000, dtype=np.float32)
    y = np.full(1000, 0.5, dtype=np.float32)
    out = cuda.device_array_like(x)
    axpy[8, 128](np.float32(2.0), cuda.to_device(x), cuda.to_device(y), out)
    got = out.copy_to_host()
    assert np.array_equal(got, np.float32(2.0) * x + y), got[:8]
    assert "PhOS vGPU" in str(cuda.get_current_device().name), cuda.get_current_device().name
    print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_numba_training_loop_converges_as_numpy_does(build_dir):
    """Logistic regression trained by SGD with numba kernels (per-sample
    forward pass, per-weight gradient, update): its losses follow a float64
    numpy run of the same algorithm, and fall."""
    r = run_client(build_dir, """
    import math
    import numpy as np
    from numba import cuda

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
        if k < grad.size - 1:
            s = 0.0
            for i in range(err.size):
                s += x[i, k] * err[i]
            grad[k] = s / err.size
        elif k == grad.size - 1:
            s = 0.0
            for i in range(err.size):
                s += err[i]
            grad[k] = s / err.size

    @cuda.jit
    def update(w, b, grad, lr):
        k = cuda.grid(1)
        if k < w.size:
            w[k] -= lr * grad[k]
        elif k == w.size:
            b[0] -= lr * grad[k]

    rng = np.random.default_rng(7)
    n, d, steps, lr = 256, 16, 40, 0.5
    true_w = rng.normal(size=d)
    x = rng.normal(size=(n, d))
    y = (x @ true_w + 0.1 * rng.normal(size=n) > 0).astype(np.float64)

    dx, dy = cuda.to_device(x), cuda.to_device(y)
    dw, db = cuda.to_device(np.zeros(d)), cuda.to_device(np.zeros(1))
    derr, dlosses, dgrad = cuda.device_array(n), cuda.device_array(n), cuda.device_array(d + 1)
    w, b = np.zeros(d), 0.0
    for step in range(steps):
        forward[(n + 127) // 128, 128](dx, dw, db, dy, derr, dlosses)
        gradient[1, 32](dx, derr, dgrad)
        update[1, 32](dw, db, dgrad, lr)
        loss = dlosses.copy_to_host().mean()
        # The same step in numpy.
        p = 1 / (1 + np.exp(-(x @ w + b)))
        ref = np.mean(-(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7)))
        e = p - y
        w, b = w - lr * (x.T @ e) / n, b - lr * e.mean()
        assert abs(loss - ref) <= 1e-9 * max(1.0, abs(ref)), (step, loss, ref)
        if step == 0:
            first = loss
    assert np.allclose(dw.copy_to_host(), w, rtol=1e-9, atol=1e-12)
    assert loss < 0.5 * first, (first, loss)
    print(f"loss {first:.4f} -> {loss:.4f}")
    """)
    assert r.returncode == 0 and r.stdout.startswith("loss "), r.stdout + r.stderr


NVJITLINK = """
import numpy as np
from cuda.bindings import nvjitlink as nj

PTX = b'''.version 8.0
.target sm_80
.address_size 64
.visible .entry k() { ret; }
'''

def link(options, inputs):
    h = nj.create(len(options), options)
    try:
        for kind, data in inputs:
            nj.add_data(h, kind, data, len(data), "input")
        nj.complete(h)
        n = nj.get_linked_cubin_size(h)
        out = bytearray(n)
        nj.get_linked_cubin(h, out)
        return bytes(out), None
    except nj.nvJitLinkError as e:
        size = nj.get_error_log_size(h)
        log = bytearray(size)
        nj.get_error_log(h, log)
        return None, (str(e), log.decode().rstrip("\\x00"))
    finally:
        nj.destroy(h)
"""


def test_vgpu_nvjitlink_keeps_ptx_and_says_what_it_refuses(build_dir):
    r = run_client(build_dir, NVJITLINK + textwrap.dedent("""
    assert nj.version() == (13, 0)
    cubin, err = link(["-arch=sm_80"], [(nj.InputType.PTX, PTX)])
    assert err is None and cubin.rstrip(b"\\x00") == PTX.rstrip(b"\\x00"), (cubin, err)
    cubin, err = link(["-arch=sm_80"], [(nj.InputType.ANY, PTX)])
    assert err is None and b".entry k" in cubin, err
    _, err = link(["-arch=sm_80"], [(nj.InputType.CUBIN, b"\\x7fELF" + bytes(60))])
    assert "machine code" in err[1], err
    # A "cubin" that is PTX (what vgpu's NVRTC and nvJitLink hand out) is PTX.
    cubin, err = link(["-arch=sm_80"], [(nj.InputType.CUBIN, PTX)])
    assert err is None and cubin.rstrip(b"\\x00") == PTX.rstrip(b"\\x00"), (cubin, err)
    _, err = link(["-arch=sm_80"], [(nj.InputType.PTX, PTX), (nj.InputType.PTX, PTX)])
    assert "linking 2 PTX modules together is not supported" in err[1], err
    _, err = link(["-arch=sm_80"], [(nj.InputType.PTX, b"not ptx")])
    assert "is not PTX" in err[1], err
    _, err = link(["-arch=sm_80"], [])
    assert "nothing was added" in err[1], err
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".ptx") as f:
        f.write(PTX)
        f.flush()
        h = nj.create(1, ["-arch=sm_80"])
        nj.add_file(h, nj.InputType.PTX, f.name)
        nj.complete(h)
        out = bytearray(nj.get_linked_ptx_size(h))
        nj.get_linked_ptx(h, out)
        assert out.rstrip(b"\\x00") == PTX.rstrip(b"\\x00"), out
        nj.destroy(h)
    h = nj.create(1, ["-arch=sm_80"])
    try:
        nj.add_file(h, nj.InputType.PTX, "/nonexistent.ptx")
        raise AssertionError("a missing file was accepted")
    except nj.nvJitLinkError:
        log = bytearray(nj.get_error_log_size(h))
        nj.get_error_log(h, log)
        assert "cannot read /nonexistent.ptx" in log.decode(), log
    nj.destroy(h)
    for options, code in ((["-O3"], "MISSING_ARCH"), (["-arch=sm_80", "-bogus"], "UNRECOGNIZED_OPTION"),
                          (["-arch=sm_20"], "UNRECOGNIZED_ARCH")):
        try:
            nj.create(len(options), options)
            raise AssertionError(f"{options} accepted")
        except nj.nvJitLinkError as e:
            assert code in str(e), (options, e)
    print("ok")
    """))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_lto_ir_is_refused_with_the_reason_without_nvidias_nvjitlink(build_dir):
    r = run_client(build_dir, """
    from numba import cuda

    @cuda.jit
    def k(a):
        a[0] = 1.0

    try:
        k[1, 1](cuda.device_array(1))
        print("ran")
    except Exception as e:
        print(type(e).__name__, e)
    """, PHOS_VGPU_NVJITLINK="/nonexistent/libnvJitLink.so.13")
    assert r.returncode == 0, r.stderr
    assert "LTO-IR" in r.stdout and "/nonexistent/libnvJitLink.so.13" in r.stdout and \
        "PHOS_VGPU_NVJITLINK" in r.stdout, r.stdout


PINNED_AND_MAPPED = """
import numpy as np
from numba import cuda

@cuda.jit
def scale(a, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] * 2 + 1

x = np.arange(100000, dtype=np.float32)
with cuda.pinned(x):
    stream = cuda.stream()
    d = cuda.to_device(x, stream=stream)
    stream.synchronize()
y = np.zeros_like(x)
with cuda.mapped(y) as on_device:
    scale[(x.size + 255) // 256, 256](d, on_device)
    cuda.synchronize()
y[0] += 1
assert np.array_equal(y[1:], x[1:] * 2 + 1) and y[0] == 2, y[:4]
print("ok", float(y.sum()))
"""


def test_numba_pinned_and_mapped_arrays_run_on_vgpu_and_under_phos_alike(build_dir, phos, phosd):
    """cuda.pinned and cuda.mapped register numpy arrays the program already has
    (cuMemHostRegister): a copy from a pinned array, then a kernel that writes a
    mapped array in place. Under PhOS the arrays' pages become a file phosd
    shares (docs/remoting.md); after the block they are the program's again."""
    direct = run_client(build_dir, PINNED_AND_MAPPED)
    assert direct.returncode == 0 and direct.stdout.startswith("ok"), direct.stdout + direct.stderr
    under = subprocess.run([str(phos), "run", "--runtime-dir", str(phosd.runtime_dir), "--", sys.executable, "-c",
                            PINNED_AND_MAPPED],
                           env=dict(os.environ, PHOS_VGPU_BANDWIDTH_SCALE="0",
                                    LD_LIBRARY_PATH=":".join([str(build_dir / "vgpu"),
                                                              os.environ.get("LD_LIBRARY_PATH", "")])),
                           capture_output=True, text=True, timeout=300)
    assert under.returncode == 0 and under.stdout == direct.stdout, under.stdout + under.stderr
    assert "session" in phosd.log(), "the program never had a PhOS session"
