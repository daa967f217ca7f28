// examples/resnet/resnet.cpp — trains a ResNet (18/34/50/101/152) on CIFAR-10/100, an image folder
// (ImageNet layout) or synthetic data, with top-1/top-5 evaluation after every epoch.
//
//   ./resnet --dataset cifar10 --data data/cifar-10-batches-bin --epochs 200 --batch-size 128
//   ./resnet --dataset folder --data /data/imagenet --model resnet50 --channels-last --amp bf16
//   ./resnet --dataset folder ... --decode gpu       # JPEGs decoded by nvJPEG on the GPU (scripts/setup.sh)
//   mpirun -np 8 -x NCCL_NVLS_ENABLE=0 ./resnet ...   # one process per GPU, data-parallel
//   ./resnet ... --resume                            # continues from the newest checkpoint in --output
//   ./resnet ... --cuda-graph                        # one GPU: the training step captured once and replayed
//   ./resnet ... --export-onnx resnet.onnx           # at the end: the trained model for ONNX Runtime / TensorRT
//
// The same program runs on one GPU, on the CPU (--device cpu, or no GPU visible) and under mpirun: with
// several processes each trains on its shard of every epoch (the DataLoader's DistributedSampler), the
// gradients are averaged during backward (dist::DataParallel), and only rank 0 prints and writes files
// other than its own checkpoint part. README.md beside this file has the recipes and what the CSV files hold.
#include <kiln/kiln.h>  // Tensor, nn::models::resnet*, data::*, optim::*, amp::*, dist::*, io::*

#include "example_util.h"  // ex::Options, ex::pick_device, ex::Progress
#include "graphed_step.h"  // ex::GraphedStep, ex::StaticBatch (--cuda-graph)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- configuration

// Every option, as a field bound to its entry in the parser (ex::Options keeps the values; these are references
// to them). One Config per process, passed by reference.
struct Config {
  ex::Options o{"resnet", "Trains a ResNet on CIFAR-10/100, an image folder (ImageNet layout) or synthetic data."};
  std::string& model = o.add_string("model", "resnet18", "resnet18 | resnet34 | resnet50 | resnet101 | resnet152");
  std::string& dataset = o.add_string("dataset", "synthetic", "synthetic | cifar10 | cifar100 | folder");
  std::string& data_dir = o.add_string("data", "", "data folder: CIFAR binary files, or train/ and val/ image folders");
  int64_t& image_size = o.add_int("image-size", 0, "training crop (0: 32 for CIFAR and synthetic, 224 for folder)");
  std::string& decode = o.add_string("decode", "cpu",
                                     "cpu | gpu: where --dataset folder decodes its images (gpu: nvJPEG, train and "
                                     "eval; needs a GPU and nvJPEG from scripts/setup.sh)");
  std::string& stem = o.add_string("stem", "auto", "auto | cifar | imagenet (auto: the 3x3 CIFAR stem up to 64 px)");
  int64_t& num_classes = o.add_int("num-classes", 0, "classes of synthetic data (0: 10); others: from the data set");
  int64_t& synthetic_size = o.add_int("synthetic-size", 10000, "synthetic training samples");
  int64_t& synthetic_eval_size = o.add_int("synthetic-eval-size", 1000, "synthetic evaluation samples");
  std::string& device = o.add_string("device", "auto", "auto | cpu | cuda (auto: this process's GPU if any)");
  int64_t& batch_size = o.add_int("batch-size", 128, "samples per process per micro-batch");
  int64_t& eval_batch_size = o.add_int("eval-batch-size", 0, "samples per process per eval batch (0: --batch-size)");
  int64_t& epochs = o.add_int("epochs", 90, "passes over the training set");
  int64_t& steps_per_epoch = o.add_int("steps-per-epoch", 0, "cap on optimizer steps per epoch (0: whole epoch)");
  int64_t& eval_steps = o.add_int("eval-steps", 0, "cap on eval batches per process (0: the whole eval set)");
  int64_t& accumulate = o.add_int("accumulate", 1, "micro-batches per optimizer step (gradient accumulation)");
  std::string& optimizer = o.add_string("optimizer", "sgd", "sgd | adamw");
  double& lr = o.add_double("lr", 0.1, "peak learning rate (for the global batch; scale it with the batch)");
  double& momentum = o.add_double("momentum", 0.9, "SGD momentum");
  bool& nesterov = o.add_flag("nesterov", "SGD with Nesterov momentum");
  double& weight_decay = o.add_double("weight-decay", 1e-4, "weight decay (SGD: L2; AdamW: decoupled)");
  std::string& schedule = o.add_string("schedule", "cosine", "cosine | step (both after a linear warmup)");
  double& warmup_epochs = o.add_double("warmup-epochs", 0, "linear warmup length, in epochs (may be fractional)");
  double& min_lr = o.add_double("min-lr", 0, "cosine: the final learning rate");
  std::string& lr_steps =
      o.add_string("lr-steps", "30,60,80", "step: epochs at which the lr is multiplied by --lr-gamma");
  double& lr_gamma = o.add_double("lr-gamma", 0.1, "step: the factor at each of --lr-steps");
  double& label_smoothing = o.add_double("label-smoothing", 0, "cross-entropy label smoothing, in [0, 1)");
  bool& zero_init_residual = o.add_flag("zero-init-residual", "start each residual branch's last BN at 0");
  std::string& amp = o.add_string("amp", "auto", "bf16 | fp16 | off | auto (GPU: bf16; CPU: off)");
  bool& channels_last = o.add_flag("channels-last", "model and images in NHWC memory (fastest with cuDNN)");
  bool& grad_checkpoint = o.add_flag("grad-checkpoint", "recompute each stage's activations in backward");
  bool& sync_bn = o.add_flag("sync-bn", "batch-norm statistics over all processes (with mpirun)");
  bool& cuda_graph = o.add_flag("cuda-graph",
                                "after 2 eager steps, capture the training step in a CUDA graph and replay it for "
                                "every later batch (one GPU; every batch is full, the last partial one is dropped); "
                                "not with --accumulate > 1, --grad-checkpoint, --profile, mpirun or the CPU");
  int64_t& workers = o.add_int("workers", 4, "data loading threads per process");
  std::string& output = o.add_string("output", "runs/resnet", "folder for checkpoints and CSV files");
  bool& resume = o.add_flag("resume", "continue from the newest complete checkpoint in --output");
  int64_t& checkpoint_every = o.add_int("checkpoint-every", 1000, "save every N optimizer steps (0: epoch ends only)");
  int64_t& keep_checkpoints = o.add_int("keep-checkpoints", 3, "checkpoints kept (0: all)");
  int64_t& log_every = o.add_int("log-every", 50, "progress line and train_log.csv row every N steps");
  std::string& tensorboard = o.add_string("tensorboard", "", "also log the metrics as TensorBoard event files to DIR");
  std::string& export_onnx = o.add_string("export-onnx", "",
                                          "after training, write the model to FILE as ONNX (opset 17, batch norm "
                                          "folded) for ONNX Runtime or TensorRT: input \"images\" (N, 3, H, W) "
                                          "float32 of any batch N, output \"logits\" (N, classes)");
  ex::ProfileOptions profiling = ex::StepProfiler::add_options(o, "<output>/trace.json");
  int64_t& seed = o.add_int("seed", 0, "seed of the initial weights, the data order and the augmentations");
  bool& deterministic = o.add_flag("deterministic", "bit-reproducible GPU kernels (for exact GPU resumes)");
  bool& print_checksum = o.add_flag("print-checksum", "print a checksum of the weights at the end (tests)");
  int64_t& stop_at_step = o.add_int("stop-at-step", 0, "stop after this optimizer step, as if killed (tests)");
  std::string& fake_cifar_dir =
      o.add_string("make-fake-cifar10", "", "write CIFAR-10-format files of patterns to DIR, exit");
  int64_t& fake_cifar_images = o.add_int("fake-images-per-file", 1000, "images per fake CIFAR-10 file (6 files)");

  // Parses the command line and checks the values (exits 2 naming the bad one); fills in the automatic ones.
  void parse(int argc, char** argv);
};

// Step-schedule milestones "30,60,80" -> {30, 60, 80} (epochs).
std::vector<double> parse_milestones(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size() || out.back() <= 0) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      std::cerr << "resnet: --lr-steps takes positive epochs separated by commas (e.g. 30,60,80), got '" << text
                << "'\n";
      std::exit(2);
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& why) {
  std::cout << std::flush;
  std::cerr << "resnet: " << why << "\n";
  std::exit(2);
}

void Config::parse(int argc, char** argv) {
  Config& c = *this;
  o.parse(argc, argv);
  auto one_of = [&](const std::string& name, const std::string& v, std::vector<std::string> allowed) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    o.fail("--" + name + " " + v + " is not known; use one of " + list);
  };
  one_of("model", c.model, {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"});
  one_of("dataset", c.dataset, {"synthetic", "cifar10", "cifar100", "folder"});
  one_of("stem", c.stem, {"auto", "cifar", "imagenet"});
  one_of("optimizer", c.optimizer, {"sgd", "adamw"});
  one_of("schedule", c.schedule, {"cosine", "step"});
  one_of("amp", c.amp, {"auto", "bf16", "fp16", "off"});
  one_of("decode", c.decode, {"cpu", "gpu"});
  if (c.decode == "gpu" && c.dataset != "folder")
    o.fail("--decode gpu decodes the JPEGs of --dataset folder; --dataset " + c.dataset +
           (c.dataset == "synthetic" ? std::string(" has no images to decode") : " is read from binary files") +
           ": leave out --decode");
  auto at_least = [&](const std::string& name, int64_t v, int64_t min) {
    if (v < min) o.fail("--" + name + " must be at least " + std::to_string(min) + ", got " + std::to_string(v));
  };
  at_least("batch-size", c.batch_size, 1);
  at_least("epochs", c.epochs, 1);
  at_least("accumulate", c.accumulate, 1);
  at_least("log-every", c.log_every, 1);
  at_least("fake-images-per-file", c.fake_cifar_images, 1);
  for (auto [name, v] : {std::pair{"eval-batch-size", c.eval_batch_size},
                         {"steps-per-epoch", c.steps_per_epoch},
                         {"eval-steps", c.eval_steps},
                         {"workers", c.workers},
                         {"image-size", c.image_size},
                         {"checkpoint-every", c.checkpoint_every},
                         {"keep-checkpoints", c.keep_checkpoints},
                         {"num-classes", c.num_classes},
                         {"stop-at-step", c.stop_at_step},
                         {"seed", c.seed}})
    at_least(name, v, 0);
  if (!(c.lr > 0)) o.fail("--lr must be positive");
  for (auto [name, v] : {std::pair{"momentum", c.momentum},
                         {"weight-decay", c.weight_decay},
                         {"min-lr", c.min_lr},
                         {"lr-gamma", c.lr_gamma}})
    if (v < 0) o.fail(std::string("--") + name + " must be >= 0, got " + std::to_string(v));
  if (c.label_smoothing < 0 || c.label_smoothing >= 1) o.fail("--label-smoothing must be in [0, 1)");
  if (c.warmup_epochs < 0 || c.warmup_epochs > static_cast<double>(c.epochs))
    o.fail("--warmup-epochs must be between 0 and --epochs");
  if (c.eval_batch_size == 0) c.eval_batch_size = c.batch_size;
  if (c.dataset != "synthetic" && c.num_classes != 0)
    o.fail("--num-classes is for --dataset synthetic; the other data sets say how many classes they have");
  if (c.dataset == "synthetic" && c.num_classes == 0) c.num_classes = 10;
  if (c.dataset != "synthetic" && c.data_dir.empty() && c.fake_cifar_dir.empty())
    o.fail("--dataset " + c.dataset + " needs --data DIR (" +
           (c.dataset == "folder" ? std::string("a folder with train/ and val/, each holding one folder per class")
                                  : "the folder of the CIFAR binary files; --make-fake-cifar10 DIR writes fake ones") +
           ")");
  if (c.dataset.rfind("cifar", 0) == 0 && c.image_size != 0 && c.image_size != 32)
    o.fail("CIFAR images are 32x32: leave out --image-size for --dataset " + c.dataset);
  if (c.image_size == 0) c.image_size = c.dataset == "folder" ? 224 : 32;
  if (c.image_size < 16) o.fail("--image-size must be at least 16");
  if (c.schedule == "step") parse_milestones(c.lr_steps);  // exits with the reason when malformed
  if (!c.export_onnx.empty()) {                            // found out now rather than after the training
    const fs::path folder = fs::path(c.export_onnx).parent_path();
    if (!folder.empty() && !fs::is_directory(folder))
      o.fail("--export-onnx " + c.export_onnx + ": the folder " + folder.string() + " does not exist");
  }
  if (c.cuda_graph) {  // what a replayed step cannot do (the GPU and the number of processes: in run())
    if (const std::string why = ex::cuda_graph_env_conflict(); !why.empty()) o.fail(why);
    if (c.accumulate > 1)
      o.fail("--cuda-graph replays one whole optimizer step per batch; it does not take --accumulate " +
             std::to_string(c.accumulate) + " (raise --batch-size instead, or leave out --cuda-graph)");
    if (c.grad_checkpoint)
      o.fail(
          "--cuda-graph does not take --grad-checkpoint (its recomputation rewinds the random generator, which "
          "replays cannot follow); leave out one of them");
    if (!c.profiling.profile.empty())
      o.fail(
          "--cuda-graph does not take --profile (a replay is one launch, with no ops to time); profile without "
          "--cuda-graph: the eager steps run the same kernels");
    if (c.device == "cpu") o.fail("--cuda-graph needs a GPU, and this run is on the CPU (--device cpu)");
  }
}

// ---------------------------------------------------------------- fake CIFAR-10 files

// Writes data_batch_1..5.bin and test_batch.bin in CIFAR-10's binary format (records of 1 label byte and
// 3072 CHW image bytes). Class k is a colour and stripes at angle k * 18 degrees, with a random phase, period
// and noise per image: learnable, so the learning curve means something, yet no two images are alike.
void write_fake_cifar10(const fs::path& dir, int64_t per_file, uint64_t seed) {
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double pi = std::acos(-1.0);
  std::vector<uint8_t> record(1 + 3 * 32 * 32);
  for (std::string name :
       {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"}) {
    const fs::path path = dir / (name + ".bin");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (int64_t i = 0; i < per_file; ++i) {
      const int label = static_cast<int>(rng() % 10);
      const double angle = label * pi / 10, phase = 2 * pi * uniform(rng), period = 5 + 3 * uniform(rng);
      record[0] = static_cast<uint8_t>(label);
      for (int ch = 0; ch < 3; ++ch) {
        const double colour = 60 * std::cos(2 * pi * (label / 10.0 + ch / 3.0));  // a hue per class
        for (int y = 0; y < 32; ++y) {
          for (int x = 0; x < 32; ++x) {
            const double stripes = 50 * std::sin(2 * pi * (x * std::cos(angle) + y * std::sin(angle)) / period + phase);
            const double v = 128 + colour + stripes + 60 * (uniform(rng) - 0.5);
            record[1 + ch * 1024 + y * 32 + x] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
          }
        }
      }
      out.write(reinterpret_cast<const char*>(record.data()), static_cast<std::streamsize>(record.size()));
    }
    if (!out.flush()) fail("cannot write " + path.string() + " (is the folder writable, is the disk full?)");
  }
  std::cout << "wrote 5 x " << per_file << " training and " << per_file << " test images in CIFAR-10 format to "
            << dir.string() << "\ntrain on them with: resnet --dataset cifar10 --data " << dir.string() << "\n";
}

// ---------------------------------------------------------------- data

struct Data {
  std::shared_ptr<const data::Dataset> train, eval;
  int64_t num_classes = 0;
};

// `folder` is how --dataset folder reads its images (where it decodes them, see run()).
Data make_data(const Config& c, const data::ImageFolderOptions& folder) {
  Data d;
  if (c.dataset == "synthetic") {
    // Standard-normal images (already "normalised") and uniform labels: for throughput and smoke tests; there
    // is nothing to learn beyond memorising. For a learning curve without data use --make-fake-cifar10.
    const std::vector<data::SyntheticField> fields = {{"image", {3, c.image_size, c.image_size}, DType::Float32},
                                                      {"label", {}, DType::Int64, c.num_classes}};
    const auto seed = static_cast<uint64_t>(c.seed);
    d.train = std::make_shared<data::SyntheticDataset>(
        data::SyntheticOptions{.size = c.synthetic_size, .fields = fields, .seed = seed});
    d.eval = std::make_shared<data::SyntheticDataset>(
        data::SyntheticOptions{.size = c.synthetic_eval_size, .fields = fields, .seed = seed + 1});
    d.num_classes = c.num_classes;
    return d;
  }
  if (!fs::is_directory(c.data_dir)) fail("--data " + c.data_dir + ": no such folder");
  try {
    if (c.dataset == "cifar10") {
      d.train = std::make_shared<data::CIFAR10>(
          c.data_dir, data::CIFAR10Options{.split = data::Split::Train, .transform = data::transforms::cifar_train()});
      d.eval = std::make_shared<data::CIFAR10>(
          c.data_dir, data::CIFAR10Options{.split = data::Split::Test, .transform = data::transforms::cifar_eval()});
      d.num_classes = 10;
    } else if (c.dataset == "cifar100") {
      d.train = std::make_shared<data::CIFAR100>(
          c.data_dir, data::CIFAR100Options{.split = data::Split::Train, .transform = data::transforms::cifar_train()});
      d.eval = std::make_shared<data::CIFAR100>(
          c.data_dir, data::CIFAR100Options{.split = data::Split::Test, .transform = data::transforms::cifar_eval()});
      d.num_classes = 100;
    } else {  // folder: ImageNet's layout, root/train/<class>/*.JPEG and root/val/<class>/*.JPEG
      for (const char* split : {"train", "val"}) {
        if (!fs::is_directory(fs::path(c.data_dir) / split))
          fail("--data " + c.data_dir + " has no " + split + "/ folder; --dataset folder expects " + c.data_dir +
               "/train/<class>/<images> and " + c.data_dir + "/val/<class>/<images>");
      }
      // Both pipelines are ones the GPU path runs (RandomResizedCrop + flip; Resize + CenterCrop), so --decode gpu
      // decodes evaluation images on the GPU too.
      auto train = std::make_shared<data::ImageFolder>((fs::path(c.data_dir) / "train").string(),
                                                       data::transforms::imagenet_train(c.image_size), folder);
      auto eval = std::make_shared<data::ImageFolder>((fs::path(c.data_dir) / "val").string(),
                                                      data::transforms::imagenet_eval(c.image_size), folder);
      if (train->classes() != eval->classes())
        fail("--data " + c.data_dir + ": train/ has " + std::to_string(train->classes().size()) +
             " class folders and val/ has " + std::to_string(eval->classes().size()) +
             " (or other names); both need the same class folders");
      d.num_classes = static_cast<int64_t>(train->classes().size());
      d.train = train;
      d.eval = eval;
    }
  } catch (const kiln::Error& e) {
    fail("cannot read --dataset " + c.dataset + " from " + c.data_dir + ": " + e.what());
  }
  return d;
}

// --decode gpu: decodes the first training image through the loader's collate, on this process's GPU, before
// anything else, so that a kiln built without nvJPEG, or a libnvjpeg that cannot be found, stops the run here with
// kiln's message and this program's way out, rather than from the loader's first batch after the model is built.
void check_gpu_decode(const data::Dataset& train, Device dev, uint64_t seed) {
  cuda::DeviceGuard on_dev(dev.index());  // where the loader's collate decodes (its options.device)
  data::SampleRng rng(seed, 0, 0);
  std::vector<data::Example> first = {train.get(0, rng)};  // reads the file; a bad one throws, naming it
  try {
    data::Batch batch = train.collate_fn()(first, /*pinned=*/false);
    if (batch.ready) batch.ready->synchronize();
  } catch (const kiln::Error& e) {
    fail(std::string("--decode gpu: decoding the first training image on the GPU failed: ") + e.what() +
         "\nIn this program: --decode cpu decodes on the CPU.");
  }
}

// This process's share of the evaluation set without padding (DistributedSampler repeats samples to even the
// shards out, which would count some twice): rank r takes r, r + W, r + 2W, ... The shards differ in size by
// at most one sample, which is fine in eval: nothing in it communicates before the final all-reduce.
class ShardSampler : public data::Sampler {
 public:
  ShardSampler(int64_t n, int rank, int world) : n_(n), rank_(rank), world_(world) {}
  int64_t size() const override { return n_ > rank_ ? (n_ - rank_ - 1) / world_ + 1 : 0; }
  std::vector<int64_t> indices(uint64_t) const override {
    std::vector<int64_t> out;
    for (int64_t i = rank_; i < n_; i += world_) out.push_back(i);
    return out;
  }

 private:
  int64_t n_, rank_, world_;
};

// ---------------------------------------------------------------- model

struct Precision {
  bool autocast = false;
  DType dtype = DType::BFloat16;  // of the autocast region (float16 also needs the GradScaler)
};

nn::Handle<nn::models::ResNet> make_model(const Config& c, int64_t num_classes) {
  nn::models::ResNetOptions o{.num_classes = num_classes,
                              .zero_init_residual = c.zero_init_residual,
                              .cifar_stem = c.stem == "cifar" || (c.stem == "auto" && c.image_size <= 64)};
  if (c.model == "resnet18") return nn::models::resnet18(o);
  if (c.model == "resnet34") return nn::models::resnet34(o);
  if (c.model == "resnet50") return nn::models::resnet50(o);
  if (c.model == "resnet101") return nn::models::resnet101(o);
  return nn::models::resnet152(o);
}

// The model's forward; with checkpoint_stages, each of layer1..layer4 keeps only its input and recomputes its
// activations in backward. ResNet has no switch for it, so this walks the model's public children as
// ResNet::forward does. (N, 3, H, W) -> logits (N, classes).
Tensor forward(nn::models::ResNet& m, const Tensor& x, bool checkpoint_stages) {
  if (!checkpoint_stages) return m(x);
  Tensor h = m.maxpool(m.bn1->forward_relu(m.conv1(x)));  // (N, 64, H / 4, W / 4); H, W with the CIFAR stem
  for (const auto& stage : {m.layer1, m.layer2, m.layer3, m.layer4}) {
    // The recomputation in backward replays forward's random generators and autocast state (the same dtypes).
    h = autograd::checkpoint([stage](const Tensor& in) { return stage(in); }, h);
  }
  return m.fc(flatten(m.avgpool(h), 1));  // (N, 512 e, 1, 1) -> (N, 512 e) -> (N, classes)
}

// ---------------------------------------------------------------- optimizer and schedule

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, std::vector<Tensor> params) {
  if (c.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(std::move(params),
                                          optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay});
  return std::make_unique<optim::SGD>(
      std::move(params),
      optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay, .nesterov = c.nesterov});
}

// Stepped once per optimizer step (not per epoch), so the warmup is smooth and a mid-epoch resume is exact.
std::unique_ptr<optim::LRScheduler> make_scheduler(const Config& c, optim::Optimizer& opt, int64_t steps_per_epoch) {
  const int64_t total = c.epochs * steps_per_epoch;
  const auto warmup = static_cast<int64_t>(std::llround(c.warmup_epochs * static_cast<double>(steps_per_epoch)));
  if (c.schedule == "cosine") return optim::linear_warmup_cosine_decay(opt, warmup, total, c.min_lr);
  // step: the milestones count from the end of the warmup (SequentialLR restarts the count of its second part)
  std::vector<int64_t> milestones;
  for (double e : parse_milestones(c.lr_steps))
    milestones.push_back(std::max<int64_t>(1, std::llround(e * static_cast<double>(steps_per_epoch)) - warmup));
  auto steps = std::make_unique<optim::MultiStepLR>(opt, milestones, c.lr_gamma);
  if (warmup == 0) return steps;
  return optim::warmup_then(opt, warmup, std::move(steps));
}

// ---------------------------------------------------------------- evaluation

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0, samples = 0;
};

// Loss, top-1 and top-5 accuracy over the evaluation set, summed over every process (so all ranks agree).
EvalResult evaluate(nn::models::ResNet& model, data::DataLoader& loader, const Config& c, Device dev,
                    Precision precision) {
  model.eval();
  NoGradGuard no_grad;
  const int64_t k = std::min<int64_t>(5, model.options.num_classes);
  Tensor sums = zeros({3}, {.dtype = DType::Float64, .device = dev});  // loss sum, top-1 hits, top-5 hits
  int64_t samples = 0, batches = 0;
  for (data::Batch& batch : loader.epoch(0)) {
    if (c.eval_steps > 0 && batches++ >= c.eval_steps) break;
    auto [images, labels] = batch;  // (N, 3, H, W) float32 (--decode gpu: maybe bfloat16), (N) int64, on `dev`
    Tensor x = c.channels_last ? images.contiguous(MemoryFormat::ChannelsLast) : images;
    Tensor logits, loss_sum;
    {
      amp::Autocast cast(precision.dtype, precision.autocast);
      logits = model(x);                                                                // (N, classes)
      loss_sum = nn::cross_entropy(logits, labels, {.reduction = nn::Reduction::Sum});  // plain loss, no smoothing
    }
    Tensor top_classes = std::get<1>(topk(logits.to(DType::Float32), k, 1));  // (N, k); logits may be 16-bit
    Tensor hits = top_classes.eq(labels.unsqueeze(1));                        // (N, k) bool: at most one true per row
    sums.add_(stack(
        {loss_sum.to(DType::Float64), hits.narrow(1, 0, 1).sum().to(DType::Float64), hits.sum().to(DType::Float64)}));
    samples += batch.batch_size();
  }
  Tensor totals = cat({sums, full({1}, static_cast<double>(samples), {.dtype = DType::Float64, .device = dev})});
  dist::all_reduce(totals);  // (4): sum over ranks (a no-op with one process)
  const std::vector<double> t = totals.to_vector<double>();
  model.train();
  if (t[3] == 0) return {};
  return {t[0] / t[3], t[1] / t[3], t[2] / t[3], t[3]};
}

// A checksum of every parameter and buffer, to compare runs (the resume test): sum and sum of magnitudes.
std::string weights_checksum(nn::Module& model) {
  double sum = 0, magnitude = 0;
  std::vector<Tensor> all = model.parameters();
  for (const Tensor& b : model.buffers()) all.push_back(b);
  for (const Tensor& t : all) {
    Tensor d = t.detach().to(DType::Float64);
    sum += d.sum().item<double>();
    magnitude += d.abs().sum().item<double>();
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.17g %.17g", sum, magnitude);
  return buf;
}

// ---------------------------------------------------------------- export

// --export-onnx: the trained model as ONNX (opset 17), for ONNX Runtime and TensorRT. Traced in eval mode (batch norm
// on its running statistics, then folded into the convolution before it) on one image of the training size, on the
// model's device; called outside every autocast region, so the graph computes in float32 with the float32 weights.
void export_model(nn::models::ResNet& model, const Config& c, Device dev) {
  model.eval();  // (export_onnx would trace in eval mode anyway, with a warning)
  const Tensor example = randn({1, 3, c.image_size, c.image_size}, {.device = dev});  // (1, 3, H, W) float32
  const io::OnnxExportReport r = io::export_onnx(model, example, c.export_onnx,
                                                 {.input_names = {"images"},
                                                  .output_names = {"logits"},
                                                  .dynamic_axes = {{"images", {{0, "batch"}}}},
                                                  .fold_batch_norm = true});
  std::cout << "exported " << c.export_onnx << ": " << r.nodes << " ONNX nodes, " << r.bytes
            << " bytes; run it with ONNX Runtime or trtexec --onnx=" << c.export_onnx << "\n";
}

// ---------------------------------------------------------------- training

int run(int argc, char** argv) {
  Config c;
  c.parse(argc, argv);
  if (!c.fake_cifar_dir.empty()) {
    write_fake_cifar10(c.fake_cifar_dir, c.fake_cifar_images, static_cast<uint64_t>(c.seed));
    return 0;
  }

  const dist::Env& env = dist::init();  // one process, or one rank of mpirun -np N
  const Device dev = ex::pick_device(c.device, env);
  const bool main_rank = env.is_main();
  if (c.cuda_graph && env.world_size > 1)
    c.o.fail(
        "--cuda-graph runs on one GPU for now: the gradient all-reduce of dist::DataParallel cannot be captured; "
        "run the " +
        std::to_string(env.world_size) + " processes without --cuda-graph");
  if (c.cuda_graph && !dev.is_cuda())
    c.o.fail("--cuda-graph needs a GPU, and none is visible (or kiln was built without CUDA); leave out --cuda-graph");
  if (dev.is_cpu() && env.local_world_size > 1 && std::getenv("KILN_NUM_THREADS") == nullptr) {
    // CPU processes of one node would otherwise each start a thread per core, and fight over them.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_num_threads(std::max(1, cores / env.local_world_size));
  }
  Precision precision;
  if (dev.is_cuda() && c.amp != "off") precision = {true, c.amp == "fp16" ? DType::Float16 : DType::BFloat16};
  if (dev.is_cpu() && (c.amp == "bf16" || c.amp == "fp16") && main_rank)
    std::cout << "note: --amp " << c.amp << " is for the GPU; on the CPU the model trains in float32\n";
  if (c.deterministic) set_deterministic(true);
  if (dev.is_cuda() && !c.deterministic) nn::set_cudnn_benchmark(true);  // time cuDNN's algorithms once per shape
  manual_seed(static_cast<uint64_t>(c.seed));  // the same initial weights on every rank (DDP broadcasts anyway)

  // --decode gpu: the loaders' collate decodes each batch with nvJPEG on this process's GPU and hands it over in
  // the format the model takes it: channels-last with --channels-last (the model's own format, no copy), and
  // bfloat16 under bf16 autocast (what the first convolution casts it to anyway: half the bytes); otherwise
  // float32 (the GPU path writes float32 or bfloat16 only; fp16 autocast casts it).
  data::ImageFolderOptions folder;
  if (c.decode == "gpu") {
    if (!dev.is_cuda())
      fail(c.device == "cpu" ? "--decode gpu needs a GPU, and this run is on the CPU (--device cpu); use --decode cpu"
                             : "--decode gpu needs a GPU, and none is visible (or kiln was built without CUDA); use "
                               "--decode cpu");
    folder.decode = data::Decode::Gpu;
    folder.gpu = {.dtype = precision.autocast && precision.dtype == DType::BFloat16 ? DType::BFloat16 : DType::Float32,
                  .channels_last = c.channels_last};
  }

  // Data: the training loader shards by rank by itself (DistributedSampler); drop_last keeps every step's
  // batch full, as BatchNorm and the all-reduce like it.
  Data d = make_data(c, folder);
  if (c.decode == "gpu") check_gpu_decode(*d.train, dev, static_cast<uint64_t>(c.seed));
  std::optional<Device> delivery;
  if (dev.is_cuda()) delivery = dev;  // pinned batches, copied ahead on the loader's stream
  const auto seed = static_cast<uint64_t>(c.seed);
  data::DataLoader train_loader(d.train, {.batch_size = c.batch_size,
                                          .workers = static_cast<int>(c.workers),
                                          .shuffle = true,
                                          .seed = seed,
                                          .drop_last = true,
                                          .device = delivery,
                                          .prefetch_next_epoch = true});  // epochs in order: no bubble between them
  data::DataLoader eval_loader(d.eval,
                               {.batch_size = c.eval_batch_size,
                                .workers = static_cast<int>(c.workers),
                                .seed = seed,
                                .sampler = std::make_shared<ShardSampler>(d.eval->size(), env.rank, env.world_size),
                                .device = delivery});  // evaluated as epoch 0 every time: nothing loaded ahead
  int64_t steps_per_epoch = train_loader.size() / c.accumulate;  // leftover micro-batches are skipped
  if (steps_per_epoch == 0)
    fail(d.train->describe() + " gives " + std::to_string(train_loader.size()) +
         " full batches per process, fewer than one optimizer step (--accumulate " + std::to_string(c.accumulate) +
         "); lower --batch-size or --accumulate, or use more data");
  if (c.steps_per_epoch > 0) steps_per_epoch = std::min(steps_per_epoch, c.steps_per_epoch);
  const int64_t total_steps = c.epochs * steps_per_epoch;

  // Model, optimizer, schedule, loss scaling.
  auto model = make_model(c, d.num_classes);
  if (c.channels_last) {
    model->to(dev, MemoryFormat::ChannelsLast);
  } else {
    model->to(dev);
  }
  if (c.sync_bn && env.distributed()) dist::convert_sync_batchnorm(*model);  // before DataParallel sees it
  auto opt = make_optimizer(c, model->parameters());
  auto sched = make_scheduler(c, *opt, steps_per_epoch);
  amp::GradScaler scaler({.enabled = precision.autocast && precision.dtype == DType::Float16});

  if (main_rank) {
    std::printf("kiln %s | %s (%.2fM parameters, %s stem) | %s: %lld train, %lld eval samples, %lld classes\n",
                KILN_VERSION_STRING, c.model.c_str(), model->num_parameters() / 1e6,
                model->options.cifar_stem ? "CIFAR" : "ImageNet", c.dataset.c_str(),
                static_cast<long long>(d.train->size()), static_cast<long long>(d.eval->size()),
                static_cast<long long>(d.num_classes));
    std::printf(
        "%d process(es) on %s | amp %s | global batch %lld (%lld x %d x %lld) | %lld steps/epoch, %lld "
        "epochs | %s, lr %g, %s schedule%s\n",
        env.world_size, dev.is_cuda() ? "cuda" : "cpu",
        precision.autocast ? (precision.dtype == DType::Float16 ? "fp16" : "bf16") : "off",
        static_cast<long long>(c.batch_size * env.world_size * c.accumulate), static_cast<long long>(c.batch_size),
        env.world_size, static_cast<long long>(c.accumulate), static_cast<long long>(steps_per_epoch),
        static_cast<long long>(c.epochs), c.optimizer.c_str(), c.lr, c.schedule.c_str(),
        c.cuda_graph ? " | CUDA graph from the 3rd step" : "");
    if (c.decode == "gpu")
      std::printf("images decoded on the GPU (nvJPEG) into %s%s batches\n",
                  folder.gpu.dtype == DType::BFloat16 ? "bfloat16" : "float32",
                  folder.gpu.channels_last ? " channels-last" : "");
    std::fflush(stdout);
  }

  // Checkpoints: every part a run needs to continue exactly, the loader position included.
  const fs::path out_dir = c.output;
  fs::create_directories(out_dir);
  io::CheckpointManager ckpt(out_dir.string(), {.keep_last = static_cast<int>(c.keep_checkpoints), .prefix = "ckpt"});
  data::LoaderPosition pos;
  io::Metadata meta;
  io::CheckpointParts parts{.model = model.get(),
                            .optimizer = opt.get(),
                            .scheduler = sched.get(),
                            .scaler = &scaler,
                            .generators = true,
                            .loader = &pos,
                            .metadata = &meta};
  int64_t global_step = 0;
  // The training loss summed over this epoch's micro-batches (all ranks), and their count, at the checkpoint: the
  // resumed run's train_loss of that epoch is then the one an uninterrupted run gets.
  std::pair<double, double> resumed_epoch_sums{0, 0};
  const auto latest = ckpt.latest();
  if (latest && !c.resume)
    fail(out_dir.string() + " already holds checkpoints (newest: " + *latest +
         "); pass --resume to continue that run, or choose another --output");
  if (latest) {
    io::load_checkpoint(*latest, {.metadata = &meta});  // first only the metadata, to check the setup matches
    for (auto [key, now] : {std::pair<std::string, std::string>{"model", c.model}, {"dataset", c.dataset}}) {
      if (meta.strings[key] != now)
        fail(*latest + " is of --" + key + " " + meta.strings[key] + ", this run has --" + key + " " + now +
             "; resume with the same one, or choose another --output");
    }
    for (auto [key, now] : {std::pair<std::string, int64_t>{"batch_size", c.batch_size},
                            {"accumulate", c.accumulate},
                            {"world_size", env.world_size},
                            {"steps_per_epoch", steps_per_epoch}}) {
      const auto was = static_cast<int64_t>(meta.numbers[key]);
      if (was != now)
        fail(*latest + " was saved with " + key + " " + std::to_string(was) + ", this run has " + std::to_string(now) +
             "; the loader position and the schedule count in those: resume with the same --batch-size, "
             "--accumulate, --steps-per-epoch, data set and number of processes");
    }
    global_step = ckpt.resume(parts).value();
    if (main_rank) resumed_epoch_sums = {meta.numbers["epoch_loss_sum"], meta.numbers["epoch_micro"]};
    if (main_rank)
      std::cout << "resumed from " << *latest << ": step " << global_step << ", epoch " << pos.epoch + 1 << " batch "
                << pos.batch << "\n";
    if (static_cast<int64_t>(pos.epoch) >= c.epochs && main_rank)
      std::cout << "the checkpoint is at epoch " << pos.epoch + 1 << ", past --epochs " << c.epochs
                << ": nothing to train; raise --epochs to train longer\n";
  } else if (c.resume && main_rank) {
    std::cout << "no checkpoint in " << out_dir.string() << " yet: starting from the beginning\n";
  }
  auto save = [&](data::LoaderPosition at, std::pair<double, double> epoch_sums) {
    pos = at;
    meta.numbers = {{"step", static_cast<double>(global_step)},
                    {"epoch_loss_sum", epoch_sums.first},
                    {"epoch_micro", epoch_sums.second},
                    {"epoch", static_cast<double>(at.epoch)},
                    {"batch_size", static_cast<double>(c.batch_size)},
                    {"accumulate", static_cast<double>(c.accumulate)},
                    {"world_size", static_cast<double>(env.world_size)},
                    {"steps_per_epoch", static_cast<double>(steps_per_epoch)}};
    meta.strings = {{"model", c.model}, {"dataset", c.dataset}};
    ckpt.save(global_step, parts);  // every rank: rank 0 the shared parts, each rank its generators and position
  };

  dist::DataParallel ddp(model);  // broadcasts rank 0's weights and buffers; averages gradients in backward
  model->train();

  // Metrics, written by rank 0: a train_log.csv row per progress line, a metrics.csv row per epoch, and with
  // --tensorboard both in one event folder (train/... and epoch/... scalars, one writer shared). A resumed run
  // redoes the steps after its checkpoint's: the rows and points from step global_step + 1 on (steps count from
  // 1) are the interrupted run's, and are dropped.
  const int64_t resume_step = latest ? global_step + 1 : -1;
  monitor::MetricsLogger step_log({.csv = out_dir / "train_log.csv",
                                   .columns = {"epoch", "step", "loss", "lr", "data_wait", "time_s"},
                                   .tensorboard_dir = c.tensorboard,
                                   .tag_prefix = "train/",
                                   .resume_step = resume_step,
                                   .enabled = main_rank});
  monitor::MetricsLogger epoch_log(
      {.csv = out_dir / "metrics.csv",
       .columns = {"epoch", "step", "train_loss", "eval_loss", "top1", "top5", "lr", "epoch_time_s", "samples_per_s"},
       .tensorboard = step_log.tensorboard(),
       .tag_prefix = "epoch/",
       .resume_step = resume_step,
       .enabled = main_rank});

  const auto run_start = std::chrono::steady_clock::now();
  auto seconds_since = [](auto start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto scalar = [&] { return zeros({}, {.dtype = DType::Float64, .device = dev}); };
  Tensor step_loss = scalar();  // device values, read on the host only when printed (no per-step sync)
  double lr = opt->lr(0);
  // A loss sum and a micro-batch count, summed over the ranks (every rank must call it: a collective).
  auto sum_over_ranks = [&](const Tensor& loss_sum, int64_t count) -> std::pair<double, double> {
    Tensor t =
        cat({loss_sum.reshape({1}), full({1}, static_cast<double>(count), {.dtype = DType::Float64, .device = dev})});
    dist::all_reduce(t);
    const std::vector<double> v = t.to_vector<double>();
    return {v[0], v[1]};
  };
  const data::LoaderPosition start = pos;

  // --profile / --nvtx: kiln's profiler over a few steps (the top ops and a trace file), NVTX ranges for nsys.
  const std::string trace_path =
      c.profiling.trace == "<output>/trace.json" ? (out_dir / "trace.json").string() : c.profiling.trace;
  ex::StepProfiler profiler(c.profiling, trace_path, main_rank, env.rank, env.world_size);

  // --cuda-graph: the whole optimizer step (no accumulation) on static input tensors that each batch is copied
  // into; eager for the first 2 steps of this process, captured at the third (which trains too), replayed after.
  // It leaves the step's loss in graph_loss, a tensor of its own that each replay writes.
  ex::StaticBatch graph_inputs;  // "image" (N, 3, H, W) in the model's layout, "label" (N) int64
  Tensor graph_loss;             // 0-d float32
  std::optional<ex::GraphedStep> graphed;
  if (c.cuda_graph) {
    graph_loss = zeros({}, {.dtype = DType::Float32, .device = dev});
    graphed.emplace([&] {
      Tensor loss;
      {
        amp::Autocast cast(precision.dtype, precision.autocast);
        loss = nn::cross_entropy(model(graph_inputs.batch()[0]), graph_inputs.batch()[1],
                                 {.label_smoothing = c.label_smoothing});
      }
      scaler.scale(loss).backward();
      graph_loss.copy_(loss.detach());
      scaler.step(*opt);  // skipped on the device if an fp16 gradient overflowed
      scaler.update();
      opt->zero_grad();
    });
  }

  for (auto epoch = static_cast<int64_t>(pos.epoch); epoch < c.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    // Made per epoch, so that its samples/s and ETA count training only, not the evaluation between epochs.
    ex::Progress progress(total_steps, c.batch_size * env.world_size * c.accumulate, dev);
    const bool resumed_epoch = epoch == static_cast<int64_t>(start.epoch) && start.batch > 0;
    const int64_t first_batch = resumed_epoch ? start.batch : 0;
    Tensor epoch_loss = scalar(), window_loss = scalar();
    int64_t epoch_micro = 0, window_micro = 0, epoch_steps = 0;
    if (resumed_epoch) {  // rank 0 carries the sums of the part before the checkpoint, the other ranks start at 0
      epoch_loss.fill_(resumed_epoch_sums.first);
      epoch_micro = static_cast<int64_t>(resumed_epoch_sums.second);
    }
    auto range = train_loader.epoch(static_cast<uint64_t>(epoch), first_batch);
    int64_t micro = first_batch;  // micro-batches of this epoch handed out so far
    for (data::Batch& batch : range) {
      if (micro / c.accumulate >= steps_per_epoch) break;  // --steps-per-epoch, or the leftover micro-batches
      auto [images, labels] = batch;  // (N, 3, H, W) float32 (--decode gpu: maybe bfloat16), (N) int64, on `dev`
      // In the model's layout; --cuda-graph only for its first batch, which sets the static tensors' layout (later
      // batches are converted on their way into them).
      const bool convert = c.channels_last && (!graphed || graph_inputs.empty());
      Tensor x = convert ? images.contiguous(MemoryFormat::ChannelsLast) : images;
      const bool first_micro = micro % c.accumulate == 0;
      ++micro;
      const bool step_now = micro % c.accumulate == 0;
      Tensor l;       // this micro-batch's loss, on the device
      if (graphed) {  // the whole step, optimizer and zero_grad included (--cuda-graph: no accumulation)
        graph_inputs.copy_from(data::Batch{{"image", x}, {"label", labels}});
        if (graphed->run() && main_rank)
          std::cout << "cuda graph: the training step was captured at step " << global_step + 1
                    << "; the later steps replay it" << std::endl;
        l = graph_loss;
      } else {
        Tensor loss;
        {
          amp::Autocast cast(precision.dtype, precision.autocast);  // matmuls/convs in 16 bits, losses in float32
          loss =
              nn::cross_entropy(forward(*model, x, c.grad_checkpoint), labels, {.label_smoothing = c.label_smoothing});
        }
        // The step's gradient is the mean over its micro-batches; fp16 scales it up so that it does not underflow.
        Tensor scaled = scaler.scale(c.accumulate > 1 ? loss * (1.0 / static_cast<double>(c.accumulate)) : loss);
        if (step_now) {
          scaled.backward();  // the gradient all-reduce runs during this backward
        } else {
          auto local = ddp.no_sync();  // accumulate locally; the step's last backward averages the sum
          scaled.backward();
        }
        l = loss.detach();
      }
      if (first_micro) step_loss.zero_();
      step_loss.add_(l);
      epoch_loss.add_(l);
      window_loss.add_(l);
      ++epoch_micro;
      ++window_micro;
      if (!step_now) continue;

      lr = opt->lr(0);  // the rate of this step (the scheduler sets the next one below)
      if (!graphed) {
        scaler.step(*opt);  // skipped if an fp16 gradient overflowed
        scaler.update();
        opt->zero_grad();
      }
      sched->step();  // a replay reads the optimizer's learning rate before it runs
      ++global_step;
      ++epoch_steps;
      profiler.step();
      const bool epoch_end = micro / c.accumulate >= steps_per_epoch;

      if (main_rank && (global_step % c.log_every == 0 || epoch_end)) {
        const double mean_loss = window_loss.item<double>() / static_cast<double>(window_micro);  // syncs here only
        const double wait = range.stats().wait_fraction;
        std::cout << progress.line(epoch + 1, global_step, epoch_steps, mean_loss, lr, wait) << std::endl;
        step_log.log(global_step, {{"epoch", epoch + 1},
                                   {"loss", mean_loss},
                                   {"lr", lr},
                                   {"data_wait", wait},
                                   {"time_s", seconds_since(run_start)}});
        window_loss.zero_();
        window_micro = 0;
      }
      // Mid-epoch checkpoints; the one at the end of the epoch is written after the evaluation.
      if (c.checkpoint_every > 0 && global_step % c.checkpoint_every == 0 && !epoch_end)
        save(range.position(), sum_over_ranks(epoch_loss, epoch_micro));
      if (c.stop_at_step > 0 && global_step == c.stop_at_step) {
        if (main_rank) std::cout << "stopping after step " << global_step << " (--stop-at-step), as if killed\n";
        return 0;
      }
    }

    // End of the epoch: evaluate, log, checkpoint (positioned at the start of the next epoch).
    const auto [loss_sum, micro_count] = sum_over_ranks(epoch_loss, epoch_micro);
    const double train_loss = micro_count > 0 ? loss_sum / micro_count : 0;  // over every rank's micro-batches
    const double epoch_s = seconds_since(epoch_start);                       // training only
    const double rate = static_cast<double>(epoch_steps * c.batch_size * env.world_size * c.accumulate) / epoch_s;
    const EvalResult ev = evaluate(*model, eval_loader, c, dev, precision);
    if (main_rank) {
      std::printf(
          "epoch %lld done: train loss %.4f | eval loss %.4f, top-1 %.2f%%, top-5 %.2f%% (%.0f samples) | "
          "train %.1f s, %.0f samples/s\n",
          static_cast<long long>(epoch + 1), train_loss, ev.loss, 100 * ev.top1, 100 * ev.top5, ev.samples, epoch_s,
          rate);
      std::fflush(stdout);
      epoch_log.log(global_step, {{"epoch", epoch + 1},
                                  {"train_loss", train_loss},
                                  {"eval_loss", ev.loss},
                                  {"top1", ev.top1},
                                  {"top5", ev.top5},
                                  {"lr", lr},
                                  {"epoch_time_s", epoch_s},
                                  {"samples_per_s", rate}});
    }
    save({static_cast<uint64_t>(epoch + 1), 0}, {0, 0});
  }

  if (main_rank) {
    std::cout << "done: " << global_step << " steps; checkpoints, metrics.csv and train_log.csv in " << out_dir.string()
              << (c.tensorboard.empty() ? "" : "; TensorBoard event files in " + c.tensorboard) << "\n";
    if (c.print_checksum)
      std::printf("checksum %s final loss %.9g\n", weights_checksum(*model).c_str(),
                  step_loss.item<double>() / static_cast<double>(c.accumulate));
    if (!c.export_onnx.empty()) export_model(*model, c, dev);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // kiln reports misuse, bad files and failed collectives as kiln::Error, with what to do: print it and exit
  // non-zero (under mpirun that ends the whole job) rather than abort.
  try {
    return run(argc, argv);
  } catch (const kiln::Error& e) {
    std::cout << std::flush;
    std::cerr << "resnet: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout << std::flush;
    std::cerr << "resnet: error: " << e.what() << "\n";
    return 1;
  }
}
