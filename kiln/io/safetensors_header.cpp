// kiln/io/safetensors_header.cpp — parsing and checking a safetensors header. Uses only kiln's headers (no
// compiled kiln code), so the fuzz target (fuzz/fuzz_safetensors.cpp) can build it alone with sanitizers.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/tensor/error.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");

namespace {

using Json = nlohmann::json;

// safetensors' dtype strings that kiln holds, and those it does not (named so the message can say so).
struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr DTypeName kKnownDTypes[] = {
    {"F64", DType::Float64},
    {"F32", DType::Float32},
    {"F16", DType::Float16},
    {"BF16", DType::BFloat16},
    {"I64", DType::Int64},
    {"I32", DType::Int32},
    {"U8", DType::UInt8},
    {"BOOL", DType::Bool},
    {"F8_E4M3", DType::Float8_e4m3fn},
    {"F8_E5M2", DType::Float8_e5m2},
};
constexpr std::string_view kUnheldDTypes[] = {"I8",      "I16",     "U16", "U32", "U64",         "F8_E8M0",
                                              "F6_E2M3", "F6_E3M2", "F4",  "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

std::string quoted(const std::string& s) { return "'" + s + "'"; }

DType parse_dtype(const std::string& text, const std::string& tensor, const std::string& name) {
  for (const auto& known : kKnownDTypes) {
    if (text == known.name) return known.dtype;
  }
  const bool unheld = std::find(std::begin(kUnheldDTypes), std::end(kUnheldDTypes), text) != std::end(kUnheldDTypes);
  KILN_CHECK(!unheld, "safetensors file '", name, "': tensor ", quoted(tensor), " has dtype ", text,
             ", which kiln cannot hold (kiln reads F64, F32, F16, BF16, I64, I32, U8 and BOOL); convert the file's "
             "tensor to one of those first (e.g. in Python: t.to(torch.int32) before safetensors.torch.save_file)");
  KILN_FAIL("safetensors file '", name, "': tensor ", quoted(tensor), " has the unknown dtype '", text,
            "' (kiln reads F64, F32, F16, BF16, I64, I32, U8 and BOOL); the file is corrupt or not a safetensors file");
}

// A non-negative JSON integer that fits in `limit`, or an error naming what it is.
uint64_t parse_count(const Json& v, uint64_t limit, const std::string& what, const std::string& name) {
  KILN_CHECK(!(v.is_number_integer() && !v.is_number_unsigned()), "safetensors file '", name, "': ", what,
             " is negative (", v.dump(), ")");
  KILN_CHECK(v.is_number_unsigned(), "safetensors file '", name, "': ", what, " must be a non-negative integer, got ",
             v.dump());
  const uint64_t n = v.get<uint64_t>();
  KILN_CHECK(n <= limit, "safetensors file '", name, "': ", what, " is too large (", n, ")");
  return n;
}

SafetensorsEntry parse_entry(const std::string& tensor, const Json& v, uint64_t data_size, const std::string& name) {
  const std::string where = "tensor " + quoted(tensor);
  KILN_CHECK(v.is_object(), "safetensors file '", name, "': ", where,
             " must be a JSON object {dtype, shape, data_offsets}, got ", v.type_name());
  for (const auto& [key, _] : v.items()) {
    KILN_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", "safetensors file '", name, "': ", where,
               " has the unexpected field '", key, "' (expected exactly dtype, shape and data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    KILN_CHECK(v.contains(key), "safetensors file '", name, "': ", where, " has no '", key, "' field");
  }
  const Json& dtype = v["dtype"];
  const Json& shape = v["shape"];
  const Json& offsets = v["data_offsets"];
  KILN_CHECK(dtype.is_string(), "safetensors file '", name, "': ", where, ": dtype must be a string, got ",
             dtype.type_name());
  KILN_CHECK(shape.is_array(), "safetensors file '", name, "': ", where, ": shape must be an array, got ",
             shape.type_name());
  KILN_CHECK(offsets.is_array() && offsets.size() == 2, "safetensors file '", name, "': ", where,
             ": data_offsets must be an array [begin, end], got ", offsets.dump());

  SafetensorsEntry e;
  e.name = tensor;
  e.dtype = parse_dtype(dtype.get<std::string>(), tensor, name);
  // Elements, and the product of the sizes with 0 counted as 1: kiln's strides are products of sizes, so even
  // an empty tensor's sizes must multiply without overflow.
  constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1, span = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t d = parse_count(shape[i], kInt64Max, where + ": shape[" + std::to_string(i) + "]", name);
    numel *= d;  // cannot overflow: numel <= span
    KILN_CHECK(!__builtin_mul_overflow(span, std::max<uint64_t>(d, 1), &span) && span <= kInt64Max,
               "safetensors file '", name, "': ", where, ": shape ", shape.dump(), " has too many elements");
    e.shape.push_back(static_cast<int64_t>(d));
  }
  uint64_t nbytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(element_size(e.dtype)), &nbytes),
             "safetensors file '", name, "': ", where, ": shape ", shape.dump(), " has too many bytes");
  e.begin = parse_count(offsets[0], std::numeric_limits<uint64_t>::max(), where + ": data_offsets[0]", name);
  e.end = parse_count(offsets[1], std::numeric_limits<uint64_t>::max(), where + ": data_offsets[1]", name);
  KILN_CHECK(e.begin <= e.end, "safetensors file '", name, "': ", where, ": data_offsets [", e.begin, ", ", e.end,
             "] end before they begin");
  KILN_CHECK(e.end <= data_size, "safetensors file '", name, "': ", where, ": data_offsets [", e.begin, ", ", e.end,
             "] are out of bounds: the data section has ", data_size, " bytes (a truncated file?)");
  KILN_CHECK(e.end - e.begin == nbytes, "safetensors file '", name, "': ", where, ": size mismatch: data_offsets [",
             e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes but dtype ", dtype.get<std::string>(),
             " x shape ", shape.dump(), " needs ", nbytes);
  return e;
}

std::map<std::string, std::string> parse_metadata(const Json& v, const std::string& name) {
  KILN_CHECK(v.is_object(), "safetensors file '", name, "': __metadata__ must be a JSON object of strings, got ",
             v.type_name());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : v.items()) {
    KILN_CHECK(value.is_string(), "safetensors file '", name, "': __metadata__['", key, "'] must be a string, got ",
               value.type_name());
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

// A first pass over the header's JSON (nlohmann's SAX interface) that builds nothing: it refuses the first
// duplicate key (JSON parsers keep the last one silently) and any nesting deeper than a header has ({name:
// {dtype, shape: [...], data_offsets: [...]}}: depth 3). Linear in the header's size (a set per open object),
// unlike nlohmann's callback parser, which rescans the enclosing object at the end of every nested one: a header
// of 200,000 tensors took minutes with it.
class HeaderChecker {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  std::string why;  // set when the header is refused

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) {
    if (!open()) return false;
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) {
    if (keys_.back().insert(k).second) return true;
    why = "duplicate key '" + k + "'";
    return false;
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return open(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const Json::exception& e) {
    why = std::string("the header is not valid JSON (") + e.what() + "): corrupt or not a safetensors file";
    return false;
  }

 private:
  bool open() {
    if (depth_++ <= 3) return true;
    why = "it nests deeper than a safetensors header does";
    return false;
  }
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // per open object
};

}  // namespace

uint64_t safetensors_header_length(const uint8_t* first8, uint64_t file_size, const std::string& name) {
  KILN_CHECK(file_size >= 8, "safetensors file '", name, "' is too short (", file_size,
             " bytes; a safetensors file starts with an 8-byte header length): truncated or not a safetensors file");
  uint64_t n = 0;
  std::memcpy(&n, first8, 8);  // little-endian
  KILN_CHECK(n <= file_size - 8, "safetensors file '", name, "': the header length (", n,
             " bytes) is larger than the rest of the file (", file_size - 8,
             " bytes): truncated or not a safetensors file");
  KILN_CHECK(n <= kMaxSafetensorsHeaderBytes, "safetensors file '", name, "': the header length (", n,
             " bytes) is over the ", kMaxSafetensorsHeaderBytes, "-byte limit: corrupt or not a safetensors file");
  return n;
}

SafetensorsHeader parse_safetensors_json(const uint8_t* json, size_t json_size, uint64_t file_size,
                                         const std::string& name) {
  KILN_CHECK(file_size >= 8 && json_size <= file_size - 8, "safetensors file '", name,
             "': the header is larger than the file");
  // Two linear passes: the checker refuses duplicate keys and deep nesting, then the DOM is built.
  HeaderChecker checker;
  if (!Json::sax_parse(json, json + json_size, &checker)) {
    KILN_FAIL("safetensors file '", name, "': bad JSON header: ", checker.why);
  }
  Json header;
  try {
    header = Json::parse(json, json + json_size);
  } catch (const Json::exception& e) {
    KILN_FAIL("safetensors file '", name, "': the header is not valid JSON (", e.what(),
              "): corrupt or not a safetensors file");
  }
  KILN_CHECK(header.is_object(), "safetensors file '", name, "': the header must be a JSON object, got ",
             header.type_name());

  SafetensorsHeader out;
  out.data_start = 8 + json_size;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      out.metadata = parse_metadata(value, name);
    } else {
      out.entries.push_back(parse_entry(key, value, data_size, name));
    }
  }
  // The spec: the tensors cover the data section exactly, without gaps or overlaps.
  std::sort(out.entries.begin(), out.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : out.entries) {
    KILN_CHECK(e.begin >= covered, "safetensors file '", name, "': tensors '", previous ? previous->name : "",
               "' and '", e.name, "' overlap (data_offsets [", previous ? previous->begin : 0, ", ", covered, "] and [",
               e.begin, ", ", e.end, "])");
    KILN_CHECK(e.begin == covered, "safetensors file '", name, "': gap in the data section: bytes [", covered, ", ",
               e.begin, ") belong to no tensor (before '", e.name, "')");
    covered = e.end;
    previous = &e;
  }
  KILN_CHECK(covered == data_size, "safetensors file '", name, "': gap in the data section: bytes [", covered, ", ",
             data_size, ") after the last tensor belong to no tensor");
  return out;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& name) {
  const uint64_t n = safetensors_header_length(data, size, name);
  return parse_safetensors_json(data + 8, static_cast<size_t>(n), size, name);
}

namespace detail {
void check_safetensors_bools(const uint8_t* bytes, size_t n, const SafetensorsEntry& entry, const std::string& name) {
  for (size_t i = 0; i < n; ++i) {
    KILN_CHECK(bytes[i] <= 1, "safetensors file '", name, "': BOOL tensor '", entry.name, "' holds the byte ",
               static_cast<int>(bytes[i]), " at element ", i, " (a bool is 0 or 1): corrupt file");
  }
}
}  // namespace detail

}  // namespace kiln::io
