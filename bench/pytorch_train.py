"""PyTorch on the cases of bench_train (issue 12): whole training steps (zero_grad, forward under autocast, loss,
backward, optimizer step; GradScaler for fp16) through PyTorch eager and torch.compile, on the same GPU as kiln.

    python3 bench/pytorch_train.py [--mode eager|compile|both] [--case NAME]... [--steps N] [--warmup N] [--repeat N]
                                   [--photos DIR] [--quick]
    python3 bench/train_table.py kiln.log torch.log        # kiln / PyTorch, per case

Cases (the names bench_train uses): resnet50_bf16, resnet50_fp16, resnet18_cifar_bf16, bert_base_128, bert_base_512,
bert_large_128, bert_base_128_ckpt (eager only), resnet50_jpeg (eager only; needs --photos, a folder from
bench/make_photos.py). Random (not zero) data made once on the GPU and reused by every step, as bench/model_cases.h
does, except resnet50_jpeg, whose batches come from the JPEGs through torchvision's ImageFolder and a DataLoader.

Timing: the warm-up steps (at least 15 under torch.compile, so compilation stays outside), a synchronize, the peak
memory statistics reset, then one CUDA event before the first of --steps steps and one after the last: step_ms is
the block's time / steps (not a median of single steps), throughput = batch * 1000 / step_ms, peak_gib =
torch.cuda.max_memory_allocated() / 2**30 over the timed steps. After a header "pytorch <version> ...", one JSON
line per case and mode:
    {"bench":"train","framework":"torch-eager","case":"resnet50_bf16","model":"resnet50","batch":256,
     "input":"224x224","precision":"bf16","optimizer":"sgd","step_ms":..,"throughput":..,"unit":"img/s",
     "peak_gib":..,"steps":30,"warmup":10,"loss":..}
A case that is not run prints {"bench":"train","framework":..,"case":..,"skipped":"<reason>"}; one that fails
(out of memory, a compile error) {"bench":"train","framework":..,"case":..,"error":"<message>"}, and the script
goes on with the next.
"""
import argparse
import dataclasses
import gc
import json
import os
import sys
import time
import zlib
from typing import Callable, Optional

import torch
import torch.nn.functional as F

BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}
COMPILE_WARMUP = 15  # torch.compile's first calls compile (and may recompile once); keep them out of the timing


class Skip(Exception):
    """A case that does not run in this mode or without its input; printed as "skipped"."""


@dataclasses.dataclass
class Case:
    model: torch.nn.Module  # on the GPU, in train mode; what torch.compile wraps
    loss: Callable  # loss(net) -> scalar: one step's forward and loss through net (the model or its compiled form)
    opt: torch.optim.Optimizer
    dtype: torch.dtype  # autocast's; float16 adds a GradScaler
    info: dict  # model, batch, input, precision, optimizer: printed as they are
    unit: str  # "img/s" or "seq/s"
    min_warmup: int = 0
    extra: Optional[Callable] = None  # () -> dict of case-specific figures for the JSON line, read after timing
    close: Optional[Callable] = None  # releases what the case holds besides tensors (the loader's workers)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, fused=True)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)


def info(model, batch, input, dtype, optimizer):
    return {"model": model, "batch": batch, "input": input, "precision": PRECISION[dtype], "optimizer": optimizer}


# ---------------------------------------------------------------------------------------------------------------
# The cases: each builds its model, optimizer and data (or loader).

def resnet50_random(args, dtype):
    import torchvision

    batch, size = (2, 64) if args.quick else (256, 224)
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device="cuda").contiguous(memory_format=torch.channels_last)  # (B, 3, H, W)
    y = torch.randint(0, 1000, (batch,), device="cuda")  # (B,)
    return Case(model, lambda net: F.cross_entropy(net(x), y), sgd(model), dtype,
                info("resnet50", batch, f"{size}x{size}", dtype, "sgd"), "img/s")


def resnet50_bf16(args):
    return resnet50_random(args, torch.bfloat16)


def resnet50_fp16(args):
    return resnet50_random(args, torch.float16)


def resnet18_cifar_bf16(args):
    import torchvision

    batch, size = (2, 32) if args.quick else (512, 32)
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # the CIFAR stem: 3x3, stride 1, no max pooling
    model.maxpool = torch.nn.Identity()
    model = model.cuda().to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")
    return Case(model, lambda net: F.cross_entropy(net(x), y), sgd(model), torch.bfloat16,
                info("resnet18-cifar", batch, f"{size}x{size}", torch.bfloat16, "sgd"), "img/s")


def bert_random(args, name, sizes, batch, seq, checkpointing=False):
    from transformers import BertConfig, BertForMaskedLM

    if args.quick:
        batch, seq, sizes = 2, 32, {**sizes, "num_hidden_layers": 2}
    config = BertConfig(**sizes, attn_implementation="sdpa")  # max_position_embeddings 512 by default
    model = BertForMaskedLM(config).cuda().train()
    if checkpointing:
        try:  # the non-reentrant variant, which PyTorch recommends; each BertLayer is one checkpointed segment
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:  # a transformers without the keyword
            model.gradient_checkpointing_enable()
    # The batch as bench/model_cases.h builds it; every tensor (B, T) int64.
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    types = torch.zeros(batch, seq, dtype=torch.long, device="cuda")
    mask = torch.ones(batch, seq, dtype=torch.long, device="cuda")
    mask[1::2, seq - 16:] = 0  # the last 16 tokens of every other sequence are padding
    labels = torch.where(torch.rand(batch, seq, device="cuda") < 0.15, ids, torch.full_like(ids, -100))
    attention = getattr(model.config, "_attn_implementation", None)

    def loss(net):
        return net(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss

    return Case(model, loss, adamw(model), torch.bfloat16, info(name, batch, f"{seq} tokens", torch.bfloat16, "adamw"),
                "seq/s", extra=lambda: {"attention": attention, "checkpointing": checkpointing})


def bert_base_128(args):
    return bert_random(args, "bert-base", {}, 128, 128)


def bert_base_512(args):
    return bert_random(args, "bert-base", {}, 64, 512)


def bert_large_128(args):
    return bert_random(args, "bert-large", BERT_LARGE, 64, 128)


def bert_base_128_ckpt(args):
    return bert_random(args, "bert-base", {}, 128, 128, checkpointing=True)


class FlatPhotos(torch.utils.data.Dataset):
    """The photos of a folder without class subfolders; labels 0..9 from a hash of the file's name (crc32, the same
    in every process, unlike Python's hash())."""

    def __init__(self, folder, transform):
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                            if f.lower().endswith((".jpg", ".jpeg", ".png")))
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            rgb = img.convert("RGB")
        return self.transform(rgb), zlib.crc32(os.path.basename(self.paths[i]).encode()) % 10


def resnet50_jpeg(args):
    if not args.photos:
        raise Skip("no --photos DIR given (bench/make_photos.py DIR --count 2400 makes one)")
    if not os.path.isdir(args.photos):
        raise Skip(f"--photos {args.photos} is not a folder")
    import torchvision
    from torchvision import transforms as T

    batch, size = (2, 64) if args.quick else (256, 224)
    workers = min(2 if args.quick else 16, os.cpu_count() or 1)
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    if any(e.is_dir() for e in os.scandir(args.photos)):
        ds = torchvision.datasets.ImageFolder(args.photos, tf)
    else:  # the photos lie flat in the folder
        ds = FlatPhotos(args.photos, tf)
    if len(ds) < batch:
        raise Skip(f"{len(ds)} photos in {args.photos}, fewer than one batch of {batch} "
                   "(bench/make_photos.py DIR --count 2400)")
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                                         persistent_workers=True, drop_last=True)
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last).train()
    waited = {"s": 0.0}

    def cycle():  # epoch after epoch; each new epoch reshuffles
        while True:
            for x, y in loader:
                yield (x.to("cuda", non_blocking=True).contiguous(memory_format=torch.channels_last),
                       y.to("cuda", non_blocking=True))

    batches = cycle()

    def loss(net):
        t = time.perf_counter()
        x, y = next(batches)  # (B, 3, 224, 224) channels-last, (B,)
        waited["s"] += time.perf_counter() - t
        return F.cross_entropy(net(x), y)

    def extra():  # host time per timed step spent waiting for the loader
        return {"workers": workers, "photos": len(ds), "data_wait_ms": round(1000 * waited["s"] / args.steps, 3)}

    # The loader keeps workers * prefetch_factor (2) batches in flight; warm up past them so that the timed steps
    # are fed at the loader's steady rate, not from batches made while cuDNN searched its algorithms.
    return Case(model, loss, sgd(model), torch.bfloat16, info("resnet50", batch, f"{size}x{size} jpeg",
                                                              torch.bfloat16, "sgd"),
                "img/s", min_warmup=0 if args.quick else 2 * 2 * workers,
                extra=extra, close=batches.close)


# name -> (builder, runs under torch.compile); the order of the table
CASES = {
    "resnet50_bf16": (resnet50_bf16, True),
    "resnet50_fp16": (resnet50_fp16, True),
    "resnet18_cifar_bf16": (resnet18_cifar_bf16, True),
    "bert_base_128": (bert_base_128, True),
    "bert_base_512": (bert_base_512, True),
    "bert_large_128": (bert_large_128, True),
    "bert_base_128_ckpt": (bert_base_128_ckpt, False),
    "resnet50_jpeg": (resnet50_jpeg, False),
}


# ---------------------------------------------------------------------------------------------------------------
# Timing

def time_case(case, net, warmup, steps):
    """(ms per step, peak GiB, last loss) over `steps` steps timed as one block after `warmup` steps."""
    scaler = torch.amp.GradScaler("cuda") if case.dtype == torch.float16 else None

    def step():
        case.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=case.dtype):
            loss = case.loss(net)
        if scaler is None:
            loss.backward()
            case.opt.step()
        else:  # fused SGD takes the scale and the inf check itself: no host sync in scaler.step
            scaler.scale(loss).backward()
            scaler.step(case.opt)
            scaler.update()
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    loss = None
    torch.cuda.profiler.start()  # the timed steps are the range an attached profiler records (bench/kernel_trace.cpp)
    start.record()
    for _ in range(steps):
        loss = step()
    stop.record()
    stop.synchronize()
    torch.cuda.profiler.stop()
    ms = start.elapsed_time(stop) / steps
    return ms, torch.cuda.max_memory_allocated() / 2**30, loss.detach().float().item()


def message(e):
    """One line: the exception's type and the first lines of its message (an OOM message runs long)."""
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def run_case(args, name, mode):
    line = {"bench": "train", "framework": f"torch-{mode}", "case": name}
    build, compiles = CASES[name]
    case = net = None
    try:
        if mode == "compile" and not compiles:
            raise Skip("eager only")
        torch.manual_seed(args.seed)
        case = build(args)
        net = torch.compile(case.model) if mode == "compile" else case.model
        warmup = max(args.warmup, case.min_warmup, args.compile_warmup if mode == "compile" else 0)
        ms, peak, loss = time_case(case, net, warmup, args.steps)
        line.update(case.info)
        line.update({"step_ms": round(ms, 3), "throughput": round(case.info["batch"] * 1000.0 / ms, 1),
                     "unit": case.unit, "peak_gib": round(peak, 3), "steps": args.steps, "warmup": warmup,
                     "loss": round(loss, 4)})
        if case.extra:
            line.update(case.extra())
    except Skip as e:
        line["skipped"] = str(e)
    except Exception as e:  # noqa: BLE001  (out of memory, a compile error, a missing package: report, go on)
        line["error"] = message(e)
    finally:
        if case is not None and case.close is not None:
            case.close()
    print(json.dumps(line), flush=True)
    # Free this case's model, optimizer state, data and compiled graphs, so that each peak is the case's own.
    del case, net
    if mode == "compile":
        torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def versions():
    found = []
    for module in ("torchvision", "transformers"):
        try:
            found.append(f"{module} {__import__(module).__version__}")
        except Exception:  # noqa: BLE001  (absent: its cases print an error line)
            found.append(f"{module} absent")
    return ", ".join(found)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="both", choices=["eager", "compile", "both"])
    p.add_argument("--case", action="append", choices=list(CASES), help="repeatable; default: every case")
    p.add_argument("--steps", type=int, help="timed steps (30; --quick 2)")
    p.add_argument("--warmup", type=int, help=f"untimed steps before (10; --quick 1; torch.compile at least "
                                             f"{COMPILE_WARMUP})")
    p.add_argument("--photos", default=os.environ.get("KILN_BENCH_IMAGES"),
                   help="a folder of JPEGs for resnet50_jpeg (bench/make_photos.py)")
    p.add_argument("--seed", type=int, default=1234, help="torch.manual_seed before each case builds its weights "
                   "and data (1234)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps: checks that the script runs")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each case and mode, one line each (eager step times move between runs; "
                        "train_table.py compares kiln with the fastest)")
    args = p.parse_args()
    if args.steps is None:
        args.steps = 2 if args.quick else 30
    if args.warmup is None:
        args.warmup = 1 if args.quick else 10
    if args.steps < 1 or args.warmup < 0 or args.repeat < 1:
        p.error("--steps and --repeat must be at least 1 and --warmup at least 0")
    args.compile_warmup = 2 if args.quick else COMPILE_WARMUP
    modes = ["eager", "compile"] if args.mode == "both" else [args.mode]
    names = args.case or list(CASES)
    if not torch.cuda.is_available():
        print(f"pytorch {torch.__version__} train: no GPU visible; nothing to measure", flush=True)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(f"pytorch {torch.__version__} train: {torch.cuda.get_device_name()}, {versions()}; {args.steps} steps "
          f"timed as one block after {args.warmup} warm-up steps, seed {args.seed} (torch.compile: at least "
          f"{max(args.warmup, args.compile_warmup)}){', quick sizes' if args.quick else ''}", flush=True)
    for name in names:
        for mode in modes:
            for _ in range(args.repeat):
                run_case(args, name, mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
