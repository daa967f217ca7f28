"""PyTorch on the cases of bench_train: whole training steps (zero_grad, forward under autocast, loss, backward,
optimizer step; GradScaler for fp16) in each of the modes a PyTorch expert would use, on the same GPU as kiln.

    python3 bench/pytorch_train.py [--mode MODE]... [--case NAME]... [--steps N] [--warmup N] [--batches N]
                                   [--repeat N] [--photos DIR] [--quick]
    python3 bench/train_table.py kiln.log torch.log        # kiln / PyTorch's fastest mode, per case

Modes (--mode, repeatable; default eager, compile, eager_graph, compile_graph):
    eager          the model as it is
    compile        torch.compile(model) (default mode), no CUDA graph
    eager_graph    the whole step captured once in a CUDA graph and replayed: warm-up steps on a side stream, then
                   torch.cuda.graph around forward, backward and the optimizer step (and the GradScaler's step and
                   update), with fused optimizers (AdamW capturable=True); each batch is copied into the static
                   inputs before its replay
    compile_graph  the same around torch.compile(model)
    compile_max    torch.compile(model, mode="max-autotune"), which captures CUDA graphs itself; slow to compile
    all            every mode above

Cases (the names bench_train uses): resnet50_bf16, resnet50_fp16, resnet18_cifar_bf16, bert_base_128, bert_base_512,
bert_large_128, bert_base_128_ckpt (eager and compile only), resnet50_fp32 and bert_base_128_fp32 (float32, TF32
products), bert_base_128_fp8 and bert_large_128_fp8 (torchao's float8 training on the Linears whose sizes are
multiples of 16, bf16 autocast elsewhere; skipped where torchao is not installed), bert_base_128_p20 and
bert_large_128_p20 (20 labelled positions per sequence, the masked-LM head on those rows only: PredictedHead;
bert_base_128_fp8_p20 and bert_large_128_fp8_p20 with torchao's float8 training as the _fp8 cases),
bert_base_dynamic (sequence classification on batches of varying length: eager and
torch.compile(dynamic=True) only; the first epoch is timed on its own, "first_epoch_s", then two epochs as one block),
resnet50_jpeg (eager and compile only; needs --photos, a folder from bench/make_photos.py). As bench_train: --batches distinct random batches (8) made once on the GPU, which
the steps cycle through; the learning rate rises linearly over the warm-up steps to the case's rate; every step's
loss (and the GradScaler's scale) is logged on the GPU and judged after the timing by bench/train_log.h's rules
(bench/train_rules.py): a non-finite loss, a timed step the GradScaler skipped or a loss that did not fall makes
the line say "trained": false and "failed": why, and train_table.py leaves that run out.

Timing: the warm-up steps (at least 15 under torch.compile, so compilation stays outside), a synchronize, the peak
memory statistics reset, then one CUDA event before the first of --steps steps and one after the last: step_ms is
the block's time / steps (not a median of single steps), throughput = batch * 1000 / step_ms, peak_gib =
torch.cuda.max_memory_allocated() / 2**30 over the timed steps (with a graph: over the capture and the replays).
First a line {"bench": "gemm_peak", ...}: the bf16 matrix product's rate on this GPU (8192^3, cuBLAS), which
train_table.py takes for the MFU. After a header "pytorch <version> ...", one JSON line per case, mode and run:
    {"bench":"train","framework":"torch-eager","case":"resnet50_bf16","model":"resnet50","batch":256,
     "input":"224x224","precision":"bf16","optimizer":"sgd","step_ms":..,"throughput":..,"unit":"img/s",
     "peak_gib":..,"steps":30,"warmup":10,"loss":..,"batches":8,"trained":true,"loss_first":..,"loss_last":..,
     "skipped_steps":0,"skipped_total":0,"losses":[..]}
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

from train_rules import judge_training

BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # fp32: TF32 products
COMPILE_WARMUP = 15  # torch.compile's first calls compile (and may recompile once); keep them out of the timing
MODES = ("eager", "compile", "eager_graph", "compile_graph", "compile_max")
DEFAULT_MODES = MODES[:4]


class Skip(Exception):
    """A case that does not run in this mode or without its input; printed as "skipped"."""


@dataclasses.dataclass
class Case:
    model: torch.nn.Module  # on the GPU, in train mode; what torch.compile wraps
    loss: Callable  # loss(net, batch) -> scalar: one step's forward and loss through net (the model or its compiled
    #                 form) on batch (a tuple of tensors; None for a case that draws its own, the JPEG one)
    opt: torch.optim.Optimizer
    dtype: torch.dtype  # autocast's; float16 adds a GradScaler
    info: dict  # model, batch, input, precision, optimizer: printed as they are
    unit: str  # "img/s" or "seq/s"
    batches: Optional[list] = None  # the distinct batches the steps cycle through (tuples of tensors)
    min_warmup: int = 0
    extra: Optional[Callable] = None  # () -> dict of case-specific figures for the JSON line, read after timing
    close: Optional[Callable] = None  # releases what the case holds besides tensors (the loader's workers)
    graphs: bool = True  # whether the graph modes apply
    dynamic: bool = False  # batches of varying shapes: timed by epochs (time_dynamic), compiled with dynamic=True


def sgd(model, graph):
    del graph  # fused SGD is capturable as it is
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, fused=True)


def adamw(model, graph):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True, capturable=graph)


def info(model, batch, input, dtype, optimizer):
    return {"model": model, "batch": batch, "input": input, "precision": PRECISION[dtype], "optimizer": optimizer}


# ---------------------------------------------------------------------------------------------------------------
# The cases: each builds its model, optimizer and data (or loader).

def resnet50_random(args, dtype):
    import torchvision

    batch, size = (2, 64) if args.quick else (256, 224)
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last).train()
    return Case(model, lambda net, b: F.cross_entropy(net(b[0]), b[1]), sgd(model, args.graph), dtype,
                info("resnet50", batch, f"{size}x{size}", dtype, "sgd"), "img/s",
                batches=image_batches(args, batch, size, 1000))


CIFAR_BATCHES = 64  # kCifarBatches in bench/bench_train.cpp


def cifar_batches(args):
    """The CIFAR case's distinct batches: 64 unless --batches is given, so that its steps do not memorise them."""
    return args.batches if args.batches_given or args.quick else CIFAR_BATCHES


PATTERN_GAIN = 0.5  # kPatternGain and kLabelNoise in bench/model_cases.h
LABEL_NOISE = 0.1


def image_batches(args, batch, size, classes, count=None):
    """--batches pairs of (B, 3, H, W) channels-last images and (B,) labels, as bench/model_cases.h makes them:
    standard-normal noise plus PATTERN_GAIN times the image's class pattern (8x8 per channel, standard-normal,
    tiled), then LABEL_NOISE of the labels redrawn uniformly, so that the loss can fall but not to zero."""
    patterns = torch.randn(classes, 3, 8, 8, device="cuda")
    out = []
    for _ in range(count or args.batches):
        x = torch.randn(batch, 3, size, size, device="cuda")
        y = torch.randint(0, classes, (batch,), device="cuda")
        x = x + PATTERN_GAIN * patterns[y].reshape(batch, 3, 1, 8, 1, 8).expand(
            batch, 3, size // 8, 8, size // 8, 8).reshape(batch, 3, size, size)  # pixel (h, w): patterns[k][:, h%8, w%8]
        y = torch.where(torch.rand(batch, device="cuda") < LABEL_NOISE,
                        torch.randint(0, classes, (batch,), device="cuda"), y)
        out.append((x.contiguous(memory_format=torch.channels_last), y))
    return out


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
    return Case(model, lambda net, b: F.cross_entropy(net(b[0]), b[1]), sgd(model, args.graph), torch.bfloat16,
                info("resnet18-cifar", batch, f"{size}x{size}", torch.bfloat16, "sgd"), "img/s",
                batches=image_batches(args, batch, size, 10, cifar_batches(args)))


def float8_training():
    """torchao's float8 training (convert_to_float8_training), or Skip where torchao is not installed."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        raise Skip(f"torchao's float8 training is not installed ({e}); pip install torchao") from e
    return convert_to_float8_training


class PredictedHead(torch.nn.Module):
    """A BertForMaskedLM whose head runs on the listed positions only (as kiln's masked_positions): the encoder's
    rows at positions (B, P) are gathered, then the transform and decoder, then the cross-entropy against the labels
    there. One module, so that torch.compile sees the gather too."""

    def __init__(self, mlm):
        super().__init__()
        self.mlm = mlm

    def forward(self, ids, types, mask, labels, positions):
        hidden = self.mlm.bert(input_ids=ids, token_type_ids=types, attention_mask=mask)[0]  # (B, S, H)
        b, s, h = hidden.shape
        rows = (positions + torch.arange(b, device=positions.device).unsqueeze(1) * s).reshape(-1)
        logits = self.mlm.cls(hidden.reshape(-1, h).index_select(0, rows))
        return F.cross_entropy(logits, labels.reshape(-1).index_select(0, rows), ignore_index=-100)


def bert_random(args, name, sizes, batch, seq, checkpointing=False, dtype=torch.bfloat16, fp8=False, predictions=0):
    from transformers import BertConfig, BertForMaskedLM

    convert = float8_training() if fp8 else None

    if args.quick:
        batch, seq, sizes = 2, 32, {**sizes, "num_hidden_layers": 2}
    config = BertConfig(**sizes, attn_implementation="sdpa")  # max_position_embeddings 512 by default
    model = BertForMaskedLM(config).cuda().train()
    if convert is not None:
        # torchao's default recipe (tensorwise scales from each tensor's current amax) on the Linears whose sizes
        # are multiples of 16, as kiln's default FP8 filter: the 30,522-wide MLM decoder stays bf16.
        convert(model, module_filter_fn=lambda m, fqn: m.in_features % 16 == 0 and m.out_features % 16 == 0)
    if checkpointing:
        try:  # the non-reentrant variant, which PyTorch recommends; each BertLayer is one checkpointed segment
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:  # a transformers without the keyword
            model.gradient_checkpointing_enable()
    # The batches as bench/model_cases.h builds them; every tensor (B, T) int64. Random tokens; 15% of positions
    # carry a label (the token itself), the rest are ignored (-100); the same types and mask in each.
    types = torch.zeros(batch, seq, dtype=torch.long, device="cuda")
    mask = torch.ones(batch, seq, dtype=torch.long, device="cuda")
    mask[1::2, seq - 16:] = 0  # the last 16 tokens of every other sequence are padding
    # With predictions = P: exactly P labels per sequence, at distinct positions uniform over 1 .. seq - 17 (never
    # padding), listed ascending (bench/model_cases.h's make_bert).
    if args.quick and predictions:
        predictions = 4
    batches = []
    for _ in range(args.batches):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
        if predictions:
            positions = torch.stack([torch.randperm(seq - 17)[:predictions].sort().values + 1 for _ in range(batch)])
            positions = positions.cuda()
            labels = torch.full_like(ids, -100).scatter(1, positions, ids.gather(1, positions))
            batches.append((ids, labels, positions))
            continue
        batches.append((ids, torch.where(torch.rand(batch, seq, device="cuda") < 0.15, ids, torch.full_like(ids, -100))))
    attention = getattr(model.config, "_attn_implementation", None)

    def loss(net, b):
        if predictions:
            return net(b[0], types, mask, b[1], b[2])
        return net(input_ids=b[0], token_type_ids=types, attention_mask=mask, labels=b[1]).loss

    if predictions:
        model = PredictedHead(model)
    described = info(name, batch, f"{seq} tokens" + (f", {predictions} predicted" if predictions else ""), dtype,
                     "adamw")
    if fp8:
        described["precision"] = "fp8"
    return Case(model, loss, adamw(model, args.graph), dtype, described, "seq/s", batches=batches,
                extra=lambda: {"attention": attention, "checkpointing": checkpointing}, graphs=not checkpointing)


def bert_base_128(args):
    return bert_random(args, "bert-base", {}, 128, 128)


def bert_base_512(args):
    return bert_random(args, "bert-base", {}, 64, 512)


def bert_large_128(args):
    return bert_random(args, "bert-large", BERT_LARGE, 64, 128)


def bert_base_128_p20(args):
    return bert_random(args, "bert-base", {}, 128, 128, predictions=20)


def bert_large_128_p20(args):
    return bert_random(args, "bert-large", BERT_LARGE, 64, 128, predictions=20)


def bert_base_128_fp8_p20(args):
    return bert_random(args, "bert-base", {}, 128, 128, fp8=True, predictions=20)


def bert_large_128_fp8_p20(args):
    return bert_random(args, "bert-large", BERT_LARGE, 64, 128, fp8=True, predictions=20)


def bert_base_128_ckpt(args):
    return bert_random(args, "bert-base", {}, 128, 128, checkpointing=True)


def resnet50_fp32(args):
    return resnet50_random(args, torch.float32)


def bert_base_128_fp32(args):
    return bert_random(args, "bert-base", {}, 128, 128, dtype=torch.float32)


def bert_base_128_fp8(args):
    return bert_random(args, "bert-base", {}, 128, 128, fp8=True)


def bert_large_128_fp8(args):
    return bert_random(args, "bert-large", BERT_LARGE, 64, 128, fp8=True)


def bert_base_dynamic(args):
    """BERT-base sequence classification on batches of varying length, as bench_train's dynamic_case: 64 batches
    of 32 (quick: 4 of 2); 2,048 lengths uniform on [16, 128], sorted and cut into batches, each padded to its
    longest, the batches' order shuffled; tokens uniform on [1, vocab), padding 0; label: the token at position 1
    in the upper half of the vocabulary. AdamW, bf16 autocast."""
    from transformers import BertConfig, BertForSequenceClassification

    batches, batch, lo, hi = (4, 2, 16, 128) if args.quick else (64, 32, 16, 128)
    config = BertConfig(num_labels=2, attn_implementation="sdpa",
                        **({"num_hidden_layers": 2, "vocab_size": 1000} if args.quick else {}))
    model = BertForSequenceClassification(config).cuda().train()
    lengths = torch.randint(lo, hi + 1, (batches * batch,)).sort().values
    data = []
    padded = 0
    for k in torch.randperm(batches).tolist():
        lens = lengths[k * batch:(k + 1) * batch]
        n = int(lens.max())
        keep = torch.arange(n).reshape(1, n) < lens.reshape(batch, 1)  # (B, n): inside each sequence
        ids = torch.where(keep, torch.randint(1, config.vocab_size, (batch, n)), torch.zeros(batch, n, dtype=torch.long))
        labels = (ids[:, 1] >= config.vocab_size // 2).long()
        data.append((ids.cuda(), torch.zeros(batch, n, dtype=torch.long, device="cuda"), keep.long().cuda(),
                     labels.cuda()))
        padded += batch * n

    def loss(net, b):
        return net(input_ids=b[0], token_type_ids=b[1], attention_mask=b[2], labels=b[3]).loss

    return Case(model, loss, adamw(model, False), torch.bfloat16,
                info("bert-base-classifier", batch, f"{lo}-{hi} tokens", torch.bfloat16, "adamw"), "seq/s",
                batches=data, graphs=False, dynamic=True,
                extra=lambda: {"epoch_batches": batches, "tokens_per_step": round(padded / batches, 1)})


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

    def loss(net, b):
        del b  # the loader's batches
        t = time.perf_counter()
        x, y = next(batches)  # (B, 3, 224, 224) channels-last, (B,)
        waited["s"] += time.perf_counter() - t
        return F.cross_entropy(net(x), y)

    def extra():  # host time per timed step spent waiting for the loader
        return {"workers": workers, "photos": len(ds), "data_wait_ms": round(1000 * waited["s"] / args.steps, 3)}

    # The loader keeps workers * prefetch_factor (2) batches in flight; warm up past them so that the timed steps
    # are fed at the loader's steady rate, not from batches made while cuDNN searched its algorithms.
    return Case(model, loss, sgd(model, False), torch.bfloat16, info("resnet50", batch, f"{size}x{size} jpeg",
                                                                     torch.bfloat16, "sgd"),
                "img/s", min_warmup=0 if args.quick else 2 * 2 * workers,
                extra=extra, close=batches.close, graphs=False)


# name -> builder; the order of the table
CASES = {
    "resnet50_bf16": resnet50_bf16,
    "resnet50_fp16": resnet50_fp16,
    "resnet18_cifar_bf16": resnet18_cifar_bf16,
    "bert_base_128": bert_base_128,
    "bert_base_128_p20": bert_base_128_p20,
    "bert_large_128_p20": bert_large_128_p20,
    "bert_base_128_fp8_p20": bert_base_128_fp8_p20,
    "bert_large_128_fp8_p20": bert_large_128_fp8_p20,
    "bert_base_512": bert_base_512,
    "bert_large_128": bert_large_128,
    "bert_base_128_ckpt": bert_base_128_ckpt,
    "resnet50_fp32": resnet50_fp32,
    "bert_base_128_fp32": bert_base_128_fp32,
    "bert_base_128_fp8": bert_base_128_fp8,
    "bert_large_128_fp8": bert_large_128_fp8,
    "bert_base_dynamic": bert_base_dynamic,
    "resnet50_jpeg": resnet50_jpeg,
}
GRAPH_MODES = ("eager_graph", "compile_graph")


# ---------------------------------------------------------------------------------------------------------------
# Timing

class StepLog:
    """Every step's loss and the GradScaler's scale after it, written on the GPU as the steps run (no host sync)."""

    def __init__(self, capacity, scaler):
        self.losses = torch.zeros(capacity, device="cuda")
        self.scales = torch.zeros(capacity, device="cuda") if scaler is not None else None
        self.scaler, self.n, self.timed = scaler, 0, []

    def record(self, loss):
        if self.n >= len(self.losses):
            raise RuntimeError(f"more steps than the step log holds ({len(self.losses)})")
        self.losses[self.n].copy_(loss.detach().float().reshape(()))
        if self.scales is not None:
            self.scales[self.n].copy_(self.scaler._scale.reshape(()))  # the scale tensor update() rewrites
        self.n += 1

    def fields(self, cycle):
        losses = self.losses[:self.n].double().tolist()
        scales = self.scales[:self.n].double().tolist() if self.scales is not None else []
        init = getattr(self.scaler, "_init_scale", 65536.0)  # the scale before the first step
        return judge_training(losses, scales, init, self.timed, cycle)


def set_lr_warmup(opt, base, k, warmup):
    """Step k of the warm-up trains at base * (k + 1) / warmup, later steps at base (as bench_train's LrWarmup)."""
    f = (k + 1) / warmup if k < warmup else 1.0
    for group, lr in zip(opt.param_groups, base):
        group["lr"] = lr * f


def training_step(case, net, scaler):
    """step(batch) -> loss: zero_grad, forward and loss under autocast (off for float32), backward, optimizer step
    (through the GradScaler when there is one)."""
    def step(batch):
        case.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16 if case.dtype == torch.float32 else case.dtype,
                            enabled=case.dtype != torch.float32):
            loss = case.loss(net, batch)
        if scaler is None:
            loss.backward()
            case.opt.step()
        else:  # the fused optimizers take the scale and the inf check themselves: no host sync in scaler.step
            scaler.scale(loss).backward()
            scaler.step(case.opt)
            scaler.update()
        return loss

    return step


def time_case(case, net, warmup, steps, graph):
    """(ms per step, peak GiB, last loss, step log) over `steps` steps timed as one block after `warmup` steps;
    with `graph`, the warm-up runs on a side stream, one step is captured and the timed steps are its replays."""
    scaler = torch.amp.GradScaler("cuda") if case.dtype == torch.float16 else None
    log = StepLog(2 * (warmup + steps) + 64, scaler)
    base_lr = [g["lr"] for g in case.opt.param_groups]
    count = {"k": 0}
    step = training_step(case, net, scaler)

    def next_batch():
        k = count["k"]
        count["k"] += 1
        return case.batches[k % len(case.batches)] if case.batches else None

    def eager_step():
        set_lr_warmup(case.opt, base_lr, count["k"], warmup)
        loss = step(next_batch())
        log.record(loss)
        return loss

    if not graph:
        for _ in range(warmup):
            eager_step()
        run = eager_step
    else:
        static = tuple(t.clone() for t in case.batches[0])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                eager_step()
        torch.cuda.current_stream().wait_stream(side)
        set_lr_warmup(case.opt, base_lr, warmup, warmup)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the peak over the capture and the replays, as bench_train's
        g = torch.cuda.CUDAGraph()
        case.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = step(static)

        def run():
            for t, src in zip(static, next_batch()):
                t.copy_(src)
            g.replay()
            log.record(static_loss)
            return static_loss

        for _ in range(3):  # as bench_train's replay warm-up
            run()
    torch.cuda.synchronize()
    if not graph:
        torch.cuda.reset_peak_memory_stats()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    loss = None
    first = log.n
    torch.cuda.profiler.start()  # the timed steps are the range an attached profiler records (bench/kernel_trace.cpp)
    start.record()
    for _ in range(steps):
        loss = run()
    stop.record()
    stop.synchronize()
    torch.cuda.profiler.stop()
    log.timed.append((first, log.n))
    ms = start.elapsed_time(stop) / steps
    return ms, torch.cuda.max_memory_allocated() / 2**30, loss.detach().float().item(), log


def time_dynamic(case, net, warmup):
    """The dynamic-shape case: (first epoch s, ms per step over two more epochs timed as one block, peak GiB, last
    loss, step log). The LR warm-up spans the first `warmup` steps; every step is logged."""
    n = len(case.batches)
    log = StepLog(3 * n + 64, None)
    base_lr = [g["lr"] for g in case.opt.param_groups]
    count = {"k": 0}
    step = training_step(case, net, None)

    def run():
        k = count["k"]
        count["k"] += 1
        set_lr_warmup(case.opt, base_lr, k, warmup)
        loss = step(case.batches[k % n])
        log.record(loss)
        return loss

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    torch.cuda.synchronize()
    first_epoch_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first = log.n
    start.record()
    for _ in range(2 * n):
        loss = run()
    stop.record()
    stop.synchronize()
    log.timed.append((first, log.n))
    return (first_epoch_s, start.elapsed_time(stop) / (2 * n), torch.cuda.max_memory_allocated() / 2**30,
            loss.detach().float().item(), log)


def gemm_peak(quick):
    """The bf16 matrix product's rate here: {"bench": "gemm_peak", ...} with TFLOP/s, the median of 20 timed
    products of 8192^3 (2 * 8192^3 FLOPs each) after 5 untimed ones."""
    n = 512 if quick else 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(25):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(stop))
    ms = sorted(times)[len(times) // 2]
    return {"bench": "gemm_peak", "framework": "torch", "dtype": "bf16", "n": n, "ms": round(ms, 4),
            "tflops": round(2 * n**3 / (ms / 1000) / 1e12, 1)}


def message(e):
    """One line: the exception's type and the first lines of its message (an OOM message runs long)."""
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def run_case(args, name, mode):
    line = {"bench": "train", "framework": f"torch-{mode}", "case": name}
    build = CASES[name]
    case = net = None
    compiles = mode.startswith("compile")
    try:
        torch.manual_seed(args.seed)
        args.graph = mode in GRAPH_MODES
        case = build(args)
        if not case.graphs and (args.graph or mode == "compile_max"):
            raise Skip("no CUDA graph for this case (eager and compile only)")
        if case.dynamic and mode not in ("eager", "compile"):
            raise Skip("varying shapes: eager and compile(dynamic=True) only")
        if mode == "compile_max":
            net = torch.compile(case.model, mode="max-autotune")
        else:
            net = torch.compile(case.model, dynamic=True if case.dynamic else None) if compiles else case.model
        if case.dynamic:  # the first epoch compiles and plans for new shapes: timed on its own
            first_epoch_s, ms, peak, loss, log = time_dynamic(case, net, args.warmup)
            steps, warmup = 2 * len(case.batches), 0
            line["first_epoch_s"] = round(first_epoch_s, 3)
        else:
            warmup = max(args.warmup, case.min_warmup, args.compile_warmup if compiles else 0)
            ms, peak, loss, log = time_case(case, net, warmup, args.steps, args.graph)
            steps = args.steps
        ok, why, fields = log.fields(len(case.batches) if case.batches else args.batches)
        line.update(case.info)
        line.update({"step_ms": round(ms, 3), "throughput": round(case.info["batch"] * 1000.0 / ms, 1),
                     "unit": case.unit, "peak_gib": round(peak, 3), "steps": steps, "warmup": warmup,
                     "cuda_graph": args.graph or mode == "compile_max", "loss": round(loss, 4)})
        line.update(fields)
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
    if compiles:
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
    p.add_argument("--mode", action="append", choices=list(MODES) + ["all"],
                   help=f"repeatable; default: {', '.join(DEFAULT_MODES)}")
    p.add_argument("--case", action="append", choices=list(CASES), help="repeatable; default: every case")
    p.add_argument("--steps", type=int, help="timed steps (30; --quick 2)")
    p.add_argument("--warmup", type=int, help=f"untimed steps before (10; --quick 1; torch.compile at least "
                                             f"{COMPILE_WARMUP})")
    p.add_argument("--photos", default=os.environ.get("KILN_BENCH_IMAGES"),
                   help="a folder of JPEGs for resnet50_jpeg (bench/make_photos.py)")
    p.add_argument("--batches", type=int, help="distinct batches the steps cycle through (8; --quick 2)")
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
    args.batches_given = args.batches is not None
    if args.batches is None:
        args.batches = 2 if args.quick else 8
    if args.steps < 1 or args.warmup < 1 or args.repeat < 1 or args.batches < 1:
        p.error("--steps, --warmup, --batches and --repeat must be at least 1")
    args.compile_warmup = 2 if args.quick else COMPILE_WARMUP
    modes = list(MODES) if "all" in (args.mode or []) else list(dict.fromkeys(args.mode or DEFAULT_MODES))
    names = args.case or list(CASES)
    if not torch.cuda.is_available():
        print(f"pytorch {torch.__version__} train: no GPU visible; nothing to measure", flush=True)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(json.dumps(gemm_peak(args.quick)), flush=True)
    print(f"pytorch {torch.__version__} train: {torch.cuda.get_device_name()}, {versions()}; {args.steps} steps "
          f"timed as one block after {args.warmup} warm-up steps, cycling through {args.batches} batches, seed "
          f"{args.seed} (torch.compile: at least {max(args.warmup, args.compile_warmup)} warm-up steps); modes "
          f"{', '.join(modes)}{', quick sizes' if args.quick else ''}", flush=True)
    for name in names:
        for mode in modes:
            for _ in range(args.repeat):
                run_case(args, name, mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
