"""Image loading throughput with PIL and torchvision, in bench_images' cases and JSON-lines format.

    python3 bench/pytorch_images.py /tmp/photos                  (or KILN_BENCH_IMAGES=/tmp/photos)
    python3 bench/pytorch_images.py /tmp/photos --seconds 5 --threads 1,4,16 --impl torchvision

The JPEG files are read into memory first. N "threads" are N worker processes (a multiprocessing pool, as a
PyTorch DataLoader's workers), each with torch.set_num_threads(1), each looping over all the files from its
own starting point for --seconds (3) after a few untimed images. Cases (impl pil: PIL decode + the classic
torchvision.transforms on PIL images; impl torchvision: torchvision.io.decode_jpeg + transforms.v2 on tensors,
antialias=True):
    decode                  the whole JPEG to RGB (PIL: Image.open + convert("RGB"); torchvision: decode_jpeg)
    decode+imagenet_train   RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor/ToDtype + Normalize
    decode+imagenet_eval    Resize(256) + CenterCrop(224) + ToTensor/ToDtype + Normalize

--gpu [--batch N]: instead, torchvision.io.decode_jpeg(device="cuda") on lists of N (256) files in one process,
then per image RandomResizedCrop(224) + RandomHorizontalFlip and one Normalize of the stacked batch on the GPU:
case gpu_decode+imagenet_train, as bench_images --gpu (images/s once the GPU has finished).
"""
import argparse
import io
import json
import multiprocessing as mp
import os
import sys
import time

import torch
import torchvision
from PIL import Image
from torchvision import transforms as T1
from torchvision.transforms import v2 as T2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
FILES = []  # the JPEG bytes, set before the pool forks


def pil_decode(data):
    im = Image.open(io.BytesIO(data))
    return im.convert("RGB")


def tv_decode(data):
    return torchvision.io.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                      mode=torchvision.io.ImageReadMode.RGB)


def make_work(impl, case):
    if impl == "pil":
        train = T1.Compose([T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.ToTensor(),
                            T1.Normalize(MEAN, STD)])
        evaluate = T1.Compose([T1.Resize(256), T1.CenterCrop(224), T1.ToTensor(), T1.Normalize(MEAN, STD)])
        decode = pil_decode
    else:
        train = T2.Compose([T2.RandomResizedCrop(224, antialias=True), T2.RandomHorizontalFlip(),
                            T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD)])
        evaluate = T2.Compose([T2.Resize(256, antialias=True), T2.CenterCrop(224),
                               T2.ToDtype(torch.float32, scale=True), T2.Normalize(MEAN, STD)])
        decode = tv_decode
    if case == "decode":
        return decode
    if case == "decode+imagenet_train":
        return lambda data: train(decode(data))
    return lambda data: evaluate(decode(data))


def worker(args):
    impl, case, seconds, start = args
    torch.set_num_threads(1)
    work = make_work(impl, case)
    n = len(FILES)
    for k in range(min(n, 8)):
        work(FILES[(start + k) % n])
    count, i = 0, start
    t0 = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        work(FILES[i % n])
        i += 1
        count += 1
        elapsed = time.perf_counter() - t0
    return count, elapsed


def gpu_bench(args, hw):
    """GPU decoding of batches of JPEGs with torchvision's nvJPEG path, and the training transforms on the GPU."""
    train = T2.Compose([T2.RandomResizedCrop(224, antialias=True), T2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in FILES]
    n = len(data)

    def batch(start):
        files = [data[(start + k) % n] for k in range(args.batch)]
        images = torchvision.io.decode_jpeg(files, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
        x = torch.stack([train(img) for img in images]).float().div_(255)
        return (x - mean) / std

    batch(0)  # warm-up
    torch.cuda.synchronize()
    count, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        batch(i)
        i += args.batch
        count += args.batch
    torch.cuda.synchronize()
    ips = count / (time.perf_counter() - start)
    print(json.dumps({"bench": "images", "impl": "torchvision", "case": "gpu_decode+imagenet_train", "threads": 1,
                      "batch": args.batch, "images_per_s": round(ips, 1), "per_thread": round(ips, 1),
                      "files": n, "hardware_threads": hw}), flush=True)


def main():
    global FILES
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default=os.environ.get("KILN_BENCH_IMAGES"))
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--impl", default="pil,torchvision")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    if not args.folder:
        sys.exit("pytorch_images: give a folder of JPEGs (argument or KILN_BENCH_IMAGES); "
                 "python3 bench/make_photos.py /tmp/photos builds one")
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(args.folder) for f in fs
                   if f.lower().endswith((".jpg", ".jpeg")))
    if not paths:
        sys.exit(f"pytorch_images: no .jpg/.jpeg files under '{args.folder}'")
    FILES = [open(path, "rb").read() for path in paths]
    hw = os.cpu_count() or 1
    if args.gpu:
        return gpu_bench(args, hw)
    threads = [int(t) for t in args.threads.split(",")]
    ctx = mp.get_context("fork")
    for case in ["decode", "decode+imagenet_train", "decode+imagenet_eval"]:
        for impl in args.impl.split(","):
            for n in threads:
                if n > hw and n != threads[0]:
                    continue  # capped at the cores there are
                with ctx.Pool(n) as pool:
                    results = pool.map(worker, [(impl, case, args.seconds, len(FILES) * k // n) for k in range(n)])
                ips = sum(c for c, _ in results) / max(e for _, e in results)
                print(json.dumps({"bench": "images", "impl": impl, "case": case, "threads": n,
                                  "images_per_s": round(ips, 1), "per_thread": round(ips / n, 1),
                                  "files": len(FILES), "hardware_threads": hw}), flush=True)


if __name__ == "__main__":
    main()
