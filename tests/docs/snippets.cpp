// The C++ snippets of the user-facing documentation, copied as they are written there (each one names its
// source), compiled as a user compiles them: -Wall -Wextra -Werror, without the suppressions kiln's own code
// builds with (tests/CMakeLists.txt). A snippet that stops compiling, or starts to warn (an options struct with a
// field lacking a default member initializer gives -Wmissing-field-initializers for every designated initializer
// that leaves it out), fails the build. The snippets that are cheap on the CPU also run; the others (a GPU, an
// image folder, several processes) are compiled only, inside functions the tests never call. The whole programs
// README.md points to (tests/install/consumer/main.cpp and mlp.cpp) are compiled as they are, with the same flags,
// by the target test_docs_programs; the whole programs written in the documents are extracted from them and built
// by CMake (tests/docs/check_snippets.py), and CTest checks that every other C++ block of them is copied here
// (docs.fragments).
#include <gtest/gtest.h>
#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>  // cuda::Graph

#include <algorithm>  // std::count
#include <cmath>      // std::isfinite
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

// The snippets keep the layout of the documents they come from.
// clang-format off
namespace snippets {
using namespace kiln;

// A folder of its own under the test's temporary directory, for snippets that write files ("run/...").
struct InTempFolder {
  std::filesystem::path old = std::filesystem::current_path();
  std::filesystem::path dir;
  explicit InTempFolder(const std::string& name) : dir(std::filesystem::path(::testing::TempDir()) / name) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::filesystem::current_path(dir);
  }
  ~InTempFolder() {
    std::filesystem::current_path(old);
    std::filesystem::remove_all(dir);
  }
};

// The whole programs of the documents (README.md's training program, "Using kiln from another CMake project", the
// PyTorch guide's training loop) are not copied here: CMake extracts them as they are written
// (tests/docs/check_snippets.py), and test_docs_programs compiles them, CTest runs them (docs.program.*).

// ---- README.md, "Replaying a training step as a CUDA graph" (needs a GPU: compiled only)
[[maybe_unused]] void readme_cuda_graph(nn::ModulePtr model, optim::Optimizer& opt,
                                        data::DataLoader& loader, uint64_t e) {
  Tensor x = empty({256, 3, 224, 224}, {.device = Device::cuda(0)}), y = empty({256}, {.dtype = DType::Int64, .device = Device::cuda(0)});  // the step's inputs
  Tensor loss;
  cuda::Graph graph;
  graph.capture([&] {                      // 3 eager warm-up steps (they train), then the recorded one
    opt.zero_grad();
    { amp::Autocast cast(DType::BFloat16); loss = nn::cross_entropy(model(x), y); }
    loss.backward();
    opt.step();
  });
  for (data::Batch& b : loader.epoch(e)) {
    x.copy_(b[0]);  y.copy_(b[1]);
    graph.replay();                        // loss holds this step's value; scheduler.step() works between replays
  }
}

// ---- README.md, "Training on several GPUs" (several processes: compiled only)
[[maybe_unused]] void readme_several_gpus(nn::ModulePtr model) {
  auto env = dist::init();                 // rank, world size; makes cuda:<local rank> current
  model->to(env.device());
  dist::DataParallel ddp(model);           // rank 0's weights everywhere; gradients averaged during backward
  // the DataLoader shards by rank by itself (DistributedSampler); train with ddp(x) instead of model(x)
}

// ---- README.md, "Building and calling a model" (run, BERT-base on a batch of 8 tokens)
struct ReadmeModels { Tensor logits, scores, loss; };
ReadmeModels readme_building_a_model(const Tensor& images, const Tensor& cifar_images, const Tensor& input_ids,
                                     const Tensor& token_type_ids, const Tensor& attention_mask, const Tensor& labels) {
  nn::Sequential net{nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(), nn::Linear(16 * 28 * 28, 10)};
  Tensor logits = net(images);                                  // (N, 1, 28, 28) -> (N, 10)

  auto resnet = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});   // an nn::Handle<ResNet>
  Tensor scores = resnet(cifar_images);                         // (N, 3, 32, 32) -> (N, 10)
  auto bert = nn::make<models::BertForMaskedLM>(models::BertConfig::base());
  Tensor loss = bert(input_ids, token_type_ids, attention_mask, labels).loss;   // its forward of four tensors
  return {logits, scores, loss};
}

TEST(DocSnippets, ReadmeBuildingAModel) {
  const Tensor ids = full({1, 8}, 7, {.dtype = DType::Int64}), types = zeros({1, 8}, {.dtype = DType::Int64});
  const Tensor mask = ones({1, 8}, {.dtype = DType::Int64});
  Tensor labels = full({1, 8}, -100, {.dtype = DType::Int64});
  labels.narrow(1, 3, 1).fill_(7);  // one masked position
  const ReadmeModels got =
      readme_building_a_model(randn({2, 1, 28, 28}), randn({1, 3, 32, 32}), ids, types, mask, labels);
  EXPECT_EQ(got.logits.shape(), (Shape{2, 10}));
  EXPECT_EQ(got.scores.shape(), (Shape{1, 10}));
  EXPECT_EQ(got.loss.numel(), 1);
  EXPECT_TRUE(std::isfinite(got.loss.item<double>()));
}

// ---- README.md, "Deploy: ONNX Runtime and TensorRT", "Your own model" (run with a small BERT in a temporary
// folder; the ONNX Runtime fragments beside it are ONNX Runtime's API and Python, not compiled here)
io::OnnxExportReport readme_deploy(const models::BertConfig& config, const Tensor& input_ids,
                                   const Tensor& token_type_ids, const Tensor& attention_mask) {
  nn::Sequential net{nn::Linear(16, 64), nn::GELU(), nn::Linear(64, 4)};   // your trained model
  net.eval();
  io::OnnxExportReport report = io::export_onnx(net, randn({1, 16}), "net.onnx",
                                                {.input_names = {"features"}, .output_names = {"logits"},
                                                 .dynamic_axes = {{"features", {{0, "batch"}}}}});
  std::cout << report.nodes << " nodes, " << report.bytes << " bytes\n";   // and report.op_types, report.warnings

  auto clf = nn::make<models::BertForSequenceClassification>(config, /*num_labels=*/2);   // (N, S) int64 inputs
  clf->eval();
  const std::map<int64_t, std::string> varying = {{0, "batch"}, {1, "sequence"}};
  io::export_onnx(*clf, [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{clf(in[0], in[1], in[2]).logits};
      }, {input_ids, token_type_ids, attention_mask}, "bert.onnx",
      {.input_names = {"input_ids", "token_type_ids", "attention_mask"}, .output_names = {"logits"},
       .dynamic_axes = {{"input_ids", varying}, {"token_type_ids", varying}, {"attention_mask", varying}}});
  return report;
}

TEST(DocSnippets, ReadmeDeploy) {
  InTempFolder here("kiln_doc_snippets_deploy");
  const models::BertConfig tiny{.vocab_size = 50, .hidden_size = 16, .num_hidden_layers = 2,
                                .num_attention_heads = 2, .intermediate_size = 32, .max_position_embeddings = 16};
  const Tensor ids = full({1, 8}, 7, {.dtype = DType::Int64}), types = zeros({1, 8}, {.dtype = DType::Int64});
  const Tensor mask = ones({1, 8}, {.dtype = DType::Int64});
  io::OnnxExportReport report;
  try {
    report = readme_deploy(tiny, ids, types, mask);
  } catch (const Error& e) {
    if (std::string(e.what()).find("built without ONNX support") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_GT(report.nodes, 0);
  EXPECT_GT(std::filesystem::file_size("net.onnx"), 0u);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size("net.onnx")), report.bytes);
  EXPECT_GT(std::filesystem::file_size("bert.onnx"), 0u);
}

// ---- kiln/layers/README.md, "Building and calling modules" (Block::forward defined here to run it)
namespace layers_readme {
struct Mlp : nn::Module {
  nn::Handle<nn::Linear> fc1, fc2;               // a std::shared_ptr<nn::Linear> that can be called
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", nn::Linear(784, 256));
    fc2 = register_module("fc2", nn::Linear(256, 10));
  }
  Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
};

class Block : public nn::Module {                // any inputs, any result
  using nn::Module::forward;                     // private: it has no one-tensor forward
 public:
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& mask);
};
std::pair<Tensor, Tensor> Block::forward(const Tensor& x, const Tensor& mask) { return {x * mask, sum(mask)}; }
}  // namespace layers_readme

TEST(DocSnippets, LayersReadmeBuildingAndCallingModules) {
  using layers_readme::Mlp, layers_readme::Block;
  Tensor x = randn({2, 1, 28, 28});
  nn::Sequential seq{nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(), nn::Linear(16 * 28 * 28, 10)};
  Tensor logits = seq(x);                          // (N, 1, 28, 28) -> (N, 10); "0.weight", "3.bias", ... as PyTorch
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  EXPECT_EQ(seq.named_parameters().at(3).first, "3.bias");

  x = randn({3, 784});
  auto model = nn::make<Mlp>();                    // nn::Handle<Mlp>, as nn::models::resnet50() returns
  Tensor y = model(x);                             // (*model)(x) and model->forward(x) still work
  EXPECT_EQ(y.shape(), (Shape{3, 10}));

  Tensor mask = ones({3, 784});
  auto block = nn::make<Block>();
  auto [h, weights] = block(x, mask);              // Block::forward(x, mask)
  EXPECT_EQ(h.shape(), x.shape());
  EXPECT_EQ(weights.item<float>(), 3.f * 784.f);
}

// ---- kiln/layers/module.h and kiln/layers/containers.h, the usage examples at their tops
namespace module_header {
struct Mlp : nn::Module {
  nn::Handle<nn::Linear> fc1, fc2;
  Mlp() : Module("Mlp") {                      // the type name: profiler ranges, summaries, errors
    fc1 = register_module("fc1", nn::Linear(784, 256));   // a module value, or a std::shared_ptr to one
    fc2 = register_module("fc2", nn::Linear(256, 10));
  }
  Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
};
class Block : public nn::Module {             // a forward of several inputs, returning anything
  using nn::Module::forward;                  // private: no one-tensor forward (and no -Woverloaded-virtual)
 public:
  Block() : Module("Block") {}
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& mask);
};
std::pair<Tensor, Tensor> Block::forward(const Tensor& x, const Tensor& mask) { return {x + mask, x - mask}; }
}  // namespace module_header

TEST(DocSnippets, ModuleAndContainersHeaders) {
  using module_header::Mlp, module_header::Block;
  Tensor x = randn({2, 784}), mask = ones({2, 784});
  auto model = nn::make<Mlp>();                 // nn::Handle<Mlp>; std::make_shared<Mlp>() works too
  Tensor logits = model(x);                     // Mlp::forward inside a profiler range "Mlp"
  std::vector<std::string> names;
  for (auto& [name, p] : model->named_parameters()) names.push_back(name);   // "fc1.weight", "fc1.bias", "fc2.weight", ...
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  auto block = nn::make<Block>();
  auto [y, weights] = block(x, mask);           // Block::forward(x, mask), chosen on the static type
  EXPECT_EQ(y.shape(), weights.shape());

  nn::Sequential mlp{nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10)};   // module values, moved in
  logits = mlp(x);                           // (N, 784) -> (N, 10); parameters "0.weight", "0.bias", "2.weight", ...
  EXPECT_EQ(logits.shape(), (Shape{2, 10}));

  auto net = nn::make<nn::Sequential>(nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(),
                                      nn::Linear(16 * 28 * 28, 10));   // held by a handle: net(x)
  EXPECT_EQ(net(randn({1, 1, 28, 28})).shape(), (Shape{1, 10}));
  auto shared_linear = nn::make<nn::Linear>(10, 10);
  nn::Sequential both{shared_linear /* a std::shared_ptr or nn::Handle, shared */, nn::ReLU()};
  EXPECT_EQ(both[0].get(), shared_linear.get());

  struct Block2 : nn::Module {
    Block2() : Module("Block") {}
    Tensor forward(const Tensor& h) override { return h * 2.0; }
  };
  Tensor h = ones({1, 10});
  nn::ModuleList blocks;                     // children "0", "1", ...; iterate and call them yourself
  blocks.push_back(Block2());                // a value (moved in), or a handle
  for (const auto& b : blocks) h = b(h);     // each element is an nn::ModulePtr (a Handle<Module>)
  EXPECT_EQ(h.sum().item<float>(), 20.f);

  nn::ModuleDict heads;                      // children under their keys, in insertion order
  heads.insert("cls", nn::Linear(10, 2));
  Tensor out = heads["cls"](h);
  EXPECT_EQ(out.shape(), (Shape{1, 2}));
}

// ---- kiln/layers/attention.h (MultiheadAttention through its handle)
TEST(DocSnippets, AttentionHeader) {
  Tensor x = randn({2, 5, 256});
  Tensor padding = zeros({2, 5}, {.dtype = DType::Bool});
  auto mha = nn::make<nn::MultiheadAttention>(256, 8);   // batch_first: (N, L, E)
  auto [out, weights] = mha(x, x, x, padding /* Bool (N, S), true = padding */, Tensor(), true);
  Tensor y = mha(x);                                      // self-attention without masks: (N, L, E)
  EXPECT_EQ(out.shape(), (Shape{2, 5, 256}));
  EXPECT_EQ(weights.shape(), (Shape{2, 5, 5}));
  EXPECT_EQ(y.shape(), (Shape{2, 5, 256}));
}

// ---- kiln/io/README.md, "Checkpoints" (run with a small model in a temporary folder)
TEST(DocSnippets, IoReadmeCheckpoints) {
  InTempFolder here("kiln_doc_snippets_io");
  std::filesystem::create_directories("run");
  auto model = std::make_shared<nn::Linear>(4, 2);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  auto sched = std::make_shared<optim::StepLR>(opt, /*step_size=*/10);
  amp::GradScaler scaler({.enabled = false});
  data::LoaderPosition pos{.epoch = 1, .batch = 7};
  io::Metadata meta{.numbers = {{"step", 3}}};

  io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .scheduler = sched.get(), .scaler = &scaler,
                            .generators = true, .loader = &pos, .metadata = &meta};
  io::save_checkpoint("run/ckpt.h5", parts);   // atomic
  io::load_checkpoint("run/ckpt.h5", parts);   // checks everything, then changes the objects
  io::CheckpointManager ckpt("run/", {.keep_last = 3, .prefix = "ckpt"});
  int64_t step = ckpt.resume(parts).value_or(0);   /* ... */   ckpt.save(step, parts);

  EXPECT_EQ(step, 0);  // run/ckpt.h5 is not one of the manager's <prefix>-<step>.h5 files
  EXPECT_EQ(pos, (data::LoaderPosition{1, 7}));
  EXPECT_EQ(meta.numbers.at("step"), 3);
}

// ---- kiln/monitor/README.md (run: a CSV file in a temporary folder; GPU statistics or why there are none)
TEST(DocSnippets, MonitorReadme) {
  InTempFolder here("kiln_doc_snippets_monitor");
  const bool resumed = false;
  const int64_t steps_done = 0, step = 1;
  const double loss = 0.5, lr = 0.1;
  struct {
    bool is_main() const { return true; }
  } env;
  {
    monitor::MetricsLogger log({.csv = "run/metrics.csv", .tensorboard_dir = "run/tb",
                                .resume_step = resumed ? steps_done + 1 : -1, .enabled = env.is_main()});
    log.log(step, {{"loss", loss}, {"lr", lr}});
  }
  EXPECT_TRUE(std::filesystem::exists("run/metrics.csv"));

  if (auto s = monitor::gpu_stats(0)) std::cout << monitor::format_gpu_stats(*s) << "\n";  // gpu 97%  mem 61.2/143.8 GB  512/700 W  63 C
  else std::cout << monitor::gpu_stats_unavailable_reason(0) << "\n";
}

// ---- The usage examples at the top of the public headers, with the options structs they show.

// kiln/layers/layers.h, kiln/layers/conv.h, kiln/optim/sgd.h, kiln/optim/adam.h, kiln/optim/clip_grad.h
TEST(DocSnippets, LayersAndOptimizers) {
  Tensor x = randn({3, 784});
  auto fc = std::make_shared<nn::Linear>(784, 10);                 // "weight" (10, 784), "bias" (10)
  auto head = std::make_shared<nn::Linear>(256, 2, nn::LinearOptions{.bias = false});
  auto bn = std::make_shared<nn::BatchNorm2d>(64, nn::BatchNormOptions{.momentum = 0.01});
  auto drop = std::make_shared<nn::Dropout>(0.1);
  Tensor y = (*fc)(x);                                              // x (N, 784) -> (N, 10)
  EXPECT_EQ(y.shape(), (Shape{3, 10}));

  Tensor img = randn({1, 3, 16, 16}), w = randn({4, 2, 3, 3}), b = randn({4});
  auto conv = std::make_shared<nn::Conv2d>(3, 64, 7, nn::Conv2dOptions{.stride = 2, .padding = 3, .bias = false});
  Tensor c = (*conv)(img);                          // x (N, 3, 224, 224) -> y (N, 64, 112, 112)
  Tensor z = nn::conv2d(randn({1, 4, 8, 8}), w, b, {.stride = 1, .padding = 1, .groups = 2});
  EXPECT_EQ(c.shape(), (Shape{1, 64, 8, 8}));
  EXPECT_EQ(z.shape(), (Shape{1, 4, 8, 8}));

  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{fc});
  {
    optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
    Tensor loss = (*model)(x).square().mean();
    opt.zero_grad();  loss.backward();  opt.step();
  }
  {
    optim::AdamW opt(model->parameters(), {.lr = 1e-4, .betas = {0.9, 0.999}, .weight_decay = 0.01});
    Tensor loss = (*model)(x).square().mean();
    opt.zero_grad();  loss.backward();
    Tensor norm = nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // 0-d, on the device: no sync
    nn::utils::clip_grad_value_(model->parameters(), 0.5);               // each element into [-0.5, 0.5]
    opt.step();
    EXPECT_GT(norm.item<float>(), 0.f);
  }
}

// kiln/optim/grad_scaler.h, kiln/autograd/amp.h (on the CPU: autocast and the scaler do nothing to CPU ops)
TEST(DocSnippets, GradScalerAndAutocast) {
  auto model = std::make_shared<nn::Linear>(8, 3);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  Tensor x = randn({4, 8}), y = zeros({4}, {.dtype = DType::Int64});
  amp::GradScaler scaler({.enabled = false});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    Tensor loss;
    { amp::Autocast cast(DType::Float16); loss = nn::cross_entropy(model->forward(x), y); }
    scaler.scale(loss).backward();            // gradients are scaled by S
    scaler.unscale_(opt);                     // optional: true gradients now, e.g. for clipping
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    scaler.step(opt);                         // skipped when a gradient was inf/NaN
    scaler.update();                          // S *= 0.5 after an overflow, S *= 2 after growth_interval clean steps
  }
}

// kiln/autograd/amp.h (FP8) and kiln/layers/fp8_linear.h, as written (a GPU region: compiled only) and on the CPU
[[maybe_unused]] void amp_fp8_on_a_gpu(nn::Module& module, const nn::Handle<nn::Module>& model, const Tensor& x,
                                       const Tensor& y, Device dev) {
  Tensor loss;
  amp::Fp8Recipe recipe{.format = amp::Fp8Format::Hybrid, .amax_history_len = 16, .margin = 0};
  amp::prepare_fp8(module, recipe, dev);            // kiln/layers/fp8_linear.h: FP8 state of the chosen Linears
  {
    amp::Autocast cast(DType::BFloat16, {.fp8 = recipe});
    loss = nn::cross_entropy(model(x), y);           // Linears in FP8 (E4M3), everything else bf16 / float32
  }
  loss.backward();                                   // gradients in E5M2; float32 weight gradients
}
TEST(DocSnippets, AmpFp8OnTheCpu) {
  auto model = nn::make<nn::Sequential>(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 16));
  Tensor x = randn({8, 32}), y = zeros({8}, {.dtype = DType::Int64});
  Tensor loss;
  amp::Fp8Recipe recipe{.amax_history_len = 16};
  EXPECT_EQ(amp::prepare_fp8(*model, recipe, Device::cpu()), 2);
  {
    amp::Autocast cast(DType::BFloat16, {.device_type = DeviceType::CPU, .fp8 = recipe});
    loss = nn::cross_entropy(model(x), y);
  }
  loss.backward();
  EXPECT_EQ(model->named_parameters()[0].second.grad().dtype(), DType::Float32);
  EXPECT_EQ(model->state_dict().size(), 10u);        // weight, bias and fp8_amax_history, fp8_scale, fp8_scale_inv
}

// kiln/layers/models/resnet.h, kiln/layers/models/bert.h
TEST(DocSnippets, Models) {
  auto cifar = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});   // (N, 3, 32, 32) -> (N, 10)
  EXPECT_EQ(cifar(randn({1, 3, 32, 32})).shape(), (Shape{1, 10}));

  models::BertConfig tiny{.vocab_size = 50, .hidden_size = 16, .num_hidden_layers = 2, .num_attention_heads = 2,
                      .intermediate_size = 32, .max_position_embeddings = 16};   // any custom size
  auto clf = nn::make<models::BertForSequenceClassification>(tiny, /*num_labels=*/3);
  Tensor ids = zeros({2, 5}, {.dtype = DType::Int64});
  auto out = clf(ids, ids, ones({2, 5}, {.dtype = DType::Int64}));
  EXPECT_EQ(out.logits.shape(), (Shape{2, 3}));
}

// kiln/layers/models/resnet.h (a GPU and ImageNet's size: compiled only)
[[maybe_unused]] void resnet_header(const Tensor& images) {
  auto model = nn::models::resnet50({.num_classes = 1000});
  model->to(Device::cuda(0), MemoryFormat::ChannelsLast);
  Tensor logits = model(images);                        // (N, 3, 224, 224) -> (N, 1000)
}

// kiln/data/datasets/synthetic.h, kiln/data/dataloader.h (a small synthetic set, two workers, on the CPU)
TEST(DocSnippets, SyntheticDataAndLoader) {
  auto ds = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{.size = 10,
                             .fields = {{"image", {3, 4, 4}, DType::Float32},
                                        {"label", {}, DType::Int64, /*num_classes=*/1000}},
                             .seed = 0});
  data::DataLoader loader(ds, {.batch_size = 4, .workers = 2, .shuffle = true, .prefetch_next_epoch = true});
  data::DataLoader eval_loader(ds, {.batch_size = 4, .workers = 2});
  int64_t seen = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) seen += batch.batch_size();
    for (data::Batch& batch : eval_loader.epoch(0)) seen += batch.batch_size();
  }
  EXPECT_EQ(seen, 40);
}

// kiln/data/dataloader.h, kiln/data/image_folder.h (an image folder and a GPU: compiled only)
[[maybe_unused]] void data_headers(int local_rank) {
  auto train = std::make_shared<data::ImageFolder>("imagenet/train", data::transforms::imagenet_train(224),
                                                   data::ImageFolderOptions{.decode = data::Decode::Gpu});
  data::DataLoader loader(train, {.batch_size = 256, .workers = 8, .shuffle = true,
                                  .device = Device::cuda(local_rank), .prefetch_next_epoch = true});
  for (int epoch = 0; epoch < 90; ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) {   // already on the GPU, in sampler order
      auto [x, y] = batch;
      (void)x, (void)y;
    }
    std::cout << "data-wait share " << loader.stats().wait_fraction << "\n";
  }
}

// kiln/profiler/profiler.h, kiln/io/pretrained.h, kiln/tensor/tensor_options.h (compiled only: files of weights,
// a trace file)
[[maybe_unused]] void profiler_and_pretrained(int64_t steps, const std::function<void()>& train_step) {
  profiler::Profile prof({.schedule = {.wait = 5, .warmup = 2, .active = 3},
                          .trace_path = "run/trace.json"});     // open it in ui.perfetto.dev
  for (int64_t step = 0; step < steps; ++step) {
    train_step();
    prof.step();   // advances the schedule; writes the trace when the active steps are done
  }
  std::cout << prof.result().table(20);   // the top 20 ops by GPU time

  auto model = nn::models::resnet18({.num_classes = 1000});
  io::load_weights(*model, "resnet18.pth");  // strict (the default): a kiln::Error listing any difference
  auto clf = nn::models::resnet18({.num_classes = 10});                   // fine-tuning: another classifier
  io::LoadReport r = io::load_weights(*clf, "resnet18.pth", {.strict = false});  // loads what matches
  std::cout << r.summary();                                                // loaded / missing / mismatched / ...

  Tensor t = zeros({2, 3}, {.device = Device::cuda(0)});
  Tensor p = empty({2, 3}, {.pinned_memory = true});
}

// ---- docs/getting-started.md, "Tensors", "Autograd", "A model", "Data" (run; the data from
// examples/quickstart/data, found from the working folder upwards) and "On a GPU, with mixed precision"
// (compiled only)
namespace getting_started {
void tensors() {
  Tensor a = zeros({2, 3});                                 // float32 on the CPU
  Tensor b = ones({2, 3}, {.dtype = DType::Float64});       // options: dtype, device, ...
  Tensor c = arange(6).reshape({2, 3});                     // int64: [[0, 1, 2], [3, 4, 5]]
  Tensor d = from_vector(std::vector<float>{1, 2, 3}, {3}); // copied from host memory
  Tensor r = randn({2, 3});                                 // N(0, 1), from the seed given to manual_seed
  std::cout << c << "\n";                                   // the values, then shape, dtype and device

  Tensor e = (r * 2 + 1).relu() + d;                        // elementwise; d (3) broadcasts over the rows
  Tensor f = matmul(r, r.t());                              // (2, 3) x (3, 2) -> (2, 2)
  Tensor m = c.to(DType::Float32).mean({1});                // (2): 1 and 4
  float first = m[0].item<float>();                         // 1: the element of a one-element tensor
  std::cout << e.dtype() << " " << f.device() << " " << first << "\n";   // float32 cpu 1

  EXPECT_EQ(a.dtype(), DType::Float32);
  EXPECT_EQ(b.dtype(), DType::Float64);
  EXPECT_EQ(c.dtype(), DType::Int64);
  EXPECT_EQ(e.shape(), (Shape{2, 3}));
  EXPECT_EQ(f.shape(), (Shape{2, 2}));
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(m[1].item<float>(), 4.0f);
}

Tensor autograd_basics() {
  Tensor w = randn({3}).requires_grad_();                   // a leaf: its gradient accumulates in grad()
  Tensor x = from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor y = (w * x).sum();                                 // y = w . x, a 0-d tensor
  y.backward();                                             // dy/dw = x
  std::cout << w.grad() << "\n";                            // [1, 2, 3]
  {
    NoGradGuard no_grad;                                    // nothing is recorded in this scope
    Tensor z = w * 2;
    std::cout << z.requires_grad() << "\n";                 // 0
  }
  w.mutable_grad() = Tensor();                              // forget the gradient before the next backward
  EXPECT_FALSE(w.grad().defined());
  (w * x).sum().backward();
  return w.grad();
}

Tensor sequential_model() {
  auto model = nn::make<nn::Sequential>(nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(),   // (N, 16, 8, 8)
                                        nn::Conv2d(16, 32, 3, {.padding = 1}), nn::ReLU(),  // (N, 32, 8, 8)
                                        nn::MaxPool2d({.kernel_size = 2}),                  // (N, 32, 4, 4)
                                        nn::Flatten(),                                      // (N, 512)
                                        nn::Linear(32 * 4 * 4, 64), nn::ReLU(),
                                        nn::Linear(64, 10));                                // (N, 10)
  Tensor logits = model(randn({4, 1, 8, 8}));                                              // (4, 10)
  std::cout << model->num_parameters() << " parameters\n";
  return logits;
}

struct DigitNet : nn::Module {
  nn::Handle<nn::Conv2d> conv1, conv2;
  nn::Handle<nn::Linear> fc1, fc2;
  DigitNet() : Module("DigitNet") {                       // the name shows in profiles and errors
    conv1 = register_module("conv1", nn::Conv2d(1, 16, 3, {.padding = 1}));
    conv2 = register_module("conv2", nn::Conv2d(16, 32, 3, {.padding = 1}));
    fc1 = register_module("fc1", nn::Linear(32 * 4 * 4, 64));
    fc2 = register_module("fc2", nn::Linear(64, 10));
  }
  Tensor forward(const Tensor& x) override {              // (N, 1, 8, 8) -> (N, 10)
    Tensor h = relu(conv2(relu(conv1(x))));
    h = nn::max_pool2d(h, {.kernel_size = 2}).flatten(1);
    return fc2(relu(fc1(h)));
  }
};

Tensor subclass_model() {
  auto net = nn::make<DigitNet>();                          // an nn::Handle<DigitNet>
  Tensor scores = net(randn({4, 1, 8, 8}));                 // DigitNet::forward: (4, 10)
  for (auto& [name, p] : net->named_parameters()) std::cout << name << " " << p.numel() << "\n";
  EXPECT_EQ(net->named_parameters().front().first, "conv1.weight");
  return scores;
}

int64_t data_basics(const std::filesystem::path& root) {
  namespace T = data::transforms;
  T::Compose to_input{T::ToTensor(), T::Normalize({0.5}, {0.5})};   // uint8 (H, W, 1) -> float32 (1, H, W)
  auto train = std::make_shared<data::MNIST>(root, data::MNISTOptions{.split = data::Split::Train,
                                                                      .transform = to_input});
  data::DataLoader loader(train, {.batch_size = 32, .workers = 2, .shuffle = true});
  for (data::Batch& batch : loader.epoch(0)) {
    auto [x, y] = batch;                                    // "image" (32, 1, 8, 8) float32, "label" (32) int64
    std::cout << x.size(0) << " images, first label " << y[0].item<int64_t>() << "\n";
    break;
  }
  int64_t seen = 0;
  for (data::Batch& batch : loader.epoch(1)) {
    auto [x, y] = batch;
    EXPECT_EQ(x.shape(), (Shape{32, 1, 8, 8}));
    EXPECT_EQ(x.dtype(), DType::Float32);
    EXPECT_EQ(y.dtype(), DType::Int64);
    seen = x.size(0);
    break;
  }
  EXPECT_EQ(train->size(), 1437);
  return seen;
}

[[maybe_unused]] void on_a_gpu(nn::Handle<nn::Sequential> model, std::shared_ptr<data::MNIST> train) {
  const Device dev = cuda::is_available() ? Device::cuda(0) : Device::cpu();   // <kiln/tensor/cuda.h>
  model->to(dev);                                           // the parameters move, in place
  optim::AdamW opt(model->parameters(), {.lr = 2e-3, .weight_decay = 1e-4});
  data::DataLoader loader(train, {.batch_size = 256, .workers = 4, .shuffle = true, .device = dev});
  for (int epoch = 0; epoch < 8; ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) {
      auto [x, y] = batch;                                  // already on dev
      opt.zero_grad();
      Tensor loss;
      {
        amp::Autocast cast(DType::BFloat16);                // matmuls and convolutions in bf16
        loss = nn::cross_entropy(model(x), y);              // the loss itself in float32
      }
      loss.backward();                                      // float32 gradients of the float32 parameters
      opt.step();
    }
  }
}

[[maybe_unused]] void with_a_grad_scaler(nn::Handle<nn::Sequential> model, optim::Optimizer& opt,
                                         data::DataLoader& loader) {
  amp::GradScaler scaler;                                   // starts at a scale of 65536
  for (data::Batch& batch : loader.epoch(0)) {
    auto [x, y] = batch;
    opt.zero_grad();
    Tensor loss;
    { amp::Autocast cast(DType::Float16); loss = nn::cross_entropy(model(x), y); }
    scaler.scale(loss).backward();                          // gradients scaled by the scale
    scaler.unscale_(opt);                                   // optional: the true gradients, e.g. to clip them
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    scaler.step(opt);                                       // skipped when a gradient was inf or NaN
    scaler.update();                                        // halves the scale after an overflow, else may grow it
  }
}
}  // namespace getting_started

TEST(DocSnippets, GettingStarted) {
  manual_seed(0);
  getting_started::tensors();
  Tensor grad = getting_started::autograd_basics();
  EXPECT_EQ(grad.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(getting_started::sequential_model().shape(), (Shape{4, 10}));
  EXPECT_EQ(getting_started::subclass_model().shape(), (Shape{4, 10}));
  // The bundled digits, found from the working folder upwards (the tests run inside the build folder), as the
  // guide's whole program finds them.
  std::filesystem::path digits;
  for (auto dir = std::filesystem::current_path(); digits.empty(); dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / "examples/quickstart/data")) digits = dir / "examples/quickstart/data";
    if (dir == dir.parent_path()) break;
  }
  if (digits.empty()) GTEST_SKIP() << "examples/quickstart/data is not above the working folder";
  EXPECT_EQ(getting_started::data_basics(digits), 32);
}

// ---- docs/coming-from-pytorch.md, "Autograd" (the custom function, then its use; run)
namespace pytorch_guide {
struct ScaledTanh : autograd::Function<ScaledTanh> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, double scale) {
    Tensor y = tanh(x);
    ctx.save_for_backward({y});
    ctx.set("scale", scale);
    return y * scale;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grad_outputs) {
    Tensor y = ctx.saved()[0];
    return {grad_outputs[0] * ctx.get<double>("scale") * (1 - y * y)};   // one per Tensor argument of forward
  }
};
}  // namespace pytorch_guide

TEST(DocSnippets, PytorchGuideAutograd) {
  using pytorch_guide::ScaledTanh;
  manual_seed(1);
  const Tensor w0 = randn({3});
  const Tensor expected_grad = 2.0 * (1 - tanh(w0) * tanh(w0));
  manual_seed(1);                            // the snippet's randn gives w0 again
Tensor w = randn({3}).requires_grad_();
Tensor loss = ScaledTanh::apply(w, 2.0).sum();
loss.backward();
std::cout << w.grad() << "\n";
{
  NoGradGuard no_grad;                       // torch.no_grad()
  w -= w.grad() * 0.1;
}
w.mutable_grad() = Tensor();                 // w.grad = None
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(allclose(w.detach(), w0 - expected_grad * 0.1, 1e-5, 1e-6));
}

// ---- docs/coming-from-pytorch.md, "Modules" (the module, then its use; run)
namespace pytorch_guide {
struct Net : nn::Module {
  nn::Handle<nn::Linear> fc1, fc2;
  nn::Handle<nn::Dropout> drop;
  Net() : Module("Net") {
    fc1 = register_module("fc1", nn::Linear(16, 64));
    drop = register_module("drop", nn::Dropout(0.1));
    fc2 = register_module("fc2", nn::Linear(64, 2));
  }
  Tensor forward(const Tensor& x) override { return fc2(drop(relu(fc1(x)))); }
};
}  // namespace pytorch_guide

TEST(DocSnippets, PytorchGuideModules) {
  using pytorch_guide::Net;
auto net = nn::make<Net>();
Tensor logits = net(randn({8, 16}));         // (8, 16) -> (8, 2)
net->eval();                                 // dropout off
nn::StateDict sd = net->state_dict();        // "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
auto copy = nn::make<Net>();
copy->load_state_dict(sd);                   // strict: a kiln::Error names any missing or extra name
  EXPECT_EQ(logits.shape(), (Shape{8, 2}));
  EXPECT_FALSE(net->is_training());
  std::vector<std::string> names;
  for (auto& [name, t] : sd) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  copy->eval();
  Tensor x = randn({8, 16});
  EXPECT_TRUE(allclose(net(x), copy(x)));
  nn::StateDict wrong{{"fc1.weight", zeros({64, 16})}};
  EXPECT_THROW(copy->load_state_dict(wrong), kiln::Error);
}

// ---- docs/coming-from-pytorch.md, "Exporting to ONNX" (run in a temporary folder)
namespace pytorch_guide {
io::OnnxExportReport onnx_export() {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  model->eval();                                        // (export_onnx would trace in eval mode anyway, with a warning)
  io::OnnxExportReport report = io::export_onnx(*model, randn({1, 3, 32, 32}), "resnet18.onnx",
                                                {.input_names = {"images"}, .output_names = {"logits"},
                                                 .dynamic_axes = {{"images", {{0, "batch"}}}},
                                                 .fold_batch_norm = true});
  return report;
}
}  // namespace pytorch_guide

TEST(DocSnippets, PytorchGuideOnnxExport) {
  InTempFolder here("kiln_doc_snippets_pytorch_onnx");
  io::OnnxExportReport report;
  try {
    report = pytorch_guide::onnx_export();
  } catch (const Error& e) {
    if (std::string(e.what()).find("built without ONNX support") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_GT(report.nodes, 0);
  EXPECT_TRUE(report.warnings.empty());  // in eval mode: no warning
  // Folded: no BatchNormalization left
  EXPECT_EQ(std::count(report.op_types.begin(), report.op_types.end(), "BatchNormalization"), 0);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size("resnet18.onnx")), report.bytes);
}

// ---- docs/coming-from-pytorch.md, "Mixed precision, FP8, CUDA graphs" (a GPU: compiled only)
namespace pytorch_guide {
void amp_step(nn::Handle<nn::Module> model, optim::Optimizer& opt, const Tensor& x, const Tensor& y, Device dev) {
  // bf16: no scaler needed
  opt.zero_grad();
  Tensor loss;
  { amp::Autocast cast(DType::BFloat16); loss = nn::cross_entropy(model(x), y); }
  loss.backward();
  opt.step();

  // fp16: dynamic loss scaling
  amp::GradScaler scaler;
  opt.zero_grad();
  { amp::Autocast cast(DType::Float16); loss = nn::cross_entropy(model(x), y); }
  scaler.scale(loss).backward();
  scaler.step(opt);                          // skipped when a gradient was inf or NaN
  scaler.update();

  // FP8: the nn::Linear layers the recipe selects compute in FP8 (a GPU of compute capability 8.9 or more)
  amp::Fp8Recipe recipe{};
  amp::prepare_fp8(*model, recipe, dev);     // once per model, and before loading an FP8 checkpoint
  opt.zero_grad();
  { amp::Autocast cast(DType::BFloat16, {.fp8 = recipe}); loss = nn::cross_entropy(model(x), y); }
  loss.backward();
  opt.step();
}
}  // namespace pytorch_guide

// ---- docs/coming-from-pytorch.md, "Saving and loading" (run in a temporary folder)
TEST(DocSnippets, PytorchGuideSavingAndLoading) {
  InTempFolder here("kiln_doc_snippets_pytorch_save");
auto model = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
optim::AdamW opt(model->parameters(), {.lr = 1e-3});
optim::StepLR sched(opt, /*step_size=*/10);
data::LoaderPosition pos;                    // where the data loader is: {epoch, batch}
io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .scheduler = &sched,
                          .generators = true, .loader = &pos};
io::CheckpointManager ckpt("run/", {.keep_last = 3});
int64_t step = ckpt.resume(parts).value_or(0);   // the newest complete checkpoint, or a fresh start
ckpt.save(step + 100, parts);                    // run/ckpt-00000100.h5

io::save_safetensors("run/model.safetensors", model->state_dict());
io::load_weights(*model, "run/model.safetensors");
  EXPECT_EQ(step, 0);
  EXPECT_TRUE(std::filesystem::exists("run/ckpt-00000100.h5"));
  io::CheckpointManager again("run/", {.keep_last = 3});
  EXPECT_EQ(again.resume(parts).value_or(0), 100);
}

// ---- docs/coming-from-pytorch.md, "Several GPUs" (several processes: compiled only)
namespace pytorch_guide {
void train_on_several_gpus(nn::Handle<nn::Module> model, std::shared_ptr<data::Dataset> dataset) {
  auto env = dist::init();                   // one process of `mpirun -np N`; world size 1 without a launcher
  model->to(env.device());                   // cuda:<local rank>, or the CPU without a GPU
  dist::DataParallel ddp(model);             // rank 0's weights everywhere; gradients averaged in backward
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  data::DataLoader loader(dataset, {.batch_size = 64, .workers = 4, .shuffle = true,
                                    .device = env.device()});   // each rank gets its own shard
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (data::Batch& batch : loader.epoch(epoch)) {
      auto [x, y] = batch;
      opt.zero_grad();
      nn::cross_entropy(ddp(x), y).backward();
      opt.step();
    }
    if (env.is_main()) io::save_checkpoint("run/ckpt.h5", {.model = model.get(), .optimizer = &opt});
  }
}
}  // namespace pytorch_guide

// ---- docs/coming-from-pytorch.md, "Profiling" (run on the CPU with a small step, in a temporary folder)
namespace pytorch_guide {
void profile_steps(const std::function<void()>& train_step) {
  profiler::Profile prof({.schedule = {.wait = 1, .warmup = 1, .active = 2}, .trace_path = "run/trace.json"});
  for (int step = 0; step < 4; ++step) {
    train_step();
    prof.step();
  }
  std::cout << prof.result().table(10);      // the top 10 ops
}
}  // namespace pytorch_guide

TEST(DocSnippets, PytorchGuideProfiling) {
  InTempFolder here("kiln_doc_snippets_pytorch_profile");
  std::filesystem::create_directories("run");
  Tensor a = randn({16, 16});
  pytorch_guide::profile_steps([&] { a = relu(matmul(a, a.t())) * 0.01; });
  EXPECT_TRUE(std::filesystem::exists("run/trace.json"));
}

// ---- docs/coming-from-pytorch.md, "What differs" (a forward of several arguments, errors, CPU autocast; run)
namespace pytorch_guide {
class Masked : public nn::Module {
  using nn::Module::forward;                 // private: no one-tensor forward
 public:
  Masked() : Module("Masked") {}
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& mask) { return {x * mask, mask.sum()}; }
};
}  // namespace pytorch_guide

TEST(DocSnippets, PytorchGuideWhatDiffers) {
  using pytorch_guide::Masked;
  {
auto masked = nn::make<Masked>();
auto [out, count] = masked(randn({2, 4}), ones({2, 4}));   // Masked::forward(x, mask)
    EXPECT_EQ(out.shape(), (Shape{2, 4}));
    EXPECT_EQ(count.item<float>(), 8.f);
  }
  testing::internal::CaptureStderr();
try {
  std::cout << matmul(randn({2, 3}), randn({4, 5}));
} catch (const kiln::Error& e) {
  std::cerr << e.what() << "\n";             // names matmul and both shapes
}
  const std::string message = testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("matmul"), std::string::npos) << message;

  testing::internal::CaptureStdout();
Tensor a = randn({4, 8}), b = randn({8, 2});
{
  amp::Autocast cast(DType::BFloat16);                                     // CUDA ops only
  std::cout << matmul(a, b).dtype() << "\n";                               // float32
}
{
  amp::Autocast cast(DType::BFloat16, {.device_type = DeviceType::CPU});   // CPU ops too
  std::cout << matmul(a, b).dtype() << "\n";                               // bfloat16
}
  const std::string dtypes = testing::internal::GetCapturedStdout();
  EXPECT_EQ(dtypes, "float32\nbfloat16\n");
}

// ---- docs/writing-an-op.md, "The tests a new op needs" (the test body for the guide's RmsNorm; run). The guide's
// whole program defines RmsNormFunction and RmsNorm; they are copied here as it writes them.
namespace writing_an_op {
struct RmsNormFunction : autograd::Function<RmsNormFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& weight, double eps) {
    Tensor r = rsqrt(mean(x * x, {-1}, /*keepdim=*/true) + eps);   // 1 / rms, one per row
    Tensor xhat = x * r;
    ctx.save_for_backward({xhat, r, weight});
    return xhat * weight;
  }
  // One gradient per Tensor argument of forward (x, weight), in order; undefined where none is needed.
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    const Tensor &xhat = s[0], &r = s[1], &weight = s[2], &g = grads[0];
    Tensor gx, gw;
    if (ctx.needs_input_grad(0)) {
      Tensor gxhat = g * weight;
      gx = r * (gxhat - xhat * mean(gxhat * xhat, {-1}, /*keepdim=*/true));
    }
    if (ctx.needs_input_grad(1)) gw = (g * xhat).reshape({-1, weight.numel()}).sum({0});
    return {gx, gw};
  }
};

autocast::Op rms_norm_op() {
  static const autocast::Op op = autocast::register_op("rms_norm", autocast::Policy::Float32);
  return op;
}

class RmsNorm : public nn::Module {
 public:
  explicit RmsNorm(int64_t dim, double eps = 1e-6) : Module("RmsNorm"), eps_(eps) {
    weight_ = register_parameter("weight", ones({dim}));                       // trained, saved, moved by to()
    calls_ = register_buffer("calls", zeros({}, {.dtype = DType::Int64}));     // saved and moved, never trained
  }
  Tensor forward(const Tensor& input) override {
    KILN_CHECK(input.dim() >= 1 && input.size(-1) == weight_.numel(), "RmsNorm: the input's last dim must be ",
               weight_.numel(), ", got shape ", input.shape());
    if (is_training()) {
      NoGradGuard no_grad;
      calls_.add_(1);
    }
    auto [x, w] = autocast::inputs(rms_norm_op(), input, weight_);
    autocast::DisableGuard as_one_op;    // the ops inside run in the dtype chosen here
    return RmsNormFunction::apply(x, w, eps_);
  }

 private:
  double eps_;
  Tensor weight_, calls_;
};
}  // namespace writing_an_op

TEST(DocSnippets, WritingAnOpTests) {
  using writing_an_op::RmsNorm;
  using writing_an_op::RmsNormFunction;
  manual_seed(3);
Tensor x = randn({2, 3, 4}, {.dtype = DType::Float64}).requires_grad_();
Tensor w = randn({4}, {.dtype = DType::Float64}).requires_grad_();
EXPECT_TRUE(autograd::gradcheck([](const autograd::TensorList& in) {
  return autograd::TensorList{RmsNormFunction::apply(in[0], in[1], 1e-6)};
}, {x, w}));                                                  // float64, central differences

auto norm = nn::make<RmsNorm>(4);
Tensor x32 = randn({2, 3, 4});
Tensor x64 = x32.to(DType::Float64);
Tensor expected = x64 * rsqrt(mean(square(x64), {-1}, /*keepdim=*/true) + 1e-6);
EXPECT_TRUE(allclose(norm(x32).to(DType::Float64), expected, 1e-5, 1e-6));   // float32 against float64

EXPECT_THROW(norm(randn({2, 3})), kiln::Error);               // the message names RmsNorm and the shape
  EXPECT_EQ(norm->buffers()[0].item<int64_t>(), 1);             // the bad input was refused before counting
}

// ---- docs/checkpoints.md, "Saving and loading one file", "A folder of checkpoints", "state_dict and
// load_state_dict", "Exporting weights for PyTorch" (run in a temporary folder); "Loading PyTorch and Hugging Face
// weights" (files that are not there: compiled only)
TEST(DocSnippets, CheckpointsGuide) {
  InTempFolder here("kiln_doc_snippets_checkpoints");
  auto model = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  optim::StepLR sched(opt, /*step_size=*/10);
  {
io::Metadata meta{.numbers = {{"step", 1000}, {"val_loss", 0.31}}, .strings = {{"run_name", "baseline"}}};
io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .metadata = &meta};
io::save_checkpoint("model.h5", parts);    // atomic: a temporary file, then a rename

io::CheckpointInfo info = io::inspect_checkpoint("model.h5");    // reads no tensor data
for (const std::string& part : info.parts) std::cout << part << " ";   // model optimizer metadata
std::cout << "\n";
io::load_checkpoint("model.h5", parts);     // checks everything, then changes the objects
    EXPECT_EQ(info.parts, (std::vector<std::string>{"model", "optimizer", "metadata"}));
    EXPECT_TRUE(info.complete);

io::Metadata saved;
io::load_checkpoint("model.h5", {.metadata = &saved});   // only /metadata: check the run's settings first
if (saved.numbers.at("step") != 1000) std::cout << "another run\n";
    EXPECT_EQ(saved, meta);
  }
  {
io::CheckpointManager ckpt("run/", {.keep_last = 3, .prefix = "ckpt"});
data::LoaderPosition pos;
io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .scheduler = &sched,
                          .generators = true, .loader = &pos};
int64_t step = ckpt.resume(parts).value_or(0);   // the newest loadable checkpoint, or a fresh start
for (const auto& [saved_step, path] : ckpt.list()) std::cout << saved_step << " " << path << "\n";
ckpt.save(step + 100, parts);                    // run/ckpt-00000100.h5, then the oldest beyond 3 go
    EXPECT_EQ(step, 0);
    EXPECT_TRUE(std::filesystem::exists("run/ckpt-00000100.h5"));
  }
  {
nn::StateDict sd = model->state_dict();                      // (dotted name, tensor), sharing memory
auto bigger = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2), nn::ReLU(),
                                       nn::Linear(2, 2));    // one layer more: its "4.weight", "4.bias"
nn::Module::LoadResult r = bigger->load_state_dict(sd, /*strict=*/false);
for (const std::string& key : r.missing_keys) std::cout << "not in the state: " << key << "\n";
    EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"4.weight", "4.bias"}));
    EXPECT_TRUE(r.unexpected_keys.empty());
    auto wrong_head = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
    EXPECT_THROW(wrong_head->load_state_dict(sd, /*strict=*/false), kiln::Error);   // a shape mismatch
  }
  {
auto three_classes = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
io::LoadReport report = io::load_weights(*three_classes, model->state_dict(), {.strict = false});
std::cout << report.summary();      // loaded 2, missing 0, unexpected 0, mismatched 2 (2.weight, 2.bias)
    EXPECT_EQ(report.loaded, (std::vector<std::string>{"0.weight", "0.bias"}));
    EXPECT_EQ(report.mismatched.size(), 2u);
    EXPECT_FALSE(report.ok());
  }
  {
io::save_safetensors("model.safetensors", model->state_dict(), {{"format", "pt"}});
    EXPECT_TRUE(io::load_weights(*model, "model.safetensors").ok());
  }
}

[[maybe_unused]] void checkpoints_guide_pretrained() {
auto model = nn::models::resnet18({.num_classes = 1000});
io::load_weights(*model, "resnet18.pth");            // strict: a kiln::Error listing any difference

auto clf = nn::models::resnet18({.num_classes = 10});                     // fine-tuning: a new classifier
io::LoadReport r = io::load_weights(*clf, "resnet18.pth", {.strict = false});
std::cout << r.summary();                            // fc.weight and fc.bias: another shape, left as they are
}

[[maybe_unused]] void checkpoints_guide_prefix_map(nn::Module& target) {
  nn::Module* model = &target;
// a file whose names start with "encoder." where the model's start with "backbone."
io::LoadReport r = io::load_weights(*model, "weights.safetensors",
                                    {.strict = false, .prefix_map = {{"encoder.", "backbone."}}});
for (const io::LoadMismatch& m : r.mismatched) std::cout << m.name << "\n";
for (const std::string& rename : r.renames) std::cout << rename << "\n";
}

// ---- docs/multi-gpu.md, "The variables kiln reads", "Timeouts and a hung rank", "SyncBatchNorm", "Gradient
// accumulation under DataParallel", "Checkpoints under several ranks" (several processes: compiled only)
namespace multi_gpu {
[[maybe_unused]] void print_place() {
const dist::Env& env = dist::init();
if (env.is_main()) std::cout << env.world_size << " processes, launcher " << env.launcher << "\n";
std::cout << "rank " << env.rank << " (local rank " << env.local_rank << ") on " << env.device() << "\n";
}

[[maybe_unused]] bool all_reduce_or_report(const Tensor& t) {
dist::init({.timeout = std::chrono::minutes(30), .on_timeout = dist::OnTimeout::Throw});
try {
  dist::all_reduce(t);
} catch (const dist::TimeoutError& e) {
  std::cerr << e.what() << "\n";         // the group is unusable now: save what is this rank's, then exit
  return false;
}
  return true;
}

[[maybe_unused]] void sync_batch_norm(nn::ModulePtr model) {
auto env = dist::init();
if (env.distributed()) dist::convert_sync_batchnorm(*model);   // every BatchNorm layer of the model
model->to(env.device());
dist::DataParallel ddp(model);
}

[[maybe_unused]] void accumulate(dist::DataParallel& ddp, optim::Optimizer& opt, data::DataLoader& loader,
                                 uint64_t epoch, int64_t accum) {
int64_t micro = 0;
for (data::Batch& batch : loader.epoch(epoch)) {
  auto [x, y] = batch;
  Tensor loss = nn::cross_entropy(ddp(x), y) * (1.0 / static_cast<double>(accum));
  if (++micro % accum != 0) {
    auto local = ddp.no_sync();              // this backward stays on this rank
    loss.backward();
    continue;
  }
  loss.backward();                           // the summed gradients are averaged over the ranks
  opt.step();
  opt.zero_grad();
}
}

[[maybe_unused]] void checkpoints(nn::ModulePtr model, optim::Optimizer& opt, data::DataLoader& loader,
                                  uint64_t epochs) {
io::CheckpointManager ckpt("run/", {.keep_last = 3, .prefix = "ckpt"});
data::LoaderPosition pos;
io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .generators = true, .loader = &pos};
int64_t step = ckpt.resume(parts).value_or(0);   // every rank; the same step on all of them
dist::DataParallel ddp(model);
for (uint64_t epoch = pos.epoch; epoch < epochs; ++epoch) {
  auto range = loader.epoch(epoch, epoch == pos.epoch ? pos.batch : 0);   // skips the batches already trained on
  for (data::Batch& batch : range) {
    auto [x, y] = batch;
    opt.zero_grad();
    nn::cross_entropy(ddp(x), y).backward();
    opt.step();
    pos = range.position();
    if (++step % 500 == 0) ckpt.save(step, parts);   // every rank, with the same step
  }
}
}
}  // namespace multi_gpu

// ---- docs/performance.md, "Channels-last" (run on the CPU)
TEST(DocSnippets, PerformanceGuideChannelsLast) {
  testing::internal::CaptureStdout();
auto conv = nn::make<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = 1});
conv->to(MemoryFormat::ChannelsLast);                              // 4-d parameters in NHWC order
Tensor x = randn({2, 3, 16, 16}).to(MemoryFormat::ChannelsLast);   // the shape is still (2, 3, 16, 16)
Tensor y = conv(x);                                                // (2, 8, 16, 16), NHWC in memory
std::cout << y.is_contiguous(MemoryFormat::ChannelsLast) << "\n";  // 1
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "1\n");
  EXPECT_EQ(y.shape(), (Shape{2, 8, 16, 16}));
  EXPECT_EQ(conv->weight.suggest_memory_format(), MemoryFormat::ChannelsLast);
}

// ---- docs/performance.md, "Mixed precision: bf16, fp16 and the GradScaler" (a GPU: compiled only)
[[maybe_unused]] void performance_guide_fp16(nn::ModulePtr model, optim::Optimizer& opt, data::DataLoader& loader,
                                             uint64_t epoch) {
  amp::GradScaler scaler;                                  // for float16; bfloat16 needs none
  for (data::Batch& b : loader.epoch(epoch)) {
    auto [x, y] = b;
    opt.zero_grad();
    Tensor loss;
    { amp::Autocast cast(DType::Float16); loss = nn::cross_entropy(model(x), y); }
    scaler.scale(loss).backward();                         // gradients scaled by S
    scaler.unscale_(opt);                                  // the true gradients, before clipping
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // fused on CUDA, no host sync
    scaler.step(opt);                                      // skipped on the GPU when a gradient is inf or NaN
    scaler.update();
  }
}

// ---- docs/performance.md, "FP8" (a GPU of compute capability 8.9 or more: compiled only)
[[maybe_unused]] void performance_guide_fp8(nn::ModulePtr model, optim::Optimizer& opt, const Tensor& x,
                                            const Tensor& y) {
  amp::Fp8Recipe recipe{};                                   // Hybrid, amax history of 1024 steps, margin 0
  recipe.module_filter = [](const amp::Fp8ModuleInfo& m) {   // the default choice, less the classifier
    return amp::default_fp8_module_filter(m) && m.name != "classifier";
  };
  int64_t n = amp::prepare_fp8(*model, recipe, Device::cuda(0));
  std::cout << n << " Linear layers compute in FP8\n";
  opt.zero_grad();
  Tensor loss;
  { amp::Autocast cast(DType::BFloat16, {.fp8 = recipe}); loss = nn::cross_entropy(model(x), y); }
  loss.backward();                                           // gradients quantised to E5M2; float32 weight gradients
  opt.step();
}

// ---- docs/performance.md, "CUDA graphs" (a GPU: compiled only)
[[maybe_unused]] void performance_guide_cuda_graph(nn::ModulePtr model, optim::Optimizer& opt,
                                                   optim::LRScheduler& scheduler, data::DataLoader& loader,
                                                   uint64_t epoch) {
  Tensor x = empty({256, 3, 224, 224}, {.device = Device::cuda(0), .memory_format = MemoryFormat::ChannelsLast});
  Tensor y = empty({256}, {.dtype = DType::Int64, .device = Device::cuda(0)});
  Tensor loss;                                         // the captured step's loss; each replay rewrites it
  auto step = [&] {
    opt.zero_grad();
    { amp::Autocast cast(DType::BFloat16); loss = nn::cross_entropy(model(x), y); }
    loss.backward();
    opt.step();
  };
  cuda::Graph graph;
  int64_t calls = 0;
  for (data::Batch& b : loader.epoch(epoch)) {
    x.copy_(b[0]);  y.copy_(b[1]);                     // into the tensors the step reads
    if (graph.captured()) graph.replay();
    else if (calls++ < 2) step();                      // eager steps first
    else graph.capture(step, /*warmup=*/1);            // one real step on this batch, then the recording
    scheduler.step();                                  // learning rates are read again before each replay
  }
}

// ---- docs/performance.md, "Fused layers and optimizers" (run on the CPU: the math path, dropout then add + norm)
TEST(DocSnippets, PerformanceGuideFusedLayers) {
  testing::internal::CaptureStdout();
Tensor q = randn({2, 4, 16, 32}), k = randn({2, 4, 16, 32}), v = randn({2, 4, 16, 32});   // (N, H, L, E)
std::string why;
if (nn::attention_backend(q, k, v, {.is_causal = true}, &why) == nn::AttentionBackend::Math)
  std::cout << "math path: " << why << "\n";
Tensor h = nn::scaled_dot_product_attention(q, k, v, {.is_causal = true});

Tensor x = randn({2, 16, 64}), sub = randn({2, 16, 64});   // the residual stream and a sublayer's output
Tensor out = nn::dropout_add_layer_norm(sub, x, 0.1, /*training=*/true, {64}, ones({64}), zeros({64}));
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("math path: "), std::string::npos) << printed;
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(h.shape(), (Shape{2, 4, 16, 32}));
  EXPECT_EQ(out.shape(), (Shape{2, 16, 64}));
}

// ---- docs/performance.md, "Embedding tables larger than the GPU" (run on the CPU)
TEST(DocSnippets, PerformanceGuideHybridEmbedding) {
auto table = nn::make<nn::HybridEmbedding>(100'000, 16,
    nn::HybridEmbeddingOptions{.device = Device::cpu(), .hot_fraction = 0.1, .count_batches = 20});
optim::SparseAdam opt(table->parameters(), {.lr = 1e-3});   // "hot" and "cold": each row updated where it lives
table->on_rebalance = [&](const nn::RowSwaps& swaps) {      // rows that move take their Adam moments along
  table->swap_state_rows(swaps, opt.state(table->hot), opt.state(table->cold));
};
Tensor ids = randint(0, 100'000, {256});                    // the ids on the host: no wait for a GPU copy
Tensor rows = table(ids);                                   // (256, 16) on the device
  EXPECT_EQ(rows.shape(), (Shape{256, 16}));
  EXPECT_EQ(table->hot.size(0), 10'000);
  rows.sum().backward();
  opt.step();
  EXPECT_EQ(opt.state(table->cold).count("exp_avg"), 1u);
}

// ---- docs/performance.md, "Feeding the GPU" (an image folder and a GPU: compiled only)
[[maybe_unused]] void performance_guide_loader(uint64_t epoch,
                                               const std::function<void(const Tensor&, const Tensor&)>& train_step) {
  data::ImageFolderOptions folder{.decode = data::Decode::Gpu,
                                  .gpu = {.dtype = DType::BFloat16, .channels_last = true}};   // the model's format
  auto train = std::make_shared<data::ImageFolder>("imagenet/train", data::transforms::imagenet_train(224), folder);
  data::DataLoader loader(train, {.batch_size = 256, .workers = 8, .shuffle = true, .drop_last = true,
                                  .device = Device::cuda(0), .prefetch_next_epoch = true});
  for (data::Batch& b : loader.epoch(epoch)) {
    auto [x, y] = b;                                  // on the GPU: bfloat16, channels-last
    train_step(x, y);
  }
  std::cout << "data wait " << loader.stats().wait_fraction * 100 << "%\n";
}

// ---- docs/performance.md, "Gradient checkpointing" (run on the CPU)
TEST(DocSnippets, PerformanceGuideCheckpointing) {
auto block = nn::make<nn::Sequential>(nn::Linear(64, 256), nn::GELU(), nn::Linear(256, 64));
Tensor x = randn({32, 64}).requires_grad_();
Tensor y = autograd::checkpoint([&](const Tensor& in) { return block(in); }, x);   // keeps only x
y.sum().backward();                                 // recomputes block's forward, then runs its backward
Tensor z = nn::checkpoint_sequential(*block, 2, x); // the first segment checkpointed, the last run as usual
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(block->parameters().front().grad().defined());
  EXPECT_EQ(z.shape(), (Shape{32, 64}));
}

// ---- docs/performance.md, "kiln's profiler: tables and Perfetto traces" (run on the CPU, in a temporary folder)
namespace performance_guide {
void profile(const std::function<void()>& augment, const std::function<void()>& train_step) {
  profiler::Profile prof({.schedule = {.wait = 1, .warmup = 1, .active = 2}, .trace_path = "run/trace.json"});
  for (int step = 0; step < 4; ++step) {
    { trace::Scope range(trace::Kind::User, "augment"); augment(); }   // a range of your own
    train_step();
    prof.step();
  }
  std::cout << prof.result().table(10);                // the top 10 ops by GPU self time (host time without a GPU)
  for (const profiler::OpStats& s : prof.result().stats(trace::Kind::Module))
    std::cout << s.name << " " << s.calls << " calls, " << s.host_self_ns / 1e6 << " ms host self\n";
}
}  // namespace performance_guide

TEST(DocSnippets, PerformanceGuideProfiler) {
  InTempFolder here("kiln_doc_snippets_performance_profile");
  std::filesystem::create_directories("run");
  auto model = nn::make<nn::Sequential>(nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 4));
  Tensor a = randn({8, 16});
  testing::internal::CaptureStdout();
  performance_guide::profile([&] { a = a * 0.5 + 0.1; }, [&] { model(a).sum().backward(); });
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(std::filesystem::exists("run/trace.json"));
  EXPECT_NE(printed.find("Sequential"), std::string::npos) << printed;
}

// ---- docs/performance.md, "Nsight Systems with --nvtx" (NVTX needs a CUDA build: compiled only)
[[maybe_unused]] void performance_guide_nvtx(int64_t steps, const std::function<void()>& train_step) {
  profiler::enable_nvtx({.ops = false});     // steps, modules and backward nodes; no range per op
  for (int64_t step = 0; step < steps; ++step) {
    trace::mark_step(step);                  // closes the previous step's range, opens this one's
    if (step == 10) cuda::profiler_start();  // what nsys --capture-range=cudaProfilerApi records
    train_step();
    if (step == 19) cuda::profiler_stop();
  }
}

}  // namespace snippets
// clang-format on
