"""Golden values for kiln's layer tests, computed by PyTorch.

    python3 tests/golden/make_golden.py tests/golden/data

Writes one text file per case (<case>.golden): every input, output and gradient as float64 values,
computed on the CPU in float64 from fixed seeds, so the files are reproducible. Each case's upstream
gradient is a fixed random tensor `grad_out`: the gradients stored are those of sum(out * grad_out).
The C++ side (tests/support/golden.h) reads the files; tests/layers/test_golden*.cpp compare kiln.

Format: a comment line, then for each tensor a line `tensor <name> <ndim> <dims...>` followed by one
line of its values in row-major order, written with 17 significant digits.
"""
import os
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def write(path, case, tensors):
    with open(os.path.join(path, case + ".golden"), "w") as f:
        f.write(f"# kiln golden file '{case}', made by tests/golden/make_golden.py with torch {torch.__version__}\n")
        for name, t in tensors.items():
            t = t.detach().to(torch.float64).contiguous()
            f.write(f"tensor {name} {t.dim()} {' '.join(str(s) for s in t.shape)}\n")
            f.write(" ".join(f"{v:.17g}" for v in t.reshape(-1).tolist()) + "\n")


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_()


def grads(out, inputs, names):
    g = torch.randn_like(out)
    out.backward(g)
    result = {"grad_out": g}
    for n, t in zip(names, inputs):
        result["grad_" + n] = t.grad
    return result


def case_linear(path):
    torch.manual_seed(1)
    x, w, b = leaf(3, 4), leaf(5, 4), leaf(5)
    y = F.linear(x, w, b)
    write(path, "linear", {"x": x, "weight": w, "bias": b, "out": y, **grads(y, [x, w, b], ["x", "weight", "bias"])})


def case_layer_norm(path):
    torch.manual_seed(2)
    x, w, b = leaf(2, 3, 4), leaf(4), leaf(4)
    y = F.layer_norm(x, (4,), w, b, eps=1e-5)
    write(path, "layer_norm", {"x": x, "weight": w, "bias": b, "out": y, **grads(y, [x, w, b], ["x", "weight", "bias"])})


def case_batch_norm(path):
    torch.manual_seed(3)
    x, w, b = leaf(4, 3, 2, 2), leaf(3), leaf(3)
    rm0, rv0 = torch.randn(3), torch.rand(3) + 0.5
    rm, rv = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    t = {"x": x, "weight": w, "bias": b, "running_mean_before": rm0, "running_var_before": rv0, "out": y,
         "running_mean_after": rm, "running_var_after": rv}
    t.update(grads(y, [x, w, b], ["x", "weight", "bias"]))
    write(path, "batch_norm_train", t)
    torch.manual_seed(4)
    x2 = leaf(4, 3, 2, 2)
    y2 = F.batch_norm(x2, rm0, rv0, w.detach(), b.detach(), training=False, eps=1e-5)
    write(path, "batch_norm_eval", {"x": x2, "weight": w, "bias": b, "running_mean": rm0, "running_var": rv0,
                                    "out": y2, **grads(y2, [x2], ["x"])})


def case_cross_entropy(path):
    torch.manual_seed(5)
    logits = leaf(6, 4)
    target = torch.tensor([0, 3, -100, 2, 1, 3])
    weight = torch.rand(4) + 0.5
    y = F.cross_entropy(logits, target, weight=weight, ignore_index=-100, label_smoothing=0.1)
    write(path, "cross_entropy_indices", {"logits": logits, "target": target.to(torch.float64), "weight": weight,
                                          "out": y, **grads(y, [logits], ["logits"])})
    torch.manual_seed(6)
    logits = leaf(3, 5, 2)  # (N, C, d1)
    probs = torch.softmax(torch.randn(3, 5, 2), dim=1)
    y = F.cross_entropy(logits, probs, label_smoothing=0.2, reduction="sum")
    write(path, "cross_entropy_probabilities", {"logits": logits, "target": probs, "out": y,
                                                **grads(y, [logits], ["logits"])})


def case_conv2d(path):
    torch.manual_seed(7)
    x, w, b = leaf(2, 4, 7, 6), leaf(6, 2, 3, 2), leaf(6)
    y = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    write(path, "conv2d", {"x": x, "weight": w, "bias": b, "out": y, **grads(y, [x, w, b], ["x", "weight", "bias"])})


def case_attention(path):
    torch.manual_seed(8)
    q, k, v = leaf(2, 3, 5, 4), leaf(2, 3, 6, 4), leaf(2, 3, 6, 4)
    mask = torch.rand(5, 6) > 0.3
    mask[:, 0] = True  # every query may attend somewhere
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    write(path, "attention", {"q": q, "k": k, "v": v, "mask": mask.to(torch.float64), "out": y,
                              **grads(y, [q, k, v], ["q", "k", "v"])})


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    os.makedirs(path, exist_ok=True)
    for case in (case_linear, case_layer_norm, case_batch_norm, case_cross_entropy, case_conv2d, case_attention):
        case(path)
    print("wrote", sorted(os.listdir(path)))


if __name__ == "__main__":
    main()
