"""The table of the training cases: kiln (bench_train) beside PyTorch's fastest mode (bench/pytorch_train.py), from
their JSON lines, in Markdown.

    python3 bench/train_table.py kiln*.log torch*.log
    cat *.log | python3 bench/train_table.py
    python3 bench/train_table.py --selftest        # the table builder and the training rules on made-up lines

Reads every line that is a JSON object with "bench": "train" (other lines are skipped) and the "gemm_peak" lines.
"framework" is "kiln" (or absent: kiln's) or "torch-<mode>" (eager, compile, eager_graph, compile_graph,
compile_max). A run counts only if it trained: lines with "trained": false (their "failed" reason), "error" or
"skipped" are listed under the table and left out of every figure. Both sides get the same selection rule: each
figure is the median of the step times of a case's counted runs, shown with their [min..max] and count; five or more
runs per side are what the issue asks (fewer are flagged). kiln's graph figure is "step_ms" of lines with
"cuda_graph": true, its eager figure "eager_step_ms" (or "step_ms" of an eager-only line). PyTorch's fastest mode is
the one with the lowest median.

MFU (transformer cases): the model's FLOPs per step over the median step time, as a share of the bf16 matrix-product
rate measured in the same run (the highest "gemm_peak" line read). The count, per step of B sequences of S tokens
with hidden size H, L layers, feed-forward size I and vocabulary V (padding is computed as any token; the masked-LM
head runs on R = S rows of each sequence, or on its P listed positions, R = P, where the line's input says
"S tokens, P predicted"):
    6 * B * (S * L * (4*H*H + 2*H*I) + R * (H*H + H*V))   the linear layers (Q, K, V, output, feed-forward; the
                                                           head's transform and decoder), forward and backward
  + 12 * L * B * S*S * H                            attention's two batched products, forward and backward
Gradient checkpointing's recomputation is not counted (model FLOPs, not hardware FLOPs).
"""
import math
import statistics
import sys

from json_lines import bench_lines, read_logs
from train_rules import judge_training

KILN = "kiln"
TORCH_MODES = ("torch-eager", "torch-compile", "torch-eager_graph", "torch-compile_graph", "torch-compile_max")
DASH = "—"
MIN_RUNS = 5
BERT_SIZES = {"bert-base": (768, 12, 3072), "bert-large": (1024, 24, 4096)}  # hidden, layers, feed-forward
BERT_VOCAB = 30522


def model_flops(r):
    """FLOPs of one training step of a BERT line (the count in the docstring), or None for other models."""
    sizes = BERT_SIZES.get(r.get("model"))
    words = str(r.get("input", "")).replace(",", " ").split()
    try:
        seq = int(words[0])
        batch = int(r["batch"])
        rows = int(words[words.index("predicted") - 1]) if "predicted" in words else seq
    except (KeyError, ValueError, IndexError):
        return None
    if sizes is None:
        return None
    h, layers, ff = sizes
    linear = seq * layers * (4 * h * h + 2 * h * ff) + rows * (h * h + h * BERT_VOCAB)
    return 6 * batch * linear + 12 * layers * batch * seq * seq * h


def counted(r):
    return (isinstance(r.get("step_ms"), (int, float)) and "error" not in r and "skipped" not in r
            and r.get("trained", True) is not False)


class Results:
    """Every train line by (framework, case), and the highest bf16 matrix-product rate seen."""

    def __init__(self):
        self.lines = {}
        self.peak_tflops = None

    def add(self, lines):
        lines = list(lines)
        for r in bench_lines(lines, "gemm_peak"):
            if isinstance(r.get("tflops"), (int, float)):
                self.peak_tflops = max(self.peak_tflops or 0.0, float(r["tflops"]))
        for r in bench_lines(lines, "train"):
            if "case" in r:
                self.lines.setdefault((r.get("framework", KILN), r["case"]), []).append(r)

    def times(self, framework, case, key="step_ms"):
        """The step times of the counted runs: kiln's "graph" or "eager" figure, or a PyTorch mode's step_ms."""
        out = []
        for r in self.lines.get((framework, case), []):
            if not counted(r):
                continue
            if framework == KILN and key == "graph":
                if r.get("cuda_graph") is True:
                    out.append(float(r["step_ms"]))
            elif framework == KILN and key == "eager":
                v = r.get("eager_step_ms", r["step_ms"] if r.get("cuda_graph") is not True else None)
                if isinstance(v, (int, float)):
                    out.append(float(v))
            else:
                out.append(float(r[key]))
        return out

    def cases(self):
        seen = []
        for (_, case) in self.lines:
            if case not in seen:
                seen.append(case)
        order = list(GOALS)
        return [c for c in order if c in seen] + [c for c in seen if c not in order]

    def first(self, framework, case):
        rows = self.lines.get((framework, case), [])
        return next((r for r in rows if counted(r)), rows[0] if rows else None)


def summary(times):
    """(median, min, max, n) or None."""
    if not times:
        return None
    return statistics.median(times), min(times), max(times), len(times)


def fmt(s):
    if s is None:
        return DASH
    med, lo, hi, n = s
    flag = "" if n >= MIN_RUNS else " ⚠"
    return f"{med:.2f} [{lo:.2f}..{hi:.2f}] ×{n}{flag}"


def fastest_torch(res, case):
    """(mode, summary) of the PyTorch mode with the lowest median step time, or (None, None)."""
    best = (None, None)
    for mode in TORCH_MODES:
        s = summary(res.times(mode, case))
        if s is not None and (best[1] is None or s[0] < best[1][0]):
            best = (mode, s)
    return best


def mfu(res, case, ms):
    """The bf16 cases' MFU at `ms` per step (None for other precisions: the peak is bf16's)."""
    r = res.first(KILN, case) or next((res.first(m, case) for m in TORCH_MODES if res.first(m, case)), None)
    flops = model_flops(r) if r and r.get("precision") == "bf16" else None
    if flops is None or ms is None or not res.peak_tflops:
        return None
    return flops / (ms / 1000.0) / (res.peak_tflops * 1e12)


def speedup(goal_ms, kiln_ms):
    return goal_ms / kiln_ms if goal_ms and kiln_ms else None


def speed_goal(text, kiln_key, torch_figure, factor, label=""):
    """Goal: kiln's `kiln_key` figure ("graph" or "eager") ≥ factor × faster than torch_figure(res, case) (a
    summary or None); the detail is the ratio, followed by `label` when given."""
    def check(res, case):
        t, k = torch_figure(res, case), summary(res.times(KILN, case, kiln_key))
        if t is None or k is None:
            return None, ""
        x = speedup(t[0], k[0])
        return x >= factor, f"{x:.2f}×" + (f" {label}" if label else "")

    return text, check


def mode_figure(framework):
    return lambda res, case: summary(res.times(framework, case))


def graph_vs_fastest(factor):
    """kiln's graph step against PyTorch's fastest mode, judged only where PyTorch's strongest mode (torch.compile with
    the whole step in a CUDA graph) was run: a table of the modes without graphs alone cannot meet it."""
    text, check = speed_goal(f"kiln graph ≥ {factor:g}× fastest torch", "graph",
                             lambda res, case: fastest_torch(res, case)[1], factor)

    def check_strongest_ran(res, case):
        if ("torch-compile_graph", case) not in res.lines:
            return None, "torch compile + graph not run"
        return check(res, case)

    return text, check_strongest_ran


def eager_vs_compile(factor):
    return speed_goal(f"kiln eager ≥ {factor:g}× compile", "eager", mode_figure("torch-compile"), factor)


def eager_vs(framework, factor):
    """kiln's eager figure against one PyTorch mode (the dynamic-shape case, where no graph applies)."""
    name = framework.removeprefix("torch-")
    return speed_goal(f"kiln ≥ {factor:g}× {name}", "eager", mode_figure(framework), factor, name)


def both(*goals):
    text = "; ".join(g[0] for g in goals)

    def check(res, case):
        results = [g[1](res, case) for g in goals]
        detail = ", ".join(d for _, d in results if d)
        if any(m is False for m, _ in results):
            return False, detail
        return (None if any(m is None for m, _ in results) else True), detail

    return text, check


def mfu_goal(share):
    def check(res, case):
        k = summary(res.times(KILN, case, "graph")) or summary(res.times(KILN, case, "eager"))
        m = mfu(res, case, k[0] if k else None)
        if m is None:
            return None, ""
        return m >= share, f"MFU {100 * m:.1f}%"

    return f"MFU ≥ {100 * share:.0f}%", check


def checkpointing_goal(res, case):
    """bert_base_128_ckpt: kiln's peak <= 55% of its own bert_base_128 eager peak, at >= 75% of its eager speed."""
    r, base = res.first(KILN, case), res.first(KILN, "bert_base_128")
    if not r or not base or not counted(r) or not counted(base):
        return None, ""
    base_peak = base.get("eager_peak_gib", base.get("peak_gib"))
    base_ms = base.get("eager_step_ms", base.get("step_ms"))
    if not base_peak or not base_ms:
        return None, ""
    memory, speed = r["peak_gib"] / base_peak, base_ms / r["step_ms"]
    return memory <= 0.55 and speed >= 0.75, f"memory {100 * memory:.0f}%, throughput {100 * speed:.0f}%"


def own_speed_goal(share):
    """A JPEG case: kiln's graph throughput >= share of its own in-memory resnet50_bf16 graph throughput."""
    def check(res, case):
        k, base = summary(res.times(KILN, case, "graph")), summary(res.times(KILN, "resnet50_bf16", "graph"))
        if k is None or base is None:
            return None, ""
        x = base[0] / k[0]
        return x >= share, f"{100 * x:.0f}%"

    return f"kiln ≥ {100 * share:.0f}% of kiln resnet50_bf16", check


def fp8_speed_goal(bf16_case, factor):
    """An FP8 case: kiln's FP8 graph step >= factor x faster than its own bf16 graph step of bf16_case."""
    def check(res, case):
        k, base = summary(res.times(KILN, case, "graph")), summary(res.times(KILN, bf16_case, "graph"))
        if k is None or base is None:
            return None, ""
        x = base[0] / k[0]
        return x >= factor, f"{x:.2f}× kiln bf16"

    return f"kiln FP8 ≥ {factor:g}× kiln {bf16_case}", check


# case -> (goal as text, check(results, case) -> (met: True/False/None when not measured, detail))
STANDARD = both(graph_vs_fastest(1.15), eager_vs_compile(1.05))
GOALS = {
    "resnet50_bf16": STANDARD,
    "resnet50_fp16": STANDARD,
    "resnet18_cifar_bf16": STANDARD,
    "bert_base_128": STANDARD,
    "bert_base_512": STANDARD,
    "bert_large_128": both(graph_vs_fastest(1.15), eager_vs_compile(1.05), mfu_goal(0.55)),
    "bert_base_128_p20": STANDARD,
    "bert_large_128_p20": both(graph_vs_fastest(1.15), eager_vs_compile(1.05), mfu_goal(0.55)),
    "bert_base_128_fp8_p20": fp8_speed_goal("bert_base_128_p20", 1.2),
    "bert_large_128_fp8_p20": fp8_speed_goal("bert_large_128_p20", 1.35),
    "bert_base_128_ckpt": ("kiln peak ≤ 55% of kiln bert_base_128's, throughput ≥ 75% of it", checkpointing_goal),
    "resnet50_fp32": graph_vs_fastest(1.1),
    "bert_base_128_fp32": graph_vs_fastest(1.1),
    "bert_base_128_fp8": fp8_speed_goal("bert_base_128", 1.2),
    "bert_large_128_fp8": fp8_speed_goal("bert_large_128", 1.35),
    "bert_base_dynamic": both(eager_vs("torch-eager", 1.2), eager_vs("torch-compile", 1.0)),
    "resnet50_jpeg": own_speed_goal(0.90),
    "resnet50_jpeg_gpu": own_speed_goal(0.95),
}

HEADER = ["case", "kiln graph ms", "kiln eager ms", "fastest torch", "its ms", "torch compile ms",
          "graph / fastest", "eager / compile", "MFU kiln", "MFU torch", "goal", "met"]


def build_rows(res):
    rows = []
    for case in res.cases():
        kg, ke = summary(res.times(KILN, case, "graph")), summary(res.times(KILN, case, "eager"))
        mode, ft = fastest_torch(res, case)
        tc = summary(res.times("torch-compile", case))
        g_ratio = speedup(ft[0], kg[0]) if ft and kg else None
        e_ratio = speedup(tc[0], ke[0]) if tc and ke else None
        mk = mfu(res, case, (kg or ke)[0] if (kg or ke) else None)
        mt = mfu(res, case, ft[0] if ft else None)
        goal, check = GOALS.get(case, (DASH, None))
        met, detail = check(res, case) if check else (None, "")
        if check is None:
            status = DASH
        elif met is None:
            status = "not measured" + (f" ({detail})" if detail else "")
        else:
            status = f"{'yes' if met else 'no'} ({detail})"
        pct = lambda m: DASH if m is None else f"{100 * m:.1f}%"  # noqa: E731
        rows.append({"case": case, "graph_ratio": g_ratio, "eager_ratio": e_ratio, "mfu": mk, "met": met,
                     "fastest": mode,
                     "cells": [case, fmt(kg), fmt(ke), mode.removeprefix("torch-") if mode else DASH, fmt(ft), fmt(tc),
                               DASH if g_ratio is None else f"{g_ratio:.2f}×",
                               DASH if e_ratio is None else f"{e_ratio:.2f}×", pct(mk), pct(mt), goal, status]})
    return rows


def table(res):
    rows = build_rows(res)
    out = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r["cells"]) + " |" for r in rows]
    out.append("")
    out.append("Step times in ms: median [min..max] ×runs over the runs that trained (⚠: fewer than "
               f"{MIN_RUNS}). bf16 matrix-product rate: "
               + (f"{res.peak_tflops:.1f} TFLOP/s." if res.peak_tflops else "not measured."))
    notes = []
    for (framework, case), lines in sorted(res.lines.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for r in lines:
            for key in ("error", "skipped", "failed"):
                if key in r:
                    notes.append(f"- {case}, {framework}: {key}: {r[key]}")
        s = summary(res.times(framework, case))
        if framework != KILN and s is not None:
            notes.append(f"- {case}, {framework}: {fmt(s)} ms")
        firsts = [r["first_epoch_s"] for r in lines if counted(r) and isinstance(r.get("first_epoch_s"), (int, float))]
        if firsts:
            notes.append(f"- {case}, {framework}: first epoch (new shapes) {statistics.median(firsts):.2f} s "
                         f"[{min(firsts):.2f}..{max(firsts):.2f}] ×{len(firsts)}")
    return "\n".join(out + notes)


SELFTEST_LINES = """\
kiln 0.1 bench_train: made-up figures
{"bench":"gemm_peak","framework":"torch","tflops":800.0}
{"bench":"gemm_peak","framework":"torch","tflops":700.0}
{"bench":"train","framework":"kiln","case":"resnet50_bf16","model":"resnet50","batch":256,"step_ms":30.0,"eager_step_ms":31.0,"cuda_graph":true,"peak_gib":20.0,"trained":true}
{"bench":"train","framework":"kiln","case":"resnet50_bf16","model":"resnet50","batch":256,"step_ms":32.0,"eager_step_ms":33.0,"cuda_graph":true,"peak_gib":20.0,"trained":true}
{"bench":"train","framework":"kiln","case":"resnet50_bf16","model":"resnet50","batch":256,"step_ms":10.0,"eager_step_ms":10.0,"cuda_graph":true,"peak_gib":20.0,"trained":false,"failed":"the loss of step 3 is NaN"}
{"bench":"train","framework":"torch-eager","case":"resnet50_bf16","step_ms":50.0,"trained":true}
{"bench":"train","framework":"torch-compile","case":"resnet50_bf16","step_ms":36.0,"trained":true}
{"bench":"train","framework":"torch-compile","case":"resnet50_bf16","step_ms":34.0,"trained":true}
{"bench":"train","framework":"torch-compile_graph","case":"resnet50_bf16","step_ms":33.0,"trained":true}
{"bench":"train","framework":"torch-compile_graph","case":"resnet50_bf16","step_ms":37.0,"trained":true}
{"bench":"train","framework":"torch-compile_graph","case":"resnet50_bf16","step_ms":35.0,"trained":true}
{"bench":"train","framework":"torch-eager_graph","case":"resnet50_bf16","step_ms":20.0,"trained":false,"failed":"2 timed step(s) skipped by the GradScaler (inf/NaN gradients)"}
{"bench":"train","framework":"torch-eager_graph","case":"resnet50_bf16","error":"OutOfMemoryError: CUDA out of memory"}
{"bench":"train","framework":"kiln","case":"bert_large_128","model":"bert-large","batch":64,"input":"128 tokens","precision":"bf16","step_ms":40.0,"eager_step_ms":42.0,"cuda_graph":true,"peak_gib":30.0}
{"bench":"train","framework":"torch-compile_graph","case":"bert_large_128","model":"bert-large","batch":64,"input":"128 tokens","precision":"bf16","step_ms":45.0,"trained":true}
{"bench":"train","framework":"kiln","case":"bert_large_128_p20","model":"bert-large","batch":64,"input":"128 tokens, 20 predicted","precision":"bf16","step_ms":36.0,"eager_step_ms":38.0,"cuda_graph":true,"peak_gib":28.0}
{"bench":"train","framework":"kiln","case":"bert_base_128","model":"bert-base","batch":128,"input":"128 tokens","precision":"bf16","step_ms":30.0,"eager_step_ms":31.0,"eager_peak_gib":10.0,"cuda_graph":true,"peak_gib":10.0}
{"bench":"train","framework":"kiln","case":"bert_base_128_fp8","model":"bert-base","batch":128,"input":"128 tokens","precision":"fp8","step_ms":24.0,"eager_step_ms":25.0,"cuda_graph":true,"peak_gib":10.0,"trained":true}
{"bench":"train","framework":"torch-compile_graph","case":"bert_base_128_fp8","model":"bert-base","batch":128,"input":"128 tokens","precision":"fp8","step_ms":28.0,"trained":true}
{"bench":"train","framework":"kiln","case":"resnet18_cifar_bf16","model":"resnet18","batch":512,"step_ms":6.0,"eager_step_ms":7.5,"cuda_graph":true,"peak_gib":2.0,"trained":true}
{"bench":"train","framework":"torch-compile","case":"resnet18_cifar_bf16","step_ms":9.0,"trained":true}
{"bench":"train","framework":"kiln","case":"bert_base_128_ckpt","model":"bert-base","batch":128,"input":"128 tokens","step_ms":40.0,"cuda_graph":false,"peak_gib":5.0}
{"bench":"train","framework":"torch-compile","case":"bert_base_128_ckpt","skipped":"eager only"}
{"bench":"train","framework":"kiln","case":"bert_base_dynamic","model":"bert-base-classifier","batch":32,"step_ms":10.0,"cuda_graph":false,"first_epoch_s":4.0,"trained":true}
{"bench":"train","framework":"torch-eager","case":"bert_base_dynamic","step_ms":13.0,"first_epoch_s":2.0,"trained":true}
{"bench":"train","framework":"torch-compile","case":"bert_base_dynamic","step_ms":9.0,"first_epoch_s":60.0,"trained":true}
not json {"bench":"train"
"""


def selftest():
    res = Results()
    res.add(SELFTEST_LINES.splitlines())
    rows = {r["case"]: r for r in build_rows(res)}
    close = lambda a, b: a is not None and abs(a - b) < 1e-9  # noqa: E731
    assert res.peak_tflops == 800.0
    # resnet50_bf16: kiln graph median of 30 and 32 (the failed 10 left out) = 31, eager 32. Fastest torch mode by
    # median: compile (35) vs compile_graph (35)... compile's median is 35.0 too; ties keep the first in mode order.
    r = rows["resnet50_bf16"]
    assert r["fastest"] == "torch-compile", r
    assert close(r["graph_ratio"], 35.0 / 31.0) and close(r["eager_ratio"], 35.0 / 32.0), r
    assert r["met"] is False and r["cells"][-1] == "no (1.13×, 1.09×)", r["cells"]
    assert r["cells"][1] == "31.00 [30.00..32.00] ×2 ⚠" and r["cells"][2] == "32.00 [31.00..33.00] ×2 ⚠", r["cells"]
    assert r["mfu"] is None and r["cells"][8] == DASH, r
    # bert_large_128: 12 * 24 * 64 * 128^2 * 1024 attention + 6 * 8192 * linear FLOPs, over 40 ms at 800 TFLOP/s.
    flops = 6 * 64 * 128 * (24 * (4 * 1024**2 + 2 * 1024 * 4096) + 1024**2 + 1024 * 30522) \
        + 12 * 24 * 64 * 128**2 * 1024
    r = rows["bert_large_128"]
    assert close(r["mfu"], flops / 0.040 / 800e12), (r["mfu"], flops)
    assert close(r["graph_ratio"], 45.0 / 40.0) and r["eager_ratio"] is None, r
    assert r["met"] is False and r["cells"][-1] == "no (1.12×, MFU 52.3%)", r["cells"]
    # bert_large_128_p20: the head's transform and decoder on 20 rows of each sequence, not 128.
    flops_p20 = 6 * 64 * (128 * 24 * (4 * 1024**2 + 2 * 1024 * 4096) + 20 * (1024**2 + 1024 * 30522)) \
        + 12 * 24 * 64 * 128**2 * 1024
    r = rows["bert_large_128_p20"]
    assert close(r["mfu"], flops_p20 / 0.036 / 800e12) and flops_p20 < flops, (r["mfu"], flops_p20)
    want = f"no (torch compile + graph not run, MFU {100 * flops_p20 / 0.036 / 800e12:.1f}%)"
    assert r["met"] is False and r["cells"][-1] == want, r["cells"]
    # bert_base_128_ckpt: peak 5 / 10 = 50%, speed 31 / 40 = 77.5%: met.
    r = rows["bert_base_128_ckpt"]
    assert r["met"] is True and r["cells"][-1] == "yes (memory 50%, throughput 78%)", r["cells"]
    # bert_base_128_fp8: 30 / 24 = 1.25 >= 1.2 of kiln's own bf16 bert_base_128; torchao's line beside it.
    r = rows["bert_base_128_fp8"]
    assert r["met"] is True and r["cells"][-1] == "yes (1.25× kiln bf16)", r["cells"]
    assert close(r["graph_ratio"], 28.0 / 24.0), r
    # bert_base_128: no PyTorch line: not measured.
    r = rows["bert_base_128"]
    assert r["met"] is None and r["cells"][-1] == "not measured (torch compile + graph not run)", r["cells"]
    # resnet18_cifar_bf16: torch.compile without graphs only. kiln's graph step is 1.5× that and its eager step 1.2×,
    # but goal 1 asks for PyTorch's strongest mode, which did not run: not measured, not met.
    r = rows["resnet18_cifar_bf16"]
    assert r["fastest"] == "torch-compile" and close(r["graph_ratio"], 1.5) and close(r["eager_ratio"], 1.2), r
    assert r["met"] is None and r["cells"][-1] == "not measured (torch compile + graph not run, 1.20×)", r["cells"]
    text = table(res)
    assert "- resnet50_bf16, kiln: failed: the loss of step 3 is NaN" in text, text
    assert "- resnet50_bf16, torch-eager_graph: error: OutOfMemoryError: CUDA out of memory" in text, text
    assert "- resnet50_bf16, torch-compile_graph: 35.00 [33.00..37.00] ×3 ⚠ ms" in text, text
    # bert_base_dynamic: kiln eager 10 ms against eager 13 (1.3 >= 1.2) and compile 9 (0.9 < 1.0): not met.
    r = rows["bert_base_dynamic"]
    assert r["met"] is False and r["cells"][-1] == "no (1.30× eager, 0.90× compile)", r["cells"]
    assert "- bert_base_dynamic, torch-compile: first epoch (new shapes) 60.00 s [60.00..60.00] ×1" in text, text
    assert "- bert_base_dynamic, kiln: first epoch (new shapes) 4.00 s [4.00..4.00] ×1" in text, text
    assert list(rows) == ["resnet50_bf16", "resnet18_cifar_bf16", "bert_base_128", "bert_large_128",
                          "bert_large_128_p20", "bert_base_128_ckpt", "bert_base_128_fp8", "bert_base_dynamic"], list(rows)
    # The training rules: the same made-up logs and outcomes as bench_train --selftest (bench/train_log.h).
    timed = [(4, 8)]
    ok, why, f = judge_training([5, 4, 3, 3, 2, 2, 1, 0.5], [], 0, timed, 2)
    assert ok and f["loss_first"] == 4.5 and f["loss_last"] == 0.75, f
    ok, why, _ = judge_training([2] * 6, [], 0, timed, 2)
    assert not ok and "did not fall" in why, why
    assert judge_training([5, 4, math.nan, 3, 2, 1], [], 0, timed, 2)[1] == "the loss of step 2 is NaN"
    assert judge_training([5, 4, 3, math.inf, 2, 1], [], 0, timed, 2)[1] == "the loss of step 3 is Infinity"
    ok, why, f = judge_training([5, 4, 3, 3, 2, 2, 1, 0.5], [8, 4, 4, 4, 4, 2, 2, 2], 8, timed, 2)
    assert not ok and f["skipped_steps"] == 1 and f["skipped_total"] == 2 and why.startswith("1 timed step"), f
    ok, why, f = judge_training([5, 4, 3, 3, 2, 2, 1, 0.5], [4, 4, 8, 8, 8, 8, 16, 16], 8, timed, 2)
    assert ok and f["skipped_steps"] == 0 and f["skipped_total"] == 1, f
    ok, why, f = judge_training([3, 3, 3], [], 0, timed, 2)
    assert ok and f["fall_checked"] is False and math.isnan(f["loss_first"]), f
    assert judge_training([], [], 0, timed, 2)[1] == "no step was logged"
    print(text)
    print("train_table: selftest passed")
    return 0


def main(argv):
    if argv == ["--selftest"]:
        return selftest()
    res = Results()
    read_logs(argv, lambda lines, r: r.add(lines), res)
    if not res.lines:
        print("train_table: no train JSON lines found")
        return 0
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
