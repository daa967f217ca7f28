"""The input pipeline through PyTorch, beside bench_data_loader: torchvision's ImageFolder with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, torch.utils.data.DataLoader with 1..16
worker processes (persistent, pinned memory, shuffled, drop_last), each batch copied to the GPU with
non_blocking=True when there is one.

    python3 bench/pytorch_data_loader.py /tmp/photos [--batch 64] [--workers 1,2,4,8,16] [--seconds 4]

For each worker count: one untimed epoch, then whole epochs until --seconds have passed; one JSON line with
images/s (the clock stops when the last batch is on the device).
"""
import argparse
import json
import os
import time

import torch
import torchvision
from torchvision import transforms as T


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default=os.environ.get("KILN_BENCH_IMAGES"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    if not args.folder:
        p.error("give a folder of JPEGs in ImageFolder layout (bench/make_photos.py)")
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.ImageFolder(args.folder, tf)
    cores = os.cpu_count() or 1
    for w in [int(x) for x in args.workers.split(",")]:
        if w > cores:
            continue
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True, num_workers=w,
                                             pin_memory=gpu, persistent_workers=True)

        def epoch():
            n = 0
            for x, y in loader:
                x = x.to(dev, non_blocking=True)
                y = y.to(dev, non_blocking=True)
                n += x.shape[0]
            if gpu:
                torch.cuda.synchronize()
            return n

        epoch()
        start = time.perf_counter()
        images, epochs, elapsed = 0, 0, 0.0
        while elapsed < args.seconds or epochs < 2:
            images += epoch()
            epochs += 1
            elapsed = time.perf_counter() - start
        print(json.dumps({"bench": "data_loader", "impl": "pytorch", "workers": w, "batch": args.batch,
                          "device": "cuda" if gpu else "cpu", "images": images, "seconds": round(elapsed, 3),
                          "images_per_s": round(images / elapsed, 1), "per_worker": round(images / elapsed / w, 1)}),
              flush=True)
        del loader


if __name__ == "__main__":
    main()
