# SPDX-License-Identifier: Apache-2.0
"""A PyTorch job for tests/python/test_torch.py, run with .venv-torch's Python.

PyPI's torch carries no PTX, so its kernels run only on a real GPU: on vgpu
this job does what needs no kernel. Tensors of several dtypes are made on the
device (torch.empty, copies from pageable and pinned host memory), changed
each step by copies only (host to device, device to device, through a side
stream ordered by an event), and printed per step as a checksum of all their
bytes. Deterministic, so a restored run prints the same lines as an
uninterrupted one.

    torch_job.py [--steps N] [--sleep-ms MS] [--launch]

--launch: after the steps, launch one kernel; the job prints how torch
reports that (no kernel image on vgpu) and exits 0.
"""
import argparse
import hashlib
import sys
import time

import torch


def checksum(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--launch", action="store_true")
    args = ap.parse_args()

    assert torch.cuda.is_available(), "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name} cc {props.major}.{props.minor} memory {props.total_memory} "
          f"allocator {torch.cuda.get_allocator_backend()}", flush=True)

    gen = torch.Generator().manual_seed(1234)
    host = {
        "f32": torch.randn(4096, generator=gen),
        "f64": torch.randn(513, generator=gen, dtype=torch.float64),
        "i64": torch.randint(-2**40, 2**40, (1000,), generator=gen),
        "u8": torch.randint(0, 256, (70001,), generator=gen, dtype=torch.uint8),
        "f16": torch.randn(2048, generator=gen).to(torch.float16),
    }
    dev = {k: v.to("cuda") for k, v in host.items()}
    scratch = {k: torch.empty_like(v) for k, v in dev.items()}
    pinned = {k: v.pin_memory() for k, v in host.items()}
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    for step in range(args.steps):
        for k in dev:
            # A new host pattern of the step, into the device through pinned memory.
            pinned[k].copy_(torch.roll(host[k], shifts=step + 1))
            scratch[k].copy_(pinned[k], non_blocking=True)
        done.record()
        with torch.cuda.stream(side):
            side.wait_event(done)
            for k, t in dev.items():
                # Device to device on the side stream (contiguous ranges of one
                # dtype: cudaMemcpyAsync, no kernel): all of the state every
                # third step, else its first half from the pattern's second.
                n = t.numel()
                if step % 3 == 0:
                    t.copy_(scratch[k])
                else:
                    t[: n // 2].copy_(scratch[k][n - n // 2:][: n // 2])
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        print(f"step {step} tensors {checksum(dev.values())} allocated {torch.cuda.memory_allocated()} "
              f"requested {stats.get('requested_bytes.all.current', 0)}", flush=True)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
    print(f"final {checksum(list(dev.values()) + list(scratch.values()))}", flush=True)
    if args.launch:
        try:
            y = dev["f32"] + 1
            torch.cuda.synchronize()
            print(f"kernel ran: {float(y[0])}")
        except Exception as e:  # noqa: BLE001 (what torch raises is the point)
            print(f"kernel refused: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
