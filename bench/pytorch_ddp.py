"""PyTorch DDP on the cases of bench_ddp.cpp, for the scaling from 1 to N GPUs: full training steps (zero_grad,
forward under bf16 autocast, loss, backward with DDP's gradient all-reduce, optimizer step) of ResNet-50 (batch
256 per GPU, 224x224, channels-last, SGD with momentum) and BERT-base masked-LM (batch 128 x 128 tokens per GPU,
AdamW), on random data. Started alone it is world 1 and runs the plain model (as kiln's DataParallel is a plain
wrapper there); started by mpirun it reads Open MPI's variables and joins an NCCL process group:

    python3 bench/pytorch_ddp.py [--quick] [--model resnet50|bert-base|all] [--steps N]
    mpirun -np 2 -x NCCL_NVLS_ENABLE -x MASTER_PORT python3 bench/pytorch_ddp.py

MASTER_ADDR is 127.0.0.1 (one node) and MASTER_PORT 29517 unless set. The median step of rank 0 after warm-up,
CUDA events around each step (bench/torch_timing.py); rank 0 prints a line and a JSON line per case, as bench_ddp:
    {"bench":"ddp","framework":"pytorch","model":"resnet50","world":2,"batch_per_gpu":256,"step_ms":..,...}
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

from torch_timing import median_step_ms


def launch_env():
    """(rank, world size, local rank) from mpirun (Open MPI, then MPICH/Hydra) or torchrun's variables."""
    for r, n, l in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                    ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        if r in os.environ and n in os.environ:
            rank, world = int(os.environ[r]), int(os.environ[n])
            return rank, world, int(os.environ.get(l, rank))
    return 0, 1, 0


def make_optimizer(cls, params, **options):
    """The fused CUDA implementation where this PyTorch has it (kiln's optimizers are fused kernels too)."""
    params = list(params)  # twice, if the first try fails
    try:
        return cls(params, fused=True, **options), "fused"
    except (TypeError, RuntimeError):
        return cls(params, **options), "foreach"


def resnet50_case(args, device):
    import torchvision

    batch, size = (16, 64) if args.quick else (256, 224)
    model = torchvision.models.resnet50(num_classes=1000).to(device).to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    opt, impl = make_optimizer(torch.optim.SGD, model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    net = wrap(args, model, device)

    def loss_fn():
        return torch.nn.functional.cross_entropy(net(x), y)

    return model, opt, impl, loss_fn, batch, "img/s"


def bert_base_case(args, device):
    from transformers import BertConfig, BertForMaskedLM

    batch, seq = (8, 128) if args.quick else (128, 128)
    config = BertConfig()  # bert-base-uncased's sizes
    if args.quick:
        config.num_hidden_layers = 2
    model = BertForMaskedLM(config).to(device).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    types = torch.zeros(batch, seq, dtype=torch.long, device=device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    mask[1::2, seq - 16:] = 0  # the last 16 tokens of every other sequence are padding
    labels = torch.where(torch.rand(batch, seq, device=device) < 0.15, ids, torch.full_like(ids, -100))
    opt, impl = make_optimizer(torch.optim.AdamW, model.parameters(), lr=1e-4, weight_decay=0.01)
    net = wrap(args, model, device)

    def loss_fn():
        return net(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss

    return model, opt, impl, loss_fn, batch, "seq/s"


def wrap(args, model, device):
    """DDP with its defaults (25 MB buckets, buffers broadcast each forward) when there are several ranks."""
    if args.world == 1:
        return model
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])


def same_parameters_everywhere(model, device):
    """The sum of every parameter agrees on all ranks (DDP keeps replicas identical)."""
    total = sum(p.detach().double().sum() for p in model.parameters()).float().reshape(1).to(device)
    if dist.is_initialized():
        hi, lo = total.clone(), total.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        return bool(hi.item() == lo.item())
    return True


def bench_case(args, device, name, make):
    model, opt, impl, loss_fn, batch, unit = make(args, device)
    last = {}

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        opt.step()
        last["loss"] = loss

    for _ in range(args.warmup):  # cuDNN's algorithm search, DDP's bucket rebuild after the first step
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms = median_step_ms(step, 0, args.steps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    slowest = torch.tensor([ms], dtype=torch.float32, device=device)
    if dist.is_initialized():
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    loss = last["loss"].item()
    equal = same_parameters_everywhere(model, device)
    if not equal:
        print(f"pytorch_ddp: rank {args.rank}: {name}'s parameters differ between ranks", flush=True)
    if args.rank != 0:
        return
    throughput = batch * args.world * 1000.0 / ms
    print(f"torch {name:<9} world {args.world}  batch {batch:3d}/GPU  {ms:8.2f} ms/step (slowest rank "
          f"{slowest.item():.2f})  {throughput:9.1f} {unit}  peak {peak:.2f} GiB  loss {loss:.4f}  ({impl} "
          f"{type(opt).__name__})", flush=True)
    print(json.dumps({"bench": "ddp", "framework": "pytorch", "model": name, "world": args.world,
                      "batch_per_gpu": batch, "step_ms": round(ms, 3), "slowest_step_ms": round(slowest.item(), 3),
                      "throughput": round(throughput, 1), "unit": unit, "peak_gib": round(peak, 2),
                      "params_equal": equal, "optimizer": f"{type(opt).__name__}({impl})"}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default="all", choices=["all", "resnet50", "bert-base"])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    args.warmup = 5
    if args.quick:
        args.steps, args.warmup = 3, 1
    args.rank, args.world, local_rank = launch_env()
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
        if args.rank == 0:
            print(f"pytorch_ddp: {torch.cuda.device_count()} GPUs visible for local rank {local_rank}; "
                  "nothing to measure")
        return
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if args.world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", init_method="env://", rank=args.rank, world_size=args.world,
                                device_id=device)
    torch.manual_seed(1234 + args.rank)  # each rank its own data (DDP broadcasts rank 0's model)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    if args.rank == 0:
        print(f"pytorch {torch.__version__} ddp: world {args.world}, bf16 autocast, median of {args.steps} steps "
              f"after {args.warmup}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '(unset)')}", flush=True)
    try:
        if args.model in ("all", "resnet50"):
            bench_case(args, device, "resnet50", resnet50_case)
            torch.cuda.empty_cache()
        if args.model in ("all", "bert-base"):
            bench_case(args, device, "bert-base", bert_base_case)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
