"""The scaling table of bench_ddp (kiln) and bench/pytorch_ddp.py (PyTorch DDP), from their JSON lines.

    python3 bench/ddp_scaling.py kiln_1.log kiln_2.log torch_1.log torch_2.log
    cat *.log | python3 bench/ddp_scaling.py

Reads every line that is a JSON object with "bench": "ddp" (other lines are skipped; a line without "framework" is
kiln's). Scaling efficiency = throughput on N GPUs / (N x throughput on 1 GPU), for the largest N present; the goal
column is the issue's target (ResNet-50 99%, BERT-base 95%).
"""
import sys

from json_lines import bench_lines, read_logs

GOALS = {"resnet50": 99.0, "bert-base": 95.0}
FRAMEWORKS = ("kiln", "pytorch")


def read(lines, results):
    for r in bench_lines(lines, "ddp"):
        results[(r.get("framework", "kiln"), r["model"], int(r["world"]))] = r


def scaling(results, framework, model, n):
    one, many = results.get((framework, model, 1)), results.get((framework, model, n))
    if not one or not many or n == 1:
        return None
    return 100.0 * many["throughput"] / (n * one["throughput"])


def main():
    results = {}
    read_logs(sys.argv[1:], read, results)
    if not results:
        print("ddp_scaling: no ddp JSON lines found")
        return 1
    n = max(world for (_, _, world) in results)
    present = {m for (_, m, _) in results}
    models = [m for m in GOALS if m in present] + sorted(present - set(GOALS))

    def cell(framework, model, world):
        r = results.get((framework, model, world))
        return f"{r['throughput']:.1f}" if r else "-"

    def pct(framework, model):
        s = scaling(results, framework, model, n)
        return f"{s:.1f}%" if s is not None else "-"

    header = ["model", "unit", "kiln 1 GPU", f"kiln {n} GPUs", "kiln scaling", "pytorch 1 GPU", f"pytorch {n} GPUs",
              "pytorch scaling", "goal"]
    rows = []
    for m in models:
        unit = next((r.get("unit", "") for (f, mm, _), r in results.items() if mm == m), "")
        rows.append([m, unit, cell("kiln", m, 1), cell("kiln", m, n), pct("kiln", m), cell("pytorch", m, 1),
                     cell("pytorch", m, n), pct("pytorch", m), f"{GOALS[m]:.0f}%" if m in GOALS else "-"])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    print("ddp scaling (throughput over all GPUs; scaling = N-GPU throughput / (N x 1-GPU throughput))")
    for row in [header] + rows:
        print("  ".join(str(v).rjust(w) if i > 1 else str(v).ljust(w) for i, (v, w) in enumerate(zip(row, widths))))
    # Step times too: the table's throughputs come from them.
    for (f, m, w), r in sorted(results.items()):
        flag = "" if r.get("params_equal", True) else "  PARAMETERS DIFFER BETWEEN RANKS"
        print(f"  {f:<7} {m:<9} world {w}: {r['step_ms']:.2f} ms/step, batch {r['batch_per_gpu']}/GPU{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
