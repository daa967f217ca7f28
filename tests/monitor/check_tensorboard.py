#!/usr/bin/env python3
"""tests/monitor/check_tensorboard.py CHILD WORKDIR — TensorBoard's own reader on kiln's event files.

Runs tb_writer_child (CHILD) twice in WORKDIR: a run of steps 0..9, then a run resumed at step 5 that logs
5..12 with other values. TensorBoard's EventAccumulator (which applies the SessionLog START purge, as
TensorBoard does when it shows the folder) must then see steps 0..12 once each: 0..4 from the first run,
5..12 from the resumed one. metrics.csv, read with Python's csv module, must hold the same rows.

TensorBoard comes from third_party/python (scripts/setup.sh installs it there; CTest sets PYTHONPATH).
"""
import csv
import math
import os
import shutil
import subprocess
import sys


def fail(msg):
    print("FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        fail("usage: check_tensorboard.py CHILD WORKDIR")
    child, work = sys.argv[1], sys.argv[2]
    try:
        from tensorboard.backend.event_processing import event_accumulator
        import tensorboard
    except ImportError as e:
        fail("cannot import tensorboard (%s); PYTHONPATH=%s. Run scripts/setup.sh, which installs it into "
             "third_party/python" % (e, os.environ.get("PYTHONPATH", "")))
    print("tensorboard", tensorboard.__version__, "from", os.path.dirname(tensorboard.__file__))

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for mode in ("first", "resume"):
        r = subprocess.run([child, work, mode], capture_output=True, text=True)
        print(r.stdout, end="")
        if r.returncode != 0:
            fail("%s %s %s exited with %d: %s" % (child, work, mode, r.returncode, r.stderr))

    want = {s: (0.5 * s, s / 100) for s in range(5)}
    want.update({s: (100.0 + s, 1 - s / 100) for s in range(5, 13)})

    acc = event_accumulator.EventAccumulator(os.path.join(work, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    if tags != ["acc", "loss"]:
        fail("scalar tags %s, expected ['acc', 'loss']" % tags)
    for index, tag in enumerate(("loss", "acc")):
        points = acc.Scalars(tag)
        steps = [p.step for p in points]
        if steps != list(range(13)):
            fail("TensorBoard sees %s at steps %s, expected 0..12 once each" % (tag, steps))
        for p in points:
            expected = want[p.step][index]
            if not math.isclose(p.value, expected, rel_tol=1e-6, abs_tol=1e-7):  # stored as float32
                fail("%s at step %d is %r, expected %r" % (tag, p.step, p.value, expected))
            if not 1.5e9 < p.wall_time < 1e11:
                fail("%s at step %d has wall time %r" % (tag, p.step, p.wall_time))
    print("EventAccumulator: loss and acc at steps 0..12 once each, 0..4 from the first run, 5..12 resumed")

    with open(os.path.join(work, "metrics.csv"), newline="") as f:
        rows = list(csv.reader(f))
    if rows[0] != ["step", "loss", "acc"]:
        fail("metrics.csv header %s" % rows[0])
    got = [(int(r[0]), float(r[1]), float(r[2])) for r in rows[1:]]
    expected = [(s, want[s][0], want[s][1]) for s in range(13)]
    if got != expected:  # exact: the CSV holds the shortest decimal that reads back to the same double
        fail("metrics.csv rows %s, expected %s" % (got, expected))
    print("metrics.csv: the same 13 rows, exactly")
    print("check_tensorboard.py: passed")


if __name__ == "__main__":
    main()
