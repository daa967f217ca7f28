// bench/bench_data_loader.cpp — the whole input pipeline: ImageFolder + imagenet_train(224) through the
// DataLoader with 1..16 worker threads, batches collated into pinned memory and delivered to the GPU when
// there is one (on the CPU otherwise). bench/pytorch_data_loader.py runs the same through torchvision's
// ImageFolder and torch.utils.data.DataLoader. With --cifar DIR: CIFAR-10's binary training files through
// cifar_train() (pad-4 random crop, flip, normalise) instead, batches of 512 by default (the ResNet-18/CIFAR case).
//
//   python3 bench/make_photos.py /tmp/photos --count 2400
//   ./build/bench/bench_data_loader /tmp/photos [--batch 64] [--workers 1,2,4,8,16] [--seconds 4]
//   ./build/examples/resnet/resnet --make-fake-cifar10 /tmp/cifar     # or the real data-batch_*.bin files
//   ./build/bench/bench_data_loader --cifar /tmp/cifar [--batch 512]
//   ./build/bench/bench_data_loader --synthetic 224 [--batch 256]   # the examples' synthetic images (normal noise)
//
// For each worker count it runs whole epochs (shuffled, drop_last) until --seconds have passed, after one
// untimed epoch, and prints one JSON line: images/s delivered (the clock stops when the last batch is on the
// device), and the share of the time the consumer waited for data. The files come from the page cache
// after the first epoch: this measures decoding and augmentation, not the disk.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/tensor/cuda.h"

namespace {

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  std::string folder = std::getenv("KILN_BENCH_IMAGES") ? std::getenv("KILN_BENCH_IMAGES") : "";
  std::string cifar;
  int64_t synthetic = 0;  // --synthetic SIZE: SyntheticDataset images (3, SIZE, SIZE) float32 and labels
  int64_t batch = 0;      // 64 for JPEGs, 512 for CIFAR
  double seconds = 4;
  std::vector<int> workers = {1, 2, 4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) {
      batch = std::stoll(argv[++i]);
    } else if (a == "--workers" && i + 1 < argc) {
      workers = parse_list(argv[++i]);
    } else if (a == "--cifar" && i + 1 < argc) {
      cifar = argv[++i];
    } else if (a == "--synthetic" && i + 1 < argc) {
      synthetic = std::stoll(argv[++i]);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_data_loader FOLDER [--batch 64] [--workers 1,2,4,8,16] [--seconds 4]\n"
          "       bench_data_loader --cifar DIR [--batch 512] [--workers ...] [--seconds 4]\n"
          "       bench_data_loader --synthetic SIZE [--batch 256] [--workers ...] [--seconds 4]\n");
      return 0;
    } else {
      folder = a;
    }
  }
  if (folder.empty() && cifar.empty() && synthetic <= 0) {
    std::fprintf(stderr,
                 "bench_data_loader: give a folder of JPEGs in ImageFolder layout (bench/make_photos.py), or --cifar "
                 "DIR with CIFAR-10's binary files\n");
    return 2;
  }
  if (batch == 0) batch = !cifar.empty() ? 512 : synthetic > 0 ? 256 : 64;
  const std::string data_name = !cifar.empty() ? "cifar10" : synthetic > 0 ? "synthetic" : "jpeg";
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool gpu = cuda::is_available();
  const Device dev = gpu ? Device::cuda(0) : Device::cpu();
  std::shared_ptr<const data::Dataset> dataset;
  if (synthetic > 0) {
    const std::vector<data::SyntheticField> fields = {{"image", {3, synthetic, synthetic}, DType::Float32},
                                                      {"label", {}, DType::Int64, 1000}};
    dataset = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{.size = 4096, .fields = fields});
  } else if (cifar.empty()) {
    dataset = std::make_shared<data::ImageFolder>(folder, data::transforms::imagenet_train(224));
  } else {
    dataset = std::make_shared<data::CIFAR10>(
        cifar, data::CIFAR10Options{.split = data::Split::Train, .transform = data::transforms::cifar_train()});
  }
  for (int w : workers) {
    if (w > static_cast<int>(cores)) continue;
    data::DataLoader loader(dataset,
                            {.batch_size = batch,
                             .workers = w,
                             .shuffle = true,
                             .drop_last = true,
                             .pin_memory = gpu,
                             .device = dev,
                             .prefetch_next_epoch = true});  // as PyTorch's persistent workers (pytorch_data_loader.py)
    auto run_epoch = [&](uint64_t e) {
      int64_t images = 0;
      for (data::Batch& b : loader.epoch(e)) images += b.batch_size();
      return images;
    };
    run_epoch(0);  // warm-up: page cache, allocators
    if (gpu) cuda::synchronize();
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    int64_t images = 0;
    double wait = 0;
    uint64_t e = 1;
    double elapsed = 0;
    while (elapsed < seconds || e < 3) {
      images += run_epoch(e++);
      wait += loader.stats().total_wait_s;
      if (gpu) cuda::synchronize();
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    }
    std::printf(
        "{\"bench\": \"data_loader\", \"impl\": \"kiln\", \"data\": \"%s\", \"workers\": %d, \"batch\": %lld, "
        "\"device\": \"%s\", "
        "\"images\": %lld, \"seconds\": %.3f, \"images_per_s\": %.1f, \"per_worker\": %.1f, \"wait_share\": %.3f}\n",
        data_name.c_str(), w, static_cast<long long>(batch), gpu ? "cuda" : "cpu", static_cast<long long>(images),
        elapsed, images / elapsed, images / elapsed / w, wait / elapsed);
    std::fflush(stdout);
  }
  return 0;
}
