// bench/bench_images.cpp — image loading throughput: JPEG decoding and the ImageNet training transforms, on
// 1..16 threads, over a folder of JPEG photos (bench/make_photos.py builds one).
//
//   ./build/bench/bench_images /tmp/photos                 or   KILN_BENCH_IMAGES=/tmp/photos
//   ./build/bench/bench_images
//   ./build/bench/bench_images /tmp/photos --seconds 5 --threads 1,4,16
//   ./build/bench/bench_images --quick                     a few synthetic images: checks that it runs
//
// The files are read into memory first (the benchmark measures the CPU work, not the disk). Each thread loops
// over all the files from its own starting point for --seconds (3), after one untimed pass. Cases:
//   decode                     data::decode_image: the whole JPEG to uint8 (H, W, 3)
//   decode+imagenet_train      transforms::imagenet_train(224).load: planned decode (crop, DCT scaling) +
//                              RandomResizedCrop + flip + ToTensor + Normalize
//   decode+imagenet_train_full the same transforms after a full decode (no decode plan)
//   decode+imagenet_eval       transforms::imagenet_eval(224).load: Resize(256) + CenterCrop + ...
// One JSON line per (case, threads): images/s in total and per thread. bench/pytorch_images.py prints the same
// for PIL and torchvision.
//
// --gpu [--batch N]: instead, GPU decoding on cuda:0 (nvJPEG, kiln/data/gpu_decode/), as ImageFolder with
// Decode::Gpu does it in the loader's worker threads: each thread makes batches of N (256) samples (header,
// crop and flip on the CPU) and decodes them on the GPU with the crop/resize/flip/normalise kernel. Case
// gpu_decode+imagenet_train; the images/s counts batches whose GPU work has finished.
#include <kiln/kiln.h>  // data::decode_image, data::transforms, data::SampleRng

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/data/gpu_decode/gpu_sample.h"  // data::gpu_sample, data::gpu_decode_collate (--gpu)
#include "kiln/data/image.h"
#include "kiln/data/transforms.h"
#include "kiln/tensor/cuda.h"

namespace {

namespace T = kiln::data::transforms;
using Bytes = std::vector<uint8_t>;

struct Options {
  std::string folder;
  double seconds = 3.0;
  std::vector<int> threads = {1, 2, 4, 8, 16};
  bool quick = false;
  bool gpu = false;
  int batch = 256;
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

std::vector<Bytes> load_folder(const std::string& folder) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::recursive_directory_iterator(folder)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<Bytes> files;
  for (const auto& p : paths) files.push_back(kiln::data::read_file_bytes(p));
  return files;
}

using Work = std::function<void(const Bytes&, kiln::data::SampleRng&)>;

// Runs `work` on `threads` threads for `seconds` each; returns images per second in total.
double run(const std::vector<Bytes>& files, int threads, double seconds, const Work& work) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> pool;
  using clock = std::chrono::steady_clock;
  double elapsed_max = 0;
  std::vector<double> elapsed(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const size_t n = files.size();
      size_t i = (n * t) / threads;
      for (size_t k = 0; k < std::min<size_t>(n, 8); ++k) {  // warm-up (allocator, caches)
        kiln::data::SampleRng rng(0, 0, int64_t(k));
        work(files[(i + k) % n], rng);
      }
      int64_t count = 0;
      const auto start = clock::now();
      double s = 0;
      while (s < seconds) {
        kiln::data::SampleRng rng(1, 0, int64_t(i));
        work(files[i % n], rng);
        ++i, ++count;
        s = std::chrono::duration<double>(clock::now() - start).count();
      }
      elapsed[t] = s;
      total += count;
    });
  }
  for (auto& th : pool) th.join();
  for (double e : elapsed) elapsed_max = std::max(elapsed_max, e);
  return double(total.load()) / elapsed_max;
}

// GPU decoding: each thread prepares and decodes whole batches for `seconds`, one batch in flight on the GPU
// while it prepares the next; returns images per second in total.
double run_gpu(const std::vector<Bytes>& files, int threads, double seconds, int batch) {
  namespace data = kiln::data;
  auto gpu = data::GpuTransform::from(T::imagenet_train(224));
  auto collate = data::gpu_decode_collate(gpu, [](int64_t i) { return "file " + std::to_string(i); });
  std::atomic<int64_t> total{0};
  std::vector<double> elapsed(threads);
  std::vector<std::thread> pool;
  using clock = std::chrono::steady_clock;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      kiln::cuda::DeviceGuard guard(0);
      const size_t n = files.size();
      size_t i = (n * t) / threads;
      auto make = [&](uint64_t epoch) {
        std::vector<data::Example> examples;
        for (int k = 0; k < batch; ++k, ++i) {
          data::SampleRng rng(1, epoch, int64_t(i));
          examples.push_back(data::gpu_sample(files[i % n], "bench", gpu, rng, 0, int64_t(i % n)));
        }
        return collate(examples, true);
      };
      make(0).ready->synchronize();  // warm-up: the decoder, nvJPEG's buffers, the allocator
      int64_t count = 0;
      const auto start = clock::now();
      data::Batch in_flight = make(1);
      double s = 0;
      while (s < seconds) {
        data::Batch next = make(1);
        in_flight.ready->synchronize();
        count += batch;
        in_flight = std::move(next);
        s = std::chrono::duration<double>(clock::now() - start).count();
      }
      in_flight.ready->synchronize();
      count += batch;
      elapsed[t] = std::chrono::duration<double>(clock::now() - start).count();
      total += count;
    });
  }
  for (auto& th : pool) th.join();
  return double(total.load()) / *std::max_element(elapsed.begin(), elapsed.end());
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (const char* env = std::getenv("KILN_BENCH_IMAGES")) opt.folder = env;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) opt.seconds = std::stod(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) opt.threads = parse_list(argv[++i]);
    else if (a == "--quick") opt.quick = true;
    else if (a == "--gpu") opt.gpu = true;
    else if (a == "--batch" && i + 1 < argc) opt.batch = std::stoi(argv[++i]);
    else if (a.rfind("--", 0) != 0) opt.folder = a;
    else {
      std::fprintf(stderr,
                   "usage: bench_images [FOLDER] [--seconds S] [--threads 1,2,4] [--quick] [--gpu [--batch N]]\n");
      return EXIT_FAILURE;
    }
  }
  try {
    std::vector<Bytes> files;
    if (opt.quick && opt.folder.empty()) {
      std::printf("{\"bench\": \"images\", \"note\": \"--quick without a folder: nothing to decode\"}\n");
      return 0;
    }
    if (opt.folder.empty()) {
      std::fprintf(stderr,
                   "bench_images: give a folder of JPEGs (argument or KILN_BENCH_IMAGES); "
                   "python3 bench/make_photos.py /tmp/photos builds one\n");
      return EXIT_FAILURE;
    }
    files = load_folder(opt.folder);
    if (files.empty()) {
      std::fprintf(stderr, "bench_images: no .jpg/.jpeg files under '%s'\n", opt.folder.c_str());
      return EXIT_FAILURE;
    }
    if (opt.quick) {
      opt.seconds = 0.2;
      opt.threads = {1, 2};
    }
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    if (opt.gpu) {
      if (!kiln::cuda::is_available()) {
        std::printf("{\"bench\": \"images\", \"note\": \"--gpu: no GPU visible, nothing measured\"}\n");
        return opt.quick ? 0 : EXIT_FAILURE;
      }
      const int batch = opt.quick ? 2 : opt.batch;
      for (int threads : opt.threads) {
        if (threads > int(hw) && threads != opt.threads.front()) continue;
        const kiln::data::GpuDecodeCounts before = kiln::data::gpu_decode_counts();
        const double ips = run_gpu(files, threads, opt.seconds, batch);
        const kiln::data::GpuDecodeCounts after = kiln::data::gpu_decode_counts();
        std::printf(
            "{\"bench\": \"images\", \"impl\": \"kiln\", \"case\": \"gpu_decode+imagenet_train\", "
            "\"threads\": %d, \"batch\": %d, \"images_per_s\": %.1f, \"per_thread\": %.1f, \"files\": %zu, "
            "\"hardware_threads\": %u, \"decoded_by\": {\"engines\": %lld, \"one_at_a_time\": %lld, \"cpu\": %lld}}\n",
            threads, batch, ips, ips / threads, files.size(), hw,
            static_cast<long long>(after.engines - before.engines),
            static_cast<long long>(after.one_at_a_time - before.one_at_a_time),
            static_cast<long long>(after.cpu - before.cpu));
        std::fflush(stdout);
      }
      return 0;
    }
    const T::Compose train = T::imagenet_train(224), eval = T::imagenet_eval(224);
    const std::vector<std::pair<std::string, Work>> cases = {
        {"decode", [](const Bytes& b, kiln::data::SampleRng&) { kiln::data::decode_image(b, "bench"); }},
        {"decode+imagenet_train", [&](const Bytes& b, kiln::data::SampleRng& rng) { train.load(b, "bench", rng); }},
        {"decode+imagenet_train_full",
         [&](const Bytes& b, kiln::data::SampleRng& rng) { train(kiln::data::decode_image(b, "bench"), rng); }},
        {"decode+imagenet_eval", [&](const Bytes& b, kiln::data::SampleRng& rng) { eval.load(b, "bench", rng); }},
    };
    for (const auto& [name, work] : cases) {
      for (int threads : opt.threads) {
        if (threads > int(hw) && threads != opt.threads.front()) continue;  // capped at the cores there are
        const double ips = run(files, threads, opt.seconds, work);
        std::printf(
            "{\"bench\": \"images\", \"impl\": \"kiln\", \"case\": \"%s\", \"threads\": %d, "
            "\"images_per_s\": %.1f, \"per_thread\": %.1f, \"files\": %zu, \"hardware_threads\": %u}\n",
            name.c_str(), threads, ips, ips / threads, files.size(), hw);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_images: %s\n", e.what());
    return EXIT_FAILURE;
  }
  return 0;
}
