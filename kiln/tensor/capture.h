// kiln/tensor/capture.h — recording the ops a computation runs, as a graph of kiln ops (what io::export_onnx
// traces a module's forward with).
//
//   Tensor gelu(const Tensor& x, GeluApproximation approximate) {
//     capture::Op op("gelu");                 // at the op's entry: the ops it calls are part of it
//     Tensor y = ...;
//     if (op) op.record({x}, {y}, {{"approximate", int64_t(approximate)}});
//     return y;
//   }
//
// Nothing is recorded unless a Recorder is installed on the calling thread (capture::Session): an Op then costs
// one thread-local load. Only the outermost open Op records, so an op built from others (linear from matmul and
// add) is one record. What a record holds, by convention: `op` is the kiln function's name; `inputs` its tensor
// arguments in declaration order (an absent optional tensor as an undefined Tensor, so positions stay fixed);
// `outputs` what it returns; `attrs` every other argument under its declared name, defaults applied (an empty
// optional is left out). Records are only made for ops that a recorder can translate: an op without a record
// that reads a recorded value is reported by the recorder's trace listener (see io::export_onnx).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/tensor/scalar.h"
#include "kiln/tensor/tensor.h"

namespace kiln::capture {

// An argument of a recorded op: an integer (also bools and enums), a real number, a list of integers (dims,
// shapes), a list of reals, or a name.
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::vector<double>, std::string>;
// A named argument of a recorded op.
struct Attr {
  std::string name;  // the argument's declared name: "dim", "shape", "eps", ...
  AttrValue value;   // its value, defaults applied
};

// A number argument as it was given: integral (and bool) as int64_t, floating as double.
inline AttrValue scalar_value(Scalar s) {
  return s.is_floating_point() ? AttrValue(s.to_double()) : AttrValue(s.to_int64());
}

// One call of a kiln op.
struct OpRecord {
  std::string op;                                 // the kiln function's name: "conv2d", "add", "reshape", ...
  std::vector<Tensor> inputs;                     // tensor arguments, in order; an absent one is undefined
  std::vector<Tensor> outputs;                    // results, in order
  std::vector<Attr> attrs;                        // the other arguments, by name
  const Attr* attr(std::string_view name) const;  // null when absent
};

// The inputs and attributes of a record, as Op::done's `describe` gives them.
struct Args {
  std::vector<Tensor> inputs;  // the op's tensor arguments, in declaration order
  std::vector<Attr> attrs;     // its other arguments
};

// An op's result as a record's outputs: one tensor, a list of them, or a pair.
inline std::vector<Tensor> outputs_of(const Tensor& t) { return {t}; }
inline std::vector<Tensor> outputs_of(const std::vector<Tensor>& ts) { return ts; }
inline std::vector<Tensor> outputs_of(const std::tuple<Tensor, Tensor>& ts) {
  return {std::get<0>(ts), std::get<1>(ts)};
}

// Receives the records of the thread it is installed on.
class Recorder {
 public:
  virtual ~Recorder() = default;
  // Called once per outermost op, after it computed its results, on the thread that ran it.
  virtual void record(OpRecord&& op) = 0;
};

namespace detail {
extern std::atomic<int> g_sessions;                  // recorders installed on any thread: the cheap first test
extern constinit thread_local Recorder* t_recorder;  // constinit: no TLS init call on each access
extern constinit thread_local int t_depth;  // how many Ops are open on this thread while a recorder is installed
}  // namespace detail

// True while a recorder is installed on this thread.
inline bool active() {
  return detail::g_sessions.load(std::memory_order_relaxed) != 0 && detail::t_recorder != nullptr;
}
// How many recorded ops are open on this thread: 0 outside every op (where io::export_onnx checks that nothing
// unrecorded reads a recorded value).
inline int depth() { return detail::t_depth; }

// Installs `recorder` on this thread for the object's lifetime (one at a time: a second throws).
class Session {
 public:
  // Installs `recorder` (which must outlive the session); kiln::Error if one is installed already.
  explicit Session(Recorder& recorder);
  // Uninstalls it.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// An op's entry mark (see the top of this file). Converts to true when this op is the outermost open one under
// an installed recorder: then, and only then, it records.
class Op {
 public:
  // Opens the op `name` (a string literal: the kiln function's name).
  explicit Op(const char* name) : name_(name) {
    if (active()) {
      open_ = true;
      ++detail::t_depth;
    }
  }
  // Closes it.
  ~Op() {
    if (open_) --detail::t_depth;
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // Whether this op records: a recorder is installed and no other op is open around this one.
  explicit operator bool() const { return open_ && detail::t_depth == 1; }
  // Hands the recorder this op's record, when it records (see operator bool).
  void record(std::vector<Tensor> inputs, std::vector<Tensor> outputs, std::vector<Attr> attrs = {}) const;

  // Records `result` (a Tensor, a list of them, or a pair) with the inputs and attributes that `describe`
  // returns (a capture::Args, only built when recording), and returns it: `return op.done(out, [&] {...});`.
  template <typename Result, typename Describe>
  Result done(Result result, Describe&& describe) const {
    if (*this) {
      Args args = describe();
      record(std::move(args.inputs), outputs_of(result), std::move(args.attrs));
    }
    return result;
  }

 private:
  const char* name_;
  bool open_ = false;
};

}  // namespace kiln::capture
