// Building models from module values (nn::Sequential{nn::Linear(3, 4), nn::ReLU()}), calling them through
// nn::Handle (model(x), block(x, mask)), and the profiler ranges those calls open.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/profiler/profiler.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using profiler::Event;
using trace::Kind;

// Copies values into a parameter without recording anything.
void set(Tensor p, const std::vector<double>& v) {
  NoGradGuard no_grad;
  p.copy_(make(v, p.shape()));
}

template <typename T>
std::vector<std::string> names(const std::vector<std::pair<std::string, T>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

std::vector<const Event*> of_kind(const profiler::Result& r, Kind k, const std::string& name) {
  std::vector<const Event*> out;
  for (const Event& e : r.events())
    if (e.kind == k && e.name == name) out.push_back(&e);
  return out;
}

// A module of one's own, with a child registered from a value.
struct Affine : nn::Module {
  nn::Handle<nn::Linear> fc;
  Affine() : Module("Affine") { fc = register_module("fc", nn::Linear(2, 1)); }
  Tensor forward(const Tensor& x) override { return fc(x); }
};

// A module with a forward of two inputs returning two tensors, beside its one-tensor forward.
struct MaskedScale : nn::Module {
  Tensor scale;
  MaskedScale() : Module("MaskedScale") { scale = register_parameter("scale", full({1}, 2.0)); }
  Tensor forward(const Tensor& x) override { return x * scale; }
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& mask) {
    Tensor kept = x * mask;
    return {kept * scale, sum(mask)};
  }
};

// One more: a struct result and a non-tensor argument.
struct Shifted {
  Tensor value;
  double shift;
};
class Shift : public nn::Module {
  using nn::Module::forward;  // private: no one-tensor forward

 public:
  Shift() : Module("Shift") {}
  Shifted forward(const Tensor& x, double by) { return {x + by, by}; }
};

TEST(ModuleHandle, SequentialOfValuesMatchesAFloat64HandComputation) {
  nn::Sequential seq{nn::Linear(3, 2), nn::ReLU(), nn::Linear(2, 1)};
  EXPECT_EQ(names(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq[1]->type_name(), "ReLU");
  const std::vector<double> w0 = {0.5, -1.0, 2.0, -0.25, 0.75, 1.5}, b0 = {0.1, -0.2}, w2 = {1.5, -2.0}, b2 = {0.3};
  set(seq.at<nn::Linear>(0)->weight, w0);
  set(seq.at<nn::Linear>(0)->bias, b0);
  set(seq.at<nn::Linear>(2)->weight, w2);
  set(seq.at<nn::Linear>(2)->bias, b2);
  const std::vector<double> x = {1.0, 2.0, -1.0, -0.5, 0.25, 3.0};  // (2, 3)
  std::vector<double> expected;
  for (int n = 0; n < 2; ++n) {
    double out = b2[0];
    for (int j = 0; j < 2; ++j) {
      double h = b0[j];
      for (int k = 0; k < 3; ++k) h += w0[j * 3 + k] * x[n * 3 + k];
      out += w2[j] * (h > 0 ? h : 0.0);
    }
    expected.push_back(out);
  }
  expect_values(seq(make(x, {2, 3})), {2, 1}, expected);
}

TEST(ModuleHandle, SequentialOfTheDocumentedConvStack) {
  manual_seed(3);
  nn::Sequential seq{nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(), nn::Linear(16 * 28 * 28, 10)};
  const auto params = seq.named_parameters();
  ASSERT_EQ(names(params), (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(params[0].second.shape(), (Shape{16, 1, 3, 3}));
  EXPECT_EQ(params[2].second.shape(), (Shape{10, 16 * 28 * 28}));
  Tensor x = randn({2, 1, 28, 28});
  Tensor y = seq(x);
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  // The same layers called one by one.
  Tensor h = relu(nn::conv2d(x, params[0].second, params[1].second, {.padding = 1}));
  Tensor ref = nn::linear(reshape(h, {2, -1}), params[2].second, params[3].second);
  EXPECT_EQ(values(y), values(ref));
}

TEST(ModuleHandle, ValuesAndHandlesMixAndTheOlderFormsStillWork) {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Handle<nn::Linear> handle = nn::make<nn::Linear>(2, 2);
  nn::Sequential seq{shared, nn::ReLU(), handle, nn::Tanh()};
  EXPECT_EQ(seq.size(), 4);
  EXPECT_EQ(seq[0].get(), shared.get());  // shared, not copied
  EXPECT_EQ(seq[2].get(), handle.get());
  EXPECT_EQ(seq[3]->type_name(), "Tanh");
  seq.append(nn::Sigmoid()).append("head", nn::Linear(2, 1));
  EXPECT_EQ(names(seq.named_children()), (std::vector<std::string>{"0", "1", "2", "3", "4", "head"}));

  nn::Sequential from_vector(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::ReLU>()});
  nn::Sequential from_pointers{std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::ReLU>()};
  EXPECT_EQ(from_vector.size(), 2);
  EXPECT_EQ(from_pointers.size(), 2);
  std::vector<std::shared_ptr<nn::Linear>> linears{std::make_shared<nn::Linear>(2, 2), shared};
  nn::Sequential from_linears(linears);
  nn::ModuleList list_of_linears(linears);
  EXPECT_EQ(from_linears[1].get(), shared.get());
  EXPECT_EQ(list_of_linears[1].get(), shared.get());

  nn::ModuleList list{nn::Linear(2, 3), handle};
  list.push_back(nn::Linear(3, 1)).push_back(shared);
  EXPECT_EQ(names(list.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                                      "2.weight", "2.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(list[1].get(), handle.get());
  nn::ModuleList list_of_pointers{std::make_shared<nn::ReLU>()};
  EXPECT_EQ(list_of_pointers.size(), 1);
  nn::Sequential one{nn::ReLU()};  // one module, in braces
  nn::ModuleList one_in_list{nn::ReLU()};
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one_in_list.size(), 1);
  // ... but a lone module does not convert to a container unasked, and a container of values is not a copy.
  static_assert(!std::is_convertible_v<nn::Linear, nn::Sequential>);
  static_assert(!std::is_convertible_v<nn::Linear, nn::ModuleList>);
  static_assert(std::is_convertible_v<std::shared_ptr<nn::Linear>, nn::ModulePtr>);
  static_assert(!std::is_copy_constructible_v<nn::Sequential> && std::is_move_constructible_v<nn::Sequential>);

  nn::ModuleDict heads;
  heads.insert("cls", nn::Linear(2, 3)).insert("reg", handle);
  EXPECT_EQ(heads["cls"](ones({1, 2})).shape(), (Shape{1, 3}));
  EXPECT_EQ(heads["reg"].get(), handle.get());
}

TEST(ModuleHandle, AMovedInModuleIsTheOneThatIsNamedAndTrained) {
  nn::Linear lin(2, 1);
  set(lin.weight, {1.0, 2.0});
  set(lin.bias, {0.5});
  const Tensor weight = lin.weight;  // the same tensor, before the move
  nn::Sequential seq{std::move(lin), nn::Identity()};
  const auto params = seq.named_parameters();
  ASSERT_EQ(names(params), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(params[0].second.impl_ptr(), weight.impl_ptr());
  EXPECT_EQ(params[0].second.impl_ptr(), seq.at<nn::Linear>(0)->weight.impl_ptr());
  EXPECT_EQ(params[1].second.impl_ptr(), seq.at<nn::Linear>(0)->bias.impl_ptr());

  const Tensor x = make({1.0, 3.0}, {1, 2});
  expect_values(seq(x), {1, 1}, {1.0 + 6.0 + 0.5});
  optim::SGD opt(seq.parameters(), {.lr = 0.1});
  sum(seq(x)).backward();  // d/dW = x = (1, 3), d/db = 1
  opt.step();
  expect_values(weight, {1, 2}, {0.9, 1.7});
  expect_values(seq(x), {1, 1}, {0.9 + 5.1 + 0.4});

  // A module of one's own, whose child was registered from a value: its member handle and its registered child
  // are one module, still after it is moved in.
  nn::Sequential outer{Affine(), nn::ReLU()};
  auto affine = outer.at<Affine>(0);
  EXPECT_EQ(affine->named_children().at(0).second.get(), affine->fc.get());
  EXPECT_EQ(names(outer.named_parameters()), (std::vector<std::string>{"0.fc.weight", "0.fc.bias"}));
  set(affine->fc->weight, {2.0, -1.0});
  set(affine->fc->bias, {1.0});
  optim::SGD opt2(outer.parameters(), {.lr = 0.5});
  sum(outer(x)).backward();  // 2 - 3 + 1 = 0: ReLU's gradient at 0 is 0, so nothing moves...
  opt2.step();
  expect_values(affine->fc->weight, {1, 2}, {2.0, -1.0});
  set(affine->fc->bias, {2.0});
  opt2.zero_grad();
  sum(outer(x)).backward();  // ... now 1 > 0: d/dW = x, d/db = 1
  opt2.step();
  expect_values(affine->fc->weight, {1, 2}, {1.5, -2.5});
  expect_values(outer(x), {1, 1}, {1.5 - 7.5 + 1.5 > 0 ? 1.5 - 7.5 + 1.5 : 0.0});
  expect_values(affine->fc(x), {1, 1}, {1.5 - 7.5 + 1.5});

  // Buffers move too: BatchNorm's running statistics are the registered ones.
  nn::BatchNorm2d bn(2);
  const Tensor running_mean = bn.running_mean;
  nn::Sequential with_bn{std::move(bn)};
  EXPECT_EQ(with_bn.named_buffers().at(0).second.impl_ptr(), running_mean.impl_ptr());
  with_bn(make({1.0, 2.0, 3.0, 6.0}, {2, 2, 1, 1}));  // channel means 2 and 4; momentum 0.1
  expect_values(running_mean, {2}, {0.2, 0.4});

  // A Sequential itself moves as a whole.
  nn::Sequential moved = std::move(seq);
  EXPECT_EQ(moved.named_parameters().at(0).second.impl_ptr(), weight.impl_ptr());
}

TEST(ModuleHandle, BadElementsAreClearErrors) {
  nn::Linear lin(2, 2);
  nn::Module& base = lin;  // moving through the base would keep only the Module part
  expect_error([&] { nn::Sequential seq{std::move(base), nn::ReLU()}; }, {"Linear", "base class"});
  expect_error([&] { nn::Sequential seq{nn::ReLU(), nullptr}; }, {"child module \"1\"", "null"});
  nn::Handle<nn::Linear> empty;
  expect_error([&] { empty(ones({1, 2})); }, {"nn::Handle", "no module"});
  // A module with only a multi-input forward, reached through a ModulePtr with one tensor.
  nn::ModulePtr erased = nn::make<models::BertEncoder>(models::BertConfig{
      .vocab_size = 8, .hidden_size = 4, .num_hidden_layers = 1, .num_attention_heads = 1, .intermediate_size = 8});
  expect_error([&] { erased(ones({1, 2, 4})); }, {"BertEncoder", "forward", "nn::Handle<BertEncoder>"});
}

TEST(ModuleHandle, HandleCallEqualsTheExplicitCalls) {
  manual_seed(5);
  auto net = nn::make<nn::Sequential>(nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2));
  static_assert(std::is_same_v<decltype(net), nn::Handle<nn::Sequential>>);
  Tensor x = randn({5, 3});
  const auto y = values(net(x));
  EXPECT_EQ(y, values((*net)(x)));
  EXPECT_EQ(y, values(net->forward(x)));

  // A Handle is a std::shared_ptr: the forms in use keep compiling and share the module.
  std::shared_ptr<nn::Sequential> as_shared = net;
  std::shared_ptr<nn::Module> as_module = net;
  nn::ModulePtr as_module_ptr = net;
  nn::Handle<nn::Sequential> from_make_shared = std::make_shared<nn::Sequential>();
  EXPECT_EQ(as_shared.get(), net.get());
  EXPECT_EQ(as_module.get(), net.get());
  EXPECT_EQ(values(as_module_ptr(x)), y);  // through the virtual forward
  EXPECT_TRUE(from_make_shared != nullptr);

  // The model factories return handles.
  static_assert(std::is_same_v<decltype(nn::models::resnet18()), nn::Handle<nn::models::ResNet>>);
  static_assert(std::is_same_v<decltype(nn::models::resnet50()), nn::Handle<nn::models::ResNet>>);
  auto resnet = nn::models::resnet18({.num_classes = 3, .cifar_stem = true});
  resnet->eval();
  Tensor img = randn({1, 3, 8, 8});
  EXPECT_EQ(values(resnet(img)), values(resnet->forward(img)));
}

TEST(ModuleHandle, MultiInputForwardThroughTheHandle) {
  auto block = nn::make<MaskedScale>();
  Tensor x = make({1.0, -2.0, 3.0}, {3}), mask = make({1.0, 0.0, 1.0}, {3});
  static_assert(std::is_same_v<decltype(block(x, mask)), std::pair<Tensor, Tensor>>);
  static_assert(std::is_same_v<decltype(block(x)), Tensor>);
  auto [scaled, kept] = block(x, mask);
  expect_values(scaled, {3}, {2.0, 0.0, 6.0});
  expect_values(kept, {}, {2.0});
  expect_values(block(x), {3}, {2.0, -4.0, 6.0});

  auto shift = nn::make<Shift>();
  Shifted s = shift(x, 0.5);
  expect_values(s.value, {3}, {1.5, -1.5, 3.5});
  EXPECT_EQ(s.shift, 0.5);

  // Arguments that no forward accepts do not compile (the call is constrained on M's forward functions).
  static_assert(!std::is_invocable_v<nn::Handle<Shift>, Tensor>);
  static_assert(!std::is_invocable_v<nn::Handle<MaskedScale>, Tensor, Tensor, Tensor>);
  static_assert(!std::is_invocable_v<nn::Handle<models::BertLayer>, Tensor>);
  static_assert(std::is_invocable_v<nn::Handle<models::BertLayer>, Tensor, Tensor>);
  static_assert(std::is_invocable_v<nn::Handle<nn::Module>, Tensor>);
}

models::BertConfig tiny_bert() {
  return {.vocab_size = 20,
          .hidden_size = 8,
          .num_hidden_layers = 2,
          .num_attention_heads = 2,
          .intermediate_size = 16,
          .max_position_embeddings = 8};
}

TEST(ModuleHandle, BertAndAttentionCalledThroughHandles) {
  manual_seed(7);
  auto bert = nn::make<models::BertModel>(tiny_bert());
  bert->eval();
  Tensor ids = make({1, 5, 7, 2, 3, 9, 4, 0}, {2, 4}).to(DType::Int64);
  Tensor types = zeros({2, 4}, {.dtype = DType::Int64});
  Tensor mask = make({1, 1, 1, 1, 1, 1, 1, 0}, {2, 4}).to(DType::Int64);
  models::BertModel::Output out = bert(ids, types, mask);
  models::BertModel::Output direct = bert->forward(ids, types, mask);
  EXPECT_EQ(values(out.sequence_output), values(direct.sequence_output));
  EXPECT_EQ(values(out.pooled_output), values(direct.pooled_output));

  // One layer on its own, with the (N, 1, 1, S) Bool mask BertModel builds.
  auto layer = bert->encoder->layer->at<models::BertLayer>(0);
  Tensor h = randn({2, 4, 8}), allowed = reshape(ne(mask, 0), {2, 1, 1, 4});
  EXPECT_EQ(values(layer(h, allowed)), values(layer->forward(h, allowed)));

  auto mha = nn::make<nn::MultiheadAttention>(8, 2);
  Tensor q = randn({2, 3, 8});
  auto [o, w] = mha(q, q, q, Tensor(), Tensor(), true);
  const auto ref = mha->forward(q, q, q, Tensor(), Tensor(), true);
  EXPECT_EQ(values(o), values(ref.output));
  EXPECT_EQ(values(w), values(ref.weights));
  EXPECT_EQ(values(mha(q)), values(ref.output));
}

TEST(ModuleHandle, HandleCallsOpenOneProfilerRangeEach) {
  auto net = nn::make<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  auto block = nn::make<MaskedScale>();
  auto mha = nn::make<nn::MultiheadAttention>(8, 2);
  manual_seed(9);
  auto bert = nn::make<models::BertModel>(tiny_bert());
  bert->eval();
  Tensor ids = zeros({1, 3}, {.dtype = DType::Int64});
  Tensor q = randn({1, 3, 8});

  profiler::Profile prof;
  net(randn({3, 4}));
  block(ones({3}), ones({3}));
  mha(q, q, q);
  mha(q);
  bert(ids, Tensor(), Tensor());
  prof.stop();
  const profiler::Result& r = prof.result();

  ASSERT_EQ(of_kind(r, Kind::Module, "Sequential").size(), 1u);
  const auto linears = of_kind(r, Kind::Module, "Linear");
  ASSERT_GE(linears.size(), 2u);
  const Event& parent = r.events()[static_cast<size_t>(linears[0]->parent)];
  EXPECT_EQ(parent.kind, Kind::Module);
  EXPECT_EQ(parent.name, "Sequential");
  EXPECT_EQ(of_kind(r, Kind::Module, "MaskedScale").size(), 1u);
  EXPECT_EQ(of_kind(r, Kind::Module, "MultiheadAttention").size(), 2u);  // one per call, not nested twice
  EXPECT_EQ(of_kind(r, Kind::Module, "BertModel").size(), 1u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertEmbeddings").size(), 1u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertEncoder").size(), 1u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertLayer").size(), 2u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertAttention").size(), 2u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertSelfAttention").size(), 2u);
  EXPECT_EQ(of_kind(r, Kind::Module, "BertOutput").size(), 4u);  // attention.output and output, per layer
  EXPECT_EQ(of_kind(r, Kind::Module, "BertPooler").size(), 1u);
  // The layers' ranges sit inside the encoder's.
  for (const Event* e : of_kind(r, Kind::Module, "BertLayer")) {
    ASSERT_GE(e->parent, 0);
    EXPECT_EQ(r.events()[static_cast<size_t>(e->parent)].name, "BertEncoder");
  }
}

}  // namespace
}  // namespace kiln::testing
