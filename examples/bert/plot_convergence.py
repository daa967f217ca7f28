#!/usr/bin/env python3
"""Judges the FP8 convergence check (issue 35) from two runs' metrics.csv, and plots the two loss curves.

    python3 examples/bert/plot_convergence.py runs/conv/bf16/metrics.csv runs/conv/fp8/metrics.csv \\
        --out examples/bert/fp8_convergence.png --vocab-size 4096

The criterion: at every logged step after the first --skip (200), the FP8 run's masked-LM loss is within --tolerance
(2%) of the bf16 run's, relative to bf16's: |fp8 - bf16| / bf16 <= tolerance. The two files must log the same steps
(the same --log-every and --max-steps; fp8_convergence.sh runs them so). The script prints the largest relative gap
after --skip and its step, and the steps outside the tolerance, if any.

The PNG (matplotlib, Agg backend): above, the loss of both runs against the step, the band of +-tolerance around bf16
shaded, --skip marked, and ln(--vocab-size), the loss of a uniform guess, dashed; below, the relative gap in percent.

Exit status: 0 the criterion holds and the plot is written; 1 some logged step after --skip is outside the tolerance
(the plot is written all the same, where matplotlib is there); 2 the files cannot be compared (missing, another
header, other steps, nothing after --skip); 3 the criterion holds but matplotlib is missing, so there is no plot
(pip install matplotlib).
"""

import argparse
import csv
import math
import sys

EXIT_OUTSIDE, EXIT_BAD_INPUT, EXIT_NO_PLOT = 1, 2, 3


class InputError(Exception):
    pass


def read_losses(path):
    """[(step, loss)] of a metrics.csv (bert's header: epoch,step,loss,lr,samples_per_s,data_wait,elapsed_s)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path} is not a CSV file: {e}")
    if "step" not in header or "loss" not in header:
        raise InputError(f"{path} has no 'step' and 'loss' columns (is it a metrics.csv of bert?); its first line "
                         f"reads {','.join(header)[:200]!r}")
    if not rows:
        raise InputError(f"{path} has no rows (give a metrics.csv of a run that logged some steps)")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            out.append((int(row["step"]), float(row["loss"])))
        except (TypeError, ValueError):
            raise InputError(f"{path}:{line}: step '{row['step']}' or loss '{row['loss']}' is not a number")
    return out


def judge(bf16, fp8, skip, tolerance):
    """(rows, worst, outside): rows [(step, bf16, fp8, gap)] after skip; worst the row of the largest gap; outside
    the rows beyond the tolerance (a non-finite loss or gap counts as outside)."""
    bf16_steps = [s for s, _ in bf16]
    fp8_steps = [s for s, _ in fp8]
    if bf16_steps != fp8_steps:
        for i, (a, b) in enumerate(zip(bf16_steps, fp8_steps)):
            if a != b:
                raise InputError(f"the runs log other steps: row {i + 1} is step {a} in the bf16 file, {b} in the fp8 "
                                 "one (run both with the same --log-every and --max-steps)")
        raise InputError(f"the runs log other steps: the bf16 file has {len(bf16_steps)} rows, the fp8 one "
                         f"{len(fp8_steps)} (did one stop early?)")
    rows = []
    for (step, a), (_, b) in zip(bf16, fp8):
        if step <= skip:
            continue
        gap = abs(b - a) / a if math.isfinite(a) and math.isfinite(b) and a > 0 else math.inf
        rows.append((step, a, b, gap))
    if not rows:
        raise InputError(f"no logged step after --skip {skip} (the last is {bf16_steps[-1]}); give a smaller --skip")
    worst = max(rows, key=lambda r: r[3])
    outside = [r for r in rows if not r[3] <= tolerance]
    return rows, worst, outside


def plot(bf16, fp8, skip, tolerance, vocab_size, path, title):
    """Writes the PNG; False where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s, _ in bf16]
    a = [v for _, v in bf16]
    b = [v for _, v in fp8]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    top.fill_between(steps, [v * (1 - tolerance) for v in a], [v * (1 + tolerance) for v in a], color="tab:blue",
                     alpha=0.15, linewidth=0, label=f"bf16 \u00b1{100 * tolerance:g}%")
    top.plot(steps, a, color="tab:blue", linewidth=1.4, label="--amp bf16")
    top.plot(steps, b, color="tab:orange", linewidth=1.1, label="--amp fp8")
    if vocab_size:
        top.axhline(math.log(vocab_size), color="gray", linestyle="--", linewidth=1,
                    label=f"ln {vocab_size} (uniform guess)")
    if skip > 0:
        top.axvline(skip, color="gray", linestyle=":", linewidth=1, label=f"judged after step {skip}")
    top.set_ylabel("masked-LM loss")
    top.set_title(title)
    top.grid(alpha=0.3)
    top.legend()

    gaps = [100 * (y - x) / x if x > 0 else math.nan for x, y in zip(a, b)]
    bottom.plot(steps, gaps, color="tab:orange", linewidth=1)
    for y in (-100 * tolerance, 0, 100 * tolerance):
        bottom.axhline(y, color="gray", linestyle="--" if y else "-", linewidth=0.8)
    bottom.set_ylabel("(fp8 - bf16) / bf16, %")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    # The first steps' gaps (the loss barely below uniform, everything noisy) would set the scale: the axis shows
    # the judged steps, with room for the band.
    judged = [abs(g) for s, g in zip(steps, gaps) if s > skip and math.isfinite(g)]
    limit = max([100 * tolerance * 1.5] + [g * 1.1 for g in judged])
    bottom.set_ylim(-limit, limit)
    if skip > 0:
        bottom.axvline(skip, color="gray", linestyle=":", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv):
    parser = argparse.ArgumentParser(
        description="Judges whether the FP8 run's loss stays within a tolerance of the bf16 run's at every logged "
        "step after --skip, and plots both curves.")
    parser.add_argument("bf16_csv", help="metrics.csv of the --amp bf16 run")
    parser.add_argument("fp8_csv", help="metrics.csv of the --amp fp8 run")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--skip", type=int, default=200, help="steps not judged at the start (default 200)")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="largest allowed |fp8 - bf16| / bf16 (default 0.02)")
    parser.add_argument("--vocab-size", type=int, default=0, help="draw ln(vocab size), a uniform guess's loss")
    parser.add_argument("--title", default="BERT masked-LM pretraining: bf16 and FP8", help="the plot's title")
    args = parser.parse_args(argv)
    if args.skip < 0 or not args.tolerance > 0 or args.vocab_size < 0:
        parser.error("--skip and --vocab-size take values >= 0, --tolerance a positive number")

    try:
        bf16 = read_losses(args.bf16_csv)
        fp8 = read_losses(args.fp8_csv)
        rows, worst, outside = judge(bf16, fp8, args.skip, args.tolerance)
    except InputError as e:
        print(f"plot_convergence.py: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    step, a, b, gap = worst
    print(f"{len(rows)} logged steps after step {args.skip} (of {len(bf16)}); the largest relative gap "
          f"|fp8 - bf16| / bf16 is {100 * gap:.3f}% at step {step} (bf16 {a:.4f}, fp8 {b:.4f}); "
          f"the losses at the last step {bf16[-1][0]}: bf16 {bf16[-1][1]:.4f}, fp8 {fp8[-1][1]:.4f}")
    if outside:
        shown = ", ".join(f"{s} ({100 * g:.2f}%)" for s, _, _, g in outside[:20])
        more = f" and {len(outside) - 20} more" if len(outside) > 20 else ""
        print(f"FAILED: {len(outside)} logged step(s) outside the {100 * args.tolerance:g}% tolerance: {shown}{more}")
    else:
        print(f"ok: every logged step after step {args.skip} is within {100 * args.tolerance:g}% of bf16's loss")

    if plot(bf16, fp8, args.skip, args.tolerance, args.vocab_size, args.out, args.title):
        print(f"the plot: {args.out}")
    else:
        print("no plot: it needs matplotlib (pip install matplotlib)", file=sys.stderr)
        if not outside:
            return EXIT_NO_PLOT
    return EXIT_OUTSIDE if outside else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
