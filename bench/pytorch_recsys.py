"""PyTorch's side of the recommendation-model measurements (issue 37): the DLRM of examples/recsys/recsys.cpp, timed
as the example's timing mode (--bench-steps) times it, printing a JSON line with the same fields.

    python3 bench/pytorch_recsys.py --table-sizes 1460,583,10000000,... --embedding-dim 128 --bottom-mlp 512,256 \
        --top-mlp 1024,1024,512,256 --batch-size 4096 --table-optimizer sparse_adam --bench-steps 100 \
        --bench-warmup 30 --bench-name g3_sparse_adam [--compile] [--device cuda|cpu]
    python3 bench/pytorch_recsys.py --quick        # tiny sizes, a few steps, on the CPU where there is no GPU

The model, as the example's: a bottom MLP (13 -> --bottom-mlp... -> D, ReLU after each Linear), 26 tables of D as
torch.nn.EmbeddingBag(mode="sum", sparse=True) looked up with one id per bag (input (B, 1): each row one bag; the
same rows as nn.Embedding(sparse=True), through the kernel DLRM's reference uses), the pairwise dot products of the
27 vectors (the strictly lower triangle, row by row: 351), a top MLP (D + 351 -> --top-mlp... -> 1, ReLU between),
BCEWithLogits. Tables start U(-1/sqrt(rows), 1/sqrt(rows)) (DLRM's), the Linears at PyTorch's default. The MLPs are
trained by torch.optim.SGD at --lr (the example's DLRM recipe); the tables by --table-optimizer: sgd
(torch.optim.SGD, which takes sparse gradients), sparse_adam (torch.optim.SparseAdam) or rowwise_adagrad (RowWiseAdagrad
below, kiln's optim::RowWiseAdagrad's formula: one accumulator per row; PyTorch has none built in, and its Adagrad keeps
one per element, a second table).

The data, with the example's shapes and distributions (not its numbers): 13 dense features N(0, 1); 26 ids, table t's
drawn from Zipf(--zipf) over its first min(rows, --id-rows) rows by the example's inverse power-law CDF (rank 0, id 0,
the most frequent); the label a coin with probability sigmoid(-0.5 + 0.3 a.x + 0.35 sum_t b_t(id_t)), a ~ N(0, 1) and
b_t(id) a standard-normal value per (table, row), computed from the id (no table of them). One batch per step, all
made on the device before the warm-up.

Timing: --bench-warmup untimed steps, then each of --bench-steps steps between two CUDA events and a wait for the
second (host time on the CPU): step_ms is their median, with min and max; throughput = batch * 1000 / step_ms.
Every step's loss is written on the device and read after the timing; the run trained if every loss is finite and
the mean over the last --bench-cycle steps is below the mean over the first --bench-cycle (warm-up included), else
"trained": false with "failed" (exit status 1). Memory: the tables' parameters and optimizer state on the device
(emb_device_gib), torch.cuda.max_memory_allocated over the timed steps (gpu_peak_gib), the process's resident host
memory. --compile wraps the dense part (bottom MLP, interaction, top MLP) in torch.compile; the sparse lookups and
their sparse gradients stay eager (torch.compile does not trace sparse gradients), and the warm-up is at least 15
steps so that compilation stays out of the timing.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

DENSE, SPARSE = 13, 26
COMPILE_WARMUP = 15
GIB = float(1 << 30)


def positive_list(text, option, allow_empty=False):
    if text == "" and allow_empty:
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"pytorch_recsys.py: {option}: '{text}' is not a comma-separated list of positive numbers")
    return values


def table_rows(text):
    sizes = positive_list(text, "--table-sizes")
    if len(sizes) > SPARSE:
        raise SystemExit(f"pytorch_recsys.py: --table-sizes: give 1 to {SPARSE} sizes (they repeat over the tables)")
    return [sizes[t % len(sizes)] for t in range(SPARSE)]


def mlp(inp, hidden, out, relu_last, device):
    layers, width = [], inp
    for h in hidden:
        layers += [torch.nn.Linear(width, h, device=device), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, out, device=device))
    if relu_last:
        layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Dlrm(torch.nn.Module):
    def __init__(self, rows, dim, bottom, top, device):
        super().__init__()
        vectors = SPARSE + 1
        self.bottom = mlp(DENSE, bottom, dim, True, device)
        self.top = mlp(dim + vectors * (vectors - 1) // 2, top, 1, False, device)
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(r, dim, mode="sum", sparse=True, device=device) for r in rows)
        with torch.no_grad():
            for r, t in zip(rows, self.tables):
                t.weight.uniform_(-1 / math.sqrt(r), 1 / math.sqrt(r))
        li, lj = torch.tril_indices(vectors, vectors, offset=-1, device=device)
        self.register_buffer("pair_rows", li, persistent=False)
        self.register_buffer("pair_cols", lj, persistent=False)
        self.dense_part = self.interact  # replaced by its compiled form under --compile

    def interact(self, dense, embs):
        x = self.bottom(dense)  # (B, D)
        all_ = torch.stack([x, *embs], 1)  # (B, 27, D)
        dots = torch.bmm(all_, all_.transpose(1, 2))  # (B, 27, 27)
        pairs = dots[:, self.pair_rows, self.pair_cols]  # (B, 351)
        return self.top(torch.cat([x, pairs], 1)).reshape(-1)  # (B)

    def forward(self, dense, ids):
        embs = [t(ids[:, i:i + 1]) for i, t in enumerate(self.tables)]  # each (B, D): a bag of one id per sample
        return self.dense_part(dense, embs)


class RowWiseAdagrad(torch.optim.Optimizer):
    """kiln's optim::RowWiseAdagrad for sparse gradients: per looked-up row r (repeats summed),
    G[r] += mean(g[r]^2); p[r] -= lr * g[r] / (sqrt(G[r]) + eps). State "sum" (V): one number per row."""

    def __init__(self, params, lr=1e-2, eps=1e-10):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()  # (K), (K, D)
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], device=p.device, dtype=p.dtype)
                total = state["sum"]
                total.index_add_(0, rows, values.pow(2).mean(1))
                p.index_add_(0, rows, values / (total[rows].sqrt() + group["eps"]).unsqueeze(1), alpha=-group["lr"])


def zipf_ids(u, n, s):
    """The example's zipf_id on a tensor of uniforms u (float64) for a table of n rows."""
    if s == 1.0:
        x = torch.exp(u * math.log(n + 1.0))
    else:
        x = torch.pow(u * ((n + 1.0) ** (1.0 - s) - 1.0) + 1.0, 1.0 / (1.0 - s))
    return (x.floor().long() - 1).clamp(0, n - 1)


def row_value(ids, t):
    """A standard-normal value per (table, row), from the id: the fractional part of a Weyl sequence (uniform on
    (0, 1)) through the normal quantile."""
    frac = torch.frac((ids.double() + 1.0) * 0.6180339887498949 + t * 0.7548776662466927)
    return math.sqrt(2.0) * torch.erfinv(2.0 * frac.clamp(1e-12, 1 - 1e-12) - 1.0)


def make_batches(count, batch, id_range, zipf, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    a = torch.randn(DENSE, generator=g, device=device, dtype=torch.float64)
    out = []
    for _ in range(count):
        dense = torch.randn(batch, DENSE, generator=g, device=device, dtype=torch.float64)
        u = torch.rand(batch, SPARSE, generator=g, device=device, dtype=torch.float64).clamp_min(1e-300)
        ids = torch.stack([zipf_ids(u[:, t], n, zipf) for t, n in enumerate(id_range)], 1)  # (B, 26) int64
        logit = -0.5 + 0.3 * dense @ a
        for t in range(SPARSE):
            logit = logit + 0.35 * row_value(ids[:, t], t)
        labels = (torch.rand(batch, generator=g, device=device, dtype=torch.float64) < torch.sigmoid(logit)).float()
        out.append((dense.float(), ids, labels))
    return out


def host_rss_gib():
    now = peak = float("nan")
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    now = int(line.split()[1]) / (1 << 20)
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return now, peak


def rounded(v, digits):
    return v if not isinstance(v, float) or not math.isfinite(v) else round(v, digits)


def run(args):
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    rows = table_rows(args.table_sizes)
    id_range = [min(r, args.id_rows) if args.id_rows > 0 else r for r in rows]
    bottom = positive_list(args.bottom_mlp, "--bottom-mlp", True)
    top = positive_list(args.top_mlp, "--top-mlp", True)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = Dlrm(rows, args.embedding_dim, bottom, top, device).train()
    if args.compile:
        model.dense_part = torch.compile(model.interact)
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    table_params = list(model.tables.parameters())
    table_lr = args.table_lr or {"sgd": args.lr, "sparse_adam": 1e-3, "rowwise_adagrad": 1e-2}[args.table_optimizer]
    dense_opt = torch.optim.SGD(dense_params, lr=args.lr)
    if args.table_optimizer == "sgd":
        table_opt = torch.optim.SGD(table_params, lr=table_lr)
    elif args.table_optimizer == "sparse_adam":
        table_opt = torch.optim.SparseAdam(table_params, lr=table_lr)
    else:
        table_opt = RowWiseAdagrad(table_params, lr=table_lr)
    if cuda:
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0

    warmup = max(args.bench_warmup, COMPILE_WARMUP) if args.compile else args.bench_warmup
    total = warmup + args.bench_steps
    t0 = time.perf_counter()
    batches = make_batches(total, args.batch_size, id_range, args.zipf, device, args.seed)
    largest = max(range(SPARSE), key=lambda t: (rows[t], -t))
    touched, touched_largest = [], []
    for dense, ids, _ in batches[warmup:]:
        per_table = [int(torch.unique(ids[:, t]).numel()) for t in range(SPARSE)]
        touched.append(sum(per_table))
        touched_largest.append(per_table[largest])
    if cuda:
        torch.cuda.synchronize()
    data_s = time.perf_counter() - t0

    losses = torch.zeros(total, device=device)

    def step(i):
        dense, ids, labels = batches[i]
        dense_opt.zero_grad(set_to_none=True)
        table_opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        loss.backward()
        dense_opt.step()
        table_opt.step()
        losses[i].copy_(loss.detach())

    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    peak_setup = float("nan")
    if cuda:
        peak_setup = torch.cuda.max_memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
    ms = []
    t0 = time.perf_counter()
    for i in range(warmup, total):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(i)
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        else:
            t = time.perf_counter()
            step(i)
            ms.append(1000 * (time.perf_counter() - t))
    timed_s = time.perf_counter() - t0

    log = losses.double().tolist()
    failed = None
    bad = next((i for i, v in enumerate(log) if not math.isfinite(v)), None)
    if bad is not None:
        failed = f"the loss of step {bad} is {log[bad]}"
    cycle = min(args.bench_cycle, total // 2)
    first = sum(log[:cycle]) / cycle if cycle else float("nan")
    last = sum(log[-cycle:]) / cycle if cycle else float("nan")
    if failed is None and not last < first:
        failed = (f"the loss did not fall: mean {last:.4f} over the last {cycle} steps, {first:.4f} over the "
                  f"first {cycle}")

    def state_bytes(p, on_device):
        return sum(v.numel() * v.element_size() for v in table_opt.state.get(p, {}).values()
                   if torch.is_tensor(v) and v.is_cuda == on_device)

    dev_params = sum(p.numel() * p.element_size() for p in table_params if p.is_cuda)
    host_params = sum(p.numel() * p.element_size() for p in table_params if not p.is_cuda)
    dev_state = sum(state_bytes(p, True) for p in table_params)
    host_state = sum(state_bytes(p, False) for p in table_params)
    rss, rss_peak = host_rss_gib()
    median = sorted(ms)[len(ms) // 2]
    line = {
        "bench": "recsys", "framework": "torch-compile" if args.compile else "torch", "case": args.bench_name,
        "device": str(device), "torch": torch.__version__, "table_sizes": rows, "embedding_dim": args.embedding_dim,
        "bottom_mlp": bottom, "top_mlp": top, "batch": args.batch_size, "zipf": args.zipf, "id_rows": args.id_rows,
        "table_optimizer": args.table_optimizer, "table_lr": table_lr, "dense_optimizer": "sgd", "lr": args.lr,
        "tables": "EmbeddingBag(mode=sum, sparse=True), one id per bag", "hybrid_rows": 0, "hybrid_tables": 0,
        "warmup": warmup, "steps": args.bench_steps, "step_ms": round(median, 4),
        "step_ms_min": round(min(ms), 4), "step_ms_max": round(max(ms), 4),
        "throughput": round(args.batch_size * 1000 / median, 1), "unit": "samples/s", "timed_s": round(timed_s, 3),
        "rows_touched_per_step": round(sum(touched) / len(touched), 1),
        "largest_table_rows_touched": round(sum(touched_largest) / len(touched_largest), 1),
        "emb_device_gib": round((dev_params + dev_state) / GIB, 4),
        "emb_device_params_gib": round(dev_params / GIB, 4), "emb_device_state_gib": round(dev_state / GIB, 4),
        "emb_host_gib": round((host_params + host_state) / GIB, 4),
        "emb_total_gib": round((dev_params + dev_state + host_params + host_state) / GIB, 4),
        "hot_gib": 0.0, "cold_gib": 0.0,
    }
    if cuda:
        line.update({"gpu_allocated_gib": round(torch.cuda.memory_allocated() / GIB, 3),
                     "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
                     "gpu_peak_setup_gib": round(peak_setup, 3),
                     "gpu_reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3)})
    line.update({"host_rss_gib": rounded(rss, 3), "host_peak_rss_gib": rounded(rss_peak, 3),
                 "build_s": round(build_s, 2), "data_s": round(data_s, 2), "warmup_s": round(warmup_s, 2),
                 "trained": failed is None})
    if failed is not None:
        line["failed"] = failed
    line.update({"cycle": cycle, "loss_first": rounded(first, 4), "loss_last": rounded(last, 4),
                 "losses": [rounded(v, 4) for v in log], "step_ms_all": [round(v, 4) for v in ms]})
    print(json.dumps(line), flush=True)
    if failed is not None:
        print(f"pytorch_recsys.py: the run did not train: {failed}", file=sys.stderr)
    return 0 if failed is None else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table-sizes", default="1000,10000,100000")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--bottom-mlp", default="64")
    p.add_argument("--top-mlp", default="64,32")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--id-rows", type=int, default=0, help="ids from each table's first N rows (0: all)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.0, help="the MLPs' SGD learning rate")
    p.add_argument("--table-optimizer", choices=("sgd", "sparse_adam", "rowwise_adagrad"), default="sgd")
    p.add_argument("--table-lr", type=float, default=0.0,
                   help="0: --lr for sgd, 0.001 for sparse_adam, 0.01 for rowwise_adagrad (the example's defaults)")
    p.add_argument("--bench-steps", type=int, default=100)
    p.add_argument("--bench-warmup", type=int, default=30)
    p.add_argument("--bench-cycle", type=int, default=10)
    p.add_argument("--bench-name", default="recsys")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the dense part (the lookups stay eager)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps: does it run")
    args = p.parse_args()
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_recsys.py: --device cuda, but no GPU is visible")
    if args.quick:
        args.table_sizes, args.batch_size, args.bench_steps, args.bench_warmup = "500,5000,100000", 256, 20, 25
        args.bench_cycle = 10
    if args.bench_steps < 1 or args.bench_warmup < 0 or args.bench_cycle < 1 or args.batch_size < 1:
        raise SystemExit("pytorch_recsys.py: --bench-steps, --bench-cycle and --batch-size must be >= 1, "
                         "--bench-warmup >= 0")
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 products, as kiln's default (cuda::set_allow_tf32)
    try:
        return run(args)
    except torch.cuda.OutOfMemoryError as e:
        print(json.dumps({"bench": "recsys", "framework": "torch-compile" if args.compile else "torch",
                          "case": args.bench_name, "error": f"out of memory: {str(e).splitlines()[0]}"}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
