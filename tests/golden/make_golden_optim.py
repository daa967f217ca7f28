"""Golden trajectories of torch.optim's SGD, Adam and AdamW for kiln's optimizer tests.

    python3 tests/golden/make_golden_optim.py tests/golden/data

Writes optim_<case>.golden, one file per case of the table below (tests/optim/optim_reference.h has the same
table; tests/optim/test_optimizers_golden.cpp reads the files). Every case minimises, in float64 on the CPU,
sum(a / 2 * w^2 + b * w) over two parameters: p0 (2, 3) in group 0 with the case's options and p1 (4) in group 1
with half the learning rate. Each step sets p.grad = a * p + b and calls opt.step(). The files store p<i>.init,
p<i>.a, p<i>.b and the parameters after each step, p<i>.step<k> (k = 1..5), in the format of make_golden.py.
LAMB has no torch.optim version and is not here.
"""
import os
import sys

import torch

torch.set_default_dtype(torch.float64)

STEPS = 5

CASES = {
    "sgd_plain": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
    "sgd_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.5, maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_wd_amsgrad": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    "adam_maximize": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.05, maximize=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=0.02, betas=(0.85, 0.95), weight_decay=0.05, amsgrad=True)),
}


def write(path, case, tensors):
    with open(os.path.join(path, case + ".golden"), "w") as f:
        f.write(f"# kiln golden file '{case}', made by tests/golden/make_golden_optim.py with torch {torch.__version__}\n")
        for name, t in tensors.items():
            t = t.detach().to(torch.float64).contiguous()
            f.write(f"tensor {name} {t.dim()} {' '.join(str(s) for s in t.shape)}\n")
            f.write(" ".join(f"{v:.17g}" for v in t.reshape(-1).tolist()) + "\n")


def run_case(path, index, case, cls, options):
    g = torch.Generator().manual_seed(100 + index)
    shapes = [(2, 3), (4,)]
    init = [torch.rand(s, generator=g) * 2 - 1 for s in shapes]
    a = [torch.rand(s, generator=g) * 1.5 + 0.5 for s in shapes]
    b = [torch.rand(s, generator=g) * 2 - 1 for s in shapes]
    params = [t.clone().requires_grad_() for t in init]
    groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": options["lr"] * 0.5}]
    # foreach=False: the plain per-parameter loop (the same math as the other implementations).
    opt = cls(groups, foreach=False, **options)
    out = {}
    for i in range(2):
        out[f"p{i}.init"], out[f"p{i}.a"], out[f"p{i}.b"] = init[i], a[i], b[i]
    for k in range(1, STEPS + 1):
        with torch.no_grad():
            for i, p in enumerate(params):
                p.grad = a[i] * p + b[i]
        opt.step()
        for i, p in enumerate(params):
            out[f"p{i}.step{k}"] = p.detach().clone()
    write(path, "optim_" + case, out)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    os.makedirs(path, exist_ok=True)
    for index, (case, (cls, options)) in enumerate(CASES.items()):
        run_case(path, index, case, cls, options)
        print("wrote", os.path.join(path, "optim_" + case + ".golden"))


if __name__ == "__main__":
    main()
