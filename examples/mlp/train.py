#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""train.py: the Python twin of mlp-train, the same MLP trained through cuda.core.

Same synthetic data (the LCG and the float32 host arithmetic of mlp_train.cpp),
same kernels (the PTX nvcc built from mlp_kernels.cu), same launches in the same
order with the same grids and blocks on the legacy default stream, so it prints
the lines of `mlp-train --iterations N` bit for bit, weights checksum included.

Memory goes through cuMemAlloc and the synchronous cuMemcpyHtoD/DtoH of
cuda.bindings, as in the C++ program, rather than cuda.core's stream-ordered
pool: the two programs then make the same kinds of Driver API calls.

--state-mib N adds mlp-train's N MiB of "optimizer state" the same way: the
same per-MiB cuMemsetD32 patterns, the same state_update kernel on the same
window each step, folded into the checksum after the weights.

    LD_LIBRARY_PATH=build/vgpu python examples/mlp/train.py --iterations 20
"""
import argparse
import os
import pathlib
import sys
import time
from typing import NoReturn

import numpy as np
import xxhash

try:
    import phos_sdk  # the application SDK: on PYTHONPATH under phos run
except ImportError:
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[2] / "sdk" / "python"))
    import phos_sdk
from cuda.bindings import driver as cu
from cuda.core import LEGACY_DEFAULT_STREAM, Device, LaunchConfig, ObjectCode, launch

PROG = "train.py"
ROWS, IN, HIDDEN, CLASSES = 256, 32, 64, 8
LEARNING_RATE = np.float32(0.1)
MIB = 1 << 20
WINDOW_WORDS = MIB // 4  # the state_update window: 1 MiB of 32-bit words
CHECKSUM_SLICE = 64 * MIB


def state_pattern(index: int) -> int:
    """mlp_train.cpp's statePattern: every 32-bit word of MiB `index` before the first step."""
    return (0x9E3779B9 * (index + 1)) & 0xFFFFFFFF


def fail(what: str, result) -> NoReturn:
    err = result[0] if isinstance(result, tuple) else result
    code, name = int(err), getattr(err, "name", "unknown CUresult")
    print(f"{PROG}: {what} failed: {name} ({code})", file=sys.stderr)
    sys.exit(1)


def check(what: str, result):
    """Returns the values of a cuda.bindings call, or exits as mlp-train's CHECK does."""
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        fail(what, result)
    rest = result[1:] if isinstance(result, tuple) else ()
    return rest[0] if len(rest) == 1 else rest


class Lcg:
    """mlp_train.cpp's generator: a 64-bit LCG whose high bits give the numbers."""
    MASK = (1 << 64) - 1

    def __init__(self, seed: int):
        self.state = seed

    def next(self) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & self.MASK
        return self.state >> 33

    def uniform(self) -> np.float32:
        # static_cast<float>(next()) / 2147483648.0f - 1.0f, each step rounded to float32.
        return np.float32(self.next()) / np.float32(2147483648.0) - np.float32(1.0)


def synthetic_data():
    """Centres, samples, labels and initial weights, drawn in mlp_train.cpp's order."""
    rng = Lcg(42)
    centres = np.array([rng.uniform() for _ in range(CLASSES * IN)], dtype=np.float32)
    x = np.empty(ROWS * IN, dtype=np.float32)
    labels = np.empty(ROWS, dtype=np.int32)
    noise_scale = np.float32(0.8)
    for i in range(ROWS):
        labels[i] = rng.next() % CLASSES
        for k in range(IN):
            x[i * IN + k] = centres[labels[i] * IN + k] + noise_scale * rng.uniform()
    w1_scale = np.sqrt(np.float32(1.0) / np.float32(IN), dtype=np.float32)
    w1 = np.array([rng.uniform() * w1_scale for _ in range(IN * HIDDEN)], dtype=np.float32)
    w2_scale = np.sqrt(np.float32(1.0) / np.float32(HIDDEN), dtype=np.float32)
    w2 = np.array([rng.uniform() * w2_scale for _ in range(HIDDEN * CLASSES)], dtype=np.float32)
    b1 = np.zeros(HIDDEN, dtype=np.float32)
    b2 = np.zeros(CLASSES, dtype=np.float32)
    return x, labels, w1, b1, w2, b2


def default_ptx_path() -> pathlib.Path:
    build = os.environ.get("PHOS_BUILD_DIR")
    root = pathlib.Path(build) if build else pathlib.Path(__file__).resolve().parent / ".." / ".." / "build"
    return root / "examples" / "mlp_kernels.ptx"


def bounded_int(low: int, high: int):
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} not in [{low} - {high}]")
        return value
    return parse


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Train a small MLP on synthetic data with cuda.core (deterministic)")
    parser.add_argument("--iterations", type=bounded_int(1, 1000000), default=30, help="training steps")
    parser.add_argument("--sleep-ms", type=bounded_int(0, 60000), default=0,
                        help="pause after each step (to checkpoint mid-run)")
    parser.add_argument("--state-mib", type=bounded_int(0, 65536), default=0,
                        help="extra device memory in MiB standing in for optimizer state: filled on the "
                             "device, a 1 MiB window of it updated every step, all of it in the final "
                             "checksum (default 0: none)")
    parser.add_argument("--checkpoint-at", type=bounded_int(0, 1000000), default=None,
                        help="under PhOS: ask for a checkpoint of this process after this step (application SDK)")
    parser.add_argument("--checkpoint-image", type=pathlib.Path, default=None,
                        help="the image directory of --checkpoint-at")
    parser.add_argument("--checkpoint-mode", choices=["cow", "recopy", "stop"], default="cow",
                        help="its protocol (default cow)")
    parser.add_argument("--ptx", type=pathlib.Path, default=None,
                        help="the kernels' PTX (default: $PHOS_BUILD_DIR/examples/mlp_kernels.ptx, "
                             "else build/examples/mlp_kernels.ptx of this source tree)")
    args = parser.parse_args(argv)
    if args.checkpoint_at is not None and args.checkpoint_image is None:
        parser.error("--checkpoint-at needs --checkpoint-image")
    return args


def blocks(n: int, per: int) -> int:
    return (n + per - 1) // per


def float_bits(value: np.float32) -> str:
    return f"{int(np.float32(value).view(np.uint32)):08x}"


def main(argv=None) -> int:
    args = parse_args(argv)
    ptx_path = args.ptx if args.ptx is not None else default_ptx_path()
    try:
        ptx = ptx_path.read_bytes()
    except OSError:
        print(f"{PROG}: cannot read the kernels' PTX at {ptx_path}", file=sys.stderr)
        return 2
    try:
        checkpoint = (args.checkpoint_at, args.checkpoint_image, args.checkpoint_mode)
        return train(ptx, args.iterations, args.sleep_ms, args.state_mib, checkpoint)
    except Exception as e:
        # cuda.core reports Driver API failures as CUDAError, and cuda.pathfinder
        # a libcuda.so.1 it cannot find: say which, without a traceback.
        if not type(e).__module__.startswith("cuda."):
            raise
        print(f"{PROG}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def train(ptx: bytes, iterations: int, sleep_ms: int, state_mib: int = 0, checkpoint=(None, None, "cow")) -> int:
    # Device.set_current() retains device 0's primary context and makes it
    # current: cuDevicePrimaryCtxRetain + cuCtxSetCurrent, as mlp-train does.
    device = Device(0)
    device.set_current()
    module = ObjectCode.from_ptx(ptx, name="mlp_kernels")
    linear_forward, softmax_xent, mean, weight_grad, bias_grad, hidden_grad, sgd = (
        module.get_kernel(name) for name in ("linear_forward", "softmax_xent", "mean_256", "weight_grad",
                                             "bias_grad", "hidden_grad", "sgd_step"))
    state_update = module.get_kernel("state_update") if state_mib > 0 else None

    def alloc(nbytes: int) -> int:
        return int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))

    def upload(host: np.ndarray) -> int:
        ptr = alloc(host.nbytes)
        check("cuMemcpyHtoD", cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        return ptr

    x, labels, w1, b1, w2, b2 = synthetic_data()
    d_x, d_labels, d_w1, d_b1, d_w2, d_b2 = (upload(a) for a in (x, labels, w1, b1, w2, b2))
    d_h, d_logits, d_dlogits = alloc(ROWS * HIDDEN * 4), alloc(ROWS * CLASSES * 4), alloc(ROWS * CLASSES * 4)
    d_losses, d_loss = alloc(ROWS * 4), alloc(4)
    d_gw2, d_gb2 = alloc(w2.nbytes), alloc(b2.nbytes)
    d_dh, d_gw1, d_gb1 = alloc(ROWS * HIDDEN * 4), alloc(w1.nbytes), alloc(b1.nbytes)

    d_state = 0
    if state_mib > 0:
        d_state = alloc(state_mib * MIB)
        for m in range(state_mib):
            check("cuMemsetD32", cu.cuMemsetD32(d_state + m * MIB, state_pattern(m), MIB // 4))
    window_words = np.int32(WINDOW_WORDS)

    # Kernel arguments: device pointers as Python ints (passed as 64-bit
    # values), int and float parameters as numpy scalars of the PTX's widths.
    rows, n_in, hidden, classes = np.int32(ROWS), np.int32(IN), np.int32(HIDDEN), np.int32(CLASSES)
    one, zero = np.int32(1), np.int32(0)
    n_w1, n_b1, n_w2, n_b2 = np.int32(w1.size), np.int32(b1.size), np.int32(w2.size), np.int32(b2.size)
    stream = LEGACY_DEFAULT_STREAM  # the nullptr stream of mlp-train's cuLaunchKernel calls

    def run(kernel, grid, block, *kernel_args):
        launch(stream, LaunchConfig(grid=grid, block=block), kernel, *kernel_args)

    loss = np.zeros(1, dtype=np.float32)
    for step in range(iterations):
        # Forward.
        run(linear_forward, (blocks(HIDDEN, 16), blocks(ROWS, 16)), (16, 16),
            d_x, d_w1, d_b1, d_h, rows, n_in, hidden, one)
        run(linear_forward, (blocks(CLASSES, 8), blocks(ROWS, 32)), (8, 32),
            d_h, d_w2, d_b2, d_logits, rows, hidden, classes, zero)
        run(softmax_xent, (blocks(ROWS, 128), 1), (128, 1), d_logits, d_labels, d_dlogits, d_losses, rows, classes)
        run(mean, (1, 1), (256, 1), d_losses, d_loss, rows)
        # Backward.
        run(weight_grad, (blocks(CLASSES, 8), blocks(HIDDEN, 32)), (8, 32), d_h, d_dlogits, d_gw2, rows, hidden,
            classes)
        run(bias_grad, (1, 1), (32, 1), d_dlogits, d_gb2, rows, classes)
        run(hidden_grad, (blocks(HIDDEN, 16), blocks(ROWS, 16)), (16, 16),
            d_dlogits, d_w2, d_h, d_dh, rows, hidden, classes)
        run(weight_grad, (blocks(HIDDEN, 16), blocks(IN, 16)), (16, 16), d_x, d_dh, d_gw1, rows, n_in, hidden)
        run(bias_grad, (blocks(HIDDEN, 64), 1), (64, 1), d_dh, d_gb1, rows, hidden)
        # Update.
        run(sgd, (blocks(int(n_w1), 256), 1), (256, 1), d_w1, d_gw1, LEARNING_RATE, n_w1)
        run(sgd, (1, 1), (256, 1), d_b1, d_gb1, LEARNING_RATE, n_b1)
        run(sgd, (blocks(int(n_w2), 256), 1), (256, 1), d_w2, d_gw2, LEARNING_RATE, n_w2)
        run(sgd, (1, 1), (256, 1), d_b2, d_gb2, LEARNING_RATE, n_b2)
        if state_mib > 0:
            window = d_state + (step % state_mib) * MIB
            run(state_update, (blocks(WINDOW_WORDS // 4, 256), 1), (256, 1),
                window, d_loss, d_w1, n_w1, window_words, np.uint32(step))

        # Synchronous on the legacy stream: waits for the step's kernels.
        check("cuMemcpyDtoH", cu.cuMemcpyDtoH(loss.ctypes.data, d_loss, loss.nbytes))
        print(f"step {step} loss {float(loss[0]):.6f} ({float_bits(loss[0])})", flush=True)
        if step == checkpoint[0]:
            try:
                phos_sdk.checkpoint(checkpoint[1], checkpoint[2])  # the application SDK: one line
            except OSError as e:
                print(f"{PROG}: no checkpoint at step {step}: {e.strerror}", file=sys.stderr)
        if sleep_ms > 0:
            time.sleep(sleep_ms / 1000)

    digest = xxhash.xxh3_64()
    for ptr, nbytes in ((d_w1, w1.nbytes), (d_b1, b1.nbytes), (d_w2, w2.nbytes), (d_b2, b2.nbytes)):
        host = np.empty(nbytes, dtype=np.uint8)
        check("cuMemcpyDtoH", cu.cuMemcpyDtoH(host.ctypes.data, ptr, nbytes))
        digest.update(host.tobytes())
    # The state after the weights, read in slices as mlp-train does.
    if state_mib > 0:
        total = state_mib * MIB
        host = np.empty(min(total, CHECKSUM_SLICE), dtype=np.uint8)
        for done in range(0, total, host.nbytes):
            n = min(host.nbytes, total - done)
            check("cuMemcpyDtoH", cu.cuMemcpyDtoH(host.ctypes.data, d_state + done, n))
            digest.update(host[:n])
    print(f"weights checksum {digest.intdigest():016x}", flush=True)

    for ptr in (d_x, d_labels, d_w1, d_b1, d_w2, d_b2, d_h, d_logits, d_dlogits, d_losses, d_loss, d_gw2, d_gb2,
                d_dh, d_gw1, d_gb1) + ((d_state,) if state_mib > 0 else ()):
        check("cuMemFree", cu.cuMemFree(ptr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
