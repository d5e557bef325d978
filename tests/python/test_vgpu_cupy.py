# SPDX-License-Identifier: Apache-2.0
"""CuPy's prebuilt modules on vgpu's compute capability 12.0 profile.

CuPy ships CUB, Thrust and its cuRAND device-API generator as machine code
for sm_75..sm_120 plus compute_120 PTX only; on a 12.0 device vgpu runs that
PTX. Each client runs in its own interpreter against the built vgpu (no PhOS)
with CUPY_COMPILE_WITH_PTX=1 (CuPy's own kernels, compiled with NVRTC, are
loaded as PTX), PHOS_VGPU_CC=12.0 and a private kernel cache, and compares
with numpy, or, for the random generator, with an independent numpy
implementation of the algorithm cuRAND documents (XORWOW, curand_init's
2^67-apart subsequences, curand_uniform(_double), Box-Muller).
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cupy")


def run_client(build_dir, tmp_path, source: str, **env_extra) -> subprocess.CompletedProcess:
    libdir = build_dir / "vgpu"
    if not (libdir / "libcuda.so.1").exists():
        pytest.skip(f"vgpu was not built in {build_dir}")
    env = dict(os.environ, PHOS_VGPU_BANDWIDTH_SCALE="0", CUPY_COMPILE_WITH_PTX="1", PHOS_VGPU_CC="12.0",
               CUPY_CACHE_DIR=str(tmp_path / "cupy-cache"))
    env.pop("CUPY_ACCELERATORS", None)
    env.update(env_extra)
    env["LD_LIBRARY_PATH"] = ":".join([str(libdir), env.get("LD_LIBRARY_PATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_cub_reduction_of_an_elementwise_result(build_dir, tmp_path):
    """The reported case: a sum through CUB's device reduction (it printed 0.0
    when CUB's PTX was refused), and the same sum without CUB."""
    source = """
    import cupy as cp
    a = cp.arange(1000, dtype=cp.float32)
    print(cp._core.get_reduction_accelerators(), float((a * 2 + 1).sum()))
    """
    r = run_client(build_dir, tmp_path, source)
    assert r.returncode == 0, r.stdout + r.stderr
    accelerators, total = r.stdout.strip().rsplit(" ", 1)
    assert accelerators == "[1]", r.stdout  # 1: cupy._core._accelerator.ACCELERATOR_CUB
    assert total == "1000000.0", r.stdout
    r = run_client(build_dir, tmp_path, source, CUPY_ACCELERATORS="")
    assert r.returncode == 0 and r.stdout.strip() == "[] 1000000.0", r.stdout + r.stderr


def test_reductions_scans_and_sorts_match_numpy(build_dir, tmp_path):
    """sum, max, argmax (CUB reductions), cumsum (CUB's decoupled look-back scan
    over many tiles), sort (Thrust: radix sort; merge sort for float16) of
    float32, float64, int32 and int64 arrays, one tile and many, against numpy."""
    r = run_client(build_dir, tmp_path, """
    import numpy as np
    import cupy as cp
    rng = np.random.default_rng(0)
    checked = 0
    for n in (1000, 100003):
        for dt in (np.float32, np.float64, np.int32, np.int64):
            h = (rng.standard_normal(n) * 1000).astype(dt)
            d = cp.asarray(h)
            what = f"{np.dtype(dt).name}[{n}]"
            if np.issubdtype(dt, np.integer):
                assert int(d.sum().get()) == int(h.sum(dtype=np.int64)), what
                assert np.array_equal(cp.cumsum(d).get(), np.cumsum(h)), what
            else:
                # CUB adds in another order than numpy: within a few ulps of the exact sum.
                exact = h.astype(np.float64).sum()
                scale = np.abs(h).astype(np.float64).sum()
                eps = np.finfo(dt).eps
                assert abs(float(d.sum().get()) - exact) <= 8 * eps * scale, (what, float(d.sum().get()), exact)
                cs = cp.cumsum(d).get().astype(np.float64)
                ref = np.cumsum(h.astype(np.float64))
                bound = 8 * eps * np.cumsum(np.abs(h).astype(np.float64)) * np.log2(n)
                assert np.all(np.abs(cs - ref) <= bound), (what, np.max(np.abs(cs - ref) - bound))
            assert d.max().get() == h.max(), what
            assert int(d.argmax().get()) == int(h.argmax()), what
            assert np.array_equal(cp.sort(d).get(), np.sort(h)), what
            checked += 1
    # NaNs sort last, as numpy sorts them.
    h = rng.standard_normal(3001)
    h[::7] = np.nan
    assert np.array_equal(cp.sort(cp.asarray(h)).get(), np.sort(h), equal_nan=True)
    # float16 goes through Thrust's merge sort (griddepcontrol on compute_120).
    h = (rng.standard_normal(5000) * 100).astype(np.float16)
    assert np.array_equal(cp.sort(cp.asarray(h)).get(), np.sort(h))
    order = cp.asarray(h).argsort().get()
    assert np.array_equal(np.sort(order), np.arange(h.size)) and np.array_equal(h[order], np.sort(h))
    print("ok", checked)
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok 8", r.stdout + r.stderr


# An independent numpy implementation of cuRAND's XORWOW as its documentation
# and curand_kernel.h describe it: the seed salted and mixed into five state
# words and a Weyl counter, subsequence i reached by jumping i * 2^67 steps
# (a GF(2) matrix power here), curand() = v4 + d, curand_uniform_double from
# two draws x ^ (y << 21) scaled by 2^-53, curand_uniform as x * 2^-32 + 2^-33
# in float, curand_normal_double by Box-Muller on four draws (the second value
# kept for the next call).
XORWOW_REFERENCE = """
import numpy as np

M32 = 0xFFFFFFFF
POW53_INV = 1.1102230246251565e-16
PI_LONG = np.longdouble("3.14159265358979323846264338327950288")


def _mul(a, b):
    return ((a.astype(np.int64) @ b.astype(np.int64)) & 1).astype(np.uint8)


def _step_matrix():
    bit = lambda w, b: 32 * w + b
    m = np.zeros((160, 160), dtype=np.uint8)
    for w in range(4):                      # v[w] <- v[w + 1]
        for b in range(32):
            m[bit(w, b), bit(w + 1, b)] = 1
    for b in range(32):                     # v4 <- v4 ^ (v4 << 4) ^ t ^ (t << 1), t = v0 ^ (v0 >> 2)
        row = bit(4, b)
        m[row, bit(4, b)] ^= 1
        if b >= 4:
            m[row, bit(4, b - 4)] ^= 1
        for k in (b, b - 1):
            if 0 <= k < 32:
                m[row, bit(0, k)] ^= 1
                if k + 2 < 32:
                    m[row, bit(0, k + 2)] ^= 1
    return m


def subsequence_jumps(count):
    power, square, e = np.eye(160, dtype=np.uint8), _step_matrix(), 1 << 67
    while e:
        if e & 1:
            power = _mul(power, square)
        e >>= 1
        if e:
            square = _mul(square, square)
    jumps = [np.eye(160, dtype=np.uint8)]
    for _ in range(1, count):
        jumps.append(_mul(power, jumps[-1]))
    return jumps


class Xorwow:
    def __init__(self, seed, jump):
        s0 = (seed & M32) ^ 0xAAD26B49
        s1 = ((seed >> 32) & M32) ^ 0xF7DCEFDD
        t0, t1 = (1099087573 * s0) & M32, (2591861531 * s1) & M32
        self.d = (6615241 + t1 + t0) & M32
        v = [(123456789 + t0) & M32, 362436069 ^ t0, (521288629 + t1) & M32, 88675123 ^ t1, (5783321 + t0) & M32]
        bits = np.array([(v[w] >> b) & 1 for w in range(5) for b in range(32)], dtype=np.uint8)
        bits = _mul(jump, bits[:, None])[:, 0]
        self.v = [sum(int(bits[32 * w + b]) << b for b in range(32)) for w in range(5)]
        self.extra = None

    def next(self):
        v = self.v
        t = v[0] ^ (v[0] >> 2)
        self.v = v[1:] + [(v[4] ^ ((v[4] << 4) & M32)) ^ (t ^ ((t << 1) & M32))]
        self.d = (self.d + 362437) & M32
        return (self.v[4] + self.d) & M32

    def uniform_double(self):
        x, y = self.next(), self.next()
        return (x ^ (y << 21)) * POW53_INV + POW53_INV / 2.0

    def uniform_float(self):
        return np.float32(np.float32(self.next()) * np.float32(2.0 ** -32) + np.float32(2.0 ** -33))

    def normal_double(self):
        if self.extra is not None:
            extra, self.extra = self.extra, None
            return extra
        x0, x1, y0, y1 = (self.next() for _ in range(4))
        u = (x0 ^ (x1 << 21)) * POW53_INV + POW53_INV / 2.0
        v = (y0 ^ (y1 << 21)) * (POW53_INV * 2.0) + POW53_INV
        # In extended precision, then rounded: the device's sincospi and log are
        # within an ulp or two, which double-precision math.sin(math.pi * v)
        # near a zero of the sine is not.
        s = np.sqrt(np.longdouble(-2.0) * np.log(np.longdouble(u)))
        angle = PI_LONG * np.longdouble(v)
        self.extra = float(s * np.cos(angle))
        return float(s * np.sin(angle))
"""


def test_random_generator_follows_the_xorwow_algorithm(build_dir, tmp_path):
    """cupy.random.Generator(XORWOW) (cuRAND's device API in CuPy's compute_120
    module): element k*S + i is draw k of state i, whose seed is CuPy's
    SeedSequence(seed).generate_state(1, uint32). Uniform doubles and floats
    are bit-exact against the reference; normals are within a few ulps (the
    device computes sin/cos with sincospi); runs are deterministic."""
    r = run_client(build_dir, tmp_path, XORWOW_REFERENCE + textwrap.dedent("""
    import cupy as cp

    S, STATES = 256, 6  # states in the generator; states checked against the reference
    jumps = subsequence_jumps(STATES)

    def reference(seed, draw, per_state):
        s = int(np.random.SeedSequence(seed).generate_state(1, np.uint32)[0])
        out = []
        for i in range(STATES):
            x = Xorwow(s, jumps[i])
            out.append([draw(x) for _ in range(per_state)])
        return np.array(out)  # [state, draw]

    def generator(seed):
        return cp.random.Generator(cp.random.XORWOW(seed, size=S))

    got = generator(1).random(3 * S).get().reshape(3, S)[:, :STATES].T
    ref = reference(1, lambda x: (lambda r: 0.0 if r >= 1.0 else r)(x.uniform_double()), 3)
    assert np.array_equal(got, ref), (got, ref)
    assert np.array_equal(generator(1).random(3 * S).get().reshape(3, S)[:, :STATES].T, ref)  # deterministic

    got = generator(2).random(2 * S, dtype=np.float32).get().reshape(2, S)[:, :STATES].T
    ref = reference(2, lambda x: (lambda r: np.float32(0) if r >= 1 else r)(x.uniform_float()), 2)
    assert got.dtype == np.float32 and np.array_equal(got, ref), (got, ref)

    got = generator(5).standard_normal(2 * S).get().reshape(2, S)[:, :STATES].T
    ref = reference(5, lambda x: x.normal_double(), 2)
    ulps = np.abs(got - ref) / np.spacing(np.abs(ref))
    assert np.all(ulps <= 4), (got, ref, ulps)

    # All S states: a uniform sample of 40 * S values looks uniform.
    x = generator(9).random(40 * S).get()
    assert abs(x.mean() - 0.5) < 0.01 and abs(x.var() - 1 / 12) < 0.005 and 0 <= x.min() and x.max() < 1
    print("ok")
    """))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_random_state_needs_curand_built_for_the_device(build_dir, tmp_path):
    """cupy.random.seed/rand/randn use cuRAND's host library. CUDA 13.0's
    libcurand carries machine code for sm_75..sm_121 and PTX for compute_121
    only, so on a 12.0 device there is nothing vgpu can run: the call fails
    with a cuRAND error (never with wrong numbers) and vgpu logs why."""
    r = run_client(build_dir, tmp_path, """
    import cupy as cp
    from cupy_backends.cuda.libs import curand
    try:
        cp.random.seed(1)
        print(cp.random.rand(5))
    except curand.CURANDError as e:
        print("refused", e)
    """, PHOS_LOG="vgpu:debug", PHOS_LOG_STDERR="1")
    assert r.returncode == 0, r.stdout + r.stderr
    if not r.stdout.startswith("refused"):
        pytest.fail("cuRAND ran on a 12.0 device although it ships no PTX for it: " + r.stdout)
    assert "CURAND_STATUS_LAUNCH_FAILURE" in r.stdout, r.stdout
    assert "PTX sm_121" in r.stderr and "no PTX for compute capability 12.0 or older" in r.stderr, r.stderr[-2000:]


def test_a_captured_graph_replays_cupy_kernels(build_dir, tmp_path):
    """CuPy's stream capture (Stream.begin_capture/end_capture, Graph.launch): two elementwise kernels
    captured once, launched three times, give what numpy computes for three steps; an array allocated
    inside the capture is usable after it."""
    from test_cupy import CAPTURE  # the same client runs under phos run there
    source = CAPTURE
    r = run_client(build_dir, tmp_path, source, CUPY_ACCELERATORS="")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("True True "), r.stdout


def test_texture_and_surface_objects_through_cupys_api(build_dir, tmp_path):
    """cupy.cuda.texture as its documentation shows it: a CUDA array filled
    from numpy, sampled by a RawKernel through a texture object with linear
    filtering and clamping (between two texels: their mean), and a surface
    object written by a kernel and read back into numpy."""
    r = run_client(build_dir, tmp_path, """
    import numpy as np
    import cupy as cp
    from cupy.cuda import texture as T

    h, w = 24, 32
    img = (np.arange(h * w, dtype=np.float32).reshape(h, w) % 17) / 16.0
    ch = T.ChannelFormatDescriptor(32, 0, 0, 0, cp.cuda.runtime.cudaChannelFormatKindFloat)
    arr = T.CUDAarray(ch, w, h)
    arr.copy_from(img)
    res = T.ResourceDescriptor(cp.cuda.runtime.cudaResourceTypeArray, cuArr=arr)
    tdesc = T.TextureDescriptor((cp.cuda.runtime.cudaAddressModeClamp, cp.cuda.runtime.cudaAddressModeClamp),
                                cp.cuda.runtime.cudaFilterModeLinear, cp.cuda.runtime.cudaReadModeElementType)
    tex = T.TextureObject(res, tdesc)
    kern = cp.RawKernel(r'''
    extern "C" __global__ void shift(float* out, cudaTextureObject_t t, int w, int h) {
      int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
      if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 1.0f, y + 0.5f);
    }''', 'shift')
    out = cp.zeros((h, w), dtype=cp.float32)
    kern((w // 8, h // 8), (8, 8), (out, tex, np.int32(w), np.int32(h)))
    got = out.get()
    # Between texels x and x+1 of row y: their mean; the last column clamps.
    want = np.empty_like(img)
    want[:, :-1] = (img[:, :-1] + img[:, 1:]) / 2
    want[:, -1] = img[:, -1]
    print("max error", float(np.abs(got - want).max()))
    # Surfaces through CuPy too.
    arr2 = T.CUDAarray(ch, w, h, 0, cp.cuda.runtime.cudaArraySurfaceLoadStore)
    res2 = T.ResourceDescriptor(cp.cuda.runtime.cudaResourceTypeArray, cuArr=arr2)
    surf = T.SurfaceObject(res2)
    k2 = cp.RawKernel(r'''
    extern "C" __global__ void fill(cudaSurfaceObject_t s, int w, int h) {
      int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
      if (x < w && y < h) surf2Dwrite((float)(x * 100 + y), s, x * 4, y);
    }''', 'fill')
    k2((w // 8, h // 8), (8, 8), (surf, np.int32(w), np.int32(h)))
    back = np.zeros((h, w), dtype=np.float32)
    arr2.copy_to(back)
    ok = np.array_equal(back, np.add.outer(np.arange(h), 100 * np.arange(w)).astype(np.float32))
    print("surface", ok)
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["max error 0.0", "surface True"], r.stdout + r.stderr
