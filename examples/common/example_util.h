// examples/common/example_util.h — what the example programs share: command-line options with --help (CLI11),
// and the progress line. Written against kiln's public API only, like the examples. (Metrics files: kiln's own
// monitor::MetricsLogger, kiln/monitor/metrics.h.)
//
//   ex::Options opts("resnet", "Trains a ResNet on CIFAR-10 or an image folder.");
//   auto& epochs = opts.add_int("epochs", 90, "passes over the training set");
//   auto& amp = opts.add_string("amp", "bf16", "bf16 | fp16 | off");
//   opts.parse(argc, argv);  // --help prints the options with their defaults, exits 0; bad input exits 2
//   ex::Progress progress(total_steps, batch * world_size);
//   std::cout << progress.line(epoch, step, loss, lr, loader.stats().wait_fraction) << "\n";
//   auto profiling = ex::StepProfiler::add_options(opts, "runs/trace.json");  // --profile W,U,A, --trace, --nvtx
//   ex::StepProfiler prof(profiling, profiling.trace, main_rank, rank, world);  // then prof.step() per step
//   ... prof.step(); once per training step
#pragma once

#include <kiln/kiln.h>
#include <kiln/monitor/gpu_monitor.h>  // GPU utilisation and power for the progress line
#include <kiln/tensor/cuda.h>             // memory_stats for the progress line

#include <CLI/CLI.hpp>  // CLI::App: the options' parsing and --help

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace ex {

// Options given as --name value (or --name=value), flags as --name, parsed by CLI11. A repeated option takes its
// last value (scripts append overrides to a base list). Numbers are checked before they are taken: an integer
// option refuses "many" and "1.5", a number option refuses "nan", "inf" and "1e-4x", each naming the option.
class Options {
 public:
  Options(std::string program, std::string about) : program_(program), app_(std::move(about), std::move(program)) {
    app_.set_help_flag("-h,--help", "this text");
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.get_formatter()->column_width(32);
  }
  Options(const Options&) = delete;  // CLI11 holds references to the values below
  Options& operator=(const Options&) = delete;

  int64_t& add_int(const std::string& name, int64_t value, const std::string& help) {
    int64_t& v = ints_.emplace_back(value);
    app_.add_option("--" + name, v, with_default(help, std::to_string(value)))->type_name("INT")->check(integer());
    return v;
  }
  double& add_double(const std::string& name, double value, const std::string& help) {
    std::ostringstream s;
    s << value;
    double& v = doubles_.emplace_back(value);
    app_.add_option("--" + name, v, with_default(help, s.str()))->type_name("NUMBER")->check(finite_number());
    return v;
  }
  std::string& add_string(const std::string& name, std::string value, const std::string& help) {
    std::string& v = strings_.emplace_back(std::move(value));
    app_.add_option("--" + name, v, with_default(help, v.empty() ? "none" : v))->type_name("TEXT");
    return v;
  }
  bool& add_flag(const std::string& name, const std::string& help) {
    bool& v = flags_.emplace_back(false);
    // A flag is off unless given; a help text may say what off means in its own words.
    app_.add_flag("--" + name, v, help.find("(default:") == std::string::npos ? with_default(help, "off") : help);
    return v;
  }

  // Exits 0 after --help, 2 (with the reason and the hint to run --help) on unknown or malformed options.
  void parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      print_help();
      std::exit(0);
    } catch (const CLI::ExtrasError&) {
      const std::string first = app_.remaining().empty() ? "" : app_.remaining().front();
      fail(first.rfind('-', 0) == 0 ? "unknown option " + first : "unexpected argument '" + first + "'");
    } catch (const CLI::ParseError& e) {
      fail(e.what());
    }
  }

  // Under a launcher every rank parses the same options: only rank 0 says why they all stop.
  [[noreturn]] void fail(const std::string& why) const {
    if (kiln::data::distributed_env().rank == 0) {
      std::cerr << program_ << ": " << why << " (run " << program_ << " --help for the options)\n";
    }
    std::exit(2);
  }

  void print_help() const { std::cout << app_.help(); }

 private:
  static std::string with_default(const std::string& help, const std::string& shown) {
    return help + " (default: " + shown + ")";
  }
  // Decimal integers that fit int64_t; the text is rewritten in canonical form, so CLI11's own conversion (base 0:
  // it would read "010" as octal) sees plain digits.
  static CLI::Validator integer() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
          const char* first = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
          const char* last = text.data() + text.size();
          int64_t v = 0;
          const auto [end, ec] = std::from_chars(first, last, v);
          if (ec == std::errc::result_out_of_range) return "takes an integer, got '" + text + "', which is too large";
          if (ec != std::errc() || end != last || first == last) return "takes an integer, got '" + text + "'";
          text = std::to_string(v);
          return "";
        },
        "", "integer");
  }
  // nan and inf parse as numbers, but no option means them (and NaN slips through range checks).
  static CLI::Validator finite_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
          double v = 0;
          if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v)) {
            return "takes a finite number, got '" + text + "'";
          }
          return "";
        },
        "", "finite number");
  }

  std::string program_;
  CLI::App app_;
  std::deque<int64_t> ints_;  // deques: the values keep their addresses as options are added
  std::deque<double> doubles_;
  std::deque<std::string> strings_;
  std::deque<bool> flags_;
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
