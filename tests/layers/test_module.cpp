// nn::Module and the containers: registration, dotted names and their order, tied weights, modes,
// in-place to(), zero_grad, state_dict round trips and load errors, summary, Sequential/ModuleList/ModuleDict,
// and where a module sits in its model (path()) through moves, sharing and destruction.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/layers/containers.h"
#include "kiln/layers/module.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using Names = std::vector<std::string>;
using nn::StateDict;

// y = x @ weight + bias: (N, in) -> (N, out). Buffers: "running" (out) saved, "scratch" (out) not saved.
struct Leaf : nn::Module {
  Tensor weight, bias;
  Leaf(int64_t in, int64_t out, bool with_bias = true) : Module("Leaf") {
    weight = register_parameter("weight", make(uniform(in * out, -1, 1, in * 10 + out), {in, out}));
    bias = register_parameter("bias", with_bias ? make(uniform(out, -1, 1, out + 7), {out}) : Tensor());
    register_buffer("running", zeros({out}));
    register_buffer("scratch", zeros({out}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x.matmul(weight);
    return bias.defined() ? y + bias : y;
  }
};

struct AddConst : nn::Module {
  double c;
  explicit AddConst(double c) : Module("AddConst"), c(c) {}
  Tensor forward(const Tensor& x) override { return x + c; }
};

struct Scale : nn::Module {
  double s;
  explicit Scale(double s) : Module("Scale"), s(s) {}
  Tensor forward(const Tensor& x) override { return x * s; }
};

// Net: scale (frozen), steps (int64 buffer), encoder: Leaf(2,3), seq: [Leaf(3,4), AddConst, Leaf(4,2)],
// blocks: [Leaf(2,2), Leaf(2,2)]. 48 parameters, 47 of them trainable.
struct Net : nn::Module {
  Tensor scale;
  std::shared_ptr<Leaf> encoder;
  std::shared_ptr<nn::Sequential> seq;
  std::shared_ptr<nn::ModuleList> blocks;
  Net() : Module("Net") {
    scale = register_parameter("scale", ones({1}), /*requires_grad=*/false);
    register_buffer("steps", zeros({1}, {.dtype = DType::Int64}));
    encoder = register_module("encoder", std::make_shared<Leaf>(2, 3));
    seq = register_module(
        "seq", std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
                   std::make_shared<Leaf>(3, 4), std::make_shared<AddConst>(1.0), std::make_shared<Leaf>(4, 2)}));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks->push_back(std::make_shared<Leaf>(2, 2));
    blocks->push_back(std::make_shared<Leaf>(2, 2));
  }
};

template <typename Pairs>
Names names_of(const Pairs& pairs) {
  Names out;
  for (const auto& [name, x] : pairs) out.push_back(name);
  return out;
}

TEST(Module, NamedParametersAreDottedInRegistrationOrder) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(names_of(net->named_parameters()),
            (Names{"scale", "encoder.weight", "encoder.bias", "seq.0.weight", "seq.0.bias", "seq.2.weight",
                   "seq.2.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias"}));
  EXPECT_EQ(names_of(net->named_parameters(/*recurse=*/false)), (Names{"scale"}));
  EXPECT_EQ(net->parameters().size(), 11u);
  // parameters() hands out the stored handles themselves.
  EXPECT_TRUE(net->parameters()[1].is_same(net->encoder->weight));
  EXPECT_TRUE(net->encoder->weight.requires_grad());
  EXPECT_FALSE(net->scale.requires_grad());
}

TEST(Module, NamedBuffersIncludeNonPersistentOnes) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(names_of(net->named_buffers()),
            (Names{"steps", "encoder.running", "encoder.scratch", "seq.0.running", "seq.0.scratch", "seq.2.running",
                   "seq.2.scratch", "blocks.0.running", "blocks.0.scratch", "blocks.1.running", "blocks.1.scratch"}));
  EXPECT_EQ(net->buffers(/*recurse=*/false).size(), 1u);
}

TEST(Module, NamedModulesAndChildren) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(names_of(net->named_modules()),
            (Names{"", "encoder", "seq", "seq.0", "seq.1", "seq.2", "blocks", "blocks.0", "blocks.1"}));
  EXPECT_EQ(net->named_modules()[0].second.get(), net.get());
  EXPECT_EQ(names_of(net->named_children()), (Names{"encoder", "seq", "blocks"}));
  EXPECT_EQ(net->children().size(), 3u);
  EXPECT_EQ(net->modules().size(), 9u);
  // apply visits children before their parent.
  Names order;
  net->seq->apply([&](nn::Module& m) { order.push_back(m.type_name()); });
  EXPECT_EQ(order, (Names{"Leaf", "AddConst", "Leaf", "Sequential"}));
}

TEST(Module, MissingBiasIsStoredButSkipped) {
  auto leaf = std::make_shared<Leaf>(2, 3, /*with_bias=*/false);
  EXPECT_EQ(names_of(leaf->named_parameters()), (Names{"weight"}));
  EXPECT_EQ(names_of(leaf->state_dict()), (Names{"weight", "running"}));
  EXPECT_EQ(leaf->num_parameters(), 6);
  // The name is still taken.
  expect_error([&] { leaf->register_parameter("bias", zeros({3})); }, {"Leaf", "\"bias\"", "already"});
}

TEST(Module, TiedWeightsAreListedOnceUnderTheirFirstName) {
  Tensor shared = ones({2});
  auto a = std::make_shared<nn::Module>("A");
  a->register_parameter("w", shared);
  auto b = std::make_shared<nn::Module>("B");
  b->register_parameter("w", shared);
  b->register_parameter("v", zeros({3}));
  auto root = std::make_shared<nn::Module>("Root");
  root->register_module("a", a);
  root->register_module("b", b);
  root->register_module("a_again", a);  // a child held twice
  EXPECT_EQ(names_of(root->named_parameters()), (Names{"a.w", "b.v"}));
  EXPECT_EQ(root->num_parameters(), 5);
  EXPECT_EQ(names_of(root->named_modules()), (Names{"", "a", "b"}));
  // The state dict keeps every name, as PyTorch's: a checkpoint loads into either side of the tie.
  EXPECT_EQ(names_of(root->state_dict()), (Names{"a.w", "b.w", "b.v", "a_again.w"}));
  // Moving a tied weight moves it once, and both modules keep sharing it.
  root->to(DType::Float64);
  EXPECT_EQ(shared.dtype(), DType::Float64);
  EXPECT_TRUE(a->parameters()[0].is_same(b->parameters()[0]));
}

TEST(Module, TrainAndEvalRecurse) {
  auto net = std::make_shared<Net>();
  for (const auto& m : net->modules()) EXPECT_TRUE(m->is_training());
  net->eval();
  for (const auto& m : net->modules()) EXPECT_FALSE(m->is_training()) << m->type_name();
  net->seq->train();
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE(net->encoder->is_training());
  EXPECT_TRUE((*net->seq)[2]->is_training());
  net->train();
  for (const auto& m : net->modules()) EXPECT_TRUE(m->is_training());
}

TEST(Module, ToDTypeKeepsHandlesValidAndMovesGradients) {
  auto net = std::make_shared<Net>();
  Tensor w = net->encoder->weight;  // a handle held elsewhere, as an optimizer holds it
  const std::vector<double> w_before = values(w);
  Tensor x = make({1, 2, 3, 4}, {2, 2});
  (*net->encoder)(x).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  // d/dW sum(x W + b) = x^T 1: each row i of the gradient holds the column sum of x.
  const std::vector<double> grad_expected = {4, 4, 4, 6, 6, 6};
  expect_values(w.grad(), {2, 3}, grad_expected);

  net->to(DType::Float64);
  EXPECT_EQ(w.dtype(), DType::Float64);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.is_same(net->encoder->weight));
  expect_values(w, {2, 3}, w_before);
  EXPECT_EQ(w.grad().dtype(), DType::Float64);
  expect_values(w.grad(), {2, 3}, grad_expected);
  EXPECT_EQ(net->encoder->named_buffers()[0].second.dtype(), DType::Float64);
  // Integer buffers keep their dtype.
  EXPECT_EQ(net->named_buffers()[0].second.dtype(), DType::Int64);
  // The moved parameters still train: a new backward accumulates float64 gradients.
  (*net->encoder)(x.to(DType::Float64)).sum().backward();
  expect_values(w.grad(), {2, 3}, {8, 8, 8, 12, 12, 12});

  expect_error([&] { net->to(DType::Int32); }, {"Net", "floating-point"});
}

TEST(Module, ToChannelsLastAppliesToFourDimensionalTensorsOnly) {
  nn::Module m("Conv");
  Tensor w = m.register_parameter("weight", make(uniform(2 * 3 * 2 * 2, -1, 1), {2, 3, 2, 2}));
  Tensor b = m.register_parameter("bias", zeros({2}));
  const std::vector<double> w_before = values(w);
  m.to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(w.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(w.is_contiguous());
  expect_values(w, {2, 3, 2, 2}, w_before);
  EXPECT_TRUE(b.is_contiguous());
  EXPECT_TRUE(w.requires_grad());
}

TEST(Module, ZeroGradBothWays) {
  auto net = std::make_shared<Net>();
  (*net->encoder)(make({1, 2}, {1, 2})).sum().backward();
  Tensor w = net->encoder->weight;
  ASSERT_TRUE(w.grad().defined());
  net->zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(w.grad().defined());
  expect_values(w.grad(), {2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_FALSE(net->seq->at<Leaf>(0)->weight.grad().defined());  // untouched grads stay undefined
  net->zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Module, StateDictRoundTripIntoAFreshModule) {
  auto src = std::make_shared<Net>();
  {
    NoGradGuard no_grad;
    int k = 0;
    for (auto& p : src->parameters()) p.add_(static_cast<double>(++k));  // differ from a fresh Net's values
    src->named_buffers()[0].second.fill_(7);
  }
  StateDict sd = src->state_dict();
  EXPECT_EQ(names_of(sd),
            (Names{"scale", "steps", "encoder.weight", "encoder.bias", "encoder.running", "seq.0.weight", "seq.0.bias",
                   "seq.0.running", "seq.2.weight", "seq.2.bias", "seq.2.running", "blocks.0.weight", "blocks.0.bias",
                   "blocks.0.running", "blocks.1.weight", "blocks.1.bias", "blocks.1.running"}));
  // Detached, sharing memory.
  EXPECT_FALSE(sd[2].second.requires_grad());
  EXPECT_TRUE(sd[2].second.is_alias_of(src->encoder->weight));

  auto dst = std::make_shared<Net>();
  Tensor w = dst->encoder->weight;
  auto result = dst->load_state_dict(sd);
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  StateDict loaded = dst->state_dict();
  ASSERT_EQ(loaded.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(loaded[i].first, sd[i].first);
    EXPECT_EQ(values(loaded[i].second), values(sd[i].second)) << sd[i].first;
    EXPECT_FALSE(loaded[i].second.is_alias_of(sd[i].second)) << "values are copied, not shared";
  }
  EXPECT_TRUE(w.is_same(dst->encoder->weight));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(values(dst->named_buffers()[0].second), std::vector<double>{7});

  // dtype is converted by the copy: a float64 state loads into float32 parameters.
  StateDict sd64;
  for (const auto& [k, v] : sd) sd64.emplace_back(k, v.is_floating_point() ? v.to(DType::Float64) : v);
  auto dst2 = std::make_shared<Net>();
  dst2->load_state_dict(sd64);
  EXPECT_EQ(dst2->encoder->weight.dtype(), DType::Float32);
  expect_values(dst2->encoder->weight, {2, 3}, values(src->encoder->weight));
}

TEST(Module, StrictLoadListsEveryProblemAndChangesNothing) {
  auto src = std::make_shared<Net>();
  StateDict sd;
  for (auto& [k, v] : src->state_dict()) {
    if (k == "seq.0.bias") continue;                                      // missing
    if (k == "encoder.weight") v = zeros({3, 2});                         // wrong shape
    sd.emplace_back(k, v.is_floating_point() ? v.clone().add_(1.0) : v);  // values that differ
  }
  sd.emplace_back("extra.weight", zeros({2}));  // unexpected

  auto dst = std::make_shared<Net>();
  StateDict before;
  for (const auto& [k, v] : dst->state_dict()) before.emplace_back(k, v.clone());
  expect_error([&] { dst->load_state_dict(sd); },
               {"Net", "missing keys", "seq.0.bias", "unexpected keys", "extra.weight", "shape mismatch",
                "encoder.weight: expected shape [2, 3] vs given shape [3, 2]", "nothing was loaded"});
  StateDict after = dst->state_dict();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(values(after[i].second), values(before[i].second)) << before[i].first;

  // Non-strict still refuses shape mismatches, and again changes nothing.
  expect_error([&] { dst->load_state_dict(sd, /*strict=*/false); }, {"Net", "encoder.weight", "[3, 2]"});
  EXPECT_EQ(values(dst->seq->at<Leaf>(0)->weight), values(before[5].second));
}

TEST(Module, NonStrictLoadReportsWhatDidNotMatch) {
  auto src = std::make_shared<Net>();
  StateDict sd;
  for (auto& [k, v] : src->state_dict()) {
    if (k == "blocks.1.weight" || k == "steps") continue;
    sd.emplace_back(k, v.is_floating_point() ? v.clone().add_(1.0) : v);
  }
  sd.emplace_back("head.bias", zeros({2}));
  auto dst = std::make_shared<Net>();
  const std::vector<double> untouched = values(dst->blocks->at<Leaf>(1)->weight);
  auto result = dst->load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(result.missing_keys, (Names{"steps", "blocks.1.weight"}));
  EXPECT_EQ(result.unexpected_keys, (Names{"head.bias"}));
  EXPECT_EQ(values(dst->encoder->weight), values(src->encoder->weight.detach() + 1.0));
  EXPECT_EQ(values(dst->blocks->at<Leaf>(1)->weight), untouched);
  // Strict mode refuses the same state.
  expect_error([&] { dst->load_state_dict(sd); }, {"missing keys", "steps", "blocks.1.weight", "head.bias"});
}

TEST(Module, BadNamesAndTensorsAreRejected) {
  nn::Module m("Block");
  m.register_parameter("weight", zeros({2}));
  m.register_buffer("mean", zeros({2}));
  m.register_module("inner", std::make_shared<nn::Module>("Inner"));
  expect_error([&] { m.register_parameter("weight", zeros({2})); }, {"Block", "\"weight\"", "parameter"});
  expect_error([&] { m.register_buffer("weight", zeros({2})); }, {"Block", "\"weight\"", "parameter"});
  expect_error([&] { m.register_parameter("mean", zeros({2})); }, {"Block", "\"mean\"", "buffer"});
  expect_error([&] { m.register_module("mean", std::make_shared<nn::Module>()); }, {"Block", "\"mean\""});
  expect_error([&] { m.register_buffer("inner", zeros({2})); }, {"Block", "\"inner\"", "child module"});
  expect_error([&] { m.register_parameter("a.b", zeros({2})); }, {"Block", "\"a.b\"", "'.'"});
  expect_error([&] { m.register_module("x.y", std::make_shared<nn::Module>()); }, {"Block", "\"x.y\"", "'.'"});
  expect_error([&] { m.register_buffer("", zeros({2})); }, {"Block", "empty name"});
  expect_error([&] { m.register_parameter("steps", zeros({2}, {.dtype = DType::Int64})); },
               {"Block", "\"steps\"", "floating point", "int64"});
  expect_error([&] { m.register_module("none", nn::ModulePtr()); }, {"Block", "\"none\"", "null"});
  Tensor leaf = ones({2}).requires_grad_();
  expect_error([&] { m.register_parameter("derived", leaf * 2); }, {"Block", "\"derived\"", "detach"});
  // Nothing was added by the failed calls.
  EXPECT_EQ(names_of(m.named_parameters()), (Names{"weight"}));
  EXPECT_EQ(names_of(m.named_buffers()), (Names{"mean"}));
}

TEST(Module, SummaryListsModulesAndCounts) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->num_parameters(), 48);
  EXPECT_EQ(net->num_parameters(/*trainable_only=*/true), 47);
  const std::string s = net->summary();
  EXPECT_NE(s.find("(root)"), std::string::npos) << s;
  EXPECT_NE(s.find("Net"), std::string::npos) << s;
  EXPECT_NE(s.find("seq.1  "), std::string::npos) << s;
  EXPECT_NE(s.find("AddConst"), std::string::npos) << s;
  EXPECT_NE(s.find("trainable parameters: 47 (0.00 MB)"), std::string::npos) << s;
  EXPECT_NE(s.find("total parameters: 48 (0.00 MB)"), std::string::npos) << s;
  // One line per module (9), a header and the two count lines.
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 12) << s;
  // seq.0's own parameters: 3 x 4 + 4 = 16; the root's own: scale (1).
  bool seq0 = false, root = false;
  std::istringstream lines(s);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("seq.0 ", 0) == 0) seq0 = line.find("Leaf") != std::string::npos && line.ends_with(" 16");
    if (line.rfind("(root) ", 0) == 0) root = line.ends_with(" 1");
  }
  EXPECT_TRUE(seq0) << s;
  EXPECT_TRUE(root) << s;
}

// ---- containers ----

TEST(Sequential, ForwardChainsInOrder) {
  nn::Sequential seq{std::make_shared<AddConst>(1.0), std::make_shared<Scale>(2.0), std::make_shared<AddConst>(-0.5)};
  // ((x + 1) * 2) - 0.5
  expect_values(seq(make({1, 2, -3}, {3})), {3}, {3.5, 5.5, -4.5});
  EXPECT_EQ(seq.size(), 3);
  EXPECT_EQ(seq[1]->type_name(), "Scale");
  EXPECT_EQ(seq[-1]->type_name(), "AddConst");
  EXPECT_DOUBLE_EQ(seq.at<Scale>(1)->s, 2.0);
  expect_error([&] { (void)seq[3]; }, {"Sequential", "3", "out of range"});
  expect_error([&] { seq.at<Scale>(0); }, {"Sequential", "AddConst"});
  EXPECT_EQ(names_of(seq.named_children()), (Names{"0", "1", "2"}));

  // append, by index and by name; the empty Sequential is the identity.
  nn::Sequential built;
  expect_values(built(make({4}, {1})), {1}, {4});
  built.append(std::make_shared<Scale>(3.0)).append("shift", std::make_shared<AddConst>(1.0));
  expect_values(built(make({4}, {1})), {1}, {13});
  EXPECT_EQ(names_of(built.named_children()), (Names{"0", "shift"}));
}

TEST(Sequential, ForwardOfLayersMatchesHandComputedValues) {
  auto leaf = std::make_shared<Leaf>(2, 1);
  {
    NoGradGuard no_grad;
    leaf->weight.copy_(make({2, -1}, {2, 1}));
    leaf->bias.fill_(0.5);
  }
  nn::Sequential seq{leaf, std::make_shared<AddConst>(1.0)};
  // [1, 3] . [2, -1] + 0.5 + 1 = 0.5
  Tensor y = seq(make({1, 3}, {1, 2}));
  expect_values(y, {1, 1}, {0.5});
  EXPECT_EQ(names_of(seq.named_parameters()), (Names{"0.weight", "0.bias"}));
}

TEST(ModuleList, HoldsIndexesAndIterates) {
  nn::ModuleList list;
  list.push_back(std::make_shared<AddConst>(1.0)).push_back(std::make_shared<Leaf>(2, 2));
  list.push_back(std::make_shared<Scale>(4.0));
  EXPECT_EQ(list.size(), 3);
  Names types;
  for (const auto& m : list) types.push_back(m->type_name());
  EXPECT_EQ(types, (Names{"AddConst", "Leaf", "Scale"}));
  EXPECT_EQ(names_of(list.named_parameters()), (Names{"1.weight", "1.bias"}));
  EXPECT_EQ(list[-2]->type_name(), "Leaf");
  expect_error([&] { list.forward(zeros({1})); }, {"ModuleList", "forward"});
  expect_error([&] { (void)list[-4]; }, {"ModuleList", "-4", "out of range"});
}

TEST(ModuleDict, KeysInInsertionOrderAndMissingKeyError) {
  nn::ModuleDict dict;
  dict.insert("enc", std::make_shared<Leaf>(2, 3)).insert("act", std::make_shared<AddConst>(0.0));
  dict.insert("dec", std::make_shared<Leaf>(3, 2));
  EXPECT_EQ(dict.keys(), (Names{"enc", "act", "dec"}));
  EXPECT_EQ(dict.size(), 3);
  EXPECT_TRUE(dict.contains("dec"));
  EXPECT_FALSE(dict.contains("head"));
  EXPECT_EQ(dict["act"]->type_name(), "AddConst");
  EXPECT_EQ(names_of(dict.named_parameters()), (Names{"enc.weight", "enc.bias", "dec.weight", "dec.bias"}));
  expect_error([&] { (void)dict["head"]; }, {"ModuleDict", "\"head\"", "\"enc\", \"act\", \"dec\""});
  expect_error([&] { dict.insert("enc", std::make_shared<Scale>(1.0)); }, {"ModuleDict", "\"enc\"", "already"});
  expect_error([&] { dict.insert("a.b", std::make_shared<Scale>(1.0)); }, {"ModuleDict", "\"a.b\""});
  EXPECT_EQ(dict.size(), 3);
}

// ---- where a module sits: path() ----

// A module with a child registered from a value (moved in): inner, a Leaf(2, 2).
struct Wrapper : nn::Module {
  std::shared_ptr<Leaf> inner;
  Wrapper() : Module("Wrapper") { inner = register_module("inner", Leaf(2, 2)); }
};

// As a DLRM model: "tables" (a ModuleList built from values, then appended to) and "heads" (a ModuleDict).
struct Tables : nn::Module {
  nn::Handle<nn::ModuleList> tables;
  nn::Handle<nn::ModuleDict> heads;
  Tables() : Module("Tables") {
    tables = register_module("tables", nn::ModuleList{Leaf(2, 2), Leaf(2, 2)});
    tables->push_back(Leaf(2, 2));
    heads = register_module("heads", nn::ModuleDict());
    heads->insert("cls", nn::Sequential{Leaf(2, 3), AddConst(1.0)});
  }
};

TEST(ModulePath, NestedModulesKnowTheirDottedPath) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->path(), "");
  EXPECT_EQ(net->encoder->path(), "encoder");
  EXPECT_EQ(net->seq->path(), "seq");
  EXPECT_EQ((*net->seq)[2]->path(), "seq.2");
  EXPECT_EQ((*net->blocks)[1]->path(), "blocks.1");
  // Each module's path is the name that named_modules() of the outermost module gives it.
  for (const auto& [name, m] : net->named_modules()) EXPECT_EQ(m->path(), name);
  // The model inside a container: every path gains the container's name for it.
  nn::ModuleList outer;
  outer.push_back(std::make_shared<AddConst>(0.0)).push_back(net);
  EXPECT_EQ(net->path(), "1");
  EXPECT_EQ((*net->seq)[2]->path(), "1.seq.2");
  for (const auto& [name, m] : outer.named_modules()) EXPECT_EQ(m->path(), name);
}

TEST(ModulePath, ContainersNameTheirChildrenByIndexOrKey) {
  auto model = nn::make<Tables>();
  EXPECT_EQ((*model->tables)[0]->path(), "tables.0");
  EXPECT_EQ((*model->tables)[2]->path(), "tables.2");  // appended after the list was moved into its handle
  auto cls = std::dynamic_pointer_cast<nn::Sequential>((*model->heads)["cls"]);
  ASSERT_NE(cls, nullptr);
  EXPECT_EQ(cls->path(), "heads.cls");
  EXPECT_EQ((*cls)[1]->path(), "heads.cls.1");
  for (const auto& [name, m] : model->named_modules()) EXPECT_EQ(m->path(), name);
}

TEST(ModulePath, AMovedModuleTakesItsChildrenAlong) {
  Wrapper w;
  const std::shared_ptr<Leaf> inner = w.inner;
  EXPECT_EQ(inner->path(), "inner");
  nn::Sequential seq{std::move(w), AddConst(0.0)};  // w moved into a new handle, named "0"; w is gone
  EXPECT_EQ(seq[0]->path(), "0");
  EXPECT_EQ(inner->path(), "0.inner");  // its parent is the moved-in Wrapper
  // The container itself moved twice (to the stack, then into a handle of another container): the chain follows.
  nn::Sequential moved = std::move(seq);
  EXPECT_EQ(moved.path(), "");
  EXPECT_EQ(inner->path(), "0.inner");  // the Wrapper's parent is now `moved`
  nn::ModuleList holder;
  holder.push_back(std::make_shared<AddConst>(0.0)).push_back(std::move(moved));
  EXPECT_EQ(holder[1]->path(), "1");
  EXPECT_EQ(inner->path(), "1.0.inner");
  for (const auto& [name, m] : holder.named_modules()) EXPECT_EQ(m->path(), name);
}

TEST(ModulePath, ASharedChildKeepsItsFirstParentWhileThatLives) {
  auto shared = std::make_shared<Leaf>(2, 2);
  auto first = nn::make<nn::ModuleDict>();
  first->insert("a", shared);
  nn::Sequential second{std::make_shared<AddConst>(0.0), shared};
  EXPECT_EQ(shared->path(), "a");                                      // the first registration wins
  EXPECT_EQ(names_of(second.named_modules()), (Names{"", "0", "1"}));  // each parent lists it under its own name
  // The first parent is destroyed while the child lives on (in `second`): the child forgets it; nothing dangles.
  first.reset();
  EXPECT_EQ(shared->path(), "");
  // Registered again, it takes the new parent.
  nn::ModuleList third;
  third.push_back(shared);
  EXPECT_EQ(shared->path(), "0");
}

TEST(ModulePath, AParentDestroyedBeforeItsChild) {
  std::shared_ptr<Leaf> child;
  {
    Wrapper w;  // on the stack
    child = w.inner;
    EXPECT_EQ(child->path(), "inner");
  }
  EXPECT_EQ(child->path(), "");
  // A grandparent destroyed: the path starts at the parent that is left.
  auto mid = nn::make<Wrapper>();
  {
    nn::ModuleList top;
    top.push_back(mid);
    EXPECT_EQ(mid->inner->path(), "0.inner");
  }
  EXPECT_EQ(mid->path(), "");
  EXPECT_EQ(mid->inner->path(), "inner");
}

TEST(ModulePath, AModuleRegisteredUnderItsOwnDescendantKeepsNoParent) {
  Wrapper top;  // on the stack; its child registers it back (through a handle that does not own it)
  top.inner->register_module("up", nn::ModulePtr(&top, [](nn::Module*) {}));
  EXPECT_EQ(top.path(), "");  // the parent chain never loops
  EXPECT_EQ(top.inner->path(), "inner");
}

// ---- placement on every backend ----

class ModuleDeviceTest : public BackendTest {};

TEST_P(ModuleDeviceTest, ToDeviceMovesParametersAndBuffersAndBack) {
  auto net = std::make_shared<Net>();
  Tensor w = net->encoder->weight;
  const std::vector<double> w_before = values(w);
  (*net->encoder)(make({1, 2}, {1, 2})).sum().backward();

  net->to(dev());
  for (const auto& p : net->parameters()) EXPECT_EQ(p.device(), dev());
  for (const auto& b : net->buffers()) EXPECT_EQ(b.device(), dev());
  EXPECT_EQ(w.device(), dev());
  EXPECT_EQ(w.grad().device(), dev());
  EXPECT_TRUE(w.requires_grad());
  expect_values(w, {2, 3}, w_before);
  EXPECT_EQ(net->named_buffers()[0].second.dtype(), DType::Int64);
  // Forward and backward work where the parameters now live.
  net->zero_grad();
  (*net->encoder)(make({1, 2}, {1, 2}, opts())).sum().backward();
  EXPECT_EQ(w.grad().device(), dev());
  expect_values(w.grad(), {2, 3}, {1, 1, 1, 2, 2, 2});

  net->to(Device::cpu(), DType::Float64);
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.is_cpu());
  for (const auto& b : net->buffers()) EXPECT_TRUE(b.is_cpu());
  EXPECT_EQ(w.dtype(), DType::Float64);
  EXPECT_EQ(w.grad().dtype(), DType::Float64);
  expect_values(w, {2, 3}, w_before);
}

KILN_INSTANTIATE_BACKENDS(ModuleDeviceTest);

}  // namespace
}  // namespace kiln::testing
