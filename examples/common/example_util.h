// examples/common/example_util.h — what the example programs share: command-line options with --help, and the
// progress line. Written against kiln's public API only, like the examples. (Metrics files: kiln's own
// monitor::MetricsLogger, kiln/monitor/metrics.h.)
//
//   ex::Options opts("resnet", "Trains a ResNet on CIFAR-10 or an image folder.");
//   auto& epochs = opts.add_int("epochs", 90, "passes over the training set");
//   auto& amp = opts.add_string("amp", "bf16", "bf16 | fp16 | off");
//   opts.parse(argc, argv);                       // --help prints the options and exits 0; bad input exits 2
//   ex::Progress progress(total_steps, batch * world_size);
//   std::cout << progress.line(epoch, step, loss, lr, loader.stats().wait_fraction) << "\n";
//   auto profiling = ex::StepProfiler::add_options(opts, "runs/trace.json");  // --profile W,U,A, --trace, --nvtx
//   ex::StepProfiler prof(profiling, profiling.trace, main_rank, rank, world);  // then prof.step() per step
//   ... prof.step(); once per training step
#pragma once

#include <kiln/kiln.h>
#include <kiln/monitor/gpu_monitor.h>  // GPU utilisation and power for the progress line
#include <kiln/tensor/cuda.h>             // memory_stats for the progress line

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace ex {

// Options given as --name value (or --name=value), flags as --name.
class Options {
 public:
  Options(std::string program, std::string about) : program_(std::move(program)), about_(std::move(about)) {}

  int64_t& add_int(const std::string& name, int64_t value, const std::string& help) {
    return add(name, help, "int", std::to_string(value)).int_value = value;
  }
  double& add_double(const std::string& name, double value, const std::string& help) {
    std::ostringstream s;
    s << value;
    return add(name, help, "number", s.str()).double_value = value;
  }
  std::string& add_string(const std::string& name, std::string value, const std::string& help) {
    auto& o = add(name, help, "text", value);
    o.string_value = std::move(value);
    return o.string_value;
  }
  bool& add_flag(const std::string& name, const std::string& help) {
    return add(name, help, "flag", "off").flag_value;
  }

  // Exits 0 after --help, 2 (with the reason and the hint to run --help) on unknown or malformed options.
  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        print_help();
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail("unexpected argument '" + a + "'");
      std::string name = a.substr(2), value;
      const auto eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      auto it = options_.find(name);
      if (it == options_.end()) fail("unknown option --" + name);
      Option& o = *it->second;
      if (o.kind == "flag") {
        if (inline_value) fail("--" + name + " is a flag and takes no value");
        o.flag_value = true;
        continue;
      }
      if (!inline_value) {
        if (i + 1 >= argc) fail("--" + name + " needs a value (" + o.kind + ")");
        value = argv[++i];
      }
      try {
        size_t used = 0;
        if (o.kind == "int") {
          o.int_value = std::stoll(value, &used);
        } else if (o.kind == "number") {
          o.double_value = std::stod(value, &used);
          // nan and inf parse as numbers, but no option means them (and NaN slips through range checks).
          if (!std::isfinite(o.double_value)) throw std::invalid_argument(value);
        } else {
          o.string_value = value;
          used = value.size();
        }
        if (used != value.size()) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        fail("--" + name + " takes " + (o.kind == "int" ? "an integer" : "a finite number") + ", got '" + value + "'");
      }
    }
  }

  // Under a launcher every rank parses the same options: only rank 0 says why they all stop.
  [[noreturn]] void fail(const std::string& why) const {
    if (kiln::data::distributed_env().rank == 0) {
      std::cerr << program_ << ": " << why << " (run " << program_ << " --help for the options)\n";
    }
    std::exit(2);
  }

  void print_help() const {
    std::cout << "usage: " << program_ << " [options]\n\n" << about_ << "\n\noptions:\n";
    for (const auto& name : order_) {
      const Option& o = *options_.at(name);
      const bool show_default = o.kind != "flag" && !o.shown_default.empty();
      std::cout << column("--" + name + (o.kind == "flag" ? "" : " " + o.kind)) << o.help
                << (show_default ? " (default: " + o.shown_default + ")" : "") << "\n";
    }
    std::cout << column("--help") << "this text\n";
  }

 private:
  static std::string column(std::string left) {
    left = "  " + left;
    if (left.size() < 28) left.resize(28, ' ');
    return left + " ";
  }
  struct Option {
    std::string kind, help, shown_default;
    int64_t int_value = 0;
    double double_value = 0;
    std::string string_value;
    bool flag_value = false;
  };
  Option& add(const std::string& name, const std::string& help, const std::string& kind, const std::string& shown) {
    auto o = std::make_unique<Option>();
    o->kind = kind;
    o->help = help;
    o->shown_default = shown;
    order_.push_back(name);
    return *(options_[name] = std::move(o));
  }
  std::string program_, about_;
  std::map<std::string, std::unique_ptr<Option>> options_;
  std::vector<std::string> order_;
};

// "cpu", "cuda", or "auto" (the process's GPU under dist::init, else the CPU).
inline kiln::Device pick_device(const std::string& name, const kiln::dist::Env& env) {
  if (name == "cpu") return kiln::Device::cpu();
  if (name == "cuda") {
    if (!env.device().is_cuda()) {
      std::cerr << "--device cuda: no GPU is visible (kiln::cuda::device_count() is 0, or kiln was built without "
                   "CUDA); use --device cpu\n";
      std::exit(2);
    }
    return env.device();
  }
  if (name != "auto") {
    std::cerr << "--device takes auto, cpu or cuda, not '" << name << "'\n";
    std::exit(2);
  }
  return env.device();
}

// The progress line: where the run is, the loss, the learning rate, samples/s, the share of time spent waiting
// for data, GPU memory, and the time left.
class Progress {
 public:
  Progress(int64_t total_steps, int64_t samples_per_step, kiln::Device device)
      : total_(total_steps), samples_per_step_(samples_per_step), device_(device), last_(Clock::now()) {}

  // Starts the rate's clock again (after an evaluation, say, whose time is not training's).
  void restart(int64_t steps_done) {
    last_ = Clock::now();
    last_steps_ = steps_done;
  }

  // `steps_done` steps since the start of this run (for the rate and the ETA).
  std::string line(int64_t epoch, int64_t step, int64_t steps_done, double loss, double lr, double wait_fraction) {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    const int64_t steps = steps_done - last_steps_;
    const double rate = seconds > 0 && steps > 0 ? steps * samples_per_step_ / seconds : 0;
    const double step_s = steps > 0 ? seconds / steps : 0;
    last_ = now;
    last_steps_ = steps_done;
    const double eta = step_s * static_cast<double>(std::max<int64_t>(0, total_ - step));
    char buf[256];
    std::snprintf(buf, sizeof buf, "epoch %lld step %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s  data wait %.0f%%",
                  static_cast<long long>(epoch), static_cast<long long>(step), static_cast<long long>(total_), loss, lr,
                  rate, 100.0 * wait_fraction);
    std::string s = buf;
    if (device_.is_cuda()) {
      const auto m = kiln::cuda::memory_stats(device_.index());
      std::snprintf(buf, sizeof buf, "  gpu mem %.1f GiB (peak %.1f)", m.allocated_bytes / 1073741824.0,
                    m.peak_allocated_bytes / 1073741824.0);
      s += buf;
      // Beside the data wait: a GPU that waits for data shows a low utilisation and power here.
      if (const auto g = kiln::monitor::gpu_stats(device_.index())) {
        if (g->utilization_percent >= 0) s += "  util " + std::to_string(g->utilization_percent) + "%";
        if (g->power_watts >= 0) s += "  " + std::to_string(static_cast<int>(g->power_watts + 0.5)) + " W";
      } else if (!gpu_stats_note_given_) {
        gpu_stats_note_given_ = true;
        std::cerr << "(no GPU utilisation in the progress line: "
                  << kiln::monitor::gpu_stats_unavailable_reason(device_.index()) << ")\n";
      }
    }
    std::snprintf(buf, sizeof buf, "  eta %dm%02ds", static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    return s + buf;
  }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_, samples_per_step_;
  kiln::Device device_;
  Clock::time_point last_;
  int64_t last_steps_ = 0;
  bool gpu_stats_note_given_ = false;
};

// Profiling for the examples: --profile WAIT,WARMUP,ACTIVE runs kiln's profiler over those steps (then
// prints the top ops and writes a Chrome/Perfetto trace), --nvtx sends kiln's ranges to Nsight Systems.
struct ProfileOptions {
  std::string& profile;
  std::string& trace;
  bool& nvtx;
};

class StepProfiler {
 public:
  static ProfileOptions add_options(Options& opts, const std::string& default_trace) {
    return {opts.add_string("profile", "", "profile steps WAIT,WARMUP,ACTIVE (e.g. 10,3,5): top ops and a trace file"),
            opts.add_string("trace", default_trace, "where --profile writes its Chrome/Perfetto trace"),
            opts.add_flag("nvtx", "NVTX ranges per step, module, backward node and op (for nsys --trace=cuda,nvtx)")};
  }

  // `main` prints the table (rank 0); every rank profiles, each writing <trace> with its rank before ".json".
  StepProfiler(const ProfileOptions& o, const std::string& trace, bool main, int rank, int world)
      : StepProfiler(o.profile, trace, o.nvtx, main, rank, world) {}
  StepProfiler(const std::string& spec, const std::string& trace, bool nvtx, bool main, int rank, int world) {
    if (nvtx) kiln::profiler::enable_nvtx();
    nvtx_ = nvtx;
    if (spec.empty()) return;
    int64_t w = -1, u = -1, a = -1;
    char extra = 0;
    if (std::sscanf(spec.c_str(), "%lld,%lld,%lld%c", reinterpret_cast<long long*>(&w), reinterpret_cast<long long*>(&u),
                    reinterpret_cast<long long*>(&a), &extra) != 3 ||
        w < 0 || u < 0 || a < 1) {
      std::cerr << "--profile takes WAIT,WARMUP,ACTIVE step counts (e.g. 10,3,5; ACTIVE >= 1), got '" << spec << "'\n";
      std::exit(2);
    }
    std::string path = trace;
    if (world > 1) {
      const auto dot = path.rfind(".json");
      const std::string tag = ".rank" + std::to_string(rank);
      path = dot != std::string::npos && dot + 5 == path.size() ? path.insert(dot, tag) : path + tag;
    }
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    prof_ = std::make_unique<kiln::profiler::Profile>(kiln::profiler::Options{
        .schedule = {.wait = w, .warmup = u, .active = a},
        .trace_path = path,
        .on_trace_ready = [main, path](const kiln::profiler::Result& r) {
          if (!main) return;
          std::cout << "profile of " << r.steps() << " steps (trace: " << path << "):\n" << r.table(15) << std::flush;
        }});
  }
  ~StepProfiler() {
    if (nvtx_) kiln::trace::end_step();
  }

  // Once per training step, after it.
  void step() {
    ++step_;
    if (prof_) {
      prof_->step();
    } else if (nvtx_) {
      kiln::trace::mark_step(step_);
    }
  }

 private:
  std::unique_ptr<kiln::profiler::Profile> prof_;
  bool nvtx_ = false;
  int64_t step_ = 0;
};

}  // namespace ex
