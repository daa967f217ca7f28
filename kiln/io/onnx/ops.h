// kiln/io/onnx/ops.h — how each recorded kiln op becomes ONNX nodes (internal to kiln_io; the table is ops.cpp).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io/onnx/graph.h"
#include "kiln/tensor/capture.h"

namespace kiln::io::onnx {

// A batch norm folded into the convolution before it (OnnxExportOptions::fold_batch_norm): the convolution
// writes the folded weight and bias, and the batch norm keeps only what follows it (add, ReLU).
struct Folding {
  std::map<size_t, size_t> conv_to_norm;  // record index of the convolution -> of its batch norm
  std::map<size_t, size_t> norm_to_conv;
};

// What a translation sees of one recorded op.
struct OpContext {
  Builder& b;
  const capture::OpRecord& first;   // the op in the first trace
  const capture::OpRecord& second;  // the same op in the second trace (the first again without dynamic axes)
  std::vector<std::string> in;      // the inputs' value names; "" where an input is undefined
  std::vector<std::string>& warnings;
  const std::string& where;                        // "in module <path>", for messages
  const capture::OpRecord* folded_norm = nullptr;  // conv2d: the batch norm folded into it
  bool folded_into_conv = false;                   // batch norms: folded into the convolution before

  int64_t i(const std::string& name) const;  // an integer attribute (kiln::Error when absent)
  double f(const std::string& name) const;   // a number attribute (integers converted)
  bool has(const std::string& name) const;
  std::vector<int64_t> ints(const std::string& name) const;
  // An attribute in both traces, as shape_list takes them.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> ints2(const std::string& name) const;
  std::pair<int64_t, int64_t> i2(const std::string& name) const;
  // The output's shape in both traces.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> out_shape(size_t k = 0) const;
};

// Names the outputs of the op (one per record output, in order).
using Translate = std::vector<std::string> (*)(OpContext& ctx);

// The translation of kiln op `op`, or null when there is none.
Translate find_translation(const std::string& op);

}  // namespace kiln::io::onnx
