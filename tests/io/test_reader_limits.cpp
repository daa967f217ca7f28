// Limits of the weight readers (DESIGN.md rule 11), on files written here by hand:
// - a safetensors header of 200,000 entries parses in linear time (nlohmann's callback parser, used before,
//   rescanned the whole object after each entry: 40,000 entries took 13.5 s, 200,000 more than a minute);
// - the unpickler's memory budget: a pickle of NONE opcodes, or a data.pkl larger than the budget, is refused
//   naming the file before it takes the memory (a 49 KB file once took 8.8 GB before it was refused);
// - a deflated zip entry that claims more bytes than deflate can produce is refused before it is allocated;
// - a genuine entry that the host has no memory for gives an OutOfMemoryError naming the file (std::bad_alloc
//   escaped before).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <zlib.h>  // a real deflate stream, as torch.save writes

#include "io/torch_file_writer.h"
#include "kiln/io/pickle_reader.h"
#include "kiln/io/safetensors.h"
#include "kiln/io/torch_file.h"
#include "support/test_support.h"

namespace kiln {
namespace {

namespace kt = kiln::testing;
using test_io::Pickle;
using test_io::ZipFile;

// A safetensors file of n empty F32 tensors ("t0".."t<n-1>", shape [0], data_offsets [0, 0]).
std::vector<uint8_t> many_entries(int n) {
  std::string json = "{";
  for (int i = 0; i < n; ++i) {
    json += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  }
  json += "}";
  std::vector<uint8_t> out(8 + json.size());
  for (int k = 0; k < 8; ++k) out[k] = static_cast<uint8_t>(json.size() >> (8 * k));
  std::copy(json.begin(), json.end(), out.begin() + 8);
  return out;
}

// The fastest of `runs` parses, in seconds: the minimum is what the machine's load disturbs least.
double parse_seconds(const std::vector<uint8_t>& file, size_t expected_entries, int runs) {
  double best = 1e9;
  for (int run = 0; run < runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const io::SafetensorsHeader h = io::parse_safetensors_header(file.data(), file.size(), "many.safetensors");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(h.entries.size(), expected_entries);
    best = std::min(best, s);
  }
  return best;
}

TEST(ReaderLimits, SafetensorsHeaderParsesInLinearTime) {
  const std::vector<uint8_t> small = many_entries(20'000), large = many_entries(200'000);
  const double t_small = parse_seconds(small, 20'000, 3), t_large = parse_seconds(large, 200'000, 2);
  // Linear (n log n with the key sets) gives a ratio near 10-13; quadratic gives 100. The bound sits between,
  // far from both, and the absolute bound only catches a quadratic parse (more than 60 s).
  EXPECT_LT(t_large, 30 * std::max(t_small, 1e-3)) << "20k entries: " << t_small << " s, 200k: " << t_large << " s";
  EXPECT_LT(t_large, 60.0);  // 1.7 s in a Release build on 2 cores; sanitizer builds are slower
  // The checks that the first pass makes still hold: a duplicate key among many is found and named.
  std::vector<uint8_t> dup = many_entries(1000);
  const std::string extra = R"(,"t500":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  dup.pop_back();  // the closing brace
  dup.insert(dup.end(), extra.begin(), extra.end());
  const uint64_t n = dup.size() - 8;
  for (int k = 0; k < 8; ++k) dup[k] = static_cast<uint8_t>(n >> (8 * k));
  kt::expect_error([&] { io::parse_safetensors_header(dup.data(), dup.size(), "dup.safetensors"); },
                   {"dup.safetensors", "duplicate key 't500'"});
}

class UnpickleBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = io::max_unpickle_bytes();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kiln_reader_limits_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    io::set_max_unpickle_bytes(saved_);
    std::filesystem::remove_all(dir_);
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    test_io::write_file(p, bytes);
    return p;
  }
  uint64_t saved_ = 0;
  std::filesystem::path dir_;
};

io::PickleHooks no_hooks() {
  io::PickleHooks h;
  h.find_global = [](const std::string& m, const std::string& n) -> io::PyRef { KILN_FAIL("no global ", m, n); };
  h.reduce = [](const io::PyRef&, const io::PyRef&) -> io::PyRef { KILN_FAIL("no reduce"); };
  h.persistent_load = [](const io::PyRef&) -> io::PyRef { KILN_FAIL("no persistent_load"); };
  return h;
}

TEST_F(UnpickleBudgetTest, DefaultBudget) {
  EXPECT_EQ(io::kDefaultMaxUnpickleBytes, uint64_t{2} << 30);
  EXPECT_EQ(io::max_unpickle_bytes(), io::kDefaultMaxUnpickleBytes);
  kt::expect_error([] { io::set_max_unpickle_bytes(0); }, {"set_max_unpickle_bytes", "positive"});
}

TEST_F(UnpickleBudgetTest, NoneOpcodesAreRefusedAtTheBudget) {
  // 100,000 NONEs: 100 KB of pickle that builds 100,000 objects (~20 MB). A budget of 1 MB stops it early.
  Pickle p;
  p.proto();
  p.b.append(100'000, 'N');
  p.stop();
  kt::expect_error([&] { io::unpickle(p.b, no_hooks(), "nones.pkl", 1 << 20); },
                   {"nones.pkl: the pickle builds more than 1048576 bytes of values", "set_max_unpickle_bytes"});
  // The same opcodes under a budget they fit in reach the STOP check (100,000 values left on the stack).
  kt::expect_error([&] { io::unpickle(p.b, no_hooks(), "nones.pkl", 1 << 30); }, {"STOP with 100000 values"});
  // Memo reads push no new objects but still take stack slots: 'N', BINPUT 0, then BINGET 0 many times.
  Pickle g;
  g.proto().op('N').op('q').op('\0');
  for (int i = 0; i < 100'000; ++i) g.op('h').op('\0');
  g.stop();
  kt::expect_error([&] { io::unpickle(g.b, no_hooks(), "gets.pkl", 1 << 20); }, {"gets.pkl", "more than 1048576"});
  // A real state dict's pickle fits the default budget with room to spare: 1,000 tensors' worth of dict items.
  Pickle d;
  d.proto().op('}').mark();
  for (int i = 0; i < 1000; ++i) d.str("layer" + std::to_string(i) + ".weight").integer(i);
  d.op('u').stop();
  const io::Unpickled u = io::unpickle(d.b, no_hooks(), "dict.pkl");
  EXPECT_EQ(u.root->dict.size(), 1000u);
  EXPECT_EQ(u.root->dict[999].second->i, 999);
}

TEST_F(UnpickleBudgetTest, TorchFileNamesTheFileWhenTheBudgetRefuses) {
  Pickle p;
  p.proto();
  p.b.append(200'000, 'N');
  p.stop();
  ZipFile z;
  z.add("archive/data.pkl", p.b, /*deflate=*/true);
  const std::string path = write("nones.pth", z.bytes());
  io::set_max_unpickle_bytes(4 << 20);
  kt::expect_error([&] { io::load_torch_file(path); },
                   {path + ": archive/data.pkl: the pickle builds more than 4194304 bytes"});
  // A data.pkl larger than the budget is refused before it is inflated.
  io::set_max_unpickle_bytes(100'000);
  kt::expect_error([&] { io::load_torch_file(path); },
                   {path, "archive/data.pkl is 200003 bytes uncompressed", "budget of 100000"});
}

TEST_F(UnpickleBudgetTest, DeflatedEntryClaimingMoreThanDeflateCanMakeIsRefused) {
  // The central directory says 10 MB; the stream holds 1 byte in 6 (deflate makes at most 1032 bytes per byte).
  ZipFile z;
  z.add("archive/data.pkl", std::string(10'000'000, 'N'), /*deflate=*/true);
  z.entries.back().compressed = ZipFile::deflate_stored("N");
  const std::string path = write("claims.pth", z.bytes());
  kt::expect_error([&] { io::load_torch_file(path); },
                   {path, "deflated entry 'archive/data.pkl' claims 10000000 bytes from 6 compressed bytes"});
}

// `data` as a raw deflate stream (zlib, level 9, no zlib header), the form of a torch.save zip entry.
std::string raw_deflate(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST_F(UnpickleBudgetTest, OutOfHostMemoryForAnEntryNamesTheFile) {
  if (kt::kSanitizerBuild) GTEST_SKIP() << "an address-space limit cannot stand for out-of-memory under a sanitizer";
  // 64 MiB of NONE opcodes deflate to about 64 KB: within deflate's ratio and the unpickle budget, so the reader
  // allocates the whole entry, which fails when the process may grow by only 16 MiB.
  const std::string pickle(64 << 20, 'N');
  ZipFile z;
  z.add("archive/data.pkl", pickle, /*deflate=*/true);
  z.entries.back().compressed = raw_deflate(pickle);
  ASSERT_LT(z.entries.back().compressed.size(), 1u << 20);
  const std::string path = write("large.pth", z.bytes());
  const kt::ThrownUnderMemoryLimit got = kt::run_under_memory_limit([&] { io::load_torch_file(path); }, 16 << 20);
  EXPECT_EQ(got.kind, "OutOfMemoryError") << got.message;
  EXPECT_NE(got.message.find(path), std::string::npos) << got.message;
  EXPECT_NE(got.message.find("out of host memory"), std::string::npos) << got.message;
}

}  // namespace
}  // namespace kiln
