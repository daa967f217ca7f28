// The profiler: what it records (ops with shapes, modules, backward nodes, steps, worker threads), its
// schedule, self times, the table and the Chrome trace file; GPU times on a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/kiln.h"
#include "kiln/profiler/nvtx.h"
#include "kiln/tensor/cuda.h"
#include "kiln/profiler/profiler.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using profiler::Event;
using profiler::Profile;
using trace::Kind;

std::shared_ptr<nn::Sequential> small_mlp() {
  manual_seed(1);
  auto net = std::make_shared<nn::Sequential>();
  net->append(std::make_shared<nn::Linear>(4, 8));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Linear>(8, 2));
  return net;
}

void train_step(nn::Module& net, Device dev = Device::cpu()) {
  Tensor x = randn({3, 4}, TensorOptions{.device = dev});
  Tensor loss = sum(net(x));
  loss.backward();
}

std::vector<const Event*> of_kind(const profiler::Result& r, Kind k, const std::string& name = "") {
  std::vector<const Event*> out;
  for (const Event& e : r.events())
    if (e.kind == k && (name.empty() || e.name == name)) out.push_back(&e);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Trace, ActiveOnlyWhileAListenerIsInstalled) {
  EXPECT_FALSE(trace::active());
  {
    Profile prof;
    EXPECT_TRUE(trace::active());
    EXPECT_TRUE(prof.recording());
  }
  EXPECT_FALSE(trace::active());
}

TEST(Profiler, RecordsOpsModulesAndBackwardNodesWithShapes) {
  auto net = small_mlp();
  Profile prof;
  train_step(*net);
  prof.stop();
  const profiler::Result& r = prof.result();

  EXPECT_EQ(of_kind(r, Kind::Module, "Sequential").size(), 1u);
  EXPECT_EQ(of_kind(r, Kind::Module, "Linear").size(), 2u);
  EXPECT_EQ(of_kind(r, Kind::Module, "ReLU").size(), 1u);

  // The first Linear's matmul: x (3, 4) times the (4, 8) weight, inside that module's range. Shapes are the
  // backend's, which multiplies batches of matrices: (1, 3, 8) = (1, 3, 4) @ (1, 4, 8).
  const Event* first_matmul = nullptr;
  for (const Event* e : of_kind(r, Kind::Op, "matmul"))
    if (e->shapes == "[1, 3, 8] f32, [1, 3, 4] f32, [1, 4, 8] f32") first_matmul = e;
  ASSERT_NE(first_matmul, nullptr) << "no matmul of (1, 3, 4) by (1, 4, 8); the trace:\n" << r.chrome_trace_json();
  ASSERT_GE(first_matmul->parent, 0);
  const Event& parent = r.events()[static_cast<size_t>(first_matmul->parent)];
  EXPECT_EQ(parent.kind, Kind::Module);
  EXPECT_EQ(parent.name, "Linear");
  EXPECT_LE(parent.host_begin_ns, first_matmul->host_begin_ns);
  EXPECT_GE(parent.host_end_ns, first_matmul->host_end_ns);

  // Backward: the nodes of this graph (two Linear layers, a ReLU, a sum; four parameters), by name, with
  // the ops they ran inside.
  std::map<std::string, int> nodes;
  for (const Event* b : of_kind(r, Kind::Backward)) ++nodes[b->name];
  EXPECT_EQ(nodes["AddmmBackward"], 2);
  EXPECT_EQ(nodes["ReluBackward"], 1);
  EXPECT_EQ(nodes["SumBackward"], 1);
  EXPECT_EQ(nodes["AccumulateGrad"], 4);
  bool some_backward_has_an_op = false;
  for (const Event& e : r.events())
    if (e.kind == Kind::Op && e.parent >= 0 && r.events()[static_cast<size_t>(e.parent)].kind == Kind::Backward)
      some_backward_has_an_op = true;
  EXPECT_TRUE(some_backward_has_an_op);
  // Every event ended inside its parent, on the host.
  for (const Event& e : r.events()) {
    EXPECT_LE(e.host_begin_ns, e.host_end_ns);
    if (e.parent < 0) continue;
    const Event& p = r.events()[static_cast<size_t>(e.parent)];
    EXPECT_EQ(p.thread, e.thread);
    EXPECT_LE(p.host_begin_ns, e.host_begin_ns);
    EXPECT_GE(p.host_end_ns, e.host_end_ns);
  }
}

// Dropout's forward is one op, "dropout" (no bernoulli, no mul), and its backward one node with one mul.
TEST(Profiler, DropoutIsOneOpAndOneBackwardNode) {
  Tensor x = randn({4, 8}).requires_grad_();
  Tensor y;
  {
    Profile prof;
    y = nn::dropout(x, 0.5, /*training=*/true);
    prof.stop();
    std::vector<std::string> ops;
    for (const Event* e : of_kind(prof.result(), Kind::Op)) ops.push_back(e->name);
    EXPECT_EQ(ops, (std::vector<std::string>{"dropout"}));
    const auto dropout = of_kind(prof.result(), Kind::Op, "dropout");
    ASSERT_EQ(dropout.size(), 1u);
    EXPECT_EQ(dropout[0]->shapes, "[4, 8] f32, [4, 8] f32, [4, 8] f32");  // out, mask, x
  }
  Tensor g = ones({4, 8});
  Profile prof;
  y.backward(g);
  prof.stop();
  const profiler::Result& r = prof.result();
  const auto nodes = of_kind(r, Kind::Backward, "DropoutBackward");
  ASSERT_EQ(nodes.size(), 1u);
  int muls_inside = 0;
  for (const Event& e : r.events())
    if (e.kind == Kind::Op && e.name == "mul" && e.parent >= 0 &&
        &r.events()[static_cast<size_t>(e.parent)] == nodes[0])
      ++muls_inside;
  EXPECT_EQ(muls_inside, 1);
}

// A product whose batch dims need two strides (attention's heads transposed out of (B, S, H, D)) is one backend
// product, not one per outer batch index.
TEST(Profiler, HeadTransposedMatmulIsOneProduct) {
  const Tensor q = randn({16, 8, 4, 32}).permute({0, 2, 1, 3});  // (B, H, S, D)
  const Tensor k = randn({16, 8, 4, 32}).permute({0, 2, 3, 1});  // (B, H, D, S)
  Profile prof;
  const Tensor scores = matmul(q, k);
  prof.stop();
  EXPECT_EQ(scores.shape(), (Shape{16, 4, 8, 8}));
  EXPECT_EQ(of_kind(prof.result(), Kind::Op, "matmul").size(), 1u);
}

TEST(Profiler, ShapesCanBeLeftOut) {
  auto net = small_mlp();
  Profile prof({.record_shapes = false});
  train_step(*net);
  prof.stop();
  ASSERT_FALSE(of_kind(prof.result(), Kind::Op, "matmul").empty());
  for (const Event& e : prof.result().events()) EXPECT_EQ(e.shapes, "");
}

TEST(Profiler, ScheduleKeepsOnlyTheActiveSteps) {
  auto net = small_mlp();
  int ready = 0;
  Profile prof({.schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 1},
                .on_trace_ready = [&](const profiler::Result& r) {
                  ++ready;
                  EXPECT_EQ(r.steps(), 2);
                }});
  std::vector<bool> recording;
  for (int i = 0; i < 6; ++i) {
    recording.push_back(prof.recording());
    train_step(*net);
    prof.step();
  }
  // Step 0 waits, step 1 warms up (recorded, thrown away), steps 2 and 3 are kept, then nothing.
  EXPECT_EQ(recording, (std::vector<bool>{false, true, true, true, false, false}));
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(prof.cycles_done(), 1);
  EXPECT_FALSE(trace::active());
  const profiler::Result& r = prof.result();
  std::set<int64_t> steps;
  for (const Event& e : r.events()) steps.insert(e.step);
  EXPECT_EQ(steps, (std::set<int64_t>{2, 3}));
  std::vector<std::string> step_names;
  for (const Event* e : of_kind(r, Kind::Step)) step_names.push_back(e->name);
  EXPECT_EQ(step_names, (std::vector<std::string>{"step 2", "step 3"}));
  // Two training steps: two Sequential calls, four Linear calls.
  EXPECT_EQ(of_kind(r, Kind::Module, "Sequential").size(), 2u);
  EXPECT_EQ(of_kind(r, Kind::Module, "Linear").size(), 4u);
}

TEST(Profiler, RepeatedCyclesWriteOneTraceEach) {
  testing::TempFolder dir;
  auto net = small_mlp();
  {
    Profile prof({.schedule = {.wait = 1, .warmup = 0, .active = 1, .repeat = 2}, .trace_path = dir.file("t.json")});
    for (int i = 0; i < 7; ++i) {
      train_step(*net);
      prof.step();
    }
    EXPECT_EQ(prof.cycles_done(), 2);
    // The second cycle's step is step 3 (wait 2, active 3).
    for (const Event& e : prof.result().events()) EXPECT_EQ(e.step, 3);
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "t.1.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "t.2.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "t.3.json"));
}

TEST(Profiler, BackToBackCyclesWithoutWaiting) {
  auto net = small_mlp();
  std::vector<std::set<int64_t>> cycles;
  Profile prof({.schedule = {.wait = 0, .warmup = 0, .active = 2, .repeat = 2},
                .on_trace_ready = [&](const profiler::Result& r) {
                  std::set<int64_t> steps;
                  for (const Event& e : r.events()) steps.insert(e.step);
                  cycles.push_back(steps);
                }});
  for (int i = 0; i < 5; ++i) {
    train_step(*net);
    prof.step();
  }
  EXPECT_EQ(cycles, (std::vector<std::set<int64_t>>{{0, 1}, {2, 3}}));
}

TEST(Profiler, StopKeepsAPartialActiveCycleButNotAWarmup) {
  auto net = small_mlp();
  {
    Profile prof({.schedule = {.wait = 0, .warmup = 2, .active = 2}});
    train_step(*net);
    prof.step();  // step 0 (warmup) done; stopping in step 1, still warmup
    prof.stop();
    EXPECT_EQ(prof.cycles_done(), 0);
    EXPECT_TRUE(prof.result().events().empty());
  }
  {
    Profile prof({.schedule = {.wait = 0, .warmup = 1, .active = 3}});
    for (int i = 0; i < 2; ++i) {
      train_step(*net);
      prof.step();
    }
    train_step(*net);  // step 2, active, never ended by step()
    prof.stop();
    EXPECT_EQ(prof.cycles_done(), 1);
    std::set<int64_t> steps;
    for (const Event& e : prof.result().events()) steps.insert(e.step);
    EXPECT_EQ(steps, (std::set<int64_t>{1, 2}));
  }
}

TEST(Profiler, RecordsWorkerThreadsOnTheirOwnRows) {
  Profile prof;
  std::thread worker([] {
    trace::Scope range(Kind::User, "load batch");
    Tensor t = ones({16});
    (void)sum(t);
  });
  worker.join();
  { trace::Scope range(Kind::User, "main work"); }
  prof.stop();
  const auto load = of_kind(prof.result(), Kind::User, "load batch");
  const auto main_work = of_kind(prof.result(), Kind::User, "main work");
  ASSERT_EQ(load.size(), 1u);
  ASSERT_EQ(main_work.size(), 1u);
  EXPECT_EQ(main_work[0]->thread, 0);
  EXPECT_NE(load[0]->thread, 0);
  EXPECT_EQ(prof.result().thread_names().at(0), "main");
  // The worker's sum ran inside its range.
  bool sum_in_worker = false;
  for (const Event& e : prof.result().events())
    if (e.kind == Kind::Op && e.name == "sum" && e.thread == load[0]->thread) sum_in_worker = true;
  EXPECT_TRUE(sum_in_worker);
}

TEST(Profiler, SelfTimeLeavesOutNestedRanges) {
  using namespace std::chrono_literals;
  Profile prof;
  {
    trace::Scope outer(Kind::User, "outer");
    std::this_thread::sleep_for(30ms);
    {
      trace::Scope inner(Kind::User, "inner");
      std::this_thread::sleep_for(20ms);
    }
  }
  prof.stop();
  const auto stats = prof.result().stats(Kind::User);
  ASSERT_EQ(stats.size(), 2u);
  const profiler::OpStats& outer = stats[0].name == "outer" ? stats[0] : stats[1];
  const profiler::OpStats& inner = stats[0].name == "inner" ? stats[0] : stats[1];
  EXPECT_EQ(outer.calls, 1);
  EXPECT_GE(inner.host_total_ns, 20'000'000);
  EXPECT_GE(outer.host_total_ns, 50'000'000);
  // outer's self time is its own 30 ms sleep: total less inner's total, exactly.
  EXPECT_EQ(outer.host_self_ns, outer.host_total_ns - inner.host_total_ns);
  EXPECT_GE(outer.host_self_ns, 30'000'000);
  EXPECT_EQ(inner.host_self_ns, inner.host_total_ns);
}

TEST(Profiler, TableListsTheTopOps) {
  auto net = small_mlp();
  Profile prof;
  for (int i = 0; i < 3; ++i) train_step(*net);
  prof.stop();
  const std::string table = prof.result().table(3);
  EXPECT_NE(table.find("op"), std::string::npos);
  EXPECT_NE(table.find("host self ms"), std::string::npos);
  EXPECT_EQ(table.find("GPU self ms"), std::string::npos) << "a CPU run has no GPU columns";
  // Header, 3 rows, the summary line.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 5) << table;
  // matmul ran 3 times per step in forward (two Linear layers: 2) and backward (at least 3 more).
  const auto stats = prof.result().stats(Kind::Op);
  const auto it = std::find_if(stats.begin(), stats.end(), [](const profiler::OpStats& s) { return s.name == "matmul"; });
  ASSERT_NE(it, stats.end());
  EXPECT_GE(it->calls, 3 * 5);
}

TEST(Profiler, ChromeTraceParsesWithTheExpectedEvents) {
  testing::TempFolder dir;
  auto net = small_mlp();
  const std::string path = dir.file("trace.json");
  {
    Profile prof({.schedule = {.wait = 0, .warmup = 0, .active = 1}, .trace_path = path});
    train_step(*net);
    prof.step();
  }
  const nlohmann::json j = nlohmann::json::parse(read_file(path));
  ASSERT_TRUE(j.contains("traceEvents"));
  std::set<std::string> categories;
  bool host_named = false, matmul_with_shapes = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "host") host_named = true;
    if (e["ph"] != "X") continue;
    categories.insert(e["cat"].get<std::string>());
    EXPECT_TRUE(e["ts"].is_number());
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    if (e["name"] == "matmul" && e["args"].contains("shapes")) matmul_with_shapes = true;
  }
  EXPECT_TRUE(host_named);
  EXPECT_TRUE(matmul_with_shapes);
  for (const char* c : {"op", "module", "backward", "step"}) EXPECT_TRUE(categories.count(c)) << c;
}

TEST(Profiler, BadInputsAreClearErrors) {
  testing::expect_error([] { Profile p({.schedule = {.wait = -1, .active = 1}}); },
                        {"schedule", "must be >= 0", "-1"});
  {
    Profile first;
    testing::expect_error([] { Profile second; }, {"another Profile is alive"});
  }
  { Profile again; }  // the first one is gone: allowed
  testing::TempFolder dir;
  Profile prof({.trace_path = dir.file("no/such/folder/trace.json")});
  { trace::Scope s(Kind::User, "x"); }
  testing::expect_error([&] { prof.stop(); }, {"cannot write the trace file", "no/such/folder"});
}

TEST(Nvtx, EnablingDoesNotChangeResults) {
  if (!profiler::nvtx_compiled()) {
    testing::expect_error([] { profiler::enable_nvtx(); }, {"no NVTX", "KILN_CUDA=ON"});
    return;
  }
  auto net = small_mlp();
  manual_seed(3);
  Tensor x = randn({3, 4});
  const Tensor plain = (*net)(x).detach();
  profiler::enable_nvtx();
  EXPECT_TRUE(profiler::nvtx_enabled());
  EXPECT_TRUE(trace::active());
  trace::mark_step(0);
  const Tensor traced = (*net)(x).detach();
  trace::end_step();
  profiler::disable_nvtx();
  EXPECT_FALSE(profiler::nvtx_enabled());
  EXPECT_FALSE(trace::active());
  EXPECT_TRUE(equal(plain, traced));
}

#if defined(KILN_NVTX_RECORDER)
TEST(Nvtx, RangesReachAnAttachedTool) {
  testing::TempFolder dir;
  const std::string log = dir.file("nvtx.log");
  const std::string cmd = std::string("NVTX_INJECTION64_PATH='") + KILN_NVTX_RECORDER + "' KILN_TEST_NVTX_LOG='" + log +
                          "' '" + KILN_NVTX_CHILD + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::string> lines;
  {
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) lines.push_back(line);
  }
  ASSERT_FALSE(lines.empty()) << "the injection library logged nothing: " << cmd;
  std::map<std::string, int> count;
  int depth = 0, max_depth = 0;
  for (const std::string& l : lines) {
    ++count[l];
    if (l.rfind("push ", 0) == 0) max_depth = std::max(max_depth, ++depth);
    if (l.rfind("pop ", 0) == 0) {
      EXPECT_GE(--depth, 0) << "a pop without its push";
    }
  }
  EXPECT_EQ(depth, 0) << "pushes and pops do not balance";
  // Two steps as start/end ranges, each with Sequential > Linear, ReLU in forward and the backward nodes.
  EXPECT_EQ(lines.front(), "start kiln step 0");
  EXPECT_EQ(count["start kiln step 0"], 1);
  EXPECT_EQ(count["start kiln step 1"], 1);
  EXPECT_EQ(count["end kiln"], 2);
  EXPECT_EQ(count["push kiln Sequential"], 2);
  EXPECT_EQ(count["push kiln Linear"], 2);
  EXPECT_EQ(count["push kiln ReLU"], 2);
  EXPECT_EQ(count["push kiln AddmmBackward"], 2);
  EXPECT_EQ(count["push kiln ReluBackward"], 2);
  EXPECT_EQ(max_depth, 2);  // Sequential > Linear
  EXPECT_EQ(count["push kiln matmul"], 0) << "ops were switched off";
}
#endif

TEST(CudaProfiler, TimesOpsOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device dev = Device::cuda(0);
  Tensor a = randn({2048, 2048}, TensorOptions{.device = dev});
  Tensor b = randn({2048, 2048}, TensorOptions{.device = dev});
  Profile prof;
  for (int i = 0; i < 3; ++i) (void)matmul(a, b);
  prof.stop();
  const auto mm = of_kind(prof.result(), Kind::Op, "matmul");
  ASSERT_EQ(mm.size(), 3u);
  for (const Event* e : mm) {
    EXPECT_EQ(e->gpu_device, 0);
    // 2 * 2048^3 flops take well over a microsecond and well under a second.
    EXPECT_GT(e->gpu_ns(), 1000);
    EXPECT_LT(e->gpu_ns(), 1'000'000'000);
  }
  // One after the other on one stream.
  EXPECT_LE(mm[0]->gpu_end_ns, mm[1]->gpu_begin_ns);
  EXPECT_LE(mm[1]->gpu_end_ns, mm[2]->gpu_begin_ns);
  const std::string json = prof.result().chrome_trace_json();
  EXPECT_NE(json.find("\"cuda:0\""), std::string::npos);
  EXPECT_NE(json.find("\"gpu_op\""), std::string::npos);
  const std::string table = prof.result().table(5);
  EXPECT_NE(table.find("matmul"), std::string::npos);
  EXPECT_NE(table.find("GPU self ms"), std::string::npos);
}

TEST(CudaProfiler, TrainingStepOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device dev = Device::cuda(0);
  auto net = small_mlp();
  net->to(dev);
  Profile prof({.schedule = {.wait = 1, .warmup = 1, .active = 2}});
  for (int i = 0; i < 4; ++i) {
    train_step(*net, dev);
    prof.step();
  }
  const auto steps = of_kind(prof.result(), Kind::Step);
  ASSERT_EQ(steps.size(), 2u);
  int64_t gpu_ops = 0;
  for (const Event& e : prof.result().events()) {
    if (e.kind != Kind::Op || e.gpu_device < 0) continue;
    ++gpu_ops;
    // Each op's GPU time lies inside its step's GPU time.
    const Event* step = e.step == 2 ? steps[0] : steps[1];
    EXPECT_GE(e.gpu_begin_ns, step->gpu_begin_ns);
    EXPECT_LE(e.gpu_end_ns, step->gpu_end_ns);
  }
  EXPECT_GT(gpu_ops, 10);
}

}  // namespace
}  // namespace kiln
