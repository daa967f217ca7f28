// Gradients of the linear algebra ops: matmul in every case torch.matmul supports (1-D operands, batched,
// broadcast batch dims), mm, bmm, addmm (with c broadcast, beta and alpha), dot and outer. gradcheck in
// float64 plus hand-derived values, the saved-operand version check, and autocast.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class LinalgGradTest : public BackendTest {};

Tensor strided_input(const Shape& shape, uint64_t seed = 7) {
  Tensor t = non_contiguous(make_input(shape, -1, 1, seed).detach()).requires_grad_();
  EXPECT_FALSE(t.is_contiguous());
  return t;
}

TensorList matmul_fn(const TensorList& in) { return {kiln::matmul(in[0], in[1])}; }

// ---------------------------------------------------------------- matmul
TEST(MatmulGrad, TwoDimensional) {
  check_gradients(matmul_fn, {make_input({3, 4}), make_input({4, 2}, -1, 1, 8)});
  check_gradients(matmul_fn, {strided_input({3, 4}), strided_input({4, 2}, 8)});
  // A transposed leaf as an operand.
  check_gradients(matmul_fn,
                  {make_input({4, 3}).detach().transpose(0, 1).requires_grad_(), make_input({4, 2}, -1, 1, 8)});
}

TEST(MatmulGrad, OneDimensionalOperands) {
  check_gradients(matmul_fn, {make_input({4}), make_input({4}, -1, 1, 8)});        // dot, 0-d result
  check_gradients(matmul_fn, {make_input({4}), make_input({4, 3}, -1, 1, 8)});     // row vector
  check_gradients(matmul_fn, {make_input({3, 4}), make_input({4}, -1, 1, 8)});     // column vector
  check_gradients(matmul_fn, {make_input({4}), make_input({2, 4, 3}, -1, 1, 8)});  // 1-D @ batched
  check_gradients(matmul_fn, {make_input({2, 3, 4}), make_input({4}, -1, 1, 8)});  // batched @ 1-D
  check_gradients(matmul_fn, {strided_input({4}), strided_input({2, 4, 3}, 8)});
}

TEST(MatmulGrad, BatchedAndBroadcast) {
  check_gradients(matmul_fn, {make_input({2, 3, 4}), make_input({2, 4, 2}, -1, 1, 8)});
  check_gradients(matmul_fn, {make_input({2, 3, 4}), make_input({4, 2}, -1, 1, 8)});        // linear layer
  check_gradients(matmul_fn, {make_input({3, 4}), make_input({2, 4, 2}, -1, 1, 8)});        // a broadcast
  check_gradients(matmul_fn, {make_input({2, 1, 2, 3}), make_input({3, 3, 2}, -1, 1, 8)});  // both broadcast
  check_gradients(matmul_fn, {make_input({1, 2, 3}), make_input({2, 3, 2}, -1, 1, 8)});     // size-1 batch dim
  check_gradients(matmul_fn, {strided_input({2, 2, 3}), strided_input({3, 2}, 8)});
  // A linear layer over a non-contiguous batch (its rows cannot be folded into one matrix).
  check_gradients(matmul_fn,
                  {make_input({3, 2, 4}).detach().transpose(0, 1).requires_grad_(), make_input({4, 2}, -1, 1, 8)});
}

// Heads transposed out of a (B, S, H, D) activation, as attention's q k^T: batch dims (B, H) that need two strides.
// The product copies such an operand once and backward reads that copy; the gradients still reach the views' leaves.
TEST(MatmulGrad, HeadTransposedOperands) {
  auto heads = [](const TensorList& in) {
    const Tensor q = in[0].transpose(1, 2), k = in[1].transpose(1, 2);  // (B, H, S, D)
    return TensorList{kiln::matmul(q, k.transpose(-2, -1))};            // (B, H, S, S)
  };
  check_gradients(heads, {make_input({2, 3, 2, 4}), make_input({2, 3, 2, 4}, -1, 1, 8)});
  // The same gradients as with the operands made contiguous first.
  const Tensor a = make_input({2, 3, 2, 4}), b = make_input({2, 3, 2, 4}, -1, 1, 8);
  kiln::matmul(a.transpose(1, 2), b.transpose(1, 2).transpose(-2, -1)).sum().backward();
  const Tensor a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  kiln::matmul(a2.transpose(1, 2).contiguous(), b2.transpose(1, 2).contiguous().transpose(-2, -1)).sum().backward();
  expect_values(a.grad(), a.shape(), values(a2.grad()), 0, 0);
  expect_values(b.grad(), b.shape(), values(b2.grad()), 0, 0);
}

TEST_P(LinalgGradTest, MatmulValues) {
  // A = [[1, 2], [3, 4]], B = [[5, 6], [7, 8]], g = 1: dA = g B^T = [[11, 15], [11, 15]], dB = A^T g = [[4, 4], [6,
  // 6]].
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  Tensor b = make({5, 6, 7, 8}, {2, 2}, opts()).requires_grad_();
  Tensor y = kiln::matmul(a, b);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "MatmulBackward");
  y.sum().backward();
  expect_values(a.grad(), {2, 2}, {11, 15, 11, 15});
  expect_values(b.grad(), {2, 2}, {4, 4, 6, 6});
}

TEST_P(LinalgGradTest, MatmulOneDimensionalValues) {
  // v (2) @ B (2, 3): out_j = sum_i v_i B_ij; with g = [1, 2, 3]: dv = B g, dB_ij = v_i g_j.
  Tensor v = make({1, -1}, {2}, opts()).requires_grad_();
  Tensor b = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  kiln::matmul(v, b).backward(make({1, 2, 3}, {3}, opts()));
  expect_values(v.grad(), {2}, {14, 32});
  expect_values(b.grad(), {2, 3}, {1, 2, 3, -1, -2, -3});
  // Batched (2, 1, 2) @ w (2): the gradient of w sums over the batch.
  Tensor x = make({1, 2, 3, 4}, {2, 1, 2}, opts()).requires_grad_();
  Tensor w = make({1, 1}, {2}, opts()).requires_grad_();
  kiln::matmul(x, w).sum().backward();
  expect_values(w.grad(), {2}, {4, 6});
  expect_values(x.grad(), {2, 1, 2}, {1, 1, 1, 1});
}

TEST_P(LinalgGradTest, MatmulBroadcastBatchGradientIsSummed) {
  // a (2, 2) is shared by both batches of b (2, 2, 1) = [[[1], [1]], [[2], [3]]]; g = 1: dA = sum_b g b^T.
  Tensor a = make({1, 0, 0, 1}, {2, 2}, opts()).requires_grad_();
  Tensor b = make({1, 1, 2, 3}, {2, 2, 1}, opts()).requires_grad_();
  kiln::matmul(a, b).sum().backward();
  expect_values(a.grad(), {2, 2}, {3, 4, 3, 4});
  expect_values(b.grad(), {2, 2, 1}, {1, 1, 1, 1});
}

TEST_P(LinalgGradTest, OnlyTheOperandThatRequiresGradGetsOne) {
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  Tensor b = make({5, 6, 7, 8}, {2, 2}, opts());
  kiln::matmul(a, b).sum().backward();
  expect_values(a.grad(), {2, 2}, {11, 15, 11, 15});
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(kiln::matmul(b, b).grad_fn(), nullptr);
}

// ---------------------------------------------------------------- mm, bmm
TEST(MmGrad, Gradcheck) {
  auto mm = [](const TensorList& in) { return TensorList{kiln::mm(in[0], in[1])}; };
  check_gradients(mm, {make_input({3, 4}), make_input({4, 2}, -1, 1, 8)});
  check_gradients(mm, {strided_input({3, 4}), make_input({4, 2}, -1, 1, 8)});
  auto bmm = [](const TensorList& in) { return TensorList{kiln::bmm(in[0], in[1])}; };
  check_gradients(bmm, {make_input({2, 3, 4}), make_input({2, 4, 2}, -1, 1, 8)});
  check_gradients(bmm, {make_input({2, 3, 4}), strided_input({2, 4, 2}, 8)});
}

TEST_P(LinalgGradTest, MmAndBmmValues) {
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  Tensor b = make({5, 6, 7, 8}, {2, 2}, opts()).requires_grad_();
  Tensor y = kiln::mm(a, b);
  EXPECT_EQ(y.grad_fn()->name(), "MmBackward");
  y.backward(make({1, 0, 0, 2}, {2, 2}, opts()));
  // dA = g B^T = [[5, 7], [12, 16]], dB = A^T g = [[1, 6], [2, 8]].
  expect_values(a.grad(), {2, 2}, {5, 7, 12, 16});
  expect_values(b.grad(), {2, 2}, {1, 6, 2, 8});
  Tensor x = make({1, 2, 3, 4}, {2, 1, 2}, opts()).requires_grad_();
  Tensor w = make({1, 2, 3, 4}, {2, 2, 1}, opts()).requires_grad_();
  Tensor z = kiln::bmm(x, w);
  EXPECT_EQ(z.grad_fn()->name(), "BmmBackward");
  z.sum().backward();
  expect_values(x.grad(), {2, 1, 2}, {1, 2, 3, 4});
  expect_values(w.grad(), {2, 2, 1}, {1, 2, 3, 4});
}

// ---------------------------------------------------------------- addmm
TEST(AddmmGrad, Gradcheck) {
  auto addmm = [](double beta, double alpha) {
    return [=](const TensorList& in) { return TensorList{kiln::addmm(in[0], in[1], in[2], beta, alpha)}; };
  };
  const Tensor a = make_input({3, 4}, -1, 1, 8), b = make_input({4, 2}, -1, 1, 9);
  check_gradients(addmm(1, 1), {make_input({3, 2}), a, b});
  check_gradients(addmm(0.5, -2), {make_input({2}), a, b});  // c broadcast over rows
  check_gradients(addmm(2, 1), {make_input({3, 1}), a, b});  // over columns
  check_gradients(addmm(1, 3), {make_input({}), a, b});      // a 0-d c
  check_gradients(addmm(1, 1), {strided_input({3, 2}), strided_input({3, 4}, 8), b});
}

TEST_P(LinalgGradTest, AddmmValues) {
  Tensor c = make({1, 1}, {2}, opts()).requires_grad_();
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  Tensor b = make({5, 6, 7, 8}, {2, 2}, opts()).requires_grad_();
  Tensor y = kiln::addmm(c, a, b, 2, 3);
  EXPECT_EQ(y.grad_fn()->name(), "AddmmBackward");
  y.sum().backward();
  expect_values(c.grad(), {2}, {4, 4});               // beta * (g summed over the 2 rows)
  expect_values(a.grad(), {2, 2}, {33, 45, 33, 45});  // alpha * g B^T
  expect_values(b.grad(), {2, 2}, {12, 12, 18, 18});  // alpha * A^T g
}

// ---------------------------------------------------------------- dot, outer
TEST(VectorProductGrad, Gradcheck) {
  auto dot = [](const TensorList& in) { return TensorList{kiln::dot(in[0], in[1])}; };
  check_gradients(dot, {make_input({5}), make_input({5}, -1, 1, 8)});
  check_gradients(dot, {strided_input({5}), strided_input({5}, 8)});
  auto outer = [](const TensorList& in) { return TensorList{kiln::outer(in[0], in[1])}; };
  check_gradients(outer, {make_input({3}), make_input({4}, -1, 1, 8)});
  check_gradients(outer, {strided_input({3}), strided_input({4}, 8)});
}

TEST_P(LinalgGradTest, DotAndOuterValues) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({4, 5, 6}, {3}, opts()).requires_grad_();
  Tensor d = kiln::dot(a, b);
  EXPECT_EQ(d.grad_fn()->name(), "DotBackward");
  (d * 2).backward();
  expect_values(a.grad(), {3}, {8, 10, 12});
  expect_values(b.grad(), {3}, {2, 4, 6});
  Tensor u = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor v = make({3, 4, 5}, {3}, opts()).requires_grad_();
  Tensor o = kiln::outer(u, v);
  EXPECT_EQ(o.grad_fn()->name(), "OuterBackward");
  o.backward(make({1, 0, 0, 0, 1, 1}, {2, 3}, opts()));
  // du_i = sum_j g_ij v_j, dv_j = sum_i g_ij u_i.
  expect_values(u.grad(), {2}, {3, 9});
  expect_values(v.grad(), {3}, {1, 2, 2});
}

// ---------------------------------------------------------------- errors, saved operands, autocast
TEST_P(LinalgGradTest, ShapeErrorsComeFromTheForward) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  expect_error([&] { kiln::matmul(a, a); }, {"matmul", "[2, 3]"});
  expect_error([&] { kiln::mm(a, a); }, {"mm", "[2, 3]"});
  expect_error([&] { kiln::bmm(a, a); }, {"bmm", "3-D"});
  expect_error([&] { kiln::dot(a, a); }, {"dot", "1-D"});
}

TEST_P(LinalgGradTest, ChangingASavedOperandInPlaceIsReportedAtBackward) {
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  Tensor w = make({1, 0, 0, 1}, {2, 2}, opts());
  Tensor y = kiln::mm(a, w);  // saves w for dA
  w.mul_(3.0);
  expect_error([&] { y.sum().backward(); }, {"MmBackward", "modified in place"});
  // a is not saved when only a requires grad: changing a non-leaf copy of it does not matter.
  Tensor h = a * 1.0;
  Tensor z = kiln::matmul(h, make({1, 0, 0, 1}, {2, 2}, opts()));
  {
    NoGradGuard no_grad;
    h.add_(1.0);
  }
  z.sum().backward();
  expect_values(a.grad(), {2, 2}, {1, 1, 1, 1});
}

TEST_P(LinalgGradTest, AutocastRunsInLowerPrecision) {
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts());
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    EXPECT_EQ(kiln::matmul(a, a).dtype(), DType::BFloat16);
    EXPECT_EQ(kiln::addmm(a, a, a).dtype(), DType::BFloat16);
  }
  // bfloat16 operands are used as they are, and record.
  Tensor x = make({1, 2, 3, 4}, {2, 2}, opts(DType::BFloat16)).requires_grad_();
  Tensor w = make({5, 6, 7, 8}, {2, 2}, opts(DType::BFloat16)).requires_grad_();
  Tensor y;
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    y = kiln::mm(x, w);
  }
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_EQ(y.grad_fn()->name(), "MmBackward");
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::BFloat16);
  expect_values(x.grad(), {2, 2}, {11, 15, 11, 15});
  expect_values(w.grad(), {2, 2}, {4, 4, 6, 6});
}

// A linear layer, addmm(bias, x, W^T): the bias gradient comes from the weight gradient's product (row sums of
// g^T), in every dtype a layer trains in; against sums and products in double.
TEST_P(LinalgGradTest, LinearBiasGradientFromTheWeightProduct) {
  const int64_t m = 64, in = 32, out = 24;
  std::vector<double> xv(m * in), wv(out * in), bv(out), gv(m * out);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(static_cast<int64_t>(i * 7 % 9) - 4) / 4;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<double>(static_cast<int64_t>(i * 5 % 7) - 3) / 4;
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<double>(i % 3) / 2;
  for (size_t i = 0; i < gv.size(); ++i) gv[i] = static_cast<double>(static_cast<int64_t>(i * 3 % 5) - 2) / 2;
  const LinearGradients ref = linear_gradients(xv, wv, gv, m, in, out);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const TensorOptions o = opts(dt);
    Tensor x = make(xv, {m, in}, o).requires_grad_(), w = make(wv, {out, in}, o).requires_grad_();
    Tensor b = make(bv, {out}, o).requires_grad_();
    Tensor y = kiln::addmm(b, x, w.t());
    (y * make(gv, {m, out}, o)).sum().backward();
    const double tol = dt == DType::Float32 ? 1e-4 : 0.02;
    expect_values(b.grad(), {out}, ref.db, tol, tol * 4);
    expect_values(w.grad(), {out, in}, ref.dw, tol, tol * 4);
    expect_values(x.grad(), {m, in}, ref.dx, tol, tol * 4);
  }
}

KILN_INSTANTIATE_BACKENDS(LinalgGradTest);

}  // namespace
}  // namespace kiln::testing
