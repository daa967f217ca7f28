// io::save_checkpoint / load_checkpoint: every part round-trips bit for bit; the file layout is what h5py
// expects (dataset names, stored types, crc32 attributes checked with zlib here); saves are atomic; bad files
// and mismatched objects give clear errors naming the file and change nothing.
#include <gtest/gtest.h>
#include <hdf5.h>  // the raw layout checks and the corruption of a dataset
#include <zlib.h>  // an independent crc32

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "io/checkpoint_test_util.h"
#include "kiln/io/checkpoint.h"
#include "kiln/io/checkpoint_internal.h"
#include "kiln/io/hdf5_tensors.h"
#include "kiln/optim/adam.h"
#include "kiln/optim/sgd.h"
#include "kiln/tensor/cuda.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

// One AdamW step on a fixed batch, so the optimizer has state.
void train_one_step(TinyNet& net, optim::Optimizer& opt) {
  opt.zero_grad();
  const Device device = net.fc1->parameters()[0].device();
  Tensor x = internal::from_vector<float>({1, 2, 3, 4, -1, 0.5f, 2, 0}, {2, 4}).to(device);
  Tensor loss = sum(net(x));
  loss.backward();
  opt.step();
}

struct Everything {
  std::shared_ptr<TinyNet> net;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LambdaLR> sched;
  amp::GradScaler scaler{{.init_scale = 1024.0, .growth_interval = 7}};
  data::LoaderPosition pos;
  io::Metadata meta;

  explicit Everything(uint64_t seed) {
    manual_seed(seed);
    net = std::make_shared<TinyNet>();
    opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{.lr = 1e-2});
    sched = optim::linear_warmup_cosine_decay(*opt, 2, 10);
  }
  io::CheckpointParts parts() {
    return {.model = net.get(),
            .optimizer = opt.get(),
            .scheduler = sched.get(),
            .scaler = &scaler,
            .generators = true,
            .loader = &pos,
            .metadata = &meta};
  }
};

TEST(IoCheckpoint, EveryPartRoundTripsBitForBit) {
  TempFolder dir;
  Everything a(1);
  train_one_step(*a.net, *a.opt);
  a.sched->step();
  a.sched->step();
  a.pos = {3, 17};
  a.meta = {.numbers = {{"step", 1200}, {"val_loss", 0.3125}}, .strings = {{"config", "{\"lr\": 0.01}"}}};
  internal::rand({5});  // move the CPU generator
  const GeneratorState gen = default_generator().state();
  io::save_checkpoint(dir.file("c.h5"), a.parts());

  Everything b(2);  // other parameters, no optimizer state, scheduler at step 0
  manual_seed(99);
  io::load_checkpoint(dir.file("c.h5"), b.parts());
  expect_same_state(a.net->state_dict(), b.net->state_dict());
  const auto sa = a.opt->state_dict(), sb = b.opt->state_dict();
  EXPECT_EQ(sa.values, sb.values);
  ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
  EXPECT_FALSE(sa.tensors.empty());
  for (const auto& [key, t] : sa.tensors) EXPECT_EQ(bytes_of(t), bytes_of(sb.tensors.at(key))) << key;
  EXPECT_EQ(a.sched->state_dict(), b.sched->state_dict());
  EXPECT_EQ(b.sched->last_epoch(), 2);
  EXPECT_EQ(b.opt->lr(0), a.opt->lr(0));
  EXPECT_EQ(a.scaler.state_dict(), b.scaler.state_dict());
  EXPECT_EQ(default_generator().state(), gen);
  EXPECT_EQ(b.pos, (data::LoaderPosition{3, 17}));
  EXPECT_EQ(b.meta, a.meta);
  // One more identical step from both gives identical parameters: the optimizer state is really restored.
  train_one_step(*a.net, *a.opt);
  train_one_step(*b.net, *b.opt);
  expect_same_state(a.net->state_dict(), b.net->state_dict());
}

TEST(IoCheckpoint, LayoutIsWhatH5pyReads) {
  TempFolder dir;
  Everything a(1);
  train_one_step(*a.net, *a.opt);
  a.meta.numbers["step"] = 5;
  const std::string path = dir.file("c.h5");
  io::save_checkpoint(path, a.parts());
  // tests/golden/check_checkpoint_h5py.py reads this file with h5py where h5py is installed.
  if (const char* keep = std::getenv("KILN_CHECKPOINT_SAMPLE"))
    fs::copy_file(path, keep, fs::copy_options::overwrite_existing);

  io::H5File f(path, io::H5File::Mode::Read);
  EXPECT_EQ(f.attr_string("/", "format"), "kiln-checkpoint");
  EXPECT_EQ(f.attr_int("/", "format_version"), 1);
  EXPECT_EQ(f.attr_int("/", "complete"), 1);
  EXPECT_FALSE(f.attr_string("/", "created").empty());
  EXPECT_EQ(f.attr_string("/optimizer", "type"), "AdamW");
  EXPECT_EQ(f.attr_double("/optimizer", "param_groups.0.lr"), a.opt->lr(0));
  EXPECT_TRUE(f.has_dataset("/optimizer/state", "0.exp_avg"));
  EXPECT_EQ(f.attr_string("/scheduler", "type"), "LambdaLR");
  EXPECT_EQ(f.attr_double("/scaler", "scale"), 1024.0);
  EXPECT_EQ(f.attr_uint("/rng/cpu", "seed"), default_generator().state().seed);
  EXPECT_EQ(f.attr_double("/metadata", "step"), 5.0);
  std::vector<std::string> names;
  for (const auto& [name, t] : a.net->state_dict()) names.push_back(name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(f.children("/model"), names);  // the dotted names themselves
  f.close();

  // Stored types, read with the HDF5 API itself.
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  auto type_of = [&](const char* ds_path, H5T_class_t& cls, size_t& size) {
    hid_t ds = H5Dopen2(file, ds_path, H5P_DEFAULT);
    hid_t type = H5Dget_type(ds);
    cls = H5Tget_class(type);
    size = H5Tget_size(type);
    const size_t ebias = cls == H5T_FLOAT ? H5Tget_ebias(type) : 0;
    H5Tclose(type);
    H5Dclose(ds);
    return ebias;
  };
  H5T_class_t cls;
  size_t size;
  EXPECT_EQ(type_of("/model/half", cls, size), 15u);  // IEEE half: numpy float16 in h5py
  EXPECT_EQ(cls, H5T_FLOAT);
  EXPECT_EQ(size, 2u);
  type_of("/model/bhalf", cls, size);
  EXPECT_EQ(cls, H5T_INTEGER);
  EXPECT_EQ(size, 2u);
  type_of("/model/mask", cls, size);
  EXPECT_EQ(cls, H5T_ENUM);  // h5py's bool
  type_of("/model/fc1.weight", cls, size);
  EXPECT_EQ(cls, H5T_FLOAT);
  EXPECT_EQ(size, 4u);
  // crc32 of fc1.weight's bytes, computed here with zlib.
  const std::vector<uint8_t> w = bytes_of(a.net->fc1->parameters()[0]);
  const uint32_t expected = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), w.data(), static_cast<uInt>(w.size())));
  hid_t attr = H5Aopen_by_name(file, "/model/fc1.weight", "crc32", H5P_DEFAULT, H5P_DEFAULT);
  uint32_t stored = 0;
  H5Aread(attr, H5T_NATIVE_UINT32, &stored);
  H5Aclose(attr);
  H5Fclose(file);
  EXPECT_EQ(stored, expected);
  io::H5File g(path, io::H5File::Mode::Read);
  EXPECT_EQ(g.attr_string("/model/bhalf", "dtype"), "bfloat16");
  EXPECT_EQ(g.tensor_info("/model", "nothing").shape, (Shape{0, 3}));
  EXPECT_EQ(g.tensor_info("/model", "scalar").shape, (Shape{}));
}

TEST(IoCheckpoint, InspectListsParts) {
  TempFolder dir;
  Everything a(1);
  io::save_checkpoint(dir.file("c.h5"), {.model = a.net.get(), .loader = &a.pos});
  const io::CheckpointInfo info = io::inspect_checkpoint(dir.file("c.h5"));
  EXPECT_EQ(info.format_version, 1);
  EXPECT_TRUE(info.complete);
  EXPECT_EQ(info.parts, (std::vector<std::string>{"model", "loader"}));
}

TEST(IoCheckpoint, FailedSaveKeepsThePreviousFileAndLeavesNoTemporary) {
  TempFolder dir;
  Everything a(1);
  const std::string path = dir.file("c.h5");
  io::save_checkpoint(path, a.parts());
  const std::string before = read_file_bytes(path);
  io::detail::set_save_fault_hook([](const std::string& part) {
    if (part == "optimizer") throw Error("injected failure after the optimizer");
  });
  train_one_step(*a.net, *a.opt);
  expect_error([&] { io::save_checkpoint(path, a.parts()); }, {"injected failure"});
  io::detail::set_save_fault_hook(nullptr);
  EXPECT_EQ(read_file_bytes(path), before);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path())) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"c.h5"});
  // A failure at the first part of a new file leaves nothing at all.
  io::detail::set_save_fault_hook([](const std::string& part) {
    if (part == "model") throw Error("injected failure after the model");
  });
  EXPECT_ANY_THROW(io::save_checkpoint(dir.file("d.h5"), a.parts()));
  io::detail::set_save_fault_hook(nullptr);
  EXPECT_EQ(read_file_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  expect_error([&] { io::save_checkpoint(dir.file("no/such/folder/c.h5"), a.parts()); }, {"does not exist"});
}

// ---- bad input ----

class IoCheckpointBad : public ::testing::Test {
 protected:
  void SetUp() override {
    good = dir.file("good.h5");
    io::save_checkpoint(good, {.model = a.net.get(), .optimizer = a.opt.get()});
  }
  // Loading into a fresh model must fail with `fragments` and leave it unchanged.
  void expect_load_error(const std::string& path, const std::vector<std::string>& fragments) {
    Everything b(7);
    const nn::StateDict before = snapshot(*b.net);
    std::vector<std::string> all = fragments;
    all.push_back(path);
    expect_error([&] { io::load_checkpoint(path, {.model = b.net.get(), .optimizer = b.opt.get()}); }, all);
    expect_same_state(before, b.net->state_dict());
  }
  std::string copy_of_good(const std::string& name) {
    fs::copy_file(good, dir / name);
    return dir.file(name);
  }
  TempFolder dir;
  Everything a{1};
  std::string good;
};

TEST_F(IoCheckpointBad, MissingEmptyTruncatedGarbage) {
  expect_load_error(dir.file("absent.h5"), {"no such file"});
  expect_load_error(dir.write("empty.h5", "").string(), {"empty"});
  expect_load_error(dir.write("garbage.h5", std::string(5000, 'x')).string(), {"not a kiln checkpoint", "KILNCKPT"});
  const std::string bytes = read_file_bytes(good);
  const std::string total = " of " + std::to_string(bytes.size()) + " bytes";
  for (size_t keep : {size_t{600}, bytes.size() / 2, bytes.size() - 100, bytes.size() - 1}) {
    const std::string p = dir.write("trunc" + std::to_string(keep) + ".h5", bytes.substr(0, keep)).string();
    expect_load_error(p, {"truncated: " + std::to_string(keep) + total});
    expect_error([&] { io::inspect_checkpoint(p); }, {p, "truncated"});
  }
  expect_load_error(dir.write("short.h5", bytes.substr(0, 20)).string(), {"truncated", "shorter than kiln's header"});
  expect_load_error(dir.write("appended.h5", bytes + "x").string(), {"appended", "damaged"});
}

// The kiln header in the user block, read here byte by byte with zlib's crc32 (independent of kiln's reader).
TEST_F(IoCheckpointBad, HeaderHoldsMagicLengthAndCrcOfTheRest) {
  const std::string bytes = read_file_bytes(good);
  ASSERT_GT(bytes.size(), 512u);
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  auto le = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{u[at + i]} << (8 * i);
    return v;
  };
  EXPECT_EQ(bytes.substr(0, 8), "KILNCKPT");
  EXPECT_EQ(le(8, 4), 1u);
  EXPECT_EQ(le(12, 4), 512u);
  EXPECT_EQ(le(16, 8), bytes.size());
  EXPECT_EQ(le(24, 4), crc32(crc32(0L, Z_NULL, 0), u + 512, static_cast<uInt>(bytes.size() - 512)));
  EXPECT_EQ(le(28, 4), crc32(crc32(0L, Z_NULL, 0), u, 28));
  EXPECT_EQ(bytes.substr(32, 480), std::string(480, '\0'));
  EXPECT_EQ(bytes.substr(512, 8), "\x89HDF\r\n\x1a\n");  // HDF5's superblock right after the user block
}

// Any flipped byte after the user block is caught by the file-level crc before HDF5 parses the file; a
// flipped header byte is caught too.
TEST_F(IoCheckpointBad, AFlippedByteAnywhereIsCaughtBeforeHdf5) {
  const std::string bytes = read_file_bytes(good);
  const size_t step = std::max<size_t>(1, (bytes.size() - 512) / 37);
  int n = 0;
  for (size_t at = 512; at < bytes.size(); at += step, ++n) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ (1 << (at % 8)));
    const std::string p = dir.write("flip.h5", bad).string();
    expect_error([&] { io::inspect_checkpoint(p); }, {p, "corrupted: checksum mismatch"});
    if (n % 8 == 0) expect_load_error(p, {"corrupted: checksum mismatch"});
  }
  EXPECT_GE(n, 37);
  for (size_t at : {size_t{0}, size_t{9}, size_t{17}, size_t{25}, size_t{30}}) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 4);
    const std::string p = dir.write("header.h5", bad).string();
    expect_load_error(p, {at < 8 ? "not a kiln checkpoint" : "corrupted: the kiln header's checksum"});
  }
}

TEST_F(IoCheckpointBad, AnotherModelListsNamesAndShapes) {
  manual_seed(3);
  TinyNet wider(16);
  optim::AdamW opt(wider.parameters());
  expect_error([&] { io::load_checkpoint(good, {.model = &wider}); },
               {good, "different shape", "fc1.weight", "fc2.weight", "fc1.bias"});
  auto seq = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 8)});
  expect_error([&] { io::load_checkpoint(good, {.model = seq.get()}); },
               {good, "missing in the file: 0.weight, 0.bias", "unexpected in the file", "fc1.weight"});
}

TEST_F(IoCheckpointBad, ChecksumMismatchNamesTheTensor) {
  const std::string p = copy_of_good("flipped.h5");
  {  // Rewrite fc2.bias's data with the HDF5 API, leaving its crc32 as it was.
    hid_t file = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(file, "/model/fc2.bias", H5P_DEFAULT);
    float v[3];
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    v[1] = std::nextafter(v[1], 10.f);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Fclose(file);
  }
  expect_load_error(p, {"corrupted: checksum mismatch"});  // the file-level crc catches it first
  // With the file-level crc recomputed, the file passes the header check and fc2.bias's own crc32 catches it.
  io::detail::seal_checkpoint(p);
  expect_load_error(p, {"/model/fc2.bias", "checksum"});
  EXPECT_NO_THROW(io::inspect_checkpoint(p));  // reads no tensor data
}

// A dataset whose shape claims more bytes than the file holds (HDF5 allocates contiguous storage late, so a
// forged 4 TiB shape costs nothing in the file) is refused before kiln allocates the tensor.
TEST_F(IoCheckpointBad, ATensorLargerThanTheFileIsRefusedBeforeAllocating) {
  const std::string p = dir.file("forged.h5");
  {
    io::H5File f(p, io::H5File::Mode::Create);
    f.create_group("/model");
  }
  hid_t file = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hsize_t dims[1] = {hsize_t{1} << 40};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t ds = H5Dcreate2(file, "/model/w", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(file);
  io::H5File(p, io::H5File::Mode::ReadWrite).set_attr("/model/w", "crc32", uint64_t{0});
  io::H5File f(p, io::H5File::Mode::Read);
  EXPECT_EQ(f.tensor_info("/model", "w").shape, (Shape{int64_t{1} << 40}));
  expect_error([&] { f.read_tensor("/model", "w"); }, {p, "/model/w", "more bytes than the whole file"});
}

TEST_F(IoCheckpointBad, MissingPartIsNamed) {
  Everything b(7);
  expect_error([&] { io::load_checkpoint(good, {.scheduler = b.sched.get()}); }, {good, "no scheduler"});
  expect_error([&] { io::load_checkpoint(good, {.loader = &b.pos}); }, {good, "no loader position"});
  expect_error([&] { io::load_checkpoint(good, {.generators = true}); }, {good, "random generator"});
  expect_error([&] { io::load_checkpoint(good, {.metadata = &b.meta}); }, {good, "no metadata"});
}

TEST_F(IoCheckpointBad, WrongFormatOrVersion) {
  const std::string other = copy_of_good("other.h5");
  // Each file is changed with HDF5 and resealed (its file-level crc recomputed) to reach HDF5's checks.
  io::H5File(other, io::H5File::Mode::ReadWrite).set_attr("/", "format", std::string("something-else"));
  io::detail::seal_checkpoint(other);
  expect_load_error(other, {"not a kiln checkpoint", "root attribute format"});
  const std::string newer = copy_of_good("newer.h5");
  io::H5File(newer, io::H5File::Mode::ReadWrite).set_attr("/", "format_version", int64_t{2});
  io::detail::seal_checkpoint(newer);
  expect_load_error(newer, {"format version 2", "newer kiln"});
  const std::string partial = copy_of_good("partial.h5");
  io::H5File(partial, io::H5File::Mode::ReadWrite).set_attr("/", "complete", int64_t{0});
  io::detail::seal_checkpoint(partial);
  expect_load_error(partial, {"incomplete"});
  // A plain HDF5 file (no user block: the older layout, or another program's file) is refused before HDF5.
  {
    io::H5File plain(dir.file("plain.h5"), io::H5File::Mode::Create);
    plain.set_attr("/", "format", std::string("kiln-checkpoint"));
  }
  expect_load_error(dir.file("plain.h5"), {"not a kiln checkpoint of this layout", "without kiln's KILNCKPT header"});
  expect_error([&] { io::inspect_checkpoint(dir.file("plain.h5")); }, {"without kiln's KILNCKPT header"});
}

TEST_F(IoCheckpointBad, OptimizerStructureIsCheckedBeforeAnythingChanges) {
  manual_seed(7);
  auto net = std::make_shared<TinyNet>();
  const nn::StateDict before = snapshot(*net);
  optim::AdamW two_groups(
      {{.params = net->fc1->parameters(), .options = {}}, {.params = net->fc2->parameters(), .options = {}}},
      optim::AdamWOptions{});
  expect_error([&] { io::load_checkpoint(good, {.model = net.get(), .optimizer = &two_groups}); },
               {good, "2", "parameter group"});
  expect_same_state(before, net->state_dict());
  optim::SGD sgd(net->parameters(), {.lr = 0.1});
  expect_error([&] { io::load_checkpoint(good, {.model = net.get(), .optimizer = &sgd}); }, {good, "AdamW", "SGD"});
  expect_same_state(before, net->state_dict());
}

// A scheduler of another class than the saved one is refused by name, before the optimizer or the model change.
TEST(IoCheckpoint, AnotherSchedulerClassIsRefusedByName) {
  TempFolder dir;
  Everything a(1);
  const std::string path = dir.file("c.h5");
  io::save_checkpoint(path, a.parts());

  Everything b(2);
  train_one_step(*b.net, *b.opt);
  const nn::StateDict before = snapshot(*b.net);
  const optim::OptimizerState opt_before = b.opt->state_dict();
  optim::StepLR step(*b.opt, 3);
  expect_error([&] { io::load_checkpoint(path, {.model = b.net.get(), .optimizer = b.opt.get(), .scheduler = &step}); },
               {path, "the checkpoint's LR scheduler is LambdaLR, this one is StepLR", "build the same scheduler"});
  expect_same_state(before, b.net->state_dict());
  EXPECT_EQ(b.opt->state_dict().values, opt_before.values);
}

// The scheduler refuses its state only when it is applied, after the optimizer took its own: the optimizer is
// put back as it was, and the model (applied after both) is untouched.
TEST(IoCheckpoint, ARefusedSchedulerStateRestoresTheOptimizer) {
  TempFolder dir;
  Everything a(1);
  train_one_step(*a.net, *a.opt);
  const std::string path = dir.file("c.h5");
  io::save_checkpoint(path, a.parts());
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Adelete_by_name(file, "/scheduler", "last_epoch", H5P_DEFAULT), 0);
  H5Fclose(file);
  io::detail::seal_checkpoint(path);  // the file-level crc matches again: the scheduler's own check refuses it

  Everything b(2);
  train_one_step(*b.net, *b.opt);
  b.opt->set_lr(0, 0.123);
  const nn::StateDict model_before = snapshot(*b.net);
  const optim::OptimizerState opt_before = b.opt->state_dict();
  std::map<std::string, std::vector<uint8_t>> opt_bytes;
  for (const auto& [key, t] : opt_before.tensors) opt_bytes[key] = bytes_of(t);
  expect_error([&] { io::load_checkpoint(path, b.parts()); }, {"last_epoch"});
  const optim::OptimizerState opt_after = b.opt->state_dict();
  EXPECT_EQ(opt_after.values, opt_before.values);
  EXPECT_EQ(b.opt->lr(0), 0.123);
  ASSERT_EQ(opt_after.tensors.size(), opt_bytes.size());
  for (const auto& [key, t] : opt_after.tensors) EXPECT_EQ(bytes_of(t), opt_bytes.at(key)) << key;
  expect_same_state(model_before, b.net->state_dict());
}

// GPU tensors are written from the host and loaded onto each parameter's (state's) device; the GPU's generator
// is saved and restored beside the CPU's.
TEST(CudaIoCheckpoint, GpuTensorsSaveAndLoadOnTheirDevices) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  TempFolder dir;
  const Device gpu = Device::cuda(0);
  manual_seed(1);
  auto a = std::make_shared<TinyNet>();
  a->to(gpu);
  optim::AdamW opt_a(a->parameters(), {.lr = 1e-2});
  train_one_step(*a, opt_a);
  internal::rand({4}, {.device = gpu});  // move the GPU generator
  const GeneratorState gpu_state = default_generator(gpu).state();
  const std::string path = dir.file("gpu.h5");
  io::save_checkpoint(path, {.model = a.get(), .optimizer = &opt_a, .generators = true});
  EXPECT_EQ(io::H5File(path, io::H5File::Mode::Read).attr_uint("/rng/cuda0", "offset"), gpu_state.offset);

  manual_seed(2);
  TinyNet on_cpu;
  io::load_checkpoint(path, {.model = &on_cpu});
  expect_same_state(a->state_dict(), on_cpu.state_dict());

  manual_seed(3);
  auto b = std::make_shared<TinyNet>();
  b->to(gpu);
  optim::AdamW opt_b(b->parameters(), {.lr = 1e-2});
  io::load_checkpoint(path, {.model = b.get(), .optimizer = &opt_b, .generators = true});
  EXPECT_EQ(default_generator(gpu).state(), gpu_state);
  for (const auto& [name, t] : b->state_dict()) EXPECT_TRUE(t.is_cuda()) << name;
  for (const auto& [key, t] : opt_b.state_dict().tensors) EXPECT_TRUE(t.is_cuda()) << key;
  expect_same_state(a->state_dict(), b->state_dict());
  train_one_step(*a, opt_a);
  train_one_step(*b, opt_b);
  expect_same_state(a->state_dict(), b->state_dict());
}

}  // namespace
}  // namespace kiln::testing
