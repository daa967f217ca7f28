"""Golden learning rates for kiln's LR schedulers (tests/optim/test_lr_scheduler_golden.cpp), computed by PyTorch.

    python3 tests/golden/make_golden_sched.py tests/golden/data

Writes one file, lr_scheduler.golden (format: tests/golden/make_golden.py). For each case, a tensor
`<case>` of shape (steps + 1, groups): row 0 is every group's lr right after the scheduler is constructed, row t
the lr after the t-th scheduler.step(), as optimizer.param_groups[g]['lr']. The optimizer is SGD (no momentum)
on dummy parameters, one group per base lr. The Hugging Face cases (hf_*) need transformers; they are left out,
with a message, where it is not importable (the C++ test then skips them).
"""
import math
import os
import sys
import warnings

import torch
from torch.optim import lr_scheduler as S

STEPS = 20
BASE_LRS = [0.1, 0.02]


def make_optimizer(base_lrs=BASE_LRS):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], "lr": lr} for lr in base_lrs]
    return torch.optim.SGD(groups, lr=base_lrs[0])


def run(opt, sched, steps=STEPS):
    rows = [[g["lr"] for g in opt.param_groups]]
    for _ in range(steps):
        opt.step()  # no gradient: changes nothing, but keeps the step order torch expects
        sched.step()
        rows.append([g["lr"] for g in opt.param_groups])
    return torch.tensor(rows, dtype=torch.float64)


def torch_cases():
    cases = {}
    opt = make_optimizer()
    cases["step_lr"] = run(opt, S.StepLR(opt, step_size=3, gamma=0.5))
    opt = make_optimizer()
    cases["multistep_lr"] = run(opt, S.MultiStepLR(opt, milestones=[5, 2, 9, 5], gamma=0.3))
    opt = make_optimizer()
    cases["exponential_lr"] = run(opt, S.ExponentialLR(opt, gamma=0.9))
    opt = make_optimizer()
    cases["cosine_lr"] = run(opt, S.CosineAnnealingLR(opt, T_max=7, eta_min=0.001))  # 20 steps: past T_max
    opt = make_optimizer()
    cases["linear_lr"] = run(opt, S.LinearLR(opt, start_factor=0.25, end_factor=1.0, total_iters=6))
    opt = make_optimizer()
    cases["onecycle_cos"] = run(opt, S.OneCycleLR(opt, max_lr=[0.1, 0.02], total_steps=20, pct_start=0.3,
                                                  cycle_momentum=False))
    opt = make_optimizer()
    cases["onecycle_linear_three_phase"] = run(
        opt, S.OneCycleLR(opt, max_lr=[0.1, 0.02], total_steps=20, pct_start=0.25, anneal_strategy="linear",
                          div_factor=10.0, final_div_factor=100.0, three_phase=True, cycle_momentum=False))
    opt = make_optimizer()
    warm = S.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=5)
    cos = S.CosineAnnealingLR(opt, T_max=15, eta_min=0.001)
    cases["sequential_warmup_cosine"] = run(opt, S.SequentialLR(opt, [warm, cos], milestones=[5]))
    return cases


def hf_cases():
    try:
        import transformers.optimization as hf
    except Exception as e:  # not installed, or broken
        print(f"make_golden_sched.py: transformers is not importable ({e}); skipping the hf_* cases", file=sys.stderr)
        return {}
    cases = {}
    opt = make_optimizer()
    cases["hf_linear_warmup"] = run(opt, hf.get_linear_schedule_with_warmup(opt, num_warmup_steps=4,
                                                                            num_training_steps=16))
    if hasattr(hf, "get_cosine_with_min_lr_schedule_with_warmup"):
        # One group: Hugging Face's min_lr is relative to optimizer.defaults['lr']; kiln's is absolute per group.
        # Up to num_training_steps only: past it Hugging Face's cosine rises again, kiln's holds min_lr.
        opt = make_optimizer([0.1])
        cases["hf_cosine_min_lr"] = run(opt, hf.get_cosine_with_min_lr_schedule_with_warmup(
            opt, num_warmup_steps=4, num_training_steps=16, min_lr=0.001), steps=16)
    else:
        print("make_golden_sched.py: this transformers has no get_cosine_with_min_lr_schedule_with_warmup; "
              "skipping hf_cosine_min_lr", file=sys.stderr)
    return cases


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/golden/make_golden_sched.py <output folder, e.g. tests/golden/data>")
    path = sys.argv[1]
    os.makedirs(path, exist_ok=True)
    warnings.simplefilter("ignore")  # step(0) inside SequentialLR warns (deprecated epoch argument)
    cases = {**torch_cases(), **hf_cases()}
    for name, t in cases.items():
        assert all(math.isfinite(v) for v in t.reshape(-1).tolist()), name
    with open(os.path.join(path, "lr_scheduler.golden"), "w") as f:
        f.write(f"# kiln golden file 'lr_scheduler', made by tests/golden/make_golden_sched.py with torch "
                f"{torch.__version__}\n")
        for name, t in cases.items():
            f.write(f"tensor {name} {t.dim()} {' '.join(str(s) for s in t.shape)}\n")
            f.write(" ".join(f"{v:.17g}" for v in t.reshape(-1).tolist()) + "\n")
    print(f"wrote {os.path.join(path, 'lr_scheduler.golden')}: {', '.join(cases)}")


if __name__ == "__main__":
    main()
