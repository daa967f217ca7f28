#!/usr/bin/env python3
"""ResNet-50 from one start on both sides: PyTorch writes the weights and the batch, each side trains them.

bench_train and pytorch_train.py each draw their own weights and batch, so their losses after many steps of
memorising one batch differ by chance as well as by arithmetic. Here both sides start from the same torchvision
weights and the same batch (batch 256, 224x224 standard-normal images, 1000 random labels) and train with
bench_train's recipe (channels-last, SGD lr 0.1, momentum 0.9, weight decay 5e-5, cuDNN benchmark mode), so the
loss of every step can be compared. fp32 runs with TF32 off (matmuls and convolutions) on both sides.

  python3 bench/same_start.py export DIR [--seed 1234] [--batch 256]   DIR/weights.pt, DIR/batch.pt
  python3 bench/same_start.py train DIR [--steps 75] [--precision bf16|fp32]
  build/bench/bench_same_start DIR [--steps 75] [--precision bf16|fp32]

Each training run prints one JSON line with the loss of every step.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F


def export(args):
    import torchvision

    os.makedirs(args.dir, exist_ok=True)
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50(num_classes=1000)
    torch.save(model.state_dict(), os.path.join(args.dir, "weights.pt"))
    x = torch.randn(args.batch, 3, 224, 224)  # (B, 3, H, W) float32
    y = torch.randint(0, 1000, (args.batch,))  # (B,) int64
    torch.save({"x": x, "y": y}, os.path.join(args.dir, "batch.pt"))
    print(f"wrote {args.dir}/weights.pt and {args.dir}/batch.pt (seed {args.seed})")


def train(args):
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = torchvision.models.resnet50(num_classes=1000)
    model.load_state_dict(torch.load(os.path.join(args.dir, "weights.pt")))
    model = model.cuda().to(memory_format=torch.channels_last).train()
    batch = torch.load(os.path.join(args.dir, "batch.pt"))
    x = batch["x"].cuda().contiguous(memory_format=torch.channels_last)
    y = batch["y"].cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, fused=True)
    losses = []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(f"{loss.item():.6g}"))
    print(json.dumps({"framework": "torch", "precision": args.precision, "steps": args.steps, "losses": losses}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("dir")
    e.add_argument("--seed", type=int, default=1234)
    e.add_argument("--batch", type=int, default=256, help="bench_train's 256; smaller for a check on the CPU")
    t = sub.add_parser("train")
    t.add_argument("dir")
    t.add_argument("--steps", type=int, default=75)
    t.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = p.parse_args()
    export(args) if args.command == "export" else train(args)


if __name__ == "__main__":
    main()
