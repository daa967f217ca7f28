"""PyTorch eager on the cases of bench_models.cpp: ResNet-50 (batch 256, 224x224; NCHW and channels-last)
and BERT-base masked-LM (batch 128, sequence 128), forward + loss + backward in float32 with TF32, cuDNN
benchmark mode on. Prints the median step time of 20 steps after 5 warm-up steps, in bench_models' format.

    python3 bench/pytorch_models.py [--quick] [--amp bf16|fp16]
"""
import argparse
import torch
from torch_timing import median_step_ms


def time_steps(step, steps, warmup):
    for _ in range(warmup):  # warm-up (cuDNN's algorithm search included) before the peak resets
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms = median_step_ms(step, 0, steps)
    return ms, torch.cuda.max_memory_allocated() / 2**30


def autocast(amp):
    if amp is None:
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=amp)


def bench_resnet50(args, channels_last):
    import torchvision

    batch, size = (16, 64) if args.quick else (256, 224)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=fmt).train()
    x = torch.randn(batch, 3, size, size, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        with autocast(args.amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()

    ms, peak = time_steps(step, args.steps, args.warmup)
    name = "channels-last" if channels_last else "nchw"
    print(f"torch resnet50  {name:<13} batch {batch:3d} {size:3d}x{size:<3d}  {ms:8.2f} ms/step  "
          f"{batch * 1000 / ms:8.1f} img/s  peak {peak:.2f} GiB")


def bench_bert_base(args):
    from transformers import BertConfig, BertForMaskedLM

    batch, seq = (8, 128) if args.quick else (128, 128)
    config = BertConfig()  # bert-base-uncased's sizes
    if args.quick:
        config.num_hidden_layers = 2
    model = BertForMaskedLM(config).cuda().train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    types = torch.zeros(batch, seq, dtype=torch.long, device="cuda")
    mask = torch.ones(batch, seq, dtype=torch.long, device="cuda")
    mask[1::2, seq - 16:] = 0
    labels = torch.where(torch.rand(batch, seq, device="cuda") < 0.15, ids, torch.full_like(ids, -100))

    def step():
        model.zero_grad(set_to_none=True)
        with autocast(args.amp):
            loss = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss
        loss.backward()

    ms, peak = time_steps(step, args.steps, args.warmup)
    print(f"torch bert-base  mlm           batch {batch:3d} seq {seq:<4d}   {ms:8.2f} ms/step  "
          f"{batch * 1000 / ms:8.1f} seq/s  peak {peak:.2f} GiB  (attention: {model.config._attn_implementation})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default="all", choices=["all", "resnet50", "bert-base"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--amp", choices=["bf16", "fp16"])
    args = p.parse_args()
    args.warmup = 5
    if args.quick:
        args.steps, args.warmup = 3, 1
    args.amp = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[args.amp]
    if not torch.cuda.is_available():
        print("pytorch_models: no GPU visible")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(f"pytorch {torch.__version__} models: float32 (TF32 on)"
          f"{', autocast ' + str(args.amp) if args.amp else ''}, median of {args.steps} steps")
    if args.model in ("all", "resnet50"):
        bench_resnet50(args, False)
        bench_resnet50(args, True)
    if args.model in ("all", "bert-base"):
        bench_bert_base(args)


if __name__ == "__main__":
    main()
