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
#pragma once

#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>  // memory_stats for the progress line

#include <chrono>
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
        } else {
          o.string_value = value;
          used = value.size();
        }
        if (used != value.size()) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        fail("--" + name + " takes " + (o.kind == "int" ? "an integer" : "a number") + ", got '" + value + "'");
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
};

}  // namespace ex
