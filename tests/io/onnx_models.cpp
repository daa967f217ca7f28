// onnx_models OUT: exports the models CI checks in ONNX Runtime (io.onnx_runtime, tests/io/onnx_check.py), one
// folder each in OUT: model.onnx, and test_data_set_<k>/input_<i>.pb, output_<j>.pb holding kiln's eval outputs for
// the inputs — at the traced batch size (set 0) and at other sizes along the dynamic axes (sets 1, 2).
//
// The models: ResNet-18 (plain, and with batch norm folded into the convolutions), a small BERT for masked-LM and
// for sequence classification (padding masks, dynamic batch and sequence), a model written here from kiln's layers
// that reaches the rest of the translations (causal attention, pooling, reductions, factories, comparisons, GELU's
// tanh form, ...), and an MLP whose weights go to an external data file. With --gpu, ResNet-50 and BERT-base
// exported from GPU-resident models instead (see gpu_models).
#include <cmath>
#include <filesystem>
#include <iostream>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"  // cuda::is_available

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using Forward = io::OnnxForward;

// Writes the data sets: each entry of `inputs` is one set; outputs from `forward` in eval mode, without gradients.
void write_sets(const fs::path& dir, nn::Module& model, const Forward& forward,
                const std::vector<std::vector<Tensor>>& sets) {
  model.eval();
  NoGradGuard no_grad;
  for (size_t k = 0; k < sets.size(); ++k) {
    const fs::path set = dir / ("test_data_set_" + std::to_string(k));
    fs::create_directories(set);
    for (size_t i = 0; i < sets[k].size(); ++i) {
      io::write_onnx_tensor(sets[k][i], (set / ("input_" + std::to_string(i) + ".pb")).string());
    }
    const std::vector<Tensor> outputs = forward(sets[k]);
    for (size_t j = 0; j < outputs.size(); ++j) {
      io::write_onnx_tensor(outputs[j], (set / ("output_" + std::to_string(j) + ".pb")).string());
    }
  }
}

void export_model(const fs::path& out, const std::string& name, nn::Module& model, const Forward& forward,
                  const std::vector<std::vector<Tensor>>& sets, const io::OnnxExportOptions& options) {
  const fs::path dir = out / name;
  fs::create_directories(dir);
  const io::OnnxExportReport report = io::export_onnx(model, forward, sets[0], (dir / "model.onnx").string(), options);
  std::cout << name << ": " << report.nodes << " nodes, " << report.initializers << " initializers, " << report.bytes
            << " bytes" << (report.external_data ? " (external data)" : "") << "; ops:";
  for (const auto& op : report.op_types) std::cout << " " << op;
  std::cout << "\n";
  write_sets(dir, model, forward, sets);
}

// Writes a data set of `outputs` for `inputs` into dir/test_data_set_<k> (outputs computed by the caller).
void write_set(const fs::path& dir, int k, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  const fs::path set = dir / ("test_data_set_" + std::to_string(k));
  fs::create_directories(set);
  for (size_t i = 0; i < inputs.size(); ++i) {
    io::write_onnx_tensor(inputs[i], (set / ("input_" + std::to_string(i) + ".pb")).string());
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    io::write_onnx_tensor(outputs[j], (set / ("output_" + std::to_string(j) + ".pb")).string());
  }
}

// A few steps of training, so that batch norm's running statistics and the weights are not at their initial values.
void train_a_little(nn::Module& model, const std::function<Tensor()>& loss_of_step) {
  model.train();
  optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    loss_of_step().backward();
    opt.step();
  }
  model.eval();
}

void resnets(const fs::path& out) {
  manual_seed(1);
  auto model = nn::models::resnet18({.num_classes = 10});
  train_a_little(*model, [&] {
    return nn::cross_entropy(model(randn({4, 3, 64, 64})), from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}));
  });
  const Forward forward = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{model(in[0])}; };
  const std::vector<std::vector<Tensor>> sets{
      {randn({2, 3, 64, 64})}, {randn({3, 3, 64, 64})}, {randn({1, 3, 64, 64})}};
  io::OnnxExportOptions options{
      .input_names = {"images"}, .output_names = {"logits"}, .dynamic_axes = {{"images", {{0, "batch"}}}}};
  export_model(out, "resnet18", *model, forward, sets, options);
  options.fold_batch_norm = true;
  export_model(out, "resnet18_folded_bn", *model, forward, sets, options);
}

// ids (N, S) in [1, vocab) with the last `pad[n]` positions of row n padding (id 0, mask 0), and token types 0 then 1.
std::vector<Tensor> bert_inputs(int64_t n, int64_t s, int64_t vocab, const std::vector<int64_t>& pad) {
  std::vector<int64_t> ids, types, mask;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < s; ++j) {
      const bool padding = j >= s - pad[static_cast<size_t>(i) % pad.size()];
      ids.push_back(padding ? 0 : 1 + (i * 31 + j * 7) % (vocab - 1));
      types.push_back(j < s / 2 ? 0 : 1);
      mask.push_back(padding ? 0 : 1);
    }
  }
  return {from_vector(ids, {n, s}), from_vector(types, {n, s}), from_vector(mask, {n, s})};
}

void berts(const fs::path& out) {
  const nn::models::BertConfig config{.vocab_size = 97,
                                      .hidden_size = 32,
                                      .num_hidden_layers = 2,
                                      .num_attention_heads = 4,
                                      .intermediate_size = 64,
                                      .max_position_embeddings = 64};
  const std::vector<std::vector<Tensor>> sets{bert_inputs(2, 16, config.vocab_size, {0, 5}),
                                              bert_inputs(3, 11, config.vocab_size, {2, 0, 10}),
                                              bert_inputs(1, 24, config.vocab_size, {0})};
  const io::OnnxExportOptions options{.input_names = {"input_ids", "token_type_ids", "attention_mask"},
                                      .output_names = {"logits"},
                                      .dynamic_axes = {{"input_ids", {{0, "batch"}, {1, "sequence"}}},
                                                       {"token_type_ids", {{0, "batch"}, {1, "sequence"}}},
                                                       {"attention_mask", {{0, "batch"}, {1, "sequence"}}}}};
  manual_seed(2);
  auto mlm = std::make_shared<nn::models::BertForMaskedLM>(config);
  train_a_little(*mlm, [&] {
    const auto in = bert_inputs(2, 16, config.vocab_size, {0, 3});
    return mlm->forward(in[0], in[1], in[2], in[0]).loss;
  });
  export_model(
      out, "bert_mlm", *mlm,
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{mlm->forward(in[0], in[1], in[2]).logits}; },
      sets, options);
  auto tanh_config = config;
  tanh_config.hidden_act = nn::models::BertActivation::GeluTanh;
  auto cls = std::make_shared<nn::models::BertForSequenceClassification>(tanh_config, 3);
  train_a_little(*cls, [&] {
    const auto in = bert_inputs(2, 16, config.vocab_size, {0, 3});
    return cls->forward(in[0], in[1], in[2], from_vector(std::vector<int64_t>{0, 2}, {2})).loss;
  });
  export_model(
      out, "bert_classifier", *cls,
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{cls->forward(in[0], in[1], in[2]).logits}; },
      sets, options);
}

// A model of kiln's layers and ops that the two above do not reach.
class Zoo : public nn::Module {
 public:
  Zoo() : Module("Zoo") {
    conv = register_module("conv", nn::Conv2d(3, 8, 3, {.stride = 2, .padding = 1}));
    bn = register_module("bn", nn::BatchNorm2d(8));
    proj = register_module("proj", nn::Linear(8, 16));
    norm = register_module("norm", nn::LayerNorm(Shape{16}));
    head = register_module("head", nn::Linear(16, 5, {.bias = false}));
  }
  std::vector<Tensor> run(const Tensor& x) {  // x (N, 3, H, W)
    Tensor y = nn::batch_norm_relu(conv(x), bn->running_mean, bn->running_var, bn->weight, bn->bias);
    y = nn::max_pool2d(y, {.kernel_size = 3, .stride = 2, .padding = 1});
    y = nn::avg_pool2d(y, {.kernel_size = 2, .ceil_mode = true, .count_include_pad = false});
    const Tensor pooled = flatten(nn::adaptive_avg_pool2d(y, {1, 1}), 1);  // (N, 8)
    const Tensor tokens = permute(flatten(y, 2), {0, 2, 1});               // (N, T, 8)
    Tensor h = norm(gelu(proj(tokens), /*tanh_approximation=*/true));      // (N, T, 16)
    const int64_t n = h.size(0), t = h.size(1);
    const Tensor heads = transpose(reshape(h, {n, t, 2, 8}), 1, 2);                           // (N, 2, T, 8)
    Tensor att = nn::scaled_dot_product_attention(heads, heads, heads, {.is_causal = true});  // (N, 2, T, 8)
    att = reshape(transpose(att, 1, 2), {n, t, 16});
    const Tensor positions = cast(arange(t), DType::Float32);  // (T)
    Tensor mixed = att + unsqueeze(positions, 1) * 0.01 - sigmoid(att) / 2;
    mixed = where(gt(mixed, 0.5), mixed, zeros_like(mixed)) + clamp(silu(mixed), -1.0, 1.0);
    const Tensor summary = cat({mean(mixed, {1}), amax(mixed, {1}) - amin(mixed, {1})}, 1);  // (N, 32)
    const Tensor logits = head(narrow(summary, 1, 0, 16) + sqrt(abs(narrow(summary, 1, 16, 16)) + 1e-3));
    const Tensor probs = softmax(logits, -1);
    const Tensor scores = sum(log_softmax(logits, 1), {1}) + matmul(pooled, ones({8}));  // (N)
    return {probs, scores, exp(select(logits, 1, 0)) - tanh(logits).sum({1})};
  }
  nn::Handle<nn::Conv2d> conv;
  nn::Handle<nn::BatchNorm2d> bn;
  nn::Handle<nn::Linear> proj, head;
  nn::Handle<nn::LayerNorm> norm;
};

void zoo(const fs::path& out) {
  manual_seed(3);
  auto model = std::make_shared<Zoo>();
  train_a_little(*model, [&] { return sum(model->run(randn({2, 3, 16, 16}))[1]); });
  export_model(out, "zoo", *model, [&](const std::vector<Tensor>& in) { return model->run(in[0]); },
               {{randn({2, 3, 16, 16})}, {randn({5, 3, 16, 16})}}, {.dynamic_axes = {{"input_0", {{0, "n"}}}}});
}

// Weights past the threshold go to model.onnx.data.
void external(const fs::path& out) {
  manual_seed(4);
  auto model = nn::make<nn::Sequential>(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 4));
  export_model(out, "mlp_external_data", *model,
               [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{model(in[0])}; }, {{randn({3, 64})}},
               {.external_data_threshold = 4096});
}

// --gpu: ResNet-50 (224 x 224) and BERT-base (sequence 128) exported from models on the GPU, with two folders each:
// <model>_tf32 holds kiln's float32 GPU eval outputs (TF32 products, kiln's default), <model>_bf16 its outputs under
// bf16 autocast; the model file is the same (float32). ONNX Runtime's CPU run is then compared with each at its
// precision's tolerance (tests/io/onnx_gpu_check.sh).
void gpu_models(const fs::path& out) {
  const Device gpu = Device::cuda(0);
  auto export_pair = [&](const std::string& name, nn::Module& model, const Forward& forward,
                         const std::vector<std::vector<Tensor>>& sets, const io::OnnxExportOptions& options) {
    const fs::path tf32 = out / (name + "_tf32"), bf16 = out / (name + "_bf16");
    fs::create_directories(tf32);
    fs::create_directories(bf16);
    model.eval();
    const auto report = io::export_onnx(model, forward, sets[0], (tf32 / "model.onnx").string(), options);
    std::cout << name << " (from " << gpu << "): " << report.nodes << " nodes, " << report.bytes << " bytes\n";
    fs::create_symlink(fs::absolute(tf32 / "model.onnx"), bf16 / "model.onnx");
    NoGradGuard no_grad;
    for (size_t k = 0; k < sets.size(); ++k) {
      write_set(tf32, static_cast<int>(k), sets[k], forward(sets[k]));
      std::vector<Tensor> low;
      {
        amp::Autocast cast(DType::BFloat16);
        low = forward(sets[k]);
      }
      for (auto& t : low) t = t.to(DType::Float32);
      write_set(bf16, static_cast<int>(k), sets[k], low);
    }
  };
  manual_seed(5);
  auto resnet = nn::models::resnet50();
  resnet->to(gpu);
  export_pair("resnet50", *resnet, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{resnet(in[0])}; },
              {{randn({2, 3, 224, 224}).to(gpu)}, {randn({3, 3, 224, 224}).to(gpu)}},
              {.input_names = {"images"}, .output_names = {"logits"}, .dynamic_axes = {{"images", {{0, "batch"}}}}});
  auto bert = std::make_shared<nn::models::BertForSequenceClassification>(nn::models::BertConfig::base(), 2);
  bert->to(gpu);
  auto on_gpu = [&](std::vector<Tensor> v) {
    for (auto& t : v) t = t.to(gpu);
    return v;
  };
  export_pair(
      "bert_base", *bert,
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{bert->forward(in[0], in[1], in[2]).logits}; },
      {on_gpu(bert_inputs(2, 128, 30522, {0, 40})), on_gpu(bert_inputs(3, 100, 30522, {7, 0, 60}))},
      {.input_names = {"input_ids", "token_type_ids", "attention_mask"},
       .output_names = {"logits"},
       .dynamic_axes = {{"input_ids", {{0, "batch"}, {1, "sequence"}}},
                        {"token_type_ids", {{0, "batch"}, {1, "sequence"}}},
                        {"attention_mask", {{0, "batch"}, {1, "sequence"}}}}});
}

}  // namespace

int main(int argc, char** argv) {
  const bool gpu = argc == 3 && std::string(argv[1]) == "--gpu";
  if (argc != 2 && !gpu) {
    std::cerr << "usage: onnx_models [--gpu] OUT_FOLDER\n";
    return 2;
  }
  const fs::path out(argv[argc - 1]);
  try {
    if (gpu) {
      KILN_CHECK(cuda::is_available(), "onnx_models --gpu: no GPU is visible");
      gpu_models(out);
      return 0;
    }
    resnets(out);
    berts(out);
    zoo(out);
    external(out);
  } catch (const std::exception& e) {
    std::cerr << "onnx_models: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
