// kiln/io/onnx_export.h — exporting a trained model to ONNX, for ONNX Runtime, TensorRT and other runtimes.
//
//   auto model = nn::models::resnet18({.num_classes = 10});
//   ...                                                          // train
//   io::export_onnx(*model, randn({1, 3, 32, 32}), "resnet18.onnx",
//                   {.input_names = {"images"}, .output_names = {"logits"},
//                    .dynamic_axes = {{"images", {{0, "batch"}}}}});
//
//   // A forward of several inputs, or with a result that is not one tensor: say how to call it.
//   io::export_onnx(*bert, [&](const std::vector<Tensor>& in) {
//         return std::vector<Tensor>{bert->forward(in[0], in[1], in[2]).logits};
//       }, {input_ids, token_type_ids, attention_mask}, "bert.onnx",
//       {.input_names = {"input_ids", "token_type_ids", "attention_mask"}, .output_names = {"logits"},
//        .dynamic_axes = {{"input_ids", {{0, "batch"}, {1, "sequence"}}},
//                         {"token_type_ids", {{0, "batch"}, {1, "sequence"}}},
//                         {"attention_mask", {{0, "batch"}, {1, "sequence"}}}}});
//
// How it works: the module's forward runs once in eval mode, without gradients or autocast, on the example inputs,
// and every kiln op it calls is recorded with its arguments (kiln/tensor/capture.h); each op is then written as
// standard ONNX operators at opset 17. Parameters and buffers become initializers under their state_dict names;
// tensors the forward makes without reading the inputs become constants. With dynamic axes the forward runs a
// second time at other sizes of those axes, and every size that follows them (reshape targets, ranges, masks) is
// computed in the graph from the inputs' shapes. Control flow that depends on values is fixed as traced.
//
// Errors (kiln::Error, the file untouched): an op kiln cannot express in ONNX names the op and the module it ran in;
// so does an op with no ONNX translation that reads a value computed from the inputs. Dtypes ONNX cannot hold
// (float8) are refused. A path that cannot be written leaves no partial file. A module in training mode is
// exported as in eval mode (dropout off, batch norm on its running statistics), with a warning on stderr.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/layers/module.h"
#include "kiln/tensor/tensor.h"

namespace kiln::io {

// How export_onnx names, sizes and stores what it writes.
struct OnnxExportOptions {
  // The graph's input names, in order; unnamed ones are "input_<i>".
  std::vector<std::string> input_names{};
  // The graph's output names, in order; unnamed ones are "output_<i>".
  std::vector<std::string> output_names{};
  // The dims of each input (by name) whose size varies at run time, with a label each: {0, "batch"}. Inputs that
  // share a label must share its size. Outputs' dims that follow a label get it too.
  std::map<std::string, std::map<int64_t, std::string>> dynamic_axes{};
  // Fold each batch norm that directly follows a convolution into the convolution's weights and bias (eval
  // semantics; what TensorRT and ONNX Runtime would otherwise do when they load the model).
  bool fold_batch_norm = false;
  // Past this many bytes of initializers, the large ones go to "<file name>.data" beside the model (ONNX's
  // external data), as protobuf cannot hold a file of 2 GB or more.
  int64_t external_data_threshold = int64_t{1} << 30;
  // The graph's name inside the file; empty: the module's type name.
  std::string graph_name{};
};

// What an export wrote.
struct OnnxExportReport {
  int64_t nodes = 0;                  // ONNX nodes in the graph
  int64_t initializers = 0;           // parameters, buffers and constants
  int64_t bytes = 0;                  // the model file and its external data
  bool external_data = false;         // whether "<file name>.data" was written
  std::vector<std::string> op_types;  // the ONNX operators used, sorted, once each
  std::vector<std::string> warnings;  // also printed to stderr
};

// Calls the model: inputs in, outputs out (each a Tensor computed by kiln ops).
using OnnxForward = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Exports `module` called through `forward` on `example_inputs` (see the top of this file) to `path`.
OnnxExportReport export_onnx(nn::Module& module, const OnnxForward& forward, const std::vector<Tensor>& example_inputs,
                             const std::string& path, const OnnxExportOptions& options = {});
// A module of one input and one output: forward(example_input).
OnnxExportReport export_onnx(nn::Module& module, const Tensor& example_input, const std::string& path,
                             const OnnxExportOptions& options = {});

// Writes one tensor as an ONNX TensorProto file, the layout of ONNX's test data (test_data_set_0/input_0.pb), which
// onnx.numpy_helper and ONNX Runtime's test runner read.
void write_onnx_tensor(const Tensor& t, const std::string& path);

}  // namespace kiln::io
