// Tests of io::read_torch_file against torch.save files written by hand (tests/io/torch_file_writer.h):
// values, dtypes, strided views, shared storages, nested dicts, zip64 and deflate; and bad input.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/torch_file_writer.h"
#include "kiln/io/torch_file.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln {
namespace {

namespace kt = kiln::testing;

using test_io::Pickle;
using test_io::ZipFile;

class TorchFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kiln_torch_file_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    test_io::write_file(p, bytes);
    return p;
  }
  std::filesystem::path dir_;
};

std::string le_bytes(const std::vector<uint64_t>& v, int width) {
  std::string s;
  for (auto x : v) test_io::put_le(s, x, width);
  return s;
}
std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// {"w": float32 (2, 3), "h": float16 (4,), "n": int64 (3,)} with the state dict's _metadata (BUILD).
ZipFile flat_archive(bool zip64 = false, bool deflate = false) {
  Pickle p;
  p.proto().ordered_dict().put().mark();
  p.str("w").tensor("FloatStorage", "0", 6, 0, {2, 3}, {3, 1});
  p.str("h").tensor("HalfStorage", "1", 4, 0, {4}, {1});
  p.str("n").tensor("LongStorage", "2", 3, 0, {3}, {1});
  p.op('u');
  // state = {"_metadata": OrderedDict({"": {"version": 1}})}, then BUILD.
  p.op('}').str("_metadata").ordered_dict().str("").op('}').str("version").integer(1).op('s').op('s').op('s');
  p.op('b').stop();
  ZipFile z;
  z.zip64 = zip64;
  z.add("archive/data.pkl", p.b, deflate);
  z.add("archive/byteorder", "little");
  z.add("archive/data/0", float_bytes({1, 2, 3, 4, 5, 6.5f}), deflate);
  z.add("archive/data/1", le_bytes({0x3C00, 0xC000, 0x3800, 0x7BFF}, 2));  // 1, -2, 0.5, 65504
  z.add("archive/data/2", le_bytes({7, static_cast<uint64_t>(-3), 1ull << 40}, 8), deflate);
  z.add("archive/version", "3\n");
  return z;
}

void expect_flat(const io::NamedTensors& t) {
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, "w");
  EXPECT_EQ(t[1].first, "h");
  EXPECT_EQ(t[2].first, "n");
  EXPECT_EQ(t[0].second.dtype(), DType::Float32);
  EXPECT_EQ(t[1].second.dtype(), DType::Float16);
  EXPECT_EQ(t[2].second.dtype(), DType::Int64);
  kt::expect_values(t[0].second, {2, 3}, {1, 2, 3, 4, 5, 6.5});
  kt::expect_values(t[1].second, {4}, {1, -2, 0.5, 65504});
  EXPECT_EQ(t[2].second.to_vector<int64_t>(), (std::vector<int64_t>{7, -3, int64_t{1} << 40}));
}

TEST_F(TorchFileTest, FlatOrderedDictOfFloat32Float16Int64) {
  const std::string path = write("flat.pth", flat_archive().bytes());
  io::TorchFile f = io::read_torch_file(path);
  expect_flat(f.tensors);
  EXPECT_TRUE(f.other.empty());
  expect_flat(io::load_torch_file(path));
}

TEST_F(TorchFileTest, Zip64AndDeflatedEntries) {
  expect_flat(io::load_torch_file(write("z64.pth", flat_archive(/*zip64=*/true).bytes())));
  expect_flat(io::load_torch_file(write("deflate.pth", flat_archive(false, /*deflate=*/true).bytes())));
  expect_flat(io::load_torch_file(write("both.pth", flat_archive(true, true).bytes())));
}

TEST_F(TorchFileTest, CompressedDeflateEntry) {
  // 16 float32 (i % 5) compressed by Python's zlib (level 9, raw deflate, fixed Huffman codes with matches).
  const std::string compressed("\x63\x60\x00\x81\x06\x7b\x20\xe1\x00\x44\x40\xdc\xe0\xc0\x40\x82\x18\x00", 18);
  std::vector<float> values;
  for (int i = 0; i < 16; ++i) values.push_back(static_cast<float>(i % 5));
  Pickle p;
  p.proto().op('}').str("v").tensor("FloatStorage", "0", 16, 0, {4, 4}, {4, 1}).op('s').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", float_bytes(values), true);
  z.entries.back().compressed = compressed;
  auto t = io::load_torch_file(write("zlib.pth", z.bytes()));
  ASSERT_EQ(t.size(), 1u);
  kt::expect_values(t[0].second, {4, 4}, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0});
  // The same stream cut short is corrupt, not a crash.
  z.entries.back().compressed = compressed.substr(0, 9);
  const std::string cut = write("zlib_cut.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(cut); }, {"zlib_cut.pth", "archive/data/0"});
}

TEST_F(TorchFileTest, AnyArchiveFolderName) {
  ZipFile z = flat_archive();
  for (auto& e : z.entries) e.name = "resnet18-f37072fd/" + e.name.substr(8);
  expect_flat(io::load_torch_file(write("named.pth", z.bytes())));
}

TEST_F(TorchFileTest, NonContiguousViewKeepsSizeStrideAndOffset) {
  // storage 0..11; t = as_strided(size (2, 3), stride (1, 2), offset 1): t[i][j] = 1 + i + 2 j.
  Pickle p;
  p.proto().op('}').put().str("t").tensor("FloatStorage", "0", 12, 1, {2, 3}, {1, 2}).op('s').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", float_bytes({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  auto t = io::load_torch_file(write("view.pth", z.bytes()));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.strides(), (Strides{1, 2}));
  kt::expect_values(t[0].second, {2, 3}, {1, 3, 5, 2, 4, 6});
}

TEST_F(TorchFileTest, TensorsSharingAStorageShareMemory) {
  // "a" = storage[0:4], "b" = storage[2:6] viewed (2, 2); the second persistent id reuses memoized parts.
  Pickle p;
  p.proto().op('}').put().mark();
  p.str("a").tensor("FloatStorage", "0", 6, 0, {4}, {1});
  p.str("b").tensor("FloatStorage", "0", 6, 2, {2, 2}, {2, 1});
  p.op('u').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", float_bytes({10, 11, 12, 13, 14, 15}));
  auto t = io::load_torch_file(write("shared.pth", z.bytes()));
  ASSERT_EQ(t.size(), 2u);
  kt::expect_values(t[0].second, {4}, {10, 11, 12, 13});
  kt::expect_values(t[1].second, {2, 2}, {12, 13, 14, 15});
  EXPECT_TRUE(t[0].second.is_alias_of(t[1].second));
  t[0].second.fill_(0);  // the overlap (elements 2, 3) changes in b too
  kt::expect_values(t[1].second, {2, 2}, {0, 0, 14, 15});
}

TEST_F(TorchFileTest, NestedCheckpointFlattensWithDottedKeys) {
  // {"model": {"w": t0}, "epoch": 3, "opt": {"lr": 0.1, "state": {0: t1}}, "name": "x", "flag": True,
  //  "none": None, "list": [t0 again, 5]}
  Pickle p;
  p.proto().op('}').put().mark();
  p.str("model").ordered_dict().str("w").tensor("FloatStorage", "0", 2, 0, {2}, {1}).op('s');
  p.str("epoch").integer(3);
  p.str("opt").op('}').mark().str("lr").binfloat(0.1).str("state").op('}').integer(0);
  p.tensor("DoubleStorage", "1", 1, 0, {}, {}).op('s').op('u');
  p.str("name").short_str("x").str("flag").op('\x88').str("none").op('N');
  p.str("list").op(']').mark().tensor("FloatStorage", "0", 2, 1, {1}, {1}).integer(-5).op('e');
  p.op('u').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", float_bytes({1.5f, -2.5f}));
  const double d = 0.25;
  z.add("archive/data/1", std::string(reinterpret_cast<const char*>(&d), 8));
  io::TorchFile f = io::read_torch_file(write("ckpt.pt", z.bytes()));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].first, "model.w");
  EXPECT_EQ(f.tensors[1].first, "opt.state.0");
  EXPECT_EQ(f.tensors[2].first, "list.0");
  kt::expect_values(f.tensors[0].second, {2}, {1.5, -2.5});
  kt::expect_values(f.tensors[1].second, {}, {0.25});
  EXPECT_EQ(f.tensors[1].second.dtype(), DType::Float64);
  kt::expect_values(f.tensors[2].second, {1}, {-2.5});
  const std::vector<std::pair<std::string, std::string>> other = {
      {"epoch", "3"}, {"opt.lr", "0.1"}, {"name", "'x'"}, {"flag", "True"}, {"none", "None"}, {"list.1", "-5"}};
  EXPECT_EQ(f.other, other);
}

TEST_F(TorchFileTest, ParameterAndRebuildTensorV3OverUntypedStorage) {
  // _rebuild_parameter(_rebuild_tensor_v3(UntypedStorage (bytes), 0, (2,), (1,), False, OrderedDict(),
  // torch.float16), True, OrderedDict())
  Pickle p;
  p.proto().op('}').str("p").global("torch._utils", "_rebuild_parameter").mark();
  p.global("torch._utils", "_rebuild_tensor_v3").mark();
  p.mark().str("storage").global("torch", "UntypedStorage").str("0").str("cuda:0").integer(4).op('t').op('Q');
  p.integer(0).ints({2}).ints({1}).op('\x89').ordered_dict().global("torch", "float16").op('t').op('R');
  p.op('\x88').ordered_dict().op('t').op('R').op('s').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", le_bytes({0x4000, 0xBC00}, 2));  // 2, -1
  auto t = io::load_torch_file(write("v3.pth", z.bytes()));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.dtype(), DType::Float16);
  kt::expect_values(t[0].second, {2}, {2, -1});
}

// ---------------------------------------------------------------- bad input

TEST_F(TorchFileTest, MissingGarbageAndTruncatedFiles) {
  kt::expect_error([&] { io::load_torch_file((dir_ / "nope.pth").string()); }, {"nope.pth", "no such file"});
  const std::string garbage = write("garbage.pth", std::string(100, 'x'));
  kt::expect_error([&] { io::load_torch_file(garbage); }, {"garbage.pth", "not a zip archive"});
  const std::string full = flat_archive().bytes();
  const std::string cut = write("cut.pth", full.substr(0, full.size() / 2));
  kt::expect_error([&] { io::load_torch_file(cut); }, {"cut.pth", "not a zip archive"});
  const std::string empty = write("empty.pth", "");
  kt::expect_error([&] { io::load_torch_file(empty); }, {"empty.pth", "too short"});
}

TEST_F(TorchFileTest, LegacyFormatIsRefusedWithAdvice) {
  const std::string p = write("old.pth", std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8", 12));
  kt::expect_error([&] { io::load_torch_file(p); }, {"old.pth", "legacy format", "torch.save"});
}

TEST_F(TorchFileTest, BadCentralDirectoryOffsets) {
  const std::string good = flat_archive().bytes();
  const size_t end = good.size() - 22;  // the end-of-central-directory record (no comment)
  std::string bad = good;
  std::string off;
  test_io::put_le(off, good.size() + 100, 4);
  bad.replace(end + 16, 4, off);  // the central directory's offset, past the end
  const std::string p1 = write("cd.pth", bad);
  kt::expect_error([&] { io::load_torch_file(p1); }, {"cd.pth", "central directory"});

  // An entry's local header offset past the end of the file.
  bad = good;
  const uint32_t cd_offset = static_cast<uint8_t>(good[end + 16]) | (static_cast<uint8_t>(good[end + 17]) << 8) |
                             (static_cast<uint8_t>(good[end + 18]) << 16);
  off.clear();
  test_io::put_le(off, 0x7FFFFFF0u, 4);
  bad.replace(cd_offset + 42, 4, off);
  const std::string p2 = write("entry.pth", bad);
  kt::expect_error([&] { io::load_torch_file(p2); }, {"entry.pth", "beyond the end of the file"});

  // The entry count larger than the directory can hold.
  bad = good;
  bad[end + 10] = '\x7f';
  bad[end + 8] = '\x7f';
  const std::string p3 = write("count.pth", bad);
  kt::expect_error([&] { io::load_torch_file(p3); }, {"count.pth", "entries"});
}

TEST_F(TorchFileTest, CorruptDataFailsItsCrc) {
  std::string bytes = flat_archive().bytes();
  const size_t at = bytes.find(float_bytes({1, 2, 3, 4, 5, 6.5f}));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x10;
  const std::string p = write("crc.pth", bytes);
  kt::expect_error([&] { io::load_torch_file(p); }, {"crc.pth", "CRC-32", "archive/data/0"});
}

TEST_F(TorchFileTest, DisallowedGlobalIsNeverCalled) {
  // The classic exploit: os.system("echo pwned") via REDUCE.
  Pickle p;
  p.proto().global("os", "system").str("echo pwned").op('\x85').op('R').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  const std::string path = write("evil.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(path); },
                   {"evil.pth", "unsupported pickled object os.system", "never runs pickled code"});
  // A module class in a full-model pickle (torch.save(model)).
  Pickle q;
  q.proto().global("torchvision.models.resnet", "ResNet").stop();
  ZipFile z2;
  z2.add("archive/data.pkl", q.b);
  const std::string path2 = write("model.pth", z2.bytes());
  kt::expect_error([&] { io::load_torch_file(path2); }, {"model.pth", "torchvision.models.resnet.ResNet"});
}

TEST_F(TorchFileTest, MissingStorageEntry) {
  Pickle p;
  p.proto().op('}').str("w").tensor("FloatStorage", "7", 2, 0, {2}, {1}).op('s').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  z.add("archive/data/0", float_bytes({1, 2}));
  const std::string path = write("missing.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(path); }, {"missing.pth", "storage '7' is missing", "archive/data/7"});
}

TEST_F(TorchFileTest, StorageTooSmallForTheTensor) {
  auto file = [&](const std::string& name, int64_t numel, int64_t offset, std::vector<int64_t> size,
                  std::vector<int64_t> stride, int64_t stored) {
    Pickle p;
    p.proto().op('}').str("w").tensor("FloatStorage", "0", numel, offset, size, stride).op('s').stop();
    ZipFile z;
    z.add("archive/data.pkl", p.b);
    z.add("archive/data/0", float_bytes(std::vector<float>(static_cast<size_t>(stored), 1.0f)));
    return write(name, z.bytes());
  };
  const std::string a = file("size.pth", 4, 0, {5}, {1}, 4);
  kt::expect_error([&] { io::load_torch_file(a); }, {"size.pth", "reaches past its storage", "(4 elements)"});
  const std::string b = file("stride.pth", 6, 0, {2, 3}, {4, 1}, 6);
  kt::expect_error([&] { io::load_torch_file(b); }, {"stride.pth", "reaches past its storage"});
  const std::string c = file("offset.pth", 6, 3, {2, 2}, {2, 1}, 6);
  kt::expect_error([&] { io::load_torch_file(c); }, {"offset.pth", "reaches past its storage"});
  const std::string d = file("huge.pth", 6, 0, {int64_t{1} << 62, 4}, {4, 1}, 6);
  kt::expect_error([&] { io::load_torch_file(d); }, {"huge.pth", "reaches past its storage"});
  // The pickle claims more elements than the entry holds.
  const std::string e = file("entry.pth", 8, 0, {2}, {1}, 2);
  kt::expect_error([&] { io::load_torch_file(e); }, {"entry.pth", "should hold 8 elements"});
}

TEST_F(TorchFileTest, BigEndianAndTruncatedPickle) {
  ZipFile z = flat_archive();
  z.entries[1].data = "big";
  const std::string p = write("big.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(p); }, {"big.pth", "big-endian", "little-endian"});
  ZipFile t = flat_archive();
  t.entries[0].data = t.entries[0].data.substr(0, 40);
  const std::string q = write("trunc.pth", t.bytes());
  kt::expect_error([&] { io::load_torch_file(q); }, {"trunc.pth", "archive/data.pkl", "bad pickle"});
}

TEST_F(TorchFileTest, CyclicAndDeeplyNestedPicklesAreRefusedWithoutCrashing) {
  // A list that holds itself (through the memo), under a dict.
  Pickle p;
  p.proto().op('}').str("x").op(']').put().get(0).op('a').op('s').stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b);
  const std::string cyclic = write("cyclic.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(cyclic); }, {"cyclic.pth", "more than 100 levels"});
  // 200000 nested lists: neither reading, refusing nor freeing them may recurse that deep.
  Pickle q;
  q.proto();
  for (int i = 0; i < 200000; ++i) q.op(']');
  for (int i = 1; i < 200000; ++i) q.op('a');
  q.stop();
  ZipFile z2;
  z2.add("archive/data.pkl", q.b);
  const std::string deep = write("deep.pth", z2.bytes());
  kt::expect_error([&] { io::load_torch_file(deep); }, {"deep.pth", "more than 100 levels"});
}

TEST_F(TorchFileTest, TorchScriptArchiveIsNamedAsSuch) {
  ZipFile z;
  z.add("model/code/__torch__.py", "def forward(self): pass\n");
  z.add("model/constants.pkl", "\x80\x02).");
  const std::string p = write("scripted.pt", z.bytes());
  kt::expect_error([&] { io::load_torch_file(p); }, {"scripted.pt", "TorchScript"});
}

}  // namespace
}  // namespace kiln
