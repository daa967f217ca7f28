// Random factories and in-place samplers; every draw takes one offset from a Philox generator.
#include <cmath>

#include "kiln/tensor/backend.h"
#include "kiln/tensor/cuda.h"  // cuda::Graph
#include "kiln/tensor/internal_ops.h"

namespace kiln::internal {
namespace {

Generator& generator_for(Generator* gen, Device device) { return gen ? *gen : default_generator(device); }

}  // namespace

GeneratorState draw_for(Generator* gen, Device device) {
  Generator& g = generator_for(gen, device);
  if (!device.is_cuda() || !cuda::Graph::capturing()) return g.next_draw();
  // Gradient checkpointing rewinds the generator to draw a region's numbers again; each replay of a captured
  // draw takes a fresh offset, so the recomputed numbers would differ from the forward's.
  KILN_CHECK_AS(NotImplementedError, !g.rewound_in_capture(),
                "random op in a CUDA graph capture after the generator was rewound (gradient checkpointing with "
                "dropout): replays could not draw the same numbers again; capture without checkpointing, or with "
                "dropout off in the checkpointed layers");
  // A captured kernel would repeat this draw on every replay: its offset lives in device memory instead, and
  // every replay takes a fresh draw from the generator and writes its offset there first. The capture itself,
  // whose kernels do not run, takes none (as the fused attention's dropout): the first replay then draws what the
  // next eager step would have, so replayed and eager runs from the same state use the same numbers.
  GeneratorState draw = g.state();
  Tensor slot = cuda::Graph::replay_input({1}, {.dtype = DType::Int64, .device = device});
  Generator* source = &g;
  const uint64_t seed = draw.seed;
  cuda::Graph::on_replay([source, slot, seed]() mutable {
    const GeneratorState next = source->next_draw();
    KILN_CHECK(next.seed == seed, "cuda::Graph::replay: the generator of a random op in this graph was seeded again ",
               "(seed ", seed, " when captured, ", next.seed, " now); capture the step again after seeding");
    internal::fill_(slot, static_cast<int64_t>(next.offset));
  });
  draw.device_offset = reinterpret_cast<const uint64_t*>(slot.data_ptr<int64_t>());
  return draw;
}

namespace {

void check_floating(DType dtype, std::string_view op) {
  KILN_CHECK(is_floating_point(dtype), op, ": needs a floating-point dtype, got ", dtype, "; use randint for integers");
}

// Fills t with one draw; t may be any layout (element i is the i-th in row-major order).
Tensor& sample_(Tensor& t, const RandomParams& params, Generator* gen) {
  KILN_CHECK(t.defined(), "random: the tensor is undefined");
  static constexpr std::string_view kNames[] = {"uniform_", "normal_", "randint", "bernoulli"};
  check_not_float8(kNames[static_cast<int>(params.kind)], t.dtype());
  if (t.numel() == 0) return t;
  const GeneratorState draw = draw_for(gen, t.device());
  backend(t.device()).random(t, params, draw);
  t.impl().storage()->bump_version();
  return t;
}

}  // namespace

Tensor& uniform_(Tensor& t, double from, double to, Generator* gen) {
  KILN_CHECK(t.defined(), "uniform_: the tensor is undefined");
  check_floating(t.dtype(), "uniform_");
  KILN_CHECK(from <= to, "uniform_: expects from <= to, got from=", from, " and to=", to);
  return sample_(t, {.kind = RandomKind::Uniform, .a = from, .b = to}, gen);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  KILN_CHECK(t.defined(), "normal_: the tensor is undefined");
  check_floating(t.dtype(), "normal_");
  KILN_CHECK(std >= 0 && std::isfinite(std), "normal_: std must be finite and >= 0, got ", std);
  return sample_(t, {.kind = RandomKind::Normal, .a = mean, .b = std}, gen);
}

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* gen) {
  Tensor t = empty(shape, options);
  return uniform_(t, 0, 1, gen);
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* gen) {
  Tensor t = empty(shape, options);
  return normal_(t, 0, 1, gen);
}

Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& options, Generator* gen) {
  Tensor t = empty(shape, options);
  return normal_(t, mean, std, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options, Generator* gen) {
  KILN_CHECK(low < high, "randint: expects low < high, got low=", low, " and high=", high);
  TensorOptions o = options;
  if (!o.dtype) o.dtype = DType::Int64;
  KILN_CHECK(*o.dtype != DType::Bool || (low >= 0 && high <= 2), "randint: range [", low, ", ", high,
             ") does not fit dtype bool");
  Tensor t = empty(shape, o);
  return sample_(t, {.kind = RandomKind::Randint, .low = low, .high = high}, gen);
}

Tensor bernoulli(const Shape& shape, double p, const TensorOptions& options, Generator* gen) {
  KILN_CHECK(p >= 0 && p <= 1, "bernoulli: probability must be in [0, 1], got ", p);
  Tensor t = empty(shape, options);
  return sample_(t, {.kind = RandomKind::Bernoulli, .a = p}, gen);
}

Tensor bernoulli(const Tensor& p, Generator* gen) {
  KILN_CHECK(p.defined(), "bernoulli: the probability tensor is undefined");
  check_not_float8("bernoulli", p.dtype());
  check_floating(p.dtype(), "bernoulli");
  // One uniform draw in p's layout, compared with p: element i of the result is u_i < p_i.
  Tensor u = empty(p.shape(), {.dtype = p.dtype(), .device = p.device()});
  uniform_(u, 0, 1, gen);
  return cast(lt(u, p), p.dtype());
}

std::tuple<Tensor, Tensor> dropout(const Tensor& x, double p, Generator* gen) {
  KILN_CHECK(x.defined(), "dropout: the input is undefined (a default-constructed Tensor)");
  check_not_float8("dropout", x.dtype());
  KILN_CHECK(p >= 0 && p < 1, "dropout: p must lie in [0, 1), got ", p,
             " (p is the probability of zeroing an element)");
  KILN_CHECK(x.is_floating_point(), "dropout: the input must be floating point, got ", x.dtype(),
             "; convert it with .to(DType::Float32) first");
  // Laid out as x (channels-last stays channels-last); the numbering is row-major whatever the layout.
  Tensor out = empty_like(x), mask = empty_like(x);
  if (x.numel() == 0) return {out, mask};  // as bernoulli: an empty draw takes no offset
  const GeneratorState draw = draw_for(gen, x.device());
  backend(x.device()).dropout(out, mask, x, p, draw);
  return {out, mask};
}

Tensor randperm(int64_t n, const TensorOptions& options, Generator* gen) {
  KILN_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  TensorOptions o = options;
  if (!o.dtype) o.dtype = DType::Int64;
  // Sorting n random keys gives a uniform permutation on every backend; 64-bit keys make ties negligible
  // and the stable sort breaks the rare tie by position.
  Tensor keys = randint(0, INT64_MAX, {n}, {.dtype = DType::Int64, .device = o.device}, gen);
  auto [sorted, order] = sort(keys, 0, false, true);
  return cast(order, *o.dtype);
}

}  // namespace kiln::internal
