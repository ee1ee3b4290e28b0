"""A small but real PyTorch training loop on synthetic data: gpuenv's quickstart.

It learns y = f(x) for a fixed random non-linear f, prints the loss as it falls, and
saves a checkpoint into the project (checkpoints/model.pt, owned by you, not root).
On a GPU it switches on mixed precision and gradient accumulation (--amp, --accumulate).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                        help="mixed precision (auto: on when a GPU is present)")
    parser.add_argument("--accumulate", type=int, default=0,
                        help="micro-batches per optimizer step (0: 4 on a GPU, 1 on the CPU)")
    parser.add_argument("--log-every", type=int, default=25)
    return parser.parse_args()


def main() -> None:
    args = parse()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = args.amp == "on" or (args.amp == "auto" and device.type == "cuda")
    accumulate = args.accumulate or (4 if device.type == "cuda" else 1)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name}; mixed precision {'on' if amp else 'off'}, "
          f"gradient accumulation {accumulate}", flush=True)

    features = 32
    teacher = nn.Sequential(nn.Linear(features, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    model = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")
    dtype = torch.bfloat16 if device.type == "cpu" else torch.float16

    started = time.monotonic()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accumulate):
            x = torch.randn(args.batch_size, features, device=device)
            y = teacher(x) + 0.01 * torch.randn(args.batch_size, 1, device=device)
            with torch.autocast(device.type, dtype=dtype, enabled=amp):
                loss = nn.functional.mse_loss(model(x), y) / accumulate
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.step(optimizer)
        scaler.update()
        if step == 1 or step % args.log_every == 0:
            print(f"step {step:4d}  loss {total:.5f}", flush=True)

    os.makedirs("checkpoints", exist_ok=True)
    torch.save(model.state_dict(), "checkpoints/model.pt")
    print(f"done in {time.monotonic() - started:.1f}s; saved checkpoints/model.pt", flush=True)


if __name__ == "__main__":
    main()
