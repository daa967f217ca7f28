// Checkpoints of a model with FP8 Linear layers (kiln/layers/fp8_linear.h): the scaling state (the fp8_* buffers)
// goes into the file with the weights, a freshly prepared model resumes from it exactly, and a model that was not
// prepared refuses the file with an error that says to call amp::prepare_fp8.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/io/checkpoint.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

nn::Handle<nn::Sequential> make_model(const amp::Fp8Recipe* recipe) {
  manual_seed(7);
  auto m = nn::make<nn::Sequential>(nn::Linear(32, 32), nn::ReLU(), nn::Linear(32, 16));
  if (recipe != nullptr) amp::prepare_fp8(*m, *recipe, Device::cpu());
  return m;
}

// One FP8 training step's output and gradients (the FP8 region on the CPU).
std::vector<Tensor> fp8_step(nn::Sequential& m, const amp::Fp8Recipe& recipe, int i) {
  m.zero_grad();
  const Tensor x = make(uniform(6 * 32, -1.0 - i, 1.0 + i, 200 + i), {6, 32});
  Tensor y;
  {
    amp::Autocast cast(DType::BFloat16, {.device_type = DeviceType::CPU, .fp8 = recipe});
    y = m.forward(x);
  }
  y.backward(make(uniform(6 * 16, -1, 1, 300 + i), {6, 16}, {.dtype = DType::BFloat16}));
  std::vector<Tensor> out{y};
  for (const Tensor& p : m.parameters()) out.push_back(p.grad());
  return out;
}

TEST(Fp8Checkpoint, ResumesExactlyAndNeedsPreparation) {
  const amp::Fp8Recipe recipe{.amax_history_len = 8, .margin = 1};
  TempFolder dir;
  auto a = make_model(&recipe);
  fp8_step(*a, recipe, 0);
  fp8_step(*a, recipe, 1);
  io::save_checkpoint(dir.file("fp8.h5"), {.model = a.get()});
  const std::vector<Tensor> want = fp8_step(*a, recipe, 2);

  auto b = make_model(&recipe);
  io::load_checkpoint(dir.file("fp8.h5"), {.model = b.get()});
  const std::vector<Tensor> got = fp8_step(*b, recipe, 2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << i;
    EXPECT_EQ(values(got[i]), values(want[i])) << "output / gradient " << i;
  }
  const nn::StateDict sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), 10u);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(values(sb[i].second), values(sa[i].second)) << sa[i].first;

  auto c = make_model(nullptr);
  expect_error([&] { io::load_checkpoint(dir.file("fp8.h5"), {.model = c.get()}); },
               {"fp8.h5", "0.fp8_amax_history", "amp::prepare_fp8(model, recipe, device)"});
}

}  // namespace
}  // namespace kiln::testing
