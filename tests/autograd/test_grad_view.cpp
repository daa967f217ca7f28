// Gradients of the view ops: gradcheck for each (contiguous and non-contiguous inputs, negative dims),
// gradients reaching the base of a view, chains of views, multi-output ops with unused outputs, and
// views that return their input unchanged. Hand-derived values where stated.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// A non-contiguous float64 leaf that requires grad, for gradcheck.
Tensor strided_input(const Shape& shape, uint64_t seed = 7) {
  return non_contiguous(make_input(shape, -1, 1, seed).detach()).requires_grad_();
}

// ---------------------------------------------------------------- gradcheck, one op at a time

TEST(ViewGrad, ReshapeLikeOps) {
  auto fn = [](auto f) { return [f](const TensorList& in) { return TensorList{f(in[0])}; }; };
  check_gradients(fn([](const Tensor& x) { return kiln::view(x, {4, -1}); }), {make_input({2, 6})});
  check_gradients(fn([](const Tensor& x) { return kiln::reshape(x, {3, 4}); }), {make_input({2, 6})});
  // A non-contiguous input makes reshape copy; the gradient is the same.
  check_gradients(fn([](const Tensor& x) { return kiln::reshape(x, {12}); }), {strided_input({3, 4})});
  check_gradients(fn([](const Tensor& x) { return kiln::flatten(x, 1, -1); }), {make_input({2, 3, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::flatten(x); }), {strided_input({2, 3})});
  check_gradients(fn([](const Tensor& x) { return kiln::unflatten(x, -1, {2, 3}); }), {make_input({2, 6})});
  check_gradients(fn([](const Tensor& x) { return kiln::squeeze(x); }), {make_input({1, 3, 1, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::squeeze(x, -2); }), {make_input({3, 1, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::unsqueeze(x, -1); }), {strided_input({2, 3})});
}

TEST(ViewGrad, PermuteTransposeExpand) {
  auto fn = [](auto f) { return [f](const TensorList& in) { return TensorList{f(in[0])}; }; };
  check_gradients(fn([](const Tensor& x) { return kiln::permute(x, {2, 0, 1}); }), {make_input({2, 3, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::permute(x, {-1, 0, 1}); }), {strided_input({2, 2, 3})});
  check_gradients(fn([](const Tensor& x) { return kiln::transpose(x, 0, -1); }), {make_input({2, 3, 2})});
  // Expanded dims (size 1 -> 3) and a new leading dim: gradients are summed over them.
  check_gradients(fn([](const Tensor& x) { return kiln::expand(x, {2, 3, 4}); }), {make_input({3, 1})});
  check_gradients(fn([](const Tensor& x) { return kiln::expand(x, {-1, 3}); }), {strided_input({2, 1})});
}

TEST(ViewGrad, RegionOps) {
  auto fn = [](auto f) { return [f](const TensorList& in) { return TensorList{f(in[0])}; }; };
  check_gradients(fn([](const Tensor& x) { return kiln::narrow(x, -1, 1, 2); }), {make_input({2, 4})});
  check_gradients(fn([](const Tensor& x) { return kiln::slice(x, 0, 1, std::nullopt, 2); }), {make_input({5, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::slice(x, -1, -3, -1, 1); }), {strided_input({2, 4})});
  check_gradients(fn([](const Tensor& x) { return kiln::select(x, 1, -1); }), {make_input({2, 3, 2})});
  check_gradients(fn([](const Tensor& x) { return kiln::diagonal(x); }), {make_input({3, 4})});
  check_gradients(fn([](const Tensor& x) { return kiln::diagonal(x, 1, -1, 0); }), {make_input({3, 4})});
  check_gradients(fn([](const Tensor& x) { return kiln::diagonal(x, -1, 1, 2); }), {strided_input({2, 3, 3})});
}

TEST(ViewGrad, AsStrided) {
  auto fn = [](auto f) { return [f](const TensorList& in) { return TensorList{f(in[0])}; }; };
  // Overlapping windows (each interior element read twice) and a strided, offset view.
  check_gradients(fn([](const Tensor& x) { return kiln::as_strided(x, {3, 2}, {1, 1}); }), {make_input({4})});
  check_gradients(fn([](const Tensor& x) { return kiln::as_strided(x, {2, 2}, {1, 3}, 1); }), {make_input({2, 3})});
  // A contiguous input that does not start at its storage's beginning: the offset is relative to it.
  check_gradients(
      [](const TensorList& in) {
        Tensor row = kiln::select(in[0], 0, 1);  // (3,), storage offset 3
        return TensorList{kiln::as_strided(row, {2}, {2}, row.offset())};
      },
      {make_input({2, 3})});
}

TEST(ViewGrad, MultiOutputOps) {
  check_gradients([](const TensorList& in) { return kiln::split(in[0], 2, 1); }, {make_input({2, 5})});
  check_gradients(
      [](const TensorList& in) {
        return kiln::split_with_sizes(in[0], {1, 0, 3}, -1);
      },
      {strided_input({2, 4})});
  check_gradients([](const TensorList& in) { return kiln::chunk(in[0], 3, 0); }, {make_input({4, 2})});
  check_gradients([](const TensorList& in) { return kiln::unbind(in[0], -1); }, {make_input({2, 3})});
  // Only some outputs used: the others reach backward undefined.
  check_gradients([](const TensorList& in) { return TensorList{kiln::chunk(in[0], 3, 1)[1]}; }, {make_input({2, 6})});
  check_gradients(
      [](const TensorList& in) {
        auto parts = kiln::unbind(in[0], 0);
        return TensorList{parts[0] * parts[2]};
      },
      {make_input({3, 2})});
}

TEST(ViewGrad, ChainedViews) {
  check_gradients(
      [](const TensorList& in) {
        Tensor p = kiln::permute(in[0], {1, 0, 2});                // (3, 2, 2)
        Tensor r = kiln::reshape(p, {3, 4});                       // copies: p is not contiguous
        return TensorList{kiln::slice(r, 1, 1, std::nullopt, 2)};  // (3, 2)
      },
      {make_input({2, 3, 2})});
}

// ---------------------------------------------------------------- values, names, no-op views

class ViewGradTest : public BackendTest {};

// x (2, 4) = 0..7; x.narrow(1, 1, 2).sum(): ones at columns 1 and 2, zeros elsewhere.
TEST_P(ViewGradTest, GradientThroughAViewReachesItsBase) {
  Tensor x = make({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}, opts()).requires_grad_();
  Tensor v = x.narrow(1, 1, 2);
  ASSERT_NE(v.grad_fn(), nullptr);
  EXPECT_EQ(v.grad_fn()->name(), "NarrowBackward");
  v.sum().backward();
  expect_values(x.grad(), {2, 4}, {0, 1, 1, 0, 0, 1, 1, 0});
}

// slice with a step and select, weighted: gradients land at the viewed elements only.
TEST_P(ViewGradTest, SliceWithStepAndSelectValues) {
  Tensor x = make({0, 1, 2, 3, 4, 5}, {6}, opts()).requires_grad_();
  Tensor s = x.slice(0, 1, std::nullopt, 2);  // elements 1, 3, 5
  (s * make({10, 20, 30}, {3}, opts())).sum().backward();
  expect_values(x.grad(), {6}, {0, 10, 0, 20, 0, 30});

  Tensor m = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  Tensor row = kiln::select(m, 0, -1);
  EXPECT_EQ(row.grad_fn()->name(), "SelectBackward");
  (row * row).sum().backward();  // d/dm = 2 m on row 1
  expect_values(m.grad(), {2, 3}, {0, 0, 0, 8, 10, 12});
}

// x (2, 3, 2) of 0..11 -> permute(1, 0, 2) (3, 2, 2) -> reshape (3, 4) -> columns 1 and 3 (3, 2).
// r[i][j] = p[i][j / 2][j % 2] = x[j / 2][i][j % 2]: columns 1, 3 are x[0][i][1] and x[1][i][1], so the
// gradient of sum(out * w) with w = 1..6 row-major puts w into x[k][i][1].
TEST_P(ViewGradTest, ChainedViewsValues) {
  std::vector<double> data(12);
  for (int i = 0; i < 12; ++i) data[i] = i;
  Tensor x = make(data, {2, 3, 2}, opts()).requires_grad_();
  Tensor out = x.permute({1, 0, 2}).reshape({3, 4}).slice(1, 1, std::nullopt, 2);
  EXPECT_EQ(out.grad_fn()->name(), "SliceBackward");
  expect_values(out, {3, 2}, {1, 7, 3, 9, 5, 11});
  (out * make({1, 2, 3, 4, 5, 6}, {3, 2}, opts())).sum().backward();
  // x[0][i][1] gets w[i][0] = 1, 3, 5; x[1][i][1] gets w[i][1] = 2, 4, 6.
  expect_values(x.grad(), {2, 3, 2}, {0, 1, 0, 3, 0, 5, 0, 2, 0, 4, 0, 6});
}

// chunk(3) of 6 columns; only chunk 1 (columns 2, 3) used.
TEST_P(ViewGradTest, MultiOutputWithUnusedOutputs) {
  Tensor x = ones({2, 6}, opts()).requires_grad_();
  auto parts = kiln::chunk(x, 3, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].grad_fn(), parts[2].grad_fn());  // one node, several outputs
  EXPECT_EQ(parts[1].grad_fn()->name(), "ChunkBackward");
  (parts[1] * 3).sum().backward();
  expect_values(x.grad(), {2, 6}, {0, 0, 3, 3, 0, 0, 0, 0, 3, 3, 0, 0});

  Tensor y = make({1, 2, 3, 4, 5, 6}, {3, 2}, opts()).requires_grad_();
  auto rows = kiln::unbind(y, 0);
  EXPECT_EQ(rows[0].grad_fn()->name(), "UnbindBackward");
  (rows[2] * rows[0]).sum().backward();  // d/drow0 = row2, d/drow2 = row0, row 1 unused
  expect_values(y.grad(), {3, 2}, {5, 6, 0, 0, 1, 2});

  Tensor z = make({1, 2, 3, 4, 5}, {5}, opts()).requires_grad_();
  auto pieces = kiln::split_with_sizes(z, {2, 3});
  EXPECT_EQ(pieces[0].grad_fn()->name(), "SplitWithSizesBackward");
  pieces[1].sum().backward();
  expect_values(z.grad(), {5}, {0, 0, 1, 1, 1});
  EXPECT_EQ(kiln::split(z, 2)[2].grad_fn()->name(), "SplitBackward");
}

// Pieces of a split whose gradients arrive as the pieces of one tensor, in place (a cat's backward hands out narrow
// views of its gradient): the input's gradient is that tensor itself, no copy. Out of order, or overlapping the
// wrong places, they are concatenated as usual. Hand-derived values.
TEST_P(ViewGradTest, SplitOfGradientsLyingSideBySideTakesThemAsTheyAre) {
  const std::vector<double> gv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  Tensor x = make(std::vector<double>(12, 0.0), {2, 6}, opts()).requires_grad_();
  auto parts = kiln::split(x, 2, 1);  // three (2, 2) pieces
  Tensor g = make(gv, {2, 6}, opts());
  kiln::cat({parts[0], parts[1], parts[2]}, 1).backward(g);
  expect_values(x.grad(), {2, 6}, gv);

  Tensor y = make(std::vector<double>(12, 0.0), {2, 6}, opts()).requires_grad_();
  auto swapped = kiln::split(y, 2, 1);
  kiln::cat({swapped[1], swapped[0], swapped[2]}, 1).backward(g);  // piece 1 gets columns 0-1, piece 0 gets 2-3
  expect_values(y.grad(), {2, 6}, {3, 4, 1, 2, 5, 6, 9, 10, 7, 8, 11, 12});
}

// Windows [0,1], [1,2], [2,3] of 4 elements: interior elements are read twice.
TEST_P(ViewGradTest, AsStridedOverlappingViewSumsGradients) {
  Tensor x = make({1, 2, 3, 4}, {4}, opts()).requires_grad_();
  Tensor w = kiln::as_strided(x, {3, 2}, {1, 1});
  EXPECT_EQ(w.grad_fn()->name(), "AsStridedBackward");
  expect_values(w, {3, 2}, {1, 2, 2, 3, 3, 4});
  (w * make({1, 10, 100, 1000, 10000, 100000}, {3, 2}, opts())).sum().backward();
  expect_values(x.grad(), {4}, {1, 110, 11000, 100000});
}

TEST_P(ViewGradTest, AsStridedRejectsInputsItCannotDifferentiate) {
  Tensor x = ones({3, 4}, opts()).requires_grad_();
  Tensor t = x.transpose(0, 1);  // not contiguous
  expect_error([&] { kiln::as_strided(t, {2}, {1}); }, {"as_strided", "contiguous", ".contiguous()"});
  Tensor row = x.select(0, 1);  // elements 4..7 of the storage
  expect_error([&] { kiln::as_strided(row, {2}, {1}, 0); }, {"as_strided", "outside the input"});
  expect_error([&] { kiln::as_strided(row, {3}, {2}); }, {"as_strided", "outside the input"});
  // Without gradients the raw op is used as it is.
  NoGradGuard no_grad;
  EXPECT_EQ(kiln::as_strided(t, {2}, {1}).numel(), 2);
}

// x (3, 1) expanded to (2, 3, 4): each element is read 8 times.
TEST_P(ViewGradTest, ExpandSumsOverExpandedDims) {
  Tensor x = make({1, 2, 3}, {3, 1}, opts()).requires_grad_();
  Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.grad_fn()->name(), "ExpandBackward");
  e.sum().backward();
  expect_values(x.grad(), {3, 1}, {8, 8, 8});
}

TEST_P(ViewGradTest, DiagonalValuesAndNames) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  Tensor d = kiln::diagonal(x, 1);  // x[0][1], x[1][2]
  EXPECT_EQ(d.grad_fn()->name(), "DiagonalBackward");
  expect_values(d, {2}, {2, 6});
  (d * make({5, 7}, {2}, opts())).sum().backward();
  expect_values(x.grad(), {2, 3}, {0, 5, 0, 0, 0, 7});
}

TEST_P(ViewGradTest, NodeNames) {
  Tensor x = ones({2, 1, 3}, opts()).requires_grad_();
  EXPECT_EQ(kiln::view(x, {6}).grad_fn()->name(), "ViewBackward");
  EXPECT_EQ(kiln::reshape(x, {3, 2}).grad_fn()->name(), "ReshapeBackward");
  EXPECT_EQ(kiln::flatten(x).grad_fn()->name(), "FlattenBackward");
  EXPECT_EQ(kiln::unflatten(x, 2, {3, 1}).grad_fn()->name(), "UnflattenBackward");
  EXPECT_EQ(kiln::squeeze(x).grad_fn()->name(), "SqueezeBackward");
  EXPECT_EQ(kiln::squeeze(x, 1).grad_fn()->name(), "SqueezeBackward");
  EXPECT_EQ(kiln::unsqueeze(x, 0).grad_fn()->name(), "UnsqueezeBackward");
  EXPECT_EQ(kiln::permute(x, {2, 1, 0}).grad_fn()->name(), "PermuteBackward");
  EXPECT_EQ(kiln::transpose(x, 0, 2).grad_fn()->name(), "TransposeBackward");
  // Views of tensors that do not require grad record nothing.
  Tensor c = ones({2, 3}, opts());
  EXPECT_FALSE(c.narrow(0, 0, 1).requires_grad());
  EXPECT_EQ(c.narrow(0, 0, 1).grad_fn(), nullptr);
  NoGradGuard no_grad;
  EXPECT_FALSE(x.narrow(0, 0, 1).requires_grad());
}

// Raw views that return the input itself: the wrapper returns it unchanged and records nothing.
TEST_P(ViewGradTest, ViewsThatReturnTheInputRecordNothing) {
  Tensor x = ones({2, 3}, opts()).requires_grad_();
  Tensor s = kiln::squeeze(x, 0);  // dim 0 has size 2
  EXPECT_TRUE(s.is_same(x));
  EXPECT_TRUE(s.is_leaf());
  EXPECT_TRUE(kiln::expand(x, {2, 3}).is_same(x));
  EXPECT_TRUE(kiln::flatten(x, 1, 1).is_same(x));
  Tensor scalar = make({2}, {}, opts()).requires_grad_();
  EXPECT_TRUE(kiln::transpose(scalar, 0, -1).is_same(scalar));
  Tensor h = x * 2;  // a non-leaf keeps its own node
  EXPECT_EQ(kiln::squeeze(h, 1).grad_fn(), h.grad_fn());
  kiln::squeeze(h, 1).sum().backward();
  expect_values(x.grad(), {2, 3}, {2, 2, 2, 2, 2, 2});
}

// A write into a view of a tensor that takes part in autograd is rejected while recording.
TEST_P(ViewGradTest, InPlaceWriteIntoAViewIsAnError) {
  Tensor x = ones({2, 3}, opts()).requires_grad_();
  Tensor h = x * 2;
  Tensor v = h.narrow(1, 0, 2);
  Tensor src = ones({2, 2}, opts());
  expect_error([&] { v.copy_(src); }, {"copy_", "view", "clone()"});
}

KILN_INSTANTIATE_BACKENDS(ViewGradTest);

}  // namespace
}  // namespace kiln::testing
