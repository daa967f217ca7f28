"""torch.optim.AdamW's step over BERT-base's parameters (Hugging Face's BertForMaskedLM, every gradient set),
fused=True and foreach=True, in bench_optim's format: median of 50 steps after 10 warm-up steps.

    python3 bench/pytorch_optim.py
"""
import torch
from torch_timing import median_step_ms


def main():
    if not torch.cuda.is_available():
        print("pytorch_optim: no GPU visible")
        return
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).cuda()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    count = sum(p.numel() for p in params)
    for name, kwargs in (("fused", {"fused": True}), ("foreach", {"foreach": True})):
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **kwargs)
        ms = median_step_ms(opt.step, 10, 50)
        print(f"torch adamw step  bert-base  {len(params)} tensors  {count / 1e6:.1f}M params  {ms:8.3f} ms  ({name})")


if __name__ == "__main__":
    main()
