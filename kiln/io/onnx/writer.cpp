// kiln/io/onnx/writer.cpp — a Graph as ONNX's protobuf (ModelProto), written atomically, with external data for
// models past protobuf's 2 GB limit; and single tensors as TensorProto files.
#include <cerrno>
#include <cstdio>  // std::rename
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/io/checkpoint_internal.h"  // temporary_path, fsync_path
#include "kiln/io/onnx/graph.h"
#include "kiln/tensor/error.h"
#include "kiln/version.h"

#if KILN_HAS_ONNX
#include "kiln_onnx/onnx.pb.h"  // generated from ONNX's onnx.proto, package kiln_onnx (cmake/kiln_onnx.cmake)
#endif

namespace kiln::io::onnx {

#if KILN_HAS_ONNX
namespace {

namespace fs = std::filesystem;

// ONNX's IR version for opset 17.
constexpr int64_t kIrVersion = 8;
// Initializers of at least this many bytes go to the external data file when the model needs one.
constexpr int64_t kExternalMinBytes = 1024;

int64_t byte_size(const Tensor& t) { return t.numel() * static_cast<int64_t>(element_size(t.dtype())); }

// Fills dims, type and name; the data is the caller's.
void fill_header(kiln_onnx::TensorProto& p, const std::string& name, const Tensor& t) {
  p.set_name(name);
  p.set_data_type(onnx_type(t.dtype(), "the tensor " + name));
  for (int64_t d : t.shape()) p.add_dims(d);
}

// raw_data is little-endian, as kiln's tensors are in memory on every machine kiln runs on.
void fill_tensor(kiln_onnx::TensorProto& p, const std::string& name, const Tensor& t) {
  fill_header(p, name, t);
  p.set_raw_data(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(byte_size(t)));
}

void fill_attr(kiln_onnx::AttributeProto& a, const std::string& name, const AttrValue& value) {
  a.set_name(name);
  if (const auto* i = std::get_if<int64_t>(&value)) {
    a.set_type(kiln_onnx::AttributeProto::INT);
    a.set_i(*i);
  } else if (const auto* f = std::get_if<float>(&value)) {
    a.set_type(kiln_onnx::AttributeProto::FLOAT);
    a.set_f(*f);
  } else if (const auto* is = std::get_if<std::vector<int64_t>>(&value)) {
    a.set_type(kiln_onnx::AttributeProto::INTS);
    for (int64_t v : *is) a.add_ints(v);
  } else if (const auto* fs_ = std::get_if<std::vector<float>>(&value)) {
    a.set_type(kiln_onnx::AttributeProto::FLOATS);
    for (float v : *fs_) a.add_floats(v);
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    a.set_type(kiln_onnx::AttributeProto::STRING);
    a.set_s(*s);
  } else {
    a.set_type(kiln_onnx::AttributeProto::TENSOR);
    fill_tensor(*a.mutable_t(), name, std::get<Tensor>(value));
  }
}

void fill_value_info(kiln_onnx::ValueInfoProto& v, const ValueInfo& info) {
  v.set_name(info.name);
  auto* tensor_type = v.mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(onnx_type(info.dtype, "the graph's value " + info.name));
  auto* shape = tensor_type->mutable_shape();
  for (const Dim& d : info.dims) {
    auto* dim = shape->add_dim();
    if (const auto* size = std::get_if<int64_t>(&d)) {
      dim->set_dim_value(*size);
    } else {
      dim->set_dim_param(std::get<std::string>(d));
    }
  }
}

// Serializes `message` to `path` through a temporary file beside it, renamed into place.
template <typename Message>
void write_message_atomically(const Message& message, const std::string& path, const std::string& what) {
  const std::string tmp = detail::temporary_path(path);
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      KILN_CHECK(out.good(), "export_onnx: cannot write ", what, " ", path, " (", std::strerror(errno),
                 "); check that its folder exists and is writable");
      KILN_CHECK(message.SerializeToOstream(&out), "export_onnx: protobuf could not serialize ", what, " ", path);
      out.close();
      KILN_CHECK(!out.fail(), "export_onnx: writing ", what, " ", path, " failed (", std::strerror(errno),
                 "); is the disk full?");
    }
    detail::fsync_path(tmp, false, path);
    KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "export_onnx: cannot rename ", tmp, " to ", path, " (",
               std::strerror(errno), ")");
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace

int64_t write_model(const Graph& graph, const std::string& path, int64_t external_threshold,
                    const std::string& producer_version) {
  const fs::path target(path);
  KILN_CHECK(!target.filename().empty() && target.filename() != "." && target.filename() != "..", "export_onnx: '",
             path, "' names a folder; give a file name such as model.onnx");
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  KILN_CHECK(fs::is_directory(folder, ec), "export_onnx: the folder ", folder.string(), " of ", path,
             " does not exist; create it first");

  kiln_onnx::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("kiln");
  model.set_producer_version(producer_version);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  auto* g = model.mutable_graph();
  g->set_name(graph.name);
  for (const Node& n : graph.nodes) {
    auto* node = g->add_node();
    node->set_op_type(n.op_type);
    node->set_name(n.name);
    for (const auto& i : n.inputs) node->add_input(i);
    for (const auto& o : n.outputs) node->add_output(o);
    for (const auto& [name, value] : n.attrs) fill_attr(*node->add_attribute(), name, value);
  }
  for (const ValueInfo& v : graph.inputs) fill_value_info(*g->add_input(), v);
  for (const ValueInfo& v : graph.outputs) fill_value_info(*g->add_output(), v);

  int64_t total = 0;
  for (const auto& [name, t] : graph.initializers) total += byte_size(t);
  const bool external = total > external_threshold;
  const std::string data_name = target.filename().string() + ".data";
  const std::string data_path = (folder / data_name).string();
  const std::string data_tmp = detail::temporary_path(data_path);
  int64_t written = 0;
  try {
    std::ofstream data;
    if (external) {
      data.open(data_tmp, std::ios::binary | std::ios::trunc);
      KILN_CHECK(data.good(), "export_onnx: cannot write the external data file ", data_path, " (",
                 std::strerror(errno), ")");
    }
    int64_t offset = 0;
    for (const auto& [name, t] : graph.initializers) {
      auto* p = g->add_initializer();
      const int64_t bytes = byte_size(t);
      if (!external || bytes < kExternalMinBytes) {
        fill_tensor(*p, name, t);
        continue;
      }
      fill_header(*p, name, t);
      p->set_data_location(kiln_onnx::TensorProto::EXTERNAL);
      auto add_entry = [&](const std::string& key, const std::string& value) {
        auto* e = p->add_external_data();
        e->set_key(key);
        e->set_value(value);
      };
      add_entry("location", data_name);
      add_entry("offset", std::to_string(offset));
      add_entry("length", std::to_string(bytes));
      data.write(static_cast<const char*>(t.data_ptr()), bytes);
      KILN_CHECK(data.good(), "export_onnx: writing ", data_path, " failed (", std::strerror(errno),
                 "); is the disk full?");
      // The next tensor starts on a 4096-byte boundary, so a runtime can map each one.
      const int64_t end = offset + bytes, aligned = (end + 4095) / 4096 * 4096;
      for (int64_t i = end; i < aligned; ++i) data.put('\0');
      offset = aligned;
    }
    if (external) {
      data.close();
      KILN_CHECK(!data.fail(), "export_onnx: writing ", data_path, " failed; is the disk full?");
      detail::fsync_path(data_tmp, false, data_path);
      KILN_CHECK(std::rename(data_tmp.c_str(), data_path.c_str()) == 0, "export_onnx: cannot rename ", data_tmp, " to ",
                 data_path, " (", std::strerror(errno), ")");
      written += offset;
    }
    KILN_CHECK(model.ByteSizeLong() < (size_t{1} << 31), "export_onnx: the model is ", model.ByteSizeLong(),
               " bytes without its large initializers, past protobuf's 2 GB limit");
    write_message_atomically(model, path, "the model");
  } catch (...) {
    fs::remove(data_tmp, ec);
    if (external) fs::remove(data_path, ec);
    throw;
  }
  detail::fsync_path(folder.string(), true, path);
  return written + static_cast<int64_t>(model.ByteSizeLong());
}

void write_tensor_file(const Tensor& t, const std::string& path) {
  kiln_onnx::TensorProto p;
  const Tensor cpu = t.detach().to(Device::cpu()).contiguous();
  fill_tensor(p, std::filesystem::path(path).stem().string(), cpu);
  write_message_atomically(p, path, "the tensor file");
}

#else  // built without ONNX support

namespace {
[[noreturn]] void no_onnx() {
  KILN_FAIL(
      "export_onnx: this kiln was built without ONNX support (KILN_ONNX=OFF, or protobuf missing when it was "
      "configured); run scripts/setup.sh (it installs libprotobuf-dev, protobuf-compiler and onnx.proto) and "
      "rebuild with -DKILN_ONNX=ON");
}
}  // namespace

int64_t write_model(const Graph&, const std::string&, int64_t, const std::string&) { no_onnx(); }
void write_tensor_file(const Tensor&, const std::string&) { no_onnx(); }

#endif

}  // namespace kiln::io::onnx
