#!/usr/bin/env python3
"""tests/io/onnx_check.py — ONNX's checker and ONNX Runtime on the models kiln exports (io::export_onnx).

    onnx_check.py [--rtol R] [--atol-scale S] DIR...
    onnx_check.py [--rtol R] [--atol-scale S] --all PARENT     every subfolder of PARENT that holds a model.onnx

Each DIR is laid out as ONNX's own test data is: model.onnx (its external data, if any, beside it) and
test_data_set_<k>/input_<i>.pb, output_<j>.pb, each a serialized TensorProto (kiln's inputs and kiln's outputs).
For each DIR: onnx.checker.check_model(full_check=True) on the file (so external data is checked too); then an ONNX
Runtime CPU session runs every data set, input_<i> fed to the i-th graph input, and every output is compared with
output_<j>:
  - floating-point outputs: |ort - ref| <= rtol * |ref| + atol, with atol = atol_scale * max|ref| (scale-aware: an
    output of large values is not held to 1e-4 in absolute terms, one of small values is not let off); NaN where the
    other has none, or an infinity that differs, fails;
  - integer and bool outputs must match exactly;
  - shapes and dtypes must match.
One line per model and data set: its output shapes, the largest absolute error and the largest error relative to
max|ref|.

Exit status: 0 all passed; 1 a model failed (the message names the model, data set, output, the worst element's
index and both values); 2 a usage error: bad arguments, a DIR without model.onnx or without data sets, --all over a
folder with no model (never a silent pass).

onnx, onnxruntime and numpy come from third_party/python (scripts/setup.sh installs them; CTest sets PYTHONPATH).
"""
import argparse
import glob
import os
import re
import sys


def usage_error(msg):
    print("onnx_check.py: error: " + msg, file=sys.stderr)
    sys.exit(2)


def import_packages():
    try:
        import numpy
        import onnx
        import onnx.numpy_helper
        import onnxruntime
    except ImportError as e:
        print("onnx_check.py: cannot import onnx, onnxruntime or numpy (%s); PYTHONPATH=%s. Run scripts/setup.sh, "
              "which installs them into third_party/python" % (e, os.environ.get("PYTHONPATH", "")), file=sys.stderr)
        sys.exit(2)
    return numpy, onnx, onnxruntime


def numbered(folder, prefix):
    """The files folder/<prefix>_<n>.pb, in the order of n; None when the numbers are not 0, 1, 2, ..."""
    found = {}
    for path in glob.glob(os.path.join(folder, prefix + "_*.pb")):
        m = re.fullmatch(re.escape(prefix) + r"_(\d+)\.pb", os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    if sorted(found) != list(range(len(found))):
        return None
    return [found[i] for i in range(len(found))]


def data_sets(model_dir):
    sets = [d for d in glob.glob(os.path.join(model_dir, "test_data_set_*")) if os.path.isdir(d)]

    def key(d):
        m = re.search(r"_(\d+)$", d)
        return (int(m.group(1)) if m else 1 << 30, d)

    return sorted(sets, key=key)


class Failure(Exception):
    pass


def is_float(np, dtype):
    # bfloat16 and the float8 types come as ml_dtypes' types, which numpy does not class as inexact.
    return np.issubdtype(dtype, np.inexact) or dtype.name.startswith(("bfloat16", "float8", "float4"))


def compare(np, got, ref, rtol, atol_scale, where):
    """Returns (max abs error, max error relative to max|ref|); raises Failure with the worst element."""
    if got.shape != ref.shape:
        raise Failure("%s: shape %s, expected %s" % (where, got.shape, ref.shape))
    if got.dtype != ref.dtype:
        raise Failure("%s: dtype %s, expected %s" % (where, got.dtype, ref.dtype))
    if got.size == 0:
        return 0.0, 0.0
    if not is_float(np, ref.dtype):
        wrong = np.flatnonzero(got.reshape(-1) != ref.reshape(-1))
        if wrong.size:
            i = int(wrong[0])
            index = np.unravel_index(i, ref.shape)
            raise Failure("%s: %d of %d elements differ (must match exactly); first at index %s: got %s, expected %s"
                          % (where, wrong.size, ref.size, tuple(int(k) for k in index), got.reshape(-1)[i],
                             ref.reshape(-1)[i]))
        return 0.0, 0.0
    g = got.astype(np.complex128 if np.iscomplexobj(ref) else np.float64).reshape(-1)
    r = ref.astype(g.dtype).reshape(-1)
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
    atol = atol_scale * scale
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
    both_nan = np.isnan(g) & np.isnan(r)
    same_inf = ~finite & ~np.isnan(r) & (g == r)
    err[both_nan | same_inf] = 0.0
    err[np.isnan(err)] = np.inf  # NaN on one side only, or an infinity against a finite value
    tol = rtol * np.where(finite, np.abs(r), 0.0) + atol
    excess = err - tol
    worst = int(np.argmax(excess))
    max_abs = float(np.max(err))
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if excess[worst] > 0:
        bad = int(np.count_nonzero(excess > 0))
        index = tuple(int(k) for k in np.unravel_index(worst, ref.shape))
        raise Failure("%s: %d of %d elements off (tolerance rtol %g * |ref| + atol %g, atol = %g * max|ref| %g); worst "
                      "at index %s: got %r, expected %r (error %g, allowed %g); max abs error %g, max rel error %g"
                      % (where, bad, r.size, rtol, atol, atol_scale, scale, index, g[worst].item(), r[worst].item(),
                         err[worst], tol[worst], max_abs, max_rel))
    return max_abs, max_rel


def check_model(np, onnx, ort, model_dir, rtol, atol_scale):
    """Checks one DIR; prints a line per data set; returns the list of failure messages."""
    name = os.path.basename(os.path.normpath(model_dir))
    path = os.path.join(model_dir, "model.onnx")
    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # ValidationError, InferenceError, a file that does not parse
        print("%s: FAILED (onnx.checker)" % name)
        return ["%s: onnx.checker.check_model failed: %s" % (name, str(e).strip())]
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:
        print("%s: FAILED (ONNX Runtime cannot load it)" % name)
        return ["%s: ONNX Runtime cannot load the model: %s" % (name, str(e).strip())]
    graph_inputs = session.get_inputs()
    graph_outputs = session.get_outputs()
    failures = []
    for data_dir in data_sets(model_dir):
        data_set = os.path.basename(data_dir)
        where = "%s %s" % (name, data_set)
        try:
            inputs = numbered(data_dir, "input")
            outputs = numbered(data_dir, "output")
            if inputs is None or outputs is None:
                raise Failure("%s: input_<i>.pb / output_<j>.pb are not numbered 0, 1, 2, ..." % where)
            if len(inputs) != len(graph_inputs):
                raise Failure("%s: %d input files, the model has %d inputs (%s)"
                              % (where, len(inputs), len(graph_inputs), ", ".join(i.name for i in graph_inputs)))
            if len(outputs) != len(graph_outputs):
                raise Failure("%s: %d output files, the model has %d outputs (%s)"
                              % (where, len(outputs), len(graph_outputs), ", ".join(o.name for o in graph_outputs)))
            feed = {}
            for graph_input, file in zip(graph_inputs, inputs):
                tensor = onnx.TensorProto()
                with open(file, "rb") as f:
                    tensor.ParseFromString(f.read())
                feed[graph_input.name] = onnx.numpy_helper.to_array(tensor, base_dir=data_dir)
            try:
                results = session.run(None, feed)
            except Exception as e:
                raise Failure("%s: ONNX Runtime failed to run it: %s" % (where, str(e).strip()))
            shapes, max_abs, max_rel = [], 0.0, 0.0
            for j, (graph_output, file, got) in enumerate(zip(graph_outputs, outputs, results)):
                tensor = onnx.TensorProto()
                with open(file, "rb") as f:
                    tensor.ParseFromString(f.read())
                ref = onnx.numpy_helper.to_array(tensor, base_dir=data_dir)
                got = np.asarray(got)
                a, r = compare(np, got, ref, rtol, atol_scale,
                               "%s output %d (%s)" % (where, j, graph_output.name))
                shapes.append(tuple(got.shape))
                max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            print("%s %s: outputs %s, max abs error %.3g, max rel error %.3g"
                  % (name, data_set, " ".join(str(s) for s in shapes), max_abs, max_rel))
        except Failure as e:
            print("%s %s: FAILED" % (name, data_set))
            failures.append(str(e))
    return failures


def main():
    parser = argparse.ArgumentParser(description="ONNX's checker and ONNX Runtime on exported models "
                                     "(DIR/model.onnx, DIR/test_data_set_<k>/input_<i>.pb, output_<j>.pb).")
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="a folder holding model.onnx and test_data_set_*/")
    parser.add_argument("--all", action="append", default=[], metavar="PARENT",
                        help="every subfolder of PARENT that holds a model.onnx (there must be one at least)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    parser.add_argument("--atol-scale", type=float, default=1e-4,
                        help="absolute tolerance as a fraction of the output's max|ref| (default 1e-4)")
    args = parser.parse_args()

    dirs = list(args.dirs)
    for parent in args.all:
        if not os.path.isdir(parent):
            usage_error("--all %s: no such folder" % parent)
        found = sorted(d for d in glob.glob(os.path.join(parent, "*")) if os.path.isfile(os.path.join(d, "model.onnx")))
        if not found:
            usage_error("--all %s: no subfolder holds a model.onnx (did the exporter write nothing?)" % parent)
        dirs += found
    if not dirs:
        usage_error("no model folder given (DIR... or --all PARENT)")
    problems = []
    for d in dirs:
        if not os.path.isfile(os.path.join(d, "model.onnx")):
            problems.append("%s has no model.onnx" % d)
        elif not data_sets(d):
            problems.append("%s has no test_data_set_<k>/ folder: nothing to compare" % d)
    if problems:
        usage_error("; ".join(problems))

    np, onnx, ort = import_packages()
    print("onnx %s, onnxruntime %s, numpy %s; rtol %g, atol %g * max|ref|"
          % (onnx.__version__, ort.__version__, np.__version__, args.rtol, args.atol_scale))
    failures = []
    for d in dirs:
        failures += check_model(np, onnx, ort, d, args.rtol, args.atol_scale)
    if failures:
        print("onnx_check.py: %d failure(s):" % len(failures), file=sys.stderr)
        for f in failures:
            print("  FAILED: " + f, file=sys.stderr)
        sys.exit(1)
    print("onnx_check.py: %d model(s) passed" % len(dirs))


if __name__ == "__main__":
    main()
