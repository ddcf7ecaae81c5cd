#!/usr/bin/python3
"""Single-process PyTorch reference for pstrain's default CNN (docs/models.md).

The same network as `pstrain run --model cnn` (conv 5x5 16 -> ReLU -> pool
2x2 -> conv 5x5 32 -> ReLU -> pool 2x2 -> dense 256 ReLU -> dense 10,
Glorot-uniform weights, zero biases), trained on MNIST in one process by
SGD with momentum, with the same learning-rate rule as pstrain's shards: a
linear warm-up (v+1)/WARMUP over the first WARMUP steps and a step decay
times FACTOR every EPOCHS epochs (or a constant or cosine rate).

Time to a held target, the rule of `pstrain run --target-accuracy`
(docs/semantics.md, "Stopped by target"): HOLD evaluations in a row at or
above the target. Every evaluation here scores the whole test set (pstrain
scores a stratified subset and only the evaluation that completes the hold
on the whole set), every --eval-every steps; the clock is the training
time alone: it stops while the model is evaluated. The time to target is
the training time at the evaluation that completes the hold.

Usage (Debian: apt-get install python3-torch):

    python3 scripts/reference/cnn_torch.py --data-dir data

prints one line per evaluation and a final JSON line. Not used by the
tests: measurement only.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

# Torch's intra-op threads are OpenMP; Debian's build multiplies through
# OpenBLAS, whose own threads inside each OpenMP thread oversubscribe the
# cores, and OpenMP's spinning waits lose the cores on a loaded machine
# (2 threads at load 19: 130-500 samples/s with either, 2,100-3,200 with
# neither). Set before torch loads; the environment overrides them.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402


def read_idx(path):
    """Reads an IDX file, raw or gzipped (PATH or PATH.gz)."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    t = torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8)
    return t.reshape(shape)


def load(data_dir, prefix):
    x = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte"))
    x = x.to(torch.float32).div_(255).unsqueeze(1)  # [N, 1, 28, 28], pixels b/255 as pstrain's
    return x.contiguous(), y.to(torch.int64)


class CNN(nn.Module):
    def __init__(self, conv=(16, 32), hidden=256, classes=10, side=28):
        super().__init__()
        layers, ch = [], 1
        for out in conv:
            layers += [nn.Conv2d(ch, out, 5), nn.ReLU(), nn.MaxPool2d(2)]
            ch, side = out, (side - 4) // 2
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(ch * side * side, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)  # Glorot uniform, as model.Spec.Init
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.features(x))


def rate_factor(args, steps_per_epoch, max_steps):
    """The factor on --lr at step v (the update taking version v to v+1)."""
    def f(v):
        r = 1.0
        if args.schedule == "step":
            n = math.floor(v / (args.step_epochs * steps_per_epoch))
            r = args.step_factor ** n
        elif args.schedule == "cosine":
            r = 0.5 * (1 + math.cos(math.pi * min(1.0, v / max_steps)))
        if v < args.warmup:
            r *= (v + 1) / args.warmup
        return r
    return f


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    for i in range(0, len(x), batch):
        correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=200, help="warm-up steps")
    p.add_argument("--schedule", choices=["step", "cosine", "constant"], default="step")
    p.add_argument("--step-epochs", type=float, default=2)
    p.add_argument("--step-factor", type=float, default=0.3)
    p.add_argument("--epochs", type=float, default=10)
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--hold", type=int, default=3, help="evaluations in a row at the target")
    p.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr, ytr = load(args.data_dir, "train")
    xte, yte = load(args.data_dir, "t10k")
    model = CNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov)
    n = len(xtr)
    steps_per_epoch = n / args.batch
    max_steps = int(args.epochs * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate_factor(args, steps_per_epoch, max_steps))
    loss_fn = nn.CrossEntropyLoss()
    train_s, step, streak, held_at, acc = 0.0, 0, 0, None, 0.0
    first_at = None  # training seconds at the first evaluation of the final streak
    perm, pos = torch.randperm(n), 0
    while step < max_steps:
        t0 = time.perf_counter()
        for _ in range(min(args.eval_every, max_steps - step)):
            if pos + args.batch > n:
                perm, pos = torch.randperm(n), 0
            idx = perm[pos:pos + args.batch]
            pos += args.batch
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
            step += 1
        train_s += time.perf_counter() - t0
        acc = evaluate(model, xte, yte)
        streak = streak + 1 if acc >= args.target else 0
        if streak == 1:
            first_at = train_s
        print(f"step {step} epoch {step / steps_per_epoch:.2f} train_s {train_s:.2f} "
              f"loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.5f} test_acc {acc:.4f} streak {streak}", flush=True)
        if args.target > 0 and streak >= args.hold:
            held_at = train_s
            break
    out = {
        "stopped_by": "target" if held_at is not None else "epochs",
        "time_to_target_seconds": held_at,
        "hold_seconds": None if held_at is None else held_at - first_at,
        "epochs": step / steps_per_epoch, "steps": step, "train_seconds": train_s,
        "samples_per_second": step * args.batch / train_s, "test_accuracy": acc,
        "lr": args.lr, "batch": args.batch, "warmup": args.warmup, "threads": args.threads,
        "schedule": args.schedule if args.schedule != "step" else f"step:{args.step_epochs:g}:{args.step_factor:g}",
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
