# SPDX-License-Identifier: Apache-2.0
"""A PyTorch training loop for scripts/gpu-check, on a GPU: an MLP of about
14 M parameters trained with Adam on random data (a few hundred MB of
parameters, gradients and optimizer state), deterministic (cuBLAS workspace
fixed, deterministic algorithms, no TF32), printing every step its loss and a
sum of the bits of every parameter (an integer sum: exact, whatever the
order). A restored run prints the same lines as an uninterrupted one.

    torch_train.py [--steps N] [--sleep-ms MS] [--width W]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def bits_sum(params) -> int:
    total = torch.zeros((), dtype=torch.int64, device="cuda")
    for p in params:
        total += p.detach().view(torch.int32).to(torch.int64).sum()
    return int(total)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args()

    assert torch.cuda.is_available(), "no CUDA device"
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1234)
    w = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(512, w), torch.nn.GELU(), torch.nn.Linear(w, w), torch.nn.GELU(),
        torch.nn.Linear(w, w), torch.nn.GELU(), torch.nn.Linear(w, w), torch.nn.GELU(),
        torch.nn.Linear(w, 16)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(99)
    x = torch.randn(1024, 512, device="cuda", generator=gen)
    target = torch.randint(0, 16, (1024,), device="cuda", generator=gen)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters {params}: {params * 16 >> 20} MiB with gradients and Adam state", flush=True)
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.9g} bits {bits_sum(model.parameters())}", flush=True)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
