"""PyTorch's convolutions on the cases of bench_conv.cpp: every distinct convolution of a ResNet, channels-last, no
bias, each pass alone: forward, backward-data (dx) and backward-filter (dw), with torch.backends.cudnn.benchmark =
True (cuDNN's graph API picks and times the engines). The backward passes go through
torch.ops.aten.convolution_backward with output_mask (True, False, False) for dx and (False, True, False) for dw, so
each runs alone, as autograd runs them.

Nets (--net): resnet50 (default): torchvision's ResNet-50 (bottleneck v1.5) at batch 256, 224x224 input (53
convolutions, 23 distinct shapes); resnet18_cifar: ResNet-18 with the CIFAR stem (3x3/1, 3 -> 64, no max pool) at
batch 512, 32x32 input (20 convolutions, 11 distinct shapes).

Timing as bench_conv's: --iters (10) passes back to back between two CUDA events, the median of --steps (10)
such blocks after --warmup (2) blocks (bench/torch_timing.py), divided by --iters. One JSON line per (shape, pass)
in bench_conv's format with "impl": "torch", then the count-weighted total per pass over the net's convolutions
(the stem's dx, measured, is left out of it: no training step computes the gradient of its input images).

    python3 bench/pytorch_conv.py [--net resnet50|resnet18_cifar] [--dtype bf16|fp16] [--shape INDEX] [--iters N]
                                  [--steps N] [--warmup N] > torch.log
    python3 bench/pytorch_conv.py --quick          # batch 2, spatial size / 8, one pass: does it run (CPU too)
    python3 bench/pytorch_conv.py --compare kiln.log torch.log   # Markdown table; needs no PyTorch

--compare takes any two such logs (also bench_conv's with --path auto and with --path cudnn) and matches their
lines on net, dtype, batch, shape and pass; the path column gives bench_conv's "path" ("matmul" or "cudnn").
"""
import argparse
import json
import os
import sys

from json_lines import bench_lines

PASSES = ("fwd", "dx", "dw")

# As bench_conv.cpp's kNets: the stem (kernel, stride), the max pool after it, the block type, blocks per stage
# (widths 64, 128, 256, 512), and what the walk must give at the full size.
NETS = {
    "resnet50": dict(title="ResNet-50", n=256, hw=224, stem_k=7, stem_stride=2, max_pool=True, bottleneck=True,
                     blocks=(3, 4, 6, 3), convs=53, distinct=23),
    "resnet18_cifar": dict(title="ResNet-18 (CIFAR stem)", n=512, hw=32, stem_k=3, stem_stride=1, max_pool=False,
                           bottleneck=False, blocks=(2, 2, 2, 2), convs=20, distinct=11),
}


def out_size(hw, k, stride):
    return (hw + 2 * (k // 2) - k) // stride + 1


def resnet_convs(net, hw):
    """A net's distinct convolutions for an input of hw x hw, block by block (a block's own convs, then its
    shortcut's downsample), as [c_in, c_out, hw, k, stride, count]; the same walk as bench_conv.cpp's, so --shape
    INDEX agrees. The downsample rule is torchvision's: stride != 1 or a change of width."""
    shapes = []

    def add(c_in, c_out, h, k, stride):
        for s in shapes:
            if s[:5] == [c_in, c_out, h, k, stride]:
                s[5] += 1
                return
        shapes.append([c_in, c_out, h, k, stride, 1])

    add(3, 64, hw, net["stem_k"], net["stem_stride"])  # the stem
    hw = out_size(hw, net["stem_k"], net["stem_stride"])
    if net["max_pool"]:
        hw = out_size(hw, 3, 2)  # max pool 3x3/2, padding 1
    c_in = 64
    expansion = 4 if net["bottleneck"] else 1
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), net["blocks"])):
        out = expansion * width
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            nxt = out_size(hw, 3, stride)
            if net["bottleneck"]:
                add(c_in, width, hw, 1, 1)  # conv1
                add(width, width, hw, 3, stride)  # conv2, strided in the first block of stages 2-4 (v1.5)
                add(width, out, nxt, 1, 1)  # conv3
            else:
                add(c_in, width, hw, 3, stride)  # conv1, strided in the first block of stages 2-4
                add(width, width, nxt, 3, 1)  # conv2
            if stride != 1 or c_in != out:
                add(c_in, out, hw, 1, stride)  # the shortcut's downsample
            c_in, hw = out, nxt
    return shapes


FULL = {name: resnet_convs(net, net["hw"]) for name, net in NETS.items()}
for _name, _net in NETS.items():
    assert len(FULL[_name]) == _net["distinct"] and sum(s[5] for s in FULL[_name]) == _net["convs"], _name


# ---------------------------------------------------------------- measuring (PyTorch)

def measure(args):
    import torch  # here, so that --compare runs where PyTorch is not installed

    quick = args.quick
    net = NETS[args.net]
    n, hw = (2, net["hw"] // 8) if quick else (net["n"], net["hw"])
    iters = args.iters if args.iters is not None else (1 if quick else 10)
    steps = args.steps if args.steps is not None else (1 if quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif quick:
        device = torch.device("cpu")
    else:
        print("pytorch_conv: no GPU visible; nothing to measure (--quick runs the code on the CPU)")
        return
    torch.backends.cudnn.benchmark = True
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(1234)
    if device.type == "cuda":
        from torch_timing import median_step_ms
    else:
        import statistics
        import time

        def median_step_ms(step, warmup, steps):
            for _ in range(warmup):
                step()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)

    # benchmark_limit: how many of cuDNN's heuristic engine configurations benchmark mode times (0: all).
    limit = getattr(torch.backends.cudnn, "benchmark_limit", None)
    print(f"pytorch {torch.__version__} cuDNN {torch.backends.cudnn.version()} (benchmark_limit {limit}) conv on "
          f"{device}: {args.net}, {args.dtype}, "
          f"batch {n}, {hw}x{hw} input, channels-last; {iters} passes per block, median of {steps} blocks after {warmup}")
    cl = torch.channels_last
    totals = {p: [0.0, 0.0, 0, False] for p in PASSES}  # ms, flop, layers, failed
    for index, (c_in, c_out, h, k, stride, count) in enumerate(resnet_convs(net, hw)):
        if args.shape is not None and index != args.shape:
            continue
        oh = out_size(h, k, stride)
        pad = k // 2
        # Random normal data; the weight with std 1 / sqrt(fan_in) (He's scale) so outputs stay in range.
        x = torch.randn(n, c_in, h, h, device=device, dtype=dtype).contiguous(memory_format=cl)
        w = (torch.randn(c_out, c_in, k, k, device=device, dtype=dtype) * (c_in * k * k) ** -0.5).contiguous(
            memory_format=cl)
        dy = torch.randn(n, c_out, oh, oh, device=device, dtype=dtype).contiguous(memory_format=cl)
        flop = 2.0 * n * c_out * oh * oh * c_in * k * k
        conv_args = ([stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)  # stride .. groups

        def fwd():
            torch.ops.aten.convolution(x, w, None, *conv_args)

        def dx():
            torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, (True, False, False))

        def dw():
            torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, (False, True, False))

        fields = {"bench": "conv", "impl": "torch", "net": args.net, "dtype": args.dtype, "shape": index, "n": n, "c_in": c_in,
                  "c_out": c_out, "hw": h, "k": k, "stride": stride, "count": count}
        for name, pass_fn in zip(PASSES, (fwd, dx, dw)):
            line = dict(fields, **{"pass": name})
            try:
                with torch.no_grad():
                    ms = median_step_ms(lambda: [pass_fn() for _ in range(iters)], warmup, steps) / iters
                in_step = not (index == 0 and name == "dx")
                line.update(ms=round(ms, 4), tflops=round(flop / ms / 1e9, 1), in_step=in_step)
                if in_step:
                    t = totals[name]
                    t[0] += ms * count
                    t[1] += flop * count
                    t[2] += count
            except Exception as e:  # one failing pass (out of memory, say) does not end the run
                line["error"] = str(e)[:400]
                totals[name][3] = True
            print(json.dumps(line), flush=True)
        del x, w, dy
    if args.shape is None:  # the totals need every shape: one --shape alone is not a training step
        for name in PASSES:
            ms, flop, layers, failed = totals[name]
            if not failed:
                print(json.dumps({"bench": "conv", "impl": "torch", "dtype": args.dtype, "n": n, "input_hw": hw,
                                  "summary": args.net, "pass": name, "layers": layers, "ms": round(ms, 3),
                                  "tflops": round(flop / ms / 1e9, 1)}))


# ---------------------------------------------------------------- --compare (no PyTorch needed)

def read_lines(path):
    """The per-shape lines of one log, keyed by net, dtype, batch, shape and pass; other lines (headers, totals) are
    skipped. Logs from before --net have no "net": they are ResNet-50's."""
    rows = {}
    with open(path) as f:
        for d in bench_lines(f, "conv"):
            if "summary" in d:
                continue
            key = (d.get("net", "resnet50"), d["dtype"], d["n"], d["c_in"], d["c_out"], d["hw"], d["k"], d["stride"],
                   d["pass"])
            rows[key] = d
    return rows


def log_labels(rows_a, rows_b, path_a, path_b):
    """Column names for the two logs: their "impl" (kiln, torch), or their file names where both are the same (two
    bench_conv logs, say --path auto beside --path cudnn)."""
    def impl(rows):
        return "/".join(sorted({d.get("impl", "?") for d in rows.values()}))

    a, b = impl(rows_a), impl(rows_b)
    if a == b:
        a, b = os.path.basename(path_a), os.path.basename(path_b)
        if a == b:
            a, b = path_a, path_b
    return a, b


def path_cell(a, b):
    """bench_conv's "path" of the row ("matmul" or "cudnn"), both when the two logs differ; "—" when neither has one."""
    paths = [r["path"] for r in (a, b) if r and r.get("path")]
    if not paths:
        return "—"
    return paths[0] if len(set(paths)) == 1 else " / ".join(paths)


def compare(a_path, b_path):
    rows_a, rows_b = read_lines(a_path), read_lines(b_path)
    if not rows_a or not rows_b:
        sys.exit(f"pytorch_conv --compare: no conv lines in {a_path if not rows_a else b_path}")
    la, lb = log_labels(rows_a, rows_b, a_path, b_path)
    keys_all = set(rows_a) | set(rows_b)
    nets = sorted({k[0] for k in keys_all}, key=lambda net: (list(NETS).index(net) if net in NETS else len(NETS), net))
    for net in nets:
        if len(nets) > 1:
            print(f"### {NETS[net]['title'] if net in NETS else net}\n")
        compare_net(net, [k for k in keys_all if k[0] == net], rows_a, rows_b, la, lb)
        if len(nets) > 1 and net != nets[-1]:
            print()


def compare_net(net, keys, rows_a, rows_b, la, lb):
    # The order of bench_conv's list: by shape index, then pass.
    keys = sorted(keys, key=lambda k: ((rows_a.get(k) or rows_b.get(k))["shape"], PASSES.index(k[8])))
    print(f"| # | shape (c_in→c_out, k/stride, input) | count | pass | path | {la} ms | {lb} ms | {la} / {lb} "
          f"| count × Δ ms |")
    print("| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    totals = {p: [0.0, 0.0, 0, 0] for p in PASSES}  # a ms, b ms, layers matched, rows unmatched
    dtype_n = set()
    for key in keys:
        _, dtype, n, c_in, c_out, hw, k, stride, name = key
        dtype_n.add((dtype, n))
        a, b = rows_a.get(key), rows_b.get(key)
        d = a or b
        shape = f"{c_in}→{c_out}, {k}x{k}/{stride}, {hw}x{hw}"
        a_ms = a.get("ms") if a else None
        b_ms = b.get("ms") if b else None

        def cell(row, ms):
            if row is None:
                return "—"
            return f"{ms:.3f}" if ms is not None else "error"

        count = d["count"]
        in_step = d.get("in_step", True)
        if a_ms is not None and b_ms:
            ratio = f"{a_ms / b_ms:.2f}"
            delta = f"{count * (a_ms - b_ms):+.3f}" if in_step else "(not in a step)"
            if in_step:
                t = totals[name]
                t[0] += count * a_ms
                t[1] += count * b_ms
                t[2] += count
        else:
            ratio = delta = "—"
            if in_step:
                totals[name][3] += 1
        print(f"| {d['shape']} | {shape} | {count} | {name} | {path_cell(a, b)} | {cell(a, a_ms)} | {cell(b, b_ms)} "
              f"| {ratio} | {delta} |")
    print()
    title = NETS[net]["title"] if net in NETS else net
    print(f"Count-weighted totals: the time one {title} training step spends in each pass (the stem's dx left out).")
    print()
    print(f"| pass | convolutions | {la} ms | {lb} ms | {la} / {lb} | {la} − {lb} ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    all_a = all_b = 0.0
    for name in PASSES:
        a_ms, b_ms, layers, unmatched = totals[name]
        if layers == 0:
            continue
        # A shape missing or failed on either side is left out of both totals, and said so.
        convs = f"{layers} ({unmatched} shape(s) missing)" if unmatched else f"{layers}"
        print(f"| {name} | {convs} | {a_ms:.2f} | {b_ms:.2f} | {a_ms / b_ms:.2f} | {a_ms - b_ms:+.2f} |")
        all_a += a_ms
        all_b += b_ms
    if all_b > 0:
        print(f"| all three | | {all_a:.2f} | {all_b:.2f} | {all_a / all_b:.2f} | {all_a - all_b:+.2f} |")
    if len(dtype_n) > 1:
        print(f"\nnote: the logs mix dtypes or batch sizes {sorted(dtype_n)}; rows are matched on both.")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--net", choices=tuple(NETS), default="resnet50",
                   help="resnet50 (batch 256, 224x224) or resnet18_cifar (batch 512, 32x32)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--shape", type=int,
                   help="one shape's index in the net's list (bench_conv --net NET --help lists them)")
    p.add_argument("--iters", type=int, help="passes per timed block (10; --quick 1)")
    p.add_argument("--steps", type=int, help="timed blocks (10; --quick 1)")
    p.add_argument("--warmup", type=int, help="untimed blocks first (2; --quick 1)")
    p.add_argument("--quick", action="store_true", help="batch 2, spatial size / 8, one pass; the CPU without a GPU")
    p.add_argument("--compare", nargs=2, metavar=("KILN_LOG", "TORCH_LOG"),
                   help="print the Markdown table of two logs (bench_conv's and this script's, or two of either), "
                        "then exit")
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    shapes = FULL[args.net]
    if args.shape is not None and not 0 <= args.shape < len(shapes):
        p.error(f"--shape takes an index from 0 to {len(shapes) - 1} for {args.net}, got {args.shape}")
    for opt in ("iters", "steps"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            p.error(f"--{opt} must be at least 1, got {getattr(args, opt)}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup must not be negative, got {args.warmup}")
    measure(args)


if __name__ == "__main__":
    main()
