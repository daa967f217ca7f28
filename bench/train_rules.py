"""Whether a benchmarked training run trained: bench/train_log.h's rules for the Python side (pytorch_train.py
judges its runs with them; train_table.py --selftest checks them on the made-up logs bench_train --selftest uses).

- every logged loss is finite;
- no step inside a timed block was skipped by the GradScaler (an inf/NaN gradient: the scale went down);
- the loss fell: the mean over the last `cycle` logged steps (one pass over the distinct batches) is below the mean
  over the first `cycle`; a run shorter than two cycles is not judged on this point and says so.
"""
import math


def spelled(value):
    """A loss as bench/json_text.h writes one in a message: NaN, Infinity, -Infinity, else 4 decimals."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.4f}"


def judge_training(losses, scales, init_scale, timed, cycle):
    """bench/train_log.h's rules on one run's log: (ok, why, fields for the JSON line). losses[i] is step i's loss,
    scales[i] the GradScaler's scale after it (empty without one), timed the [begin, end) ranges of timed steps."""
    why = None
    n = len(losses)
    if n == 0:
        why = "no step was logged"
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if why is None and bad is not None:
        why = f"the loss of step {bad} is {spelled(losses[bad])}"
    skipped_total = skipped_timed = 0
    for i, scale in enumerate(scales):
        if scale < (init_scale if i == 0 else scales[i - 1]):  # an overflow halves the scale: a skipped step
            skipped_total += 1
            skipped_timed += any(b <= i < e for b, e in timed)
    if why is None and skipped_timed:
        why = f"{skipped_timed} timed step(s) skipped by the GradScaler (inf/NaN gradients)"
    first = last = float("nan")
    if cycle >= 1 and n >= 2 * cycle:
        first, last = sum(losses[:cycle]) / cycle, sum(losses[-cycle:]) / cycle
        if why is None and not last < first:
            why = (f"the loss did not fall: mean {last:.4f} over the last {cycle} steps, {first:.4f} over the "
                   f"first {cycle}")
    fields = {"batches": cycle, "trained": why is None}
    if why is not None:
        fields["failed"] = why
    fields.update({"loss_first": round(first, 4), "loss_last": round(last, 4)})
    if n < 2 * cycle:
        fields["fall_checked"] = False
    fields.update({"skipped_steps": skipped_timed, "skipped_total": skipped_total,
                   "losses": [round(v, 4) for v in losses]})
    return why is None, why, fields
