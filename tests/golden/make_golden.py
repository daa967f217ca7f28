"""Golden values for kiln's layer and model tests, computed by PyTorch.

    python3 tests/golden/make_golden.py tests/golden/data            # every case
    python3 tests/golden/make_golden.py tests/golden/data models     # only the whole-model cases

Writes one text file per case (<case>.golden). The layer cases store every input, output and gradient as
float64 values, computed on the CPU in float64 from fixed seeds, so the files are reproducible. Each layer
case's upstream gradient is a fixed random tensor `grad_out`: the gradients stored are those of
sum(out * grad_out).

The whole-model cases (resnet18.golden: torchvision; bert_mlm.golden, bert_cls.golden: Hugging Face
transformers) need torchvision and transformers. They do not store weights: every floating-point parameter and
buffer is set from a formula of its name and flat index that tests/layers/test_golden_models.cpp computes too
(`formula_values` below), rounded to float32, and the model then runs in float64 on the CPU. They store the
names and shapes of named_parameters() and state_dict() (in order), the outputs and losses, and for every
parameter's gradient (and every buffer after a training step) its sum, L2 norm and first 16 elements.

The C++ side (tests/support/golden.h) reads the files; tests/layers/test_golden*.cpp compare kiln.

Format: a comment line, then for each tensor a line `tensor <name> <ndim> <dims...>` followed by one
line of its values in row-major order, written with 17 significant digits. Lists of names are tensors
too: `param.0007.layer1.0.conv1.weight` holds the shape of the 8th parameter (as values).
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


# ------------------------------------------------------------------------------------------ whole models
#
# The parameter formula, shared with tests/layers/test_golden_models.cpp (keep the two identical):
#   h = FNV-1a 64-bit hash of the tensor's name (UTF-8 bytes)
#   u[i] = 2 * (splitmix64(h + i) >> 11) * 2^-53 - 1, uniform in [-1, 1), all in exact uint64 / float64
#          (splitmix64(x): z = x + 0x9e3779b97f4a7c15; z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9;
#           z = (z ^ z >> 27) * 0x94d049bb133111eb; z ^ z >> 31, every operation modulo 2^64)
#   value[i] = float32(v[i]) with, by the name (its last component) and the tensor's rank:
#     "input" (the image)    u
#     running_var            1 + 0.5 u   (positive)
#     running_mean           0.1 u
#     rank >= 2              u * sqrt(3 / fan_in), fan_in = numel / size(0)   (variance 1 / fan_in)
#     rank 1, "...weight"    1 + 0.25 u  (BatchNorm / LayerNorm scale around 1)
#     rank 1, otherwise      0.1 u       (biases)
# Each v[i] takes one rounded float64 operation at most after u, so both sides get the same bits.

MASK64 = (1 << 64) - 1


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def splitmix64_stream(name, n):
    """r[i] = splitmix64(fnv1a64(name) + i) as uint64: splitmix64's output for that state, modulo 2^64."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(fnv1a64(name))
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_formula(name, n):
    import numpy as np

    z = splitmix64_stream(name, n)
    return (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53) * 2.0 - 1.0


def formula_values(name, shape):
    """The float32-rounded values (as a float64 torch tensor of `shape`) of the tensor called `name`."""
    import numpy as np

    n = 1
    for s in shape:
        n *= s
    u = uniform_formula(name, n)
    last = name.split(".")[-1]
    if name == "input":
        v = u
    elif last == "running_var":
        v = 1.0 + 0.5 * u
    elif last == "running_mean":
        v = 0.1 * u
    elif len(shape) >= 2:
        v = u * np.sqrt(3.0 / (n // shape[0]))
    elif last.endswith("weight"):
        v = 1.0 + 0.25 * u
    else:
        v = 0.1 * u
    return torch.from_numpy(v.astype(np.float32).astype(np.float64)).reshape(shape)


def set_formula(model):
    """Every floating-point parameter and buffer from the formula (a tied tensor once, by its first name)."""
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point():
                t.copy_(formula_values(name, tuple(t.shape)))


def shape_tensor(shape):
    return torch.tensor([float(s) for s in shape], dtype=torch.float64)


def stats(t, k=16):
    """sum, L2 norm, then the first k elements (row-major) of t."""
    flat = t.detach().to(torch.float64).reshape(-1)
    return torch.cat([torch.stack([flat.sum(), flat.norm()]), flat[:k]])


def record_names(out, model):
    """named_parameters() and state_dict() names and shapes, in order."""
    for i, (name, p) in enumerate(model.named_parameters()):
        out[f"param.{i:04d}.{name}"] = shape_tensor(p.shape)
    for i, (name, t) in enumerate(model.state_dict().items()):
        out[f"state.{i:04d}.{name}"] = shape_tensor(t.shape)


def record_grads(out, prefix, model):
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} has no gradient"
        out[f"{prefix}grad.{name}"] = stats(p.grad)


def case_resnet18(path):
    import torchvision

    model = torchvision.models.resnet18(weights=None).to(torch.float64)
    out = {"labels": torch.tensor([3.0, 917.0])}
    record_names(out, model)
    labels = out["labels"].to(torch.int64)
    for mode in ("train", "eval"):
        set_formula(model)
        model.zero_grad(set_to_none=True)
        model.train(mode == "train")
        x = formula_values("input", (2, 3, 64, 64)).requires_grad_()
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        out[f"{mode}.logits"] = logits
        out[f"{mode}.loss"] = loss
        out[f"{mode}.grad_input"] = stats(x.grad)
        record_grads(out, f"{mode}.", model)
        if mode == "train":  # running statistics after one step (momentum 0.1, unbiased variance)
            for name, b in model.named_buffers():
                if b.is_floating_point():
                    out[f"train.buffer.{name}"] = stats(b)
    write(path, "resnet18", out)


# The small BERT: hidden 64, 2 layers, 4 heads, intermediate 128, vocab 100, 64 positions, 2 token types,
# GELU (erf), LayerNorm eps 1e-12. Sample 0 is 12 tokens, sample 1 is 8 tokens and 4 padding ids (0).
BERT_INPUT_IDS = [[2, 15, 37, 99, 4, 58, 23, 71, 9, 88, 46, 3],
                  [2, 64, 12, 77, 31, 95, 50, 3, 0, 0, 0, 0]]
BERT_TOKEN_TYPE_IDS = [[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
                       [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]]
BERT_ATTENTION_MASK = [[1] * 12, [1] * 8 + [0] * 4]
BERT_MLM_LABELS = [[-100, 17, -100, -100, 4, -100, -100, -100, 60, -100, -100, -100],
                   [-100, -100, 12, -100, -100, 81, -100, -100, -100, -100, -100, -100]]
BERT_CLS_LABELS = [2, 0]


def bert_config():
    from transformers import BertConfig

    return BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                      layer_norm_eps=1e-12, pad_token_id=0)


def bert_inputs(out):
    for key, value in (("input_ids", BERT_INPUT_IDS), ("token_type_ids", BERT_TOKEN_TYPE_IDS),
                       ("attention_mask", BERT_ATTENTION_MASK)):
        out[key] = torch.tensor(value, dtype=torch.float64)
    return {k: out[k].to(torch.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}


def saved_keys(model):
    """The keys and shapes that save_pretrained() writes (tied copies left out), or None where it fails."""
    import tempfile

    try:
        from safetensors import safe_open

        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
                return [(k, tuple(f.get_slice(k).get_shape())) for k in f.keys()]
    except Exception as e:  # an older transformers / no safetensors: the test then skips this part
        print("note: save_pretrained keys not recorded:", e)
        return None


def run_bert(path, case, model, labels):
    import transformers

    model = model.to(torch.float64)
    model.eval()  # no dropout
    set_formula(model)
    out = {}
    record_names(out, model)
    inputs = bert_inputs(out)
    out["labels"] = torch.tensor(labels, dtype=torch.float64)
    result = model(**inputs, labels=torch.tensor(labels, dtype=torch.int64))
    result.loss.backward()
    out["logits"] = result.logits
    out["loss"] = result.loss
    record_grads(out, "", model)
    print(f"{case}: transformers {transformers.__version__}")
    return out


def case_bert(path):
    from transformers import BertForMaskedLM, BertForSequenceClassification

    torch.manual_seed(0)  # only HF's own initialisation draws from it; every value is then set by the formula
    mlm = BertForMaskedLM(bert_config())
    out = run_bert(path, "bert_mlm", mlm, BERT_MLM_LABELS)
    pred = mlm.cls.predictions
    # 1 where the decoder shares the tensor (HF ties the weight to the word embeddings, the bias to
    # cls.predictions.bias), else 0.
    out["tied.decoder_weight"] = torch.tensor(
        float(pred.decoder.weight is mlm.bert.embeddings.word_embeddings.weight))
    out["tied.decoder_bias"] = torch.tensor(float(pred.decoder.bias is not None and pred.decoder.bias is pred.bias))
    keys = saved_keys(mlm)
    if keys is not None:
        for i, (k, shape) in enumerate(keys):
            out[f"saved.{i:04d}.{k}"] = shape_tensor(shape)
    write(path, "bert_mlm", out)

    torch.manual_seed(0)
    config = bert_config()
    config.num_labels = 3
    clf = BertForSequenceClassification(config)
    write(path, "bert_cls", run_bert(path, "bert_cls", clf, BERT_CLS_LABELS))


LAYER_CASES = (case_linear, case_layer_norm, case_batch_norm, case_cross_entropy, case_conv2d, case_attention)
MODEL_CASES = (case_resnet18, case_bert)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    assert which in ("all", "layers", "models"), "second argument: all, layers or models"
    os.makedirs(path, exist_ok=True)
    cases = (LAYER_CASES if which != "models" else ()) + (MODEL_CASES if which != "layers" else ())
    for case in cases:
        case(path)
    print("wrote", sorted(os.listdir(path)))


if __name__ == "__main__":
    main()
