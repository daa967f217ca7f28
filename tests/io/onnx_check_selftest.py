#!/usr/bin/env python3
"""tests/io/onnx_check_selftest.py — onnx_check.py fails where it must (CTest: io.onnx_check_selftest).

Builds small models with onnx.helper in a temporary folder (y = x + 1 and its kin), writes their test data as
io::export_onnx does, and runs onnx_check.py on each case: correct data passes (also with errors inside the tolerance,
with external data, and through --all); a wrong output, a wrong integer, a NaN, a model the checker rejects, a wrong
shape, a wrong dtype, a missing input file each fail with exit 1 and say what is wrong; a folder without model.onnx,
one without data sets, and --all over an empty folder are usage errors (exit 2).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_check.py")


def add_one_model(dtype=TensorProto.FLOAT, shape=(2, 3), op="Add"):
    """y = x + 1 (op "Add"); another op_type makes a node the checker does not know."""
    one = numpy_helper.from_array(np.ones((), helper.tensor_dtype_to_np_dtype(dtype)), "one")  # raw_data: can be external
    node = helper.make_node(op, ["x", "one"], ["y"])
    graph = helper.make_graph([node], "add_one", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, list(shape))], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnx_check_selftest")
    model.ir_version = 9
    return model


def write_case(folder, model, inputs, outputs, external_data=False):
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    if external_data:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                        size_threshold=0)
    else:
        onnx.save_model(model, path)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data)
    for prefix, arrays in (("input", inputs), ("output", outputs)):
        for i, a in enumerate(arrays):
            with open(os.path.join(data, "%s_%d.pb" % (prefix, i)), "wb") as f:
                f.write(numpy_helper.from_array(a).SerializeToString())
    return folder


failures = []


def expect(what, args, code, says=()):
    r = subprocess.run([sys.executable, CHECK] + args, capture_output=True, text=True)
    text = r.stdout + r.stderr
    missing = [s for s in says if s not in text]
    if r.returncode != code or missing:
        failures.append("%s: exit %d (expected %d)%s\n%s" % (what, r.returncode, code,
                                                              "; output lacks %r" % missing if missing else "", text))
        print("FAILED: " + what)
    else:
        print("ok: %s (exit %d)" % (what, code))


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        good = write_case(os.path.join(tmp, "models", "add_one"), add_one_model(), [x], [x + 1])
        expect("correct outputs pass", [good], 0, ["add_one test_data_set_0: outputs (2, 3)", "1 model(s) passed"])

        near = (x + 1) * (1 + 2e-5)
        near_dir = write_case(os.path.join(tmp, "models", "near"), add_one_model(), [x], [near.astype(np.float32)])
        expect("errors inside the tolerance pass", [near_dir], 0)
        expect("--all runs every model of a folder", ["--all", os.path.join(tmp, "models")], 0, ["2 model(s) passed"])

        ext = write_case(os.path.join(tmp, "external"), add_one_model(), [x], [x + 1], external_data=True)
        if not os.path.isfile(os.path.join(ext, "weights.bin")):
            failures.append("the external-data case wrote no weights.bin")
        expect("a model with external data passes", [ext], 0)

        wrong = (x + 1).copy()
        wrong[1, 2] += 0.01
        expect("a wrong output fails", [write_case(os.path.join(tmp, "wrong"), add_one_model(), [x], [wrong])], 1,
               ["wrong test_data_set_0 output 0 (y)", "index (1, 2)", "1 of 6 elements off"])
        expect("a looser --atol-scale lets it pass",
               ["--atol-scale", "1e-2", os.path.join(tmp, "wrong")], 0)

        xi = np.arange(6, dtype=np.int64).reshape(2, 3)
        wrong_int = xi + 1
        wrong_int[0, 1] += 1
        expect("an integer output off by one fails",
               [write_case(os.path.join(tmp, "int"), add_one_model(TensorProto.INT64), [xi], [wrong_int])], 1,
               ["must match exactly", "index (0, 1)"])

        nan_ref = (x + 1).copy()
        nan_ref[0, 0] = np.nan
        expect("a NaN in one output only fails",
               [write_case(os.path.join(tmp, "nan"), add_one_model(), [x], [nan_ref])], 1, ["index (0, 0)"])

        expect("a model with an unknown op fails the checker",
               [write_case(os.path.join(tmp, "unknown_op"), add_one_model(op="NoSuchOp"), [x], [x + 1])], 1,
               ["unknown_op: onnx.checker.check_model failed", "NoSuchOp"])

        expect("an output of the wrong shape fails",
               [write_case(os.path.join(tmp, "shape"), add_one_model(shape=(2, 3)), [x],
                           [np.zeros((2, 4), np.float32)])], 1, ["shape (2, 3), expected (2, 4)"])

        expect("an output of the wrong dtype fails",
               [write_case(os.path.join(tmp, "dtype"), add_one_model(), [x], [(x + 1).astype(np.float64)])], 1,
               ["dtype float32, expected float64"])

        expect("a data set without its input fails",
               [write_case(os.path.join(tmp, "no_input"), add_one_model(), [], [x + 1])], 1,
               ["0 input files, the model has 1 inputs"])

        expect("one failing model among passing ones fails the run", [good, os.path.join(tmp, "wrong")], 1)

        os.makedirs(os.path.join(tmp, "empty"))
        expect("a folder without model.onnx is a usage error", [os.path.join(tmp, "empty")], 2, ["has no model.onnx"])
        expect("--all over a folder without models is a usage error", ["--all", os.path.join(tmp, "empty")], 2,
               ["no subfolder holds a model.onnx"])
        no_data = os.path.join(tmp, "no_data")
        os.makedirs(no_data)
        onnx.save_model(add_one_model(), os.path.join(no_data, "model.onnx"))
        expect("a model without data sets is a usage error", [no_data], 2, ["no test_data_set_<k>/"])
        expect("no arguments is a usage error", [], 2)

    if failures:
        print("\nonnx_check_selftest.py: %d case(s) failed:" % len(failures), file=sys.stderr)
        for f in failures:
            print("---- " + f, file=sys.stderr)
        sys.exit(1)
    print("onnx_check_selftest.py: every case behaved")


if __name__ == "__main__":
    main()
