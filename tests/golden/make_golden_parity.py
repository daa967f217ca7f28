"""Training-parity goldens: 20 training steps of whole models in PyTorch, for tests/layers/test_parity*.cpp.

    python3 tests/golden/make_golden_parity.py tests/golden/data                          # CPU, float32
    python3 tests/golden/make_golden_parity.py tests/golden/data --device cuda --bf16      # on a GPU: bf16 autocast,
                                                                                          # channels-last
    python3 tests/golden/make_golden_parity.py /tmp/x --bf16 --float64-spread             # also the spreads (below)

Cases (each from identical weights and batches on both sides, no weight file: see "the formula" below):
  resnet18_cifar  torchvision ResNet-18 with the CIFAR stem (conv1 3x3 stride 1, no max-pool), 10 classes,
                  batches of 8 images 32x32; SGD lr 0.01, momentum 0.9, weight decay 5e-4
  resnet50        torchvision ResNet-50, 10 classes, batches of 4 images 64x64; SGD lr 0.005, otherwise as above
  bert_mlm        Hugging Face BertForMaskedLM: hidden 128, 2 layers, 4 heads, intermediate 512, vocab 1000,
                  64 positions, no dropout; batches of 4 sequences of 32 tokens (odd ones end in 8 padding
                  tokens), 15% of positions masked; AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01
Each runs 20 steps in train mode (BatchNorm on batch statistics), cycling through 4 distinct batches.

Files, one per case: parity_<case>_cpu_f32.golden (CPU, float32, TF32 irrelevant), or with --device cuda --bf16
parity_<case>_cuda_bf16.golden (bf16 autocast, the ResNets channels-last, cuDNN benchmark mode and TF32 on, fused
optimizers: the configuration that bench/pytorch_train.py times). They hold:
  loss                 (20) the loss of every step, before that step's update
  grad1.<param>        the first step's gradient: sum, L2 norm, then 32 elements (see `stats`)
  delta.<param>        the change over the 20 steps (final weight - initial weight, in float64): sum, L2 norm, 32
                       elements
  delta.<buffer>       the same for BatchNorm's running statistics
  spread.*             only with --float64-spread (not used by the tests): the same run in float64 on the CPU, and
                       the largest differences of this run from it, printed too; they say how far two roundings of
                       the same training drift apart, which is what the tests' tolerances are derived from.
Format as make_golden.py's: `tensor <name> <ndim> <dims...>`, then the values (17 significant digits).

The formula (shared with tests/support/parity.cpp; make_golden.py's hash, a different scale):
  u[i] = make_golden.uniform_formula(name, n)[i], uniform in [-1, 1)
  ResNet: conv weights u * sqrt(6 / fan_out) (kaiming uniform, fan_out = out channels * kh * kw: the variance of
          torchvision's kaiming_normal_(mode="fan_out")), fc.weight u / sqrt(in_features) (Linear's default
          bound), BatchNorm weight 1 and bias 0 except the last BatchNorm of each residual branch, weight 0
          (torchvision's zero_init_residual: every block starts as the identity, and training is not chaotic),
          fc.bias 0, running mean 0 and variance 1.
  BERT:   every rank-2 weight (Linear, Embedding) u * 0.02 * sqrt(3) (standard deviation 0.02, as Hugging Face's
          N(0, 0.02^2)), LayerNorm weight 1, every bias 0.
  Images: u("batch.<k>.input") * sqrt(3) (variance 1). Labels and token ids: r % m, where
          r = splitmix64(fnv1a64(name) + i) (make_golden.py's), name "batch.<k>.labels" / ".input_ids" / ".mask".
All in float64, then rounded to float32 once.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import splitmix64_stream, uniform_formula  # noqa: E402  (the hash both scripts share)

torch.set_default_dtype(torch.float32)  # make_golden sets float64 for its own cases

STEPS = 20
NUM_BATCHES = 4
SAMPLES = 32
SQRT3 = math.sqrt(3.0)


def ints(name, n, m):
    return (splitmix64_stream(name, n) % np.uint64(m)).astype(np.int64)


def to32(v):
    return torch.from_numpy(np.asarray(v, dtype=np.float64).astype(np.float32))


def init_value(model_kind, name, shape):
    """The float32 starting value of parameter or buffer `name` (see the formula above)."""
    n = int(np.prod(shape)) if shape else 1
    last = name.split(".")[-1]
    if last == "running_mean" or last == "num_batches_tracked":
        return to32(np.zeros(n)).reshape(shape)
    if last == "running_var":
        return to32(np.ones(n)).reshape(shape)
    if len(shape) >= 2:
        u = uniform_formula(name, n)
        if model_kind == "bert_mlm":
            v = u * (0.02 * SQRT3)
        elif len(shape) == 4:
            v = u * math.sqrt(6.0 / (shape[0] * shape[2] * shape[3]))
        else:
            v = u * (1.0 / math.sqrt(shape[1]))
        return to32(v).reshape(shape)
    if last == "weight":  # BatchNorm / LayerNorm scale
        zero = model_kind == "resnet18_cifar" and name.endswith(".bn2.weight") or \
            model_kind == "resnet50" and name.endswith(".bn3.weight")
        return to32(np.zeros(n) if zero else np.ones(n)).reshape(shape)
    return to32(np.zeros(n)).reshape(shape)  # biases


def set_init(model, kind):
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point():
                t.copy_(init_value(kind, name, tuple(t.shape)))


# ------------------------------------------------------------------------------------------ the cases

RESNET = {  # kind: (depth, batch, size, classes, SGD learning rate)
    "resnet18_cifar": (18, 8, 32, 10, 0.01),
    "resnet50": (50, 4, 64, 10, 0.005),
}
SGD = dict(momentum=0.9, weight_decay=5e-4)
BERT = dict(vocab=1000, hidden=128, layers=2, heads=4, intermediate=512, positions=64, batch=4, seq=32)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def resnet_batch(kind, k):
    _, batch, size, classes, _ = RESNET[kind]
    x = to32(uniform_formula(f"batch.{k}.input", batch * 3 * size * size) * SQRT3).reshape(batch, 3, size, size)
    y = torch.from_numpy(ints(f"batch.{k}.labels", batch, classes))
    return x, y


def bert_batch(k):
    b, s, vocab = BERT["batch"], BERT["seq"], BERT["vocab"]
    ids = ints(f"batch.{k}.input_ids", b * s, vocab - 5).reshape(b, s) + 5  # 0 padding, 1-4 special
    draw = ints(f"batch.{k}.mask", b * s, 100).reshape(b, s)
    mask = np.ones((b, s), dtype=np.int64)
    mask[1::2, s - 8:] = 0  # odd sequences end in 8 padding tokens
    ids[:, 0] = 2  # [CLS]
    labels = np.full((b, s), -100, dtype=np.int64)
    pick = (draw < 15) & (mask == 1)
    pick[:, 0] = False
    labels[pick] = ids[pick]
    ids[pick] = 4  # [MASK]
    ids[mask == 0] = 0
    types = np.zeros((b, s), dtype=np.int64)
    types[:, s // 2:] = 1
    types[mask == 0] = 0
    assert pick.sum() > 0
    return {k_: torch.from_numpy(v) for k_, v in
            (("input_ids", ids), ("token_type_ids", types), ("attention_mask", mask), ("labels", labels))}


def make_model(kind):
    if kind == "bert_mlm":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(vocab_size=BERT["vocab"], hidden_size=BERT["hidden"], num_hidden_layers=BERT["layers"],
                            num_attention_heads=BERT["heads"], intermediate_size=BERT["intermediate"],
                            max_position_embeddings=BERT["positions"], type_vocab_size=2, hidden_act="gelu",
                            layer_norm_eps=1e-12, pad_token_id=0, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        return BertForMaskedLM(config)
    import torchvision

    depth, _, _, classes, _ = RESNET[kind]
    model = (torchvision.models.resnet18 if depth == 18 else torchvision.models.resnet50)(num_classes=classes)
    if kind == "resnet18_cifar":
        model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model


def stats(t):
    """sum, L2 norm, then SAMPLES elements at flat indices (j * n) // SAMPLES (all of them when fewer)."""
    flat = t.detach().to(torch.float64).cpu().reshape(-1)
    n = flat.numel()
    k = min(SAMPLES, n)
    idx = torch.tensor([(j * n) // k for j in range(k)], dtype=torch.int64)
    return torch.cat([torch.stack([flat.sum(), flat.norm()]), flat[idx]])


def train(kind, device, bf16, dtype=torch.float32):
    """20 steps; returns (losses, first-step gradients, final - initial of parameters and float buffers)."""
    torch.manual_seed(0)  # only the constructors' own draws; every value is then set from the formula
    model = make_model(kind)
    set_init(model, kind)
    model = model.to(device=device, dtype=dtype)
    resnet = kind != "bert_mlm"
    channels_last = resnet and bf16
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    fused = {"fused": True} if device == "cuda" else {}
    if resnet:
        opt = torch.optim.SGD(model.parameters(), lr=RESNET[kind][4], **SGD, **fused)
        batches = [resnet_batch(kind, k) for k in range(NUM_BATCHES)]
    else:
        opt = torch.optim.AdamW(model.parameters(), **ADAMW, **fused)
        batches = [bert_batch(k) for k in range(NUM_BATCHES)]
    initial = {n: t.detach().to(torch.float64).cpu().clone() for n, t in model.state_dict().items()
               if t.is_floating_point()}
    losses, grad1 = [], {}
    for step in range(STEPS):
        batch = batches[step % NUM_BATCHES]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            if resnet:
                x = batch[0].to(device=device, dtype=dtype)
                if channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                loss = F.cross_entropy(model(x), batch[1].to(device))
            else:
                loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
        loss.backward()
        if step == 0:
            grad1 = {n: p.grad.detach().to(torch.float64).cpu().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    final = {n: t.detach().to(torch.float64).cpu() for n, t in model.state_dict().items() if t.is_floating_point()}
    delta = {n: final[n] - initial[n] for n in initial}
    params = [n for n, _ in model.named_parameters()]
    return torch.tensor(losses, dtype=torch.float64), grad1, delta, params


def write(path, case, tensors, note):
    with open(os.path.join(path, case + ".golden"), "w") as f:
        f.write(f"# kiln golden file '{case}', made by tests/golden/make_golden_parity.py with torch "
                f"{torch.__version__}; {note}\n")
        for name, t in tensors.items():
            t = t.detach().to(torch.float64).contiguous()
            f.write(f"tensor {name} {t.dim()} {' '.join(str(s) for s in t.shape)}\n")
            f.write(" ".join(f"{v:.17g}" for v in t.reshape(-1).tolist()) + "\n")


def relative_update_error(delta, ref_delta):
    """max over tensors of ||delta - ref|| / ||ref|| (tensors that move), and which one."""
    worst, which = 0.0, ""
    for n, r in ref_delta.items():
        if r.norm() == 0 or n.endswith("attention.self.key.bias"):  # zero in exact arithmetic: noise only
            continue
        e = float((delta[n] - r).norm() / r.norm())
        if e > worst:
            worst, which = e, n
    return worst, which


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default=os.path.join(os.path.dirname(__file__), "data"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, ResNets channels-last")
    parser.add_argument("--case", action="append", choices=("resnet18_cifar", "resnet50", "bert_mlm"))
    parser.add_argument("--float64-spread", action="store_true",
                        help="also run in float64 on the CPU and record/print the differences from it")
    args = parser.parse_args()
    os.makedirs(args.path, exist_ok=True)
    torch.use_deterministic_algorithms(args.device == "cpu")
    if args.device == "cuda":  # as bench/pytorch_train.py
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    precision = "bf16" if args.bf16 else "f32"
    note = (f"{args.device} {precision}" + (", channels-last ResNets, cudnn.benchmark and TF32 on, fused optimizers"
                                            if args.device == "cuda" else "") +
            f", {torch.get_num_threads()} threads")
    for kind in args.case or ("resnet18_cifar", "resnet50", "bert_mlm"):
        losses, grad1, delta, params = train(kind, args.device, args.bf16)
        out = {"loss": losses}
        for n in params:
            out[f"grad1.{n}"] = stats(grad1[n])
        for n, d in delta.items():
            out[f"delta.{n}"] = stats(d)
        print(f"{kind} {args.device} {precision}: losses", " ".join(f"{v:.6f}" for v in losses.tolist()))
        if args.float64_spread:
            l64, g64, d64, _ = train(kind, "cpu", False, torch.float64)
            loss_rel = float(((losses - l64).abs() / l64.abs()).max())
            grad_err, grad_which = relative_update_error(grad1, g64)
            upd_err, upd_which = relative_update_error(delta, d64)
            print(f"  against float64: loss max rel {loss_rel:.3g}; first-step gradient max rel L2 {grad_err:.3g} "
                  f"({grad_which}); update max rel L2 {upd_err:.3g} ({upd_which})")
            per_step = ((losses - l64).abs() / l64.abs()).tolist()
            print("  loss rel per step", " ".join(f"{v:.2g}" for v in per_step))
            out["spread.loss_float64"] = l64
        write(args.path, f"parity_{kind}_{args.device}_{precision}", out, note)


if __name__ == "__main__":
    main()
