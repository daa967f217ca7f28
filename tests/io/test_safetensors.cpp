// Tests of kiln/io/safetensors.h: round trips of every dtype, files written byte by byte here (an independent
// writer), the golden file of tests/golden/make_golden_safetensors.py, and every kind of lying header.

// GCC 12 warns falsely about "literal" + std::string (its bug 105329), used here to build headers; the
// warning is raised inside libstdc++'s operator+, so it is silenced before the includes.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kiln/io/safetensors.h"
#include "support/test_support.h"

namespace kiln::io {
namespace {

namespace fs = std::filesystem;
using kiln::testing::expect_error;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("kiln_st_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file from its JSON header text and data bytes, written here without kiln's writer.
std::vector<uint8_t> st_file(const std::string& json, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + json.size() + data.size());
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : json) out.push_back(static_cast<uint8_t>(c));
  for (uint8_t b : data) out.push_back(b);
  return out;
}
template <typename T>
void append(std::vector<uint8_t>& bytes, std::initializer_list<T> values) {
  for (T v : values) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes.insert(bytes.end(), b, b + sizeof(T));
  }
}
std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.nbytes()};
}
Tensor bits16(const std::vector<uint16_t>& bits, DType dtype, const Shape& shape) {
  return internal::from_blob(bits.data(), shape, dtype);
}

// ---------------------------------------------------------------------------------------- round trips

TEST(SafetensorsRoundTrip, EveryDTypeBitExact) {
  TempDir dir("every_dtype");
  // 16-bit floats by their bits: -0, subnormal, inf, a NaN with a payload, max: nothing may be re-rounded.
  const std::vector<uint16_t> half_bits = {0x8000, 0x0001, 0x7C00, 0x7E01, 0x7BFF, 0x3555};
  const std::vector<uint16_t> bf16_bits = {0x8000, 0x0001, 0x7F80, 0x7FC1, 0x7F7F, 0x3EAB};
  const NamedTensors tensors = {
      {"f64", internal::from_vector<double>({1.0 / 3.0, -2.5e300, 0.0}, {3})},
      {"f32", internal::from_vector<float>({1.5f, -2.0f, 3.25f, 1e-30f, 7.0f, 8.0f}, {2, 3})},
      {"f16", bits16(half_bits, DType::Float16, {2, 3})},
      {"bf16", bits16(bf16_bits, DType::BFloat16, {3, 2})},
      {"i64", internal::from_vector<int64_t>({-(int64_t{1} << 62), 0, 5}, {3})},
      {"i32", internal::from_vector<int32_t>({-7, 2147483647}, {2, 1})},
      {"u8", internal::from_vector<uint8_t>({0, 255, 17}, {3})},
      {"bool", internal::from_vector<uint8_t>({1, 0, 1, 1}, {4}).to(DType::Bool)},
      {"scalar", internal::scalar_tensor(42.5, {.dtype = DType::Float32})},
      {"empty", internal::empty({0, 4}, {.dtype = DType::Float32})},
      {"empty_i64", internal::empty({3, 0}, {.dtype = DType::Int64})},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo ✓"}, {"", "empty key"}};
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, metadata);

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.entries().size(), tensors.size());
  const NamedTensors loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {  // written in the given order, so read back in it
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(loaded[i].first, tensors[i].first);
    EXPECT_EQ(f.entries()[i].name, tensors[i].first);
    EXPECT_EQ(loaded[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(loaded[i].second.shape(), tensors[i].second.shape());
    EXPECT_TRUE(loaded[i].second.is_cpu());
    EXPECT_EQ(tensor_bytes(loaded[i].second), tensor_bytes(tensors[i].second));
  }
  EXPECT_EQ(loaded[8].second.dim(), 0);
  EXPECT_EQ(loaded[8].second.item<float>(), 42.5f);
  std::vector<uint16_t> h(6), b(6);
  std::memcpy(h.data(), loaded[2].second.data_ptr(), 12);
  std::memcpy(b.data(), loaded[3].second.data_ptr(), 12);
  EXPECT_EQ(h, half_bits);
  EXPECT_EQ(b, bf16_bits);
  EXPECT_EQ(loaded[7].second.to(DType::UInt8).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 1}));

  // Nothing is left beside the file (the temporary file was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(SafetensorsRoundTrip, LayoutIsTheSpecs) {
  TempDir dir("layout");
  const std::string path = dir.file("x.safetensors");
  // A non-contiguous view is stored contiguous.
  const Tensor t = internal::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).t();
  save_safetensors(path, {{"t", t}, {"a", internal::from_vector<int32_t>({9}, {1})}});
  const std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // data 8-byte aligned, the header padded with spaces
  const std::string json(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(n));
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.find_last_not_of(' '), json.find_last_of('}'));
  EXPECT_NE(json.find(R"("t":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("a":{"dtype":"I32","shape":[1],"data_offsets":[24,28]})"), std::string::npos) << json;
  std::vector<uint8_t> data;
  append<float>(data, {1, 4, 2, 5, 3, 6});
  append<int32_t>(data, {9});
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin() + 8 + static_cast<ptrdiff_t>(n), bytes.end()), data);
  // Saving again replaces the file.
  save_safetensors(path, {{"b", internal::from_vector<uint8_t>({7}, {1})}});
  EXPECT_EQ(load_safetensors(path).at(0).first, "b");
}

// ------------------------------------------------------------------------------ files written by hand

TEST(SafetensorsHandWritten, ReadsEveryField) {
  TempDir dir("by_hand");
  // JSON keys deliberately not in data order; "b" comes first in the data. No padding, spaces in the JSON.
  const std::string json =
      R"({ "a": {"shape": [2], "dtype": "F64", "data_offsets": [8, 24]}, )"
      R"("__metadata__": {"k": "v"}, "b": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}, )"
      R"("c": {"dtype": "BOOL", "shape": [3], "data_offsets": [24, 27]}, )"
      R"("d": {"dtype": "U8", "shape": [1, 1], "data_offsets": [27, 28]}})";
  std::vector<uint8_t> data;
  append<int32_t>(data, {-3, 70000});
  append<double>(data, {0.125, -6.5});
  data.insert(data.end(), {1, 0, 1, 200});
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, st_file(json, data));

  SafetensorsFile f(path);
  ASSERT_EQ(f.entries().size(), 4u);
  EXPECT_EQ(f.entries()[0].name, "b");  // data-offset order
  EXPECT_EQ(f.entries()[1].name, "a");
  EXPECT_EQ(f.entries()[1].begin, 8u);
  EXPECT_EQ(f.entries()[1].end, 24u);
  EXPECT_EQ(f.data_start(), 8 + json.size());
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_TRUE(f.contains("c"));
  EXPECT_FALSE(f.contains("z"));
  const Tensor a = f.read("a");
  EXPECT_EQ(a.dtype(), DType::Float64);
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{0.125, -6.5}));
  EXPECT_EQ(f.read("b").to_vector<int64_t>(), (std::vector<int64_t>{-3, 70000}));
  const Tensor c = f.read("c");
  EXPECT_EQ(c.dtype(), DType::Bool);
  EXPECT_EQ(c.to(DType::UInt8).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  const Tensor d = f.read("d");
  EXPECT_EQ(d.shape(), (Shape{1, 1}));
  EXPECT_EQ(d.to_vector<int64_t>(), (std::vector<int64_t>{200}));
  expect_error([&] { f.read("z"); }, {"hand.safetensors", "no tensor named 'z'"});

  // The same bytes from memory.
  const std::vector<uint8_t> bytes = st_file(json, data);
  const NamedTensors m = load_safetensors(bytes.data(), bytes.size(), "in-memory");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[1].first, "a");
  EXPECT_EQ(m[1].second.to_vector<double>(), (std::vector<double>{0.125, -6.5}));
}

TEST(SafetensorsGolden, ReadsTheReferenceFile) {
  // tests/golden/make_golden_safetensors.py; the values below are those its docstring lists.
  const std::string path = std::string(KILN_GOLDEN_DIR) + "/sample.safetensors";
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"source", "kiln golden"}}));
  const NamedTensors all = f.read_all();
  ASSERT_EQ(all.size(), 6u);
  const std::vector<std::string> names = {"weight", "half", "bf", "ids", "scalar", "empty"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(all[i].first, names[i]);

  const Tensor w = f.read("weight");
  EXPECT_EQ(w.dtype(), DType::Float32);
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.0f, -1.5f, 2.25f, 3.140625f, -100.0f, 0.001f}));

  const Tensor h = f.read("half");
  EXPECT_EQ(h.dtype(), DType::Float16);
  std::vector<uint16_t> hb(4);
  std::memcpy(hb.data(), h.data_ptr(), 8);
  EXPECT_EQ(hb, (std::vector<uint16_t>{0x3C00, 0xC100, 0x7BFF, 0x3555}));
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1.0f, -2.5f, 65504.0f, 0.333251953125f}));

  const Tensor b = f.read("bf");
  EXPECT_EQ(b.dtype(), DType::BFloat16);
  EXPECT_EQ(b.shape(), (Shape{2, 2}));
  std::vector<uint16_t> bb(4);
  std::memcpy(bb.data(), b.data_ptr(), 8);
  EXPECT_EQ(bb, (std::vector<uint16_t>{0x3F80, 0xC040, 0x3EAB, 0x4049}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1.0f, -3.0f, 0.333984375f, 3.140625f}));

  const Tensor ids = f.read("ids");
  EXPECT_EQ(ids.dtype(), DType::Int64);
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, (int64_t{1} << 40) + 7}));

  const Tensor s = f.read("scalar");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 42.0f);
  EXPECT_EQ(f.read("empty").shape(), (Shape{0, 3}));
}

// ------------------------------------------------------------------------------------------ bad input

struct BadCase {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<std::string> fragments;
};

std::vector<uint8_t> f32_data(size_t n) { return std::vector<uint8_t>(4 * n, 0); }
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases;
  const std::string ok = "{" + entry("w", "F32", "[2]", 0, 8) + "}";
  std::vector<uint8_t> good = st_file(ok, f32_data(2));
  cases.push_back({"empty", {}, {"too short", "0 bytes"}});
  cases.push_back({"short_length", {1, 0, 0}, {"too short"}});
  cases.push_back({"truncated_data", std::vector<uint8_t>(good.begin(), good.end() - 3), {"out of bounds"}});
  cases.push_back({"truncated_header", std::vector<uint8_t>(good.begin(), good.begin() + 20), {"header length"}});
  std::vector<uint8_t> huge = good;
  huge[7] = 0x7f;
  cases.push_back({"length_too_large", huge, {"header length", "larger than the rest of the file"}});
  cases.push_back({"garbage_json", st_file("{\"w\": [1, 2", {}), {"not valid JSON"}});
  cases.push_back({"garbage_bytes", st_file("\x01\x02\xff\xfe", {}), {"not valid JSON"}});
  cases.push_back({"bad_utf8", st_file("{\"\xff\xfe\":1}", {}), {"not valid JSON"}});
  cases.push_back({"not_object", st_file("[1,2,3]", {}), {"must be a JSON object", "array"}});
  cases.push_back({"entry_not_object", st_file("{\"w\":5}", {}), {"tensor 'w'", "must be a JSON object"}});
  cases.push_back({"missing_field", st_file(R"({"w":{"dtype":"F32","shape":[0]}})", {}), {"'data_offsets'"}});
  cases.push_back({"extra_field",
                   st_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":1}})", {}),
                   {"unexpected field 'x'"}});
  cases.push_back({"dtype_not_string",
                   st_file(R"({"w":{"dtype":3,"shape":[0],"data_offsets":[0,0]}})", {}),
                   {"dtype must be a string"}});
  cases.push_back({"shape_not_array",
                   st_file(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", f32_data(2)),
                   {"shape must be an array"}});
  cases.push_back({"offsets_three",
                   st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", f32_data(2)),
                   {"data_offsets must be an array [begin, end]"}});
  cases.push_back({"offset_float",
                   st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", f32_data(2)),
                   {"data_offsets[1] must be a non-negative integer"}});
  cases.push_back({"out_of_bounds",
                   st_file("{" + entry("w", "F32", "[4]", 0, 16) + "}", f32_data(2)),
                   {"tensor 'w'", "out of bounds"}});
  cases.push_back({"end_before_begin",
                   st_file("{" + entry("w", "F32", "[0]", 8, 0) + "}", f32_data(2)),
                   {"end before they begin"}});
  cases.push_back(
      {"overlap",
       st_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", f32_data(3)),
       {"'a' and 'b' overlap"}});
  cases.push_back(
      {"gap",
       st_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}", f32_data(3)),
       {"gap in the data section", "[4, 8)"}});
  cases.push_back({"trailing_bytes", st_file(ok, f32_data(3)), {"gap in the data section", "[8, 12)"}});
  cases.push_back({"size_mismatch",
                   st_file("{" + entry("w", "F32", "[3]", 0, 8) + "}", f32_data(2)),
                   {"size mismatch", "needs 12"}});
  cases.push_back(
      {"negative_dim", st_file("{" + entry("w", "F32", "[-2]", 0, 8) + "}", f32_data(2)), {"shape[0] is negative"}});
  cases.push_back({"overflow_dims",
                   st_file("{" + entry("w", "F32", "[4294967296,4294967296]", 0, 0) + "}", {}),
                   {"too many elements"}});
  cases.push_back({"overflow_bytes",
                   st_file("{" + entry("w", "F64", "[3000000000000000000]", 0, 0) + "}", {}),
                   {"too many bytes"}});
  cases.push_back({"huge_dim",
                   st_file("{" + entry("w", "F32", "[18446744073709551615]", 0, 0) + "}", {}),
                   {"shape[0] is too large"}});
  cases.push_back({"zero_times_overflow",
                   st_file("{" + entry("w", "F32", "[0,4294967296,4294967296]", 0, 0) + "}", {}),
                   {"too many elements"}});
  cases.push_back({"unknown_dtype",
                   st_file("{" + entry("w", "F17", "[2]", 0, 8) + "}", f32_data(2)),
                   {"tensor 'w'", "unknown dtype 'F17'"}});
  cases.push_back({"unheld_dtype",
                   st_file("{" + entry("w", "I16", "[4]", 0, 8) + "}", f32_data(2)),
                   {"tensor 'w'", "dtype I16", "kiln cannot hold"}});
  cases.push_back(
      {"duplicate_key",
       st_file("{" + entry("w", "F32", "[1]", 0, 4) + "," + entry("w", "F32", "[1]", 4, 8) + "}", f32_data(2)),
       {"duplicate key 'w'"}});
  cases.push_back({"duplicate_field",
                   st_file(R"({"w":{"dtype":"F32","dtype":"F32","shape":[0],"data_offsets":[0,0]}})", {}),
                   {"duplicate key 'dtype'"}});
  cases.push_back(
      {"metadata_not_object", st_file(R"({"__metadata__":[1]})", {}), {"__metadata__ must be a JSON object"}});
  cases.push_back({"metadata_value_number",
                   st_file(R"({"__metadata__":{"epoch":3}})", {}),
                   {"__metadata__['epoch'] must be a string"}});
  cases.push_back({"too_deep", st_file(R"({"w":{"shape":[[[[1]]]]}})", {}), {"nests deeper"}});
  cases.push_back(
      {"bad_bool", st_file("{" + entry("b", "BOOL", "[2]", 0, 2) + "}", {1, 7}), {"BOOL tensor 'b'", "byte 7"}});
  return cases;
}

TEST(SafetensorsBadInput, EveryLieIsAnErrorNamingTheFile) {
  TempDir dir("bad");
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name + ".safetensors");
    write_bytes(path, c.bytes);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(c.name + ".safetensors");
    expect_error([&] { load_safetensors(path); }, fragments);
    // The same from memory, with the name given.
    fragments.back() = "mem:" + c.name;
    expect_error([&] { load_safetensors(c.bytes.data(), c.bytes.size(), "mem:" + c.name); }, fragments);
  }
}

TEST(SafetensorsBadInput, MissingFileAndFolder) {
  TempDir dir("missing");
  expect_error([&] { SafetensorsFile f(dir.file("nope.safetensors")); }, {"nope.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile f(dir.path().string()); }, {"not a regular file"});
}

TEST(SafetensorsSave, ErrorsNameThePath) {
  TempDir dir("save_errors");
  const Tensor x = internal::from_vector<float>({1}, {1});
  const std::string missing = dir.file("no/such/folder/out.safetensors");
  expect_error([&] { save_safetensors(missing, {{"x", x}}); }, {missing, "does not exist"});
  const std::string path = dir.file("out.safetensors");
  expect_error([&] { save_safetensors(path, {{"x", x}, {"x", x}}); }, {path, "'x' is used by two tensors"});
  expect_error([&] { save_safetensors(path, {{"u", Tensor()}}); }, {path, "'u' is undefined"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", x}}); }, {path, "reserved"});
  expect_error([&] { save_safetensors(path, {{"bad\xff", x}}); }, {path, "not valid UTF-8"});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);  // no temporary left
  if (::geteuid() != 0) {                                                                     // root writes anywhere
    const fs::path locked = dir.path() / "locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    const std::string p = (locked / "out.safetensors").string();
    expect_error([&] { save_safetensors(p, {{"x", x}}); }, {p, "cannot create"});
    fs::permissions(locked, fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace kiln::io
