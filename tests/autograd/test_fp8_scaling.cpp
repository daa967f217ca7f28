// amp::Fp8Recipe and amp::Fp8ScalingState: the delayed-scaling update against a reference written here in plain
// C++ doubles (and against hand-derived histories and scales), option validation, and the checkpoint round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace kiln::testing {
namespace {

using amp::AmaxComputeAlgo;
using amp::Fp8Format;
using amp::Fp8Pass;
using amp::Fp8Recipe;
using amp::Fp8ScalingState;

constexpr double kFltMax = std::numeric_limits<float>::max();

// ---------------------------------------------------------------- the reference: delayed scaling in doubles
// Written from the rule (fp8.h's header comment, Transformer Engine's DelayedScaling), one column at a time.
struct ReferenceState {
  int64_t len, n, margin;
  AmaxComputeAlgo algo;
  std::vector<double> fp8_max;         // per column
  std::vector<std::vector<double>> h;  // h[i][j], L x N
  std::vector<double> scale, scale_inv;

  ReferenceState(const Fp8Recipe& r, const std::vector<Fp8Pass>& passes)
      : len(r.amax_history_len),
        n(static_cast<int64_t>(passes.size())),
        margin(r.margin),
        algo(r.amax_compute_algo),
        h(static_cast<size_t>(len), std::vector<double>(passes.size(), 0.0)),
        scale(passes.size(), 1.0),
        scale_inv(passes.size(), 1.0) {
    for (Fp8Pass p : passes) fp8_max.push_back(r.format == Fp8Format::Hybrid && p == Fp8Pass::Backward ? 57344 : 448);
  }

  void record(int64_t j, double amax) {
    double& cell = h[0][static_cast<size_t>(j)];
    if (std::isnan(amax) || std::isnan(cell)) {
      cell = std::nan("");
    } else if (amax > cell) {
      cell = amax;
    }
  }

  void update() {
    for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
      const double c = h[0][j];
      if (c == 0) continue;  // not seen: nothing changes
      double a = 0;
      if (algo == AmaxComputeAlgo::Max) {
        for (int64_t i = 0; i < len; ++i) {
          const double v = h[static_cast<size_t>(i)][j];
          if (!std::isnan(v) && v > a) a = v;
        }
      } else {
        a = c;
      }
      // roll: the current value to the last row, row 1 leaves, rows 2.. move up, row 0 cleared
      std::vector<double> col(static_cast<size_t>(len), 0.0);
      for (int64_t i = 1; i + 1 < len; ++i) col[static_cast<size_t>(i)] = h[static_cast<size_t>(i + 1)][j];
      if (len > 1) col[static_cast<size_t>(len - 1)] = c;
      for (int64_t i = 0; i < len; ++i) h[static_cast<size_t>(i)][j] = col[static_cast<size_t>(i)];
      if (std::isfinite(a) && a > 0) {
        double s = static_cast<float>(fp8_max[j] / std::pow(2.0, static_cast<double>(margin)) / a);
        if (std::isinf(s)) s = kFltMax;
        scale[j] = s;
        scale_inv[j] = static_cast<float>(1.0 / s);
      }
    }
  }
};

// Exact comparison (NaN equal to NaN): the update is a handful of correctly rounded float32 operations.
void expect_same(const std::vector<double>& actual, const std::vector<double>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t k = 0; k < actual.size(); ++k) {
    if (std::isnan(expected[k])) {
      EXPECT_TRUE(std::isnan(actual[k])) << what << "[" << k << "] = " << actual[k] << ", expected NaN";
    } else {
      EXPECT_EQ(actual[k], expected[k]) << what << "[" << k << "]";
    }
  }
}

void expect_matches(const Fp8ScalingState& state, const ReferenceState& ref, const std::string& when) {
  std::vector<double> flat;
  for (const auto& row : ref.h) flat.insert(flat.end(), row.begin(), row.end());
  ASSERT_EQ(state.amax_history().shape(), (Shape{ref.len, ref.n}));
  expect_same(values(state.amax_history()), flat, "amax_history " + when);
  expect_same(values(state.scale()), ref.scale, "scale " + when);
  expect_same(values(state.scale_inv()), ref.scale_inv, "scale_inv " + when);
}

// A tensor on `opts` whose amax(|.|) is |v| (NaN if v is NaN, inf if v is ±inf); all zeros for v == 0.
Tensor tensor_with_amax(double v, const TensorOptions& opts) {
  return make({0.5 * v, -v, 0.25 * v, 0.0}, {2, 2}, opts);
}

class Fp8ScalingTest : public BackendTest {};

// ---------------------------------------------------------------- hand-derived cases

// L = 3, one forward (E4M3) column: each step's history and scale written out by hand.
TEST_P(Fp8ScalingTest, HistoryRollsAndMaxWindowByHand) {
  Fp8ScalingState state({.amax_history_len = 3}, {Fp8Pass::Forward}, dev());
  auto step = [&](double amax, const std::vector<double>& history, double scale) {
    state.record_amax(0, tensor_with_amax(amax, opts()));
    state.update();
    expect_values(state.amax_history(), {3, 1}, history, 0, 0);
    expect_values(state.scale(), {1}, {scale}, 0, 0);
    expect_values(state.scale_inv(), {1}, {static_cast<float>(1.0 / scale)}, 0, 0);  // 1 / scale in float32
  };
  step(2, {0, 0, 2}, 224);  // h = [2, 0, 0]: a = 2, 448 / 2
  step(4, {0, 2, 4}, 112);  // h = [4, 0, 2]: a = 4
  step(1, {0, 4, 1}, 112);  // h = [1, 2, 4]: a = 4 (row 1's 2 leaves)
  step(1, {0, 1, 1}, 112);  // h = [1, 4, 1]: a = 4 (the 4 leaves now)
  step(1, {0, 1, 1}, 448);  // h = [1, 1, 1]: a = 1
}

TEST_P(Fp8ScalingTest, MostRecentMarginAndE5M2ByHand) {
  Fp8ScalingState state({.amax_history_len = 4, .margin = 2, .amax_compute_algo = AmaxComputeAlgo::MostRecent},
                        {Fp8Pass::Forward, Fp8Pass::Backward}, dev());
  state.record_amax(0, tensor_with_amax(8, opts()));
  state.record_amax(1, tensor_with_amax(8, opts()));
  state.update();
  expect_values(state.scale(), {2}, {448.0 / 4 / 8, 57344.0 / 4 / 8}, 0, 0);  // 14, 1792
  state.record_amax(0, tensor_with_amax(0.5, opts()));
  state.record_amax(1, tensor_with_amax(16, opts()));
  state.update();
  expect_values(state.scale(), {2}, {448.0 / 4 / 0.5, 57344.0 / 4 / 16}, 0, 0);  // the 8s are ignored
  expect_values(state.amax_history(), {4, 2}, {0, 0, 0, 0, 8, 8, 0.5, 16}, 0, 0);
}

// Zero keeps everything; inf keeps the scale while in the window; NaN is skipped by Max, keeps the scale for
// MostRecent; a tiny amax gives FLT_MAX.
TEST_P(Fp8ScalingTest, SpecialAmaxesByHand) {
  Fp8ScalingState state({.amax_history_len = 2}, {Fp8Pass::Forward}, dev());
  state.record_amax(0, tensor_with_amax(7, opts()));
  state.update();
  expect_values(state.scale(), {1}, {64}, 0, 0);
  state.record_amax(0, tensor_with_amax(0, opts()));  // zeros: not seen
  state.update();
  expect_values(state.amax_history(), {2, 1}, {0, 7}, 0, 0);
  expect_values(state.scale(), {1}, {64}, 0, 0);
  state.update();  // nothing recorded at all
  expect_values(state.amax_history(), {2, 1}, {0, 7}, 0, 0);
  state.record_amax(0, tensor_with_amax(kInf, opts()));
  state.update();
  expect_values(state.amax_history(), {2, 1}, {0, kInf}, 0, 0);
  expect_values(state.scale(), {1}, {64}, 0, 0);  // a = inf: kept
  state.record_amax(0, tensor_with_amax(2, opts()));
  state.update();
  expect_values(state.scale(), {1}, {64}, 0, 0);  // the inf is still in the window
  state.record_amax(0, tensor_with_amax(kNaN, opts()));
  state.update();
  expect_values(state.amax_history(), {2, 1}, {0, kNaN}, 0, 0);
  expect_values(state.scale(), {1}, {224}, 0, 0);         // NaN skipped: a = 2
  state.record_amax(0, tensor_with_amax(1e-39, opts()));  // float32 subnormal: 448 / 1e-39 overflows
  state.update();
  expect_values(state.scale(), {1}, {kFltMax}, 0, 0);
  expect_values(state.scale_inv(), {1}, {static_cast<float>(1.0 / kFltMax)}, 0, 0);

  Fp8ScalingState recent({.amax_history_len = 2, .amax_compute_algo = AmaxComputeAlgo::MostRecent}, {Fp8Pass::Forward},
                         dev());
  recent.record_amax(0, tensor_with_amax(7, opts()));
  recent.update();
  recent.record_amax(0, tensor_with_amax(kNaN, opts()));
  recent.update();
  expect_values(recent.scale(), {1}, {64}, 0, 0);  // a = NaN: kept
}

// Several records between updates keep the largest; a NaN among them wins; bfloat16 and empty tensors.
TEST_P(Fp8ScalingTest, RecordKeepsTheLargestSinceTheLastUpdate) {
  auto state = Fp8ScalingState::for_linear({.amax_history_len = 2}, dev());
  state.record_amax(0, tensor_with_amax(3, opts()));
  state.record_amax(0, tensor_with_amax(5, opts()));
  state.record_amax(0, tensor_with_amax(4, opts()));
  state.record_amax(1, tensor_with_amax(1.5, opts(DType::BFloat16)));
  state.record_amax(1, empty({0, 3}, opts()));
  state.record_amax(2, tensor_with_amax(2, opts()));
  state.record_amax(2, tensor_with_amax(kNaN, opts()));
  state.record_amax(2, tensor_with_amax(9, opts()));
  expect_values(state.amax_history(), {2, 3}, {5, 1.5, kNaN, 0, 0, 0}, 0, 0);
  // A strided view: the amax is over its elements only.
  Tensor big = make({1, 100, 2, 100}, {2, 2}, opts());
  state.update();
  state.record_amax(0, big.select(1, 0));
  expect_values(state.amax_history(), {2, 3}, {2, 0, 0, 5, 1.5, kNaN}, 0, 0);
}

// ---------------------------------------------------------------- against the reference on made-up sequences

struct SequenceCase {
  Fp8Format format;
  int64_t len, margin;
  AmaxComputeAlgo algo;
};

// The amax a tensor shows at a step (a made-up sequence with zeros, NaN, inf, tiny and large values), or -1 for
// "not recorded this step".
double made_up_amax(int step, int j) {
  const int k = (step * 7 + j * 3) % 23;
  switch (k) {
    case 0: return 0.0;
    case 5: return -1.0;
    case 9: return j == 2 ? kNaN : 3.0;
    case 13: return step > 20 ? kInf : 0.75;
    case 17: return 1e-39;
    default: return std::ldexp(1.0 + 0.125 * ((step + j) % 8), ((step * 5 + j) % 17) - 8);  // exact in float32
  }
}

TEST_P(Fp8ScalingTest, MatchesTheReferenceOnMadeUpSequences) {
  const std::vector<SequenceCase> cases = {
      {Fp8Format::Hybrid, 1, 0, AmaxComputeAlgo::Max},        {Fp8Format::Hybrid, 2, 0, AmaxComputeAlgo::Max},
      {Fp8Format::Hybrid, 5, 0, AmaxComputeAlgo::Max},        {Fp8Format::E4M3, 5, 3, AmaxComputeAlgo::Max},
      {Fp8Format::Hybrid, 5, 1, AmaxComputeAlgo::MostRecent}, {Fp8Format::E4M3, 16, 0, AmaxComputeAlgo::MostRecent},
      {Fp8Format::Hybrid, 16, 2, AmaxComputeAlgo::Max},
  };
  const std::vector<Fp8Pass> passes = {Fp8Pass::Forward, Fp8Pass::Forward, Fp8Pass::Backward};
  for (const SequenceCase& c : cases) {
    const Fp8Recipe recipe{
        .format = c.format, .amax_history_len = c.len, .margin = c.margin, .amax_compute_algo = c.algo};
    Fp8ScalingState state(recipe, passes, dev());
    ReferenceState ref(recipe, passes);
    const std::string name = std::string(amp::fp8_format_name(c.format)) + " L=" + std::to_string(c.len) +
                             " margin=" + std::to_string(c.margin) + " " + amp::amax_compute_algo_name(c.algo);
    for (int step = 0; step < 40; ++step) {
      for (int j = 0; j < 3; ++j) {
        const double v = made_up_amax(step, j);
        if (v < 0) continue;
        state.record_amax(j, tensor_with_amax(v, opts()));
        ref.record(j, static_cast<float>(v));
        if (step % 4 == 1) {  // a second micro-batch, smaller
          state.record_amax(j, tensor_with_amax(v / 2, opts()));
          ref.record(j, static_cast<float>(v / 2));
        }
      }
      state.update();
      ref.update();
      expect_matches(state, ref, name + " after step " + std::to_string(step));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

KILN_INSTANTIATE_BACKENDS(Fp8ScalingTest);

// ---------------------------------------------------------------- options and formats

TEST(Fp8Recipe, DefaultsAreTransformerEnginesDelayedScaling) {
  const Fp8Recipe r;
  EXPECT_EQ(r.format, Fp8Format::Hybrid);
  EXPECT_EQ(r.amax_history_len, 1024);
  EXPECT_EQ(r.margin, 0);
  EXPECT_EQ(r.amax_compute_algo, AmaxComputeAlgo::Max);
  EXPECT_NO_THROW(r.validate());
  EXPECT_EQ(amp::fp8_dtype(Fp8Format::Hybrid, Fp8Pass::Forward), DType::Float8_e4m3fn);
  EXPECT_EQ(amp::fp8_dtype(Fp8Format::Hybrid, Fp8Pass::Backward), DType::Float8_e5m2);
  EXPECT_EQ(amp::fp8_dtype(Fp8Format::E4M3, Fp8Pass::Backward), DType::Float8_e4m3fn);
  // The largest finite values, from the formats' bits: 1.75 * 2^8 and 1.75 * 2^15.
  EXPECT_EQ(amp::fp8_max(DType::Float8_e4m3fn), static_cast<float>(Float8_e4m3fn(1e30)));
  EXPECT_EQ(amp::fp8_max(DType::Float8_e5m2), static_cast<float>(Float8_e5m2(1e30)));
  auto state = Fp8ScalingState::for_linear({}, Device::cpu());
  EXPECT_EQ(state.size(), 3);
  EXPECT_EQ(state.fp8_dtype(1), DType::Float8_e4m3fn);
  EXPECT_EQ(state.fp8_dtype(2), DType::Float8_e5m2);
  expect_values(state.amax_history(), {1024, 3}, std::vector<double>(3072, 0.0), 0, 0);
  expect_values(state.scale(), {3}, {1, 1, 1}, 0, 0);
  expect_values(state.scale_inv(), {3}, {1, 1, 1}, 0, 0);
}

TEST(Fp8Recipe, DefaultModuleFilterTakesLinearsWithDimsMultipleOf16) {
  const Fp8Recipe r;
  EXPECT_TRUE(r.module_filter({.name = "encoder.0.ffn", .type = "Linear", .in_features = 768, .out_features = 3072}));
  EXPECT_TRUE(r.module_filter({.type = "Linear", .in_features = 16, .out_features = 16}));
  EXPECT_FALSE(r.module_filter({.type = "Linear", .in_features = 768, .out_features = 30522 + 2}));
  EXPECT_FALSE(r.module_filter({.type = "Linear", .in_features = 8, .out_features = 16}));
  EXPECT_FALSE(r.module_filter({.type = "Linear", .in_features = 0, .out_features = 16}));
  EXPECT_FALSE(r.module_filter({.type = "Conv2d", .in_features = 64, .out_features = 64}));
  // A user's predicate is kept and called.
  Fp8Recipe only_ffn{.module_filter = [](const amp::Fp8ModuleInfo& m) { return m.name.find("ffn") != m.name.npos; }};
  EXPECT_TRUE(only_ffn.module_filter({.name = "layer.3.ffn.up", .type = "Linear"}));
  EXPECT_FALSE(
      only_ffn.module_filter({.name = "layer.3.attn.q", .type = "Linear", .in_features = 64, .out_features = 64}));
}

TEST(Fp8Recipe, InvalidOptionsNameTheOption) {
  expect_error([] { Fp8Recipe{.amax_history_len = 0}.validate(); },
               {"Fp8Recipe: amax_history_len must be in [1, ", "got 0"});
  expect_error([] { Fp8Recipe{.margin = -1}.validate(); }, {"Fp8Recipe: margin must be in [0, 64]", "got -1"});
  expect_error([] { Fp8Recipe{.margin = 65}.validate(); }, {"margin must be in [0, 64]", "got 65"});
  expect_error([] { Fp8Recipe{.format = static_cast<Fp8Format>(7)}.validate(); },
               {"Fp8Recipe: format 7 is not an Fp8Format", "Fp8Format::Hybrid"});
  expect_error([] { Fp8Recipe{.amax_compute_algo = static_cast<AmaxComputeAlgo>(2)}.validate(); },
               {"amax_compute_algo 2 is not an AmaxComputeAlgo"});
  expect_error([] { Fp8Recipe{.module_filter = nullptr}.validate(); }, {"Fp8Recipe: module_filter is empty"});
  expect_error([] { amp::parse_amax_compute_algo("mean"); },
               {"unknown amax_compute_algo \"mean\"", "\"max\" or \"most_recent\""});
  EXPECT_EQ(amp::parse_amax_compute_algo("max"), AmaxComputeAlgo::Max);
  EXPECT_EQ(amp::parse_amax_compute_algo("most_recent"), AmaxComputeAlgo::MostRecent);
  // The state's constructor validates too.
  expect_error([] { Fp8ScalingState({.margin = -3}, {Fp8Pass::Forward}); }, {"margin must be in [0, 64]", "got -3"});
  expect_error([] { Fp8ScalingState({}, {}); }, {"Fp8ScalingState: no tensors to track"});
  expect_error([] { amp::fp8_max(DType::BFloat16); }, {"fp8_max: bfloat16 is not an FP8 dtype"});
}

TEST(Fp8ScalingState, RecordRefusesBadTensors) {
  auto state = Fp8ScalingState::for_linear({.amax_history_len = 2});
  expect_error([&] { state.record_amax(3, ones({2})); }, {"record_amax: tensor index 3 is out of range for 3"});
  expect_error([&] { state.record_amax(-1, ones({2})); }, {"tensor index -1 is out of range"});
  expect_error([&] { state.record_amax(0, ones({2}, {.dtype = DType::Int64})); },
               {"record_amax: tensor 0 is int64", "float32, float16 or bfloat16"});
  expect_error([&] { state.record_amax(1, ones({2}).to(DType::Float8_e4m3fn)); },
               {"tensor 1 is float8_e4m3fn", "before quantising it"});
  expect_error([&] { state.record_amax(0, Tensor()); }, {"record_amax: tensor 0 is undefined"});
  expect_values(state.amax_history(), {2, 3}, std::vector<double>(6, 0.0), 0, 0);  // nothing written
}

// ---------------------------------------------------------------- checkpoints

// Runs `steps` made-up steps (the sequence test's) on `state`.
void run_steps(Fp8ScalingState& state, int first, int steps) {
  for (int step = first; step < first + steps; ++step) {
    for (int j = 0; j < state.size(); ++j) {
      const double v = made_up_amax(step, j);
      if (v >= 0) state.record_amax(j, tensor_with_amax(v, {}));
    }
    state.update();
  }
}

void expect_equal_states(const Fp8ScalingState& a, const Fp8ScalingState& b, const std::string& when) {
  EXPECT_EQ(a.recipe().format, b.recipe().format) << when;
  EXPECT_EQ(a.recipe().amax_history_len, b.recipe().amax_history_len) << when;
  EXPECT_EQ(a.recipe().margin, b.recipe().margin) << when;
  EXPECT_EQ(a.recipe().amax_compute_algo, b.recipe().amax_compute_algo) << when;
  expect_same(values(a.amax_history()), values(b.amax_history()), "amax_history " + when);
  expect_same(values(a.scale()), values(b.scale()), "scale " + when);
  expect_same(values(a.scale_inv()), values(b.scale_inv()), "scale_inv " + when);
}

TEST(Fp8ScalingState, StateDictRoundTripResumesExactly) {
  const Fp8Recipe saved_recipe{
      .format = Fp8Format::E4M3, .amax_history_len = 6, .margin = 2, .amax_compute_algo = AmaxComputeAlgo::MostRecent};
  auto original = Fp8ScalingState::for_linear(saved_recipe);
  run_steps(original, 0, 15);
  const amp::Fp8StateDict sd = original.state_dict();
  EXPECT_EQ(sd.values.at("format"), 1);
  EXPECT_EQ(sd.values.at("amax_history_len"), 6);
  EXPECT_EQ(sd.values.at("margin"), 2);
  EXPECT_EQ(sd.values.at("amax_compute_algo"), 1);
  EXPECT_EQ(sd.values.at("num_tensors"), 3);
  EXPECT_EQ(sd.values.at("pass.2"), 1);
  expect_same(values(sd.tensors.at("amax_history")), values(original.amax_history()), "saved history");

  // Loaded into a state built with other options (the defaults): the saved ones win, and the next steps agree.
  auto resumed = Fp8ScalingState::for_linear({});
  resumed.load_state_dict(sd);
  expect_equal_states(resumed, original, "after load");
  run_steps(original, 15, 20);
  run_steps(resumed, 15, 20);
  expect_equal_states(resumed, original, "20 steps after load");
  // The dict held copies: the 20 steps since changed the states but not the dict, and loading it again goes back.
  ASSERT_FALSE(equal(original.amax_history(), sd.tensors.at("amax_history")))
      << "the steps after the save changed nothing, so this test cannot tell a copy from an alias";
  resumed.load_state_dict(sd);
  expect_same(values(resumed.amax_history()), values(sd.tensors.at("amax_history")), "history reloaded");
  expect_same(values(resumed.scale()), values(sd.tensors.at("scale")), "scale reloaded");
}

TEST(Fp8ScalingState, LoadRefusesBadStatesAndChangesNothing) {
  auto source = Fp8ScalingState::for_linear({.amax_history_len = 4});
  run_steps(source, 0, 6);
  const amp::Fp8StateDict good = source.state_dict();
  auto target = Fp8ScalingState::for_linear({.amax_history_len = 3});
  run_steps(target, 3, 5);
  const amp::Fp8StateDict before = target.state_dict();
  auto unchanged = [&](const std::string& when) {
    EXPECT_EQ(target.recipe().amax_history_len, 3) << when;
    expect_same(values(target.amax_history()), values(before.tensors.at("amax_history")), "history " + when);
    expect_same(values(target.scale()), values(before.tensors.at("scale")), "scale " + when);
  };

  auto missing_value = good;
  missing_value.values.erase("margin");
  expect_error([&] { target.load_state_dict(missing_value); }, {"load_state_dict: the value \"margin\" is missing"});
  unchanged("missing value");
  auto missing_tensor = good;
  missing_tensor.tensors.erase("scale_inv");
  expect_error([&] { target.load_state_dict(missing_tensor); }, {"the tensor \"scale_inv\" is missing"});
  unchanged("missing tensor");
  auto wrong_shape = good;
  wrong_shape.values["amax_history_len"] = 5;
  expect_error([&] { target.load_state_dict(wrong_shape); },
               {"\"amax_history\" is float32 of shape", "expected float32 of shape [5, 3]"});
  unchanged("wrong shape");
  auto wrong_dtype = good;
  wrong_dtype.tensors["scale"] = wrong_dtype.tensors["scale"].to(DType::Float64);
  expect_error([&] { target.load_state_dict(wrong_dtype); }, {"\"scale\" is float64"});
  unchanged("wrong dtype");
  auto bad_margin = good;
  bad_margin.values["margin"] = 1.5;
  expect_error([&] { target.load_state_dict(bad_margin); }, {"\"margin\" is 1.5", "whole number in [0, 64]"});
  unchanged("bad margin");
  auto bad_algo = good;
  bad_algo.values["amax_compute_algo"] = 2;
  expect_error([&] { target.load_state_dict(bad_algo); }, {"\"amax_compute_algo\" is 2"});
  unchanged("bad algo");
  auto other_layer = Fp8ScalingState({}, {Fp8Pass::Forward, Fp8Pass::Backward}).state_dict();
  expect_error([&] { target.load_state_dict(other_layer); },
               {"the saved state tracks 2 tensors but this one tracks 3"});
  unchanged("other layer");
  auto swapped = good;
  swapped.values["pass.1"] = 1;
  expect_error([&] { target.load_state_dict(swapped); },
               {"tensor 1 was saved as a backward tensor but is a forward tensor here"});
  unchanged("swapped passes");
  target.load_state_dict(good);  // and the good one loads
  EXPECT_EQ(target.recipe().amax_history_len, 4);
}

}  // namespace
}  // namespace kiln::testing
