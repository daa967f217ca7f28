// kiln/io/checkpoint_parts.cpp — each checkpoint part to and from its HDF5 group: written, staged (read and
// checked against the objects, nothing changed) and applied.
#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "kiln/io/checkpoint_internal.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/error.h"

namespace kiln::io::detail {

namespace {

std::function<void(const std::string&)>& fault_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

void written(const std::string& part) {
  if (fault_hook()) fault_hook()(part);
}

constexpr const char* kStatePrefix = "state.";
constexpr const char* kTypeAttr = "type";  // the optimizer's or scheduler's class name

// A part the caller asked for must be in the file.
void require_group(const H5File& f, const std::string& group, const std::string& part) {
  KILN_CHECK(f.has_group(group), f.path(), ": the checkpoint has no ", part, " (group ", group,
             "); it was saved without it: load without that part, or use a checkpoint that has it");
}

// A typed part (optimizer, scheduler) must be in the file and saved from the same class as the one it is loaded
// into: `what` names the part in messages ("optimizer", "LR scheduler"), `kind` what to build ("scheduler").
void require_typed_group(const H5File& f, const std::string& group, const std::string& what, const std::string& kind,
                         const std::string& expected_type) {
  require_group(f, group, kind);
  const std::string type = f.has_attr(group, kTypeAttr) ? f.attr_string(group, kTypeAttr) : "";
  KILN_CHECK(type == expected_type, f.path(), ": the checkpoint's ", what, " is ", type.empty() ? "of no type" : type,
             ", this one is ", expected_type, "; build the same ", kind, " as the one that was saved");
}

// Every attribute of `object` as a number (all must be numeric), but `skip`.
std::map<std::string, double> numeric_attrs(const H5File& f, const std::string& object, const std::string& skip = "") {
  std::map<std::string, double> values;
  for (const std::string& name : f.attr_names(object)) {
    if (name != skip) values[name] = f.attr_double(object, name);
  }
  return values;
}

std::string cuda_group(int i) { return "/rng/cuda" + std::to_string(i); }

void write_generator(H5File& f, const std::string& group, const GeneratorState& s) {
  f.create_group(group);
  f.set_attr(group, "seed", s.seed);
  f.set_attr(group, "offset", s.offset);
}

GeneratorState read_generator(const H5File& f, const std::string& group) {
  return {f.attr_uint(group, "seed"), f.attr_uint(group, "offset")};
}

// Lists up to 10 names, then how many more.
std::string list_names(const std::vector<std::string>& names) {
  std::ostringstream s;
  for (size_t i = 0; i < names.size() && i < 10; ++i) s << (i ? ", " : "") << names[i];
  if (names.size() > 10) s << " (and " << names.size() - 10 << " more)";
  return s.str();
}

nn::StateDict stage_model(const H5File& f, nn::Module& model) {
  require_group(f, "/model", "model");
  const std::vector<std::string> stored = f.children("/model");
  const std::set<std::string> stored_set(stored.begin(), stored.end());
  const nn::StateDict expected = model.state_dict();
  std::set<std::string> expected_names;
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : expected) {
    expected_names.insert(name);
    if (!stored_set.count(name)) {
      missing.push_back(name);
      continue;
    }
    const TensorInfo info = f.tensor_info("/model", name);
    if (info.shape != t.shape() || info.dtype != t.dtype()) {
      std::ostringstream s;
      s << name << " (file: " << dtype_name(info.dtype) << " " << info.shape << ", model: " << dtype_name(t.dtype())
        << " " << t.shape() << ")";
      mismatched.push_back(s.str());
    }
  }
  for (const std::string& name : stored) {
    if (!expected_names.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::ostringstream s;
    s << f.path() << ": the checkpoint's model does not match this model (was it saved from another model?)";
    if (!missing.empty()) s << "; missing in the file: " << list_names(missing);
    if (!unexpected.empty()) s << "; unexpected in the file: " << list_names(unexpected);
    if (!mismatched.empty()) s << "; different shape or dtype: " << list_names(mismatched);
    // FP8 scaling state: the buffers nn::Linear has only once amp::prepare_fp8 (or an FP8 forward) made them.
    const auto is_fp8 = [](const std::string& name) {
      for (const std::string b : {"fp8_amax_history", "fp8_scale", "fp8_scale_inv"}) {
        if (name == b || name.ends_with("." + b)) return true;
      }
      return false;
    };
    if (std::any_of(unexpected.begin(), unexpected.end(), is_fp8)) {
      s << ". The file holds the FP8 scaling state of FP8 Linear layers (fp8_* buffers): call "
           "amp::prepare_fp8(model, recipe, device) (kiln/layers/fp8_linear.h) on this model, with the recipe of the "
           "run that saved it, before loading";
    }
    KILN_FAIL(s.str());
  }
  nn::StateDict out;
  for (const auto& [name, t] : expected) out.emplace_back(name, f.read_tensor("/model", name));
  return out;
}

optim::OptimizerState stage_optimizer(const H5File& f, const optim::Optimizer& opt) {
  require_typed_group(f, "/optimizer", "optimizer", "optimizer", opt.name());
  optim::OptimizerState state;
  state.values = numeric_attrs(f, "/optimizer", kTypeAttr);
  // Group structure: the count and the sizes, before anything is read further.
  size_t groups = 0;
  while (state.values.count("param_groups." + std::to_string(groups) + ".size")) ++groups;
  KILN_CHECK(groups == opt.num_param_groups(), f.path(), ": the checkpoint's optimizer has ", groups,
             " parameter group(s), this one has ", opt.num_param_groups());
  for (size_t g = 0; g < groups; ++g) {
    const double saved = state.values.at("param_groups." + std::to_string(g) + ".size");
    KILN_CHECK(saved == static_cast<double>(opt.params(g).size()), f.path(), ": the checkpoint's parameter group ", g,
               " has ", saved, " parameter(s), this optimizer's has ", opt.params(g).size());
  }
  if (f.has_group("/optimizer/state")) {
    for (const std::string& key : f.children("/optimizer/state")) {
      state.tensors[kStatePrefix + key] = f.read_tensor("/optimizer/state", key);
    }
  }
  return state;
}

optim::SchedulerState stage_scheduler(const H5File& f, const optim::LRScheduler& sched) {
  require_typed_group(f, "/scheduler", "LR scheduler", "scheduler", sched.name());
  return numeric_attrs(f, "/scheduler", kTypeAttr);
}

}  // namespace

void set_save_fault_hook(std::function<void(const std::string& part)> hook) { fault_hook() = std::move(hook); }

void write_parts(H5File& f, const CheckpointParts& parts) {
  if (parts.model != nullptr) {
    f.create_group("/model");
    for (const auto& [name, t] : parts.model->state_dict()) f.write_tensor("/model", name, t);
    written("model");
  }
  if (parts.optimizer != nullptr) {
    const optim::OptimizerState state = parts.optimizer->state_dict();
    f.create_group("/optimizer/state");
    f.set_attr("/optimizer", kTypeAttr, parts.optimizer->name());
    for (const auto& [key, value] : state.values) f.set_attr("/optimizer", key, value);
    for (const auto& [key, t] : state.tensors) {
      KILN_CHECK(key.rfind(kStatePrefix, 0) == 0, f.path(), ": optimizer state key '", key,
                 "' does not start with 'state.'");
      f.write_tensor("/optimizer/state", key.substr(std::string(kStatePrefix).size()), t);
    }
    written("optimizer");
  }
  if (parts.scheduler != nullptr) {
    f.create_group("/scheduler");
    f.set_attr("/scheduler", kTypeAttr, parts.scheduler->name());
    for (const auto& [key, value] : parts.scheduler->state_dict()) f.set_attr("/scheduler", key, value);
    written("scheduler");
  }
  if (parts.scaler != nullptr) {
    f.create_group("/scaler");
    f.set_attr("/scaler", "enabled", static_cast<int64_t>(parts.scaler->is_enabled()));
    for (const auto& [key, value] : parts.scaler->state_dict()) f.set_attr("/scaler", key, value);
    written("scaler");
  }
  if (parts.generators) {
    write_generator(f, "/rng/cpu", default_generator(Device::cpu()).state());
    const int gpus = cuda::device_count();
    f.set_attr("/rng", "cuda_devices", static_cast<int64_t>(gpus));
    for (int i = 0; i < gpus; ++i) write_generator(f, cuda_group(i), default_generator(Device::cuda(i)).state());
    written("rng");
  }
  if (parts.loader != nullptr) {
    f.create_group("/loader");
    f.set_attr("/loader", "epoch", parts.loader->epoch);
    f.set_attr("/loader", "batch", parts.loader->batch);
    written("loader");
  }
  if (parts.metadata != nullptr) {
    f.create_group("/metadata");
    for (const auto& [key, value] : parts.metadata->numbers) f.set_attr("/metadata", key, value);
    for (const auto& [key, value] : parts.metadata->strings) {
      KILN_CHECK(!parts.metadata->numbers.count(key), f.path(), ": metadata key '", key,
                 "' is both a number and a string; use distinct keys");
      f.set_attr("/metadata", key, value);
    }
    written("metadata");
  }
}

StagedParts stage_parts(const H5File& f, const CheckpointParts& parts) {
  StagedParts s;
  if (parts.optimizer != nullptr) s.optimizer = stage_optimizer(f, *parts.optimizer);
  if (parts.scheduler != nullptr) s.scheduler = stage_scheduler(f, *parts.scheduler);
  if (parts.scaler != nullptr) {
    require_group(f, "/scaler", "GradScaler");
    s.scaler = numeric_attrs(f, "/scaler", "enabled");
    KILN_CHECK(!parts.scaler->is_enabled() || !s.scaler.empty(), f.path(),
               ": the checkpoint's GradScaler was disabled (no state), this one is enabled; construct it with "
               "the same options as the one that was saved");
  }
  if (parts.generators) {
    require_group(f, "/rng", "random generator states");
    s.cpu_generator = read_generator(f, "/rng/cpu");
    const int gpus = cuda::device_count();
    for (int i = 0; i < gpus; ++i) {
      KILN_CHECK(f.has_group(cuda_group(i)), f.path(), ": the checkpoint has no generator state for GPU ", i,
                 " (it was saved where fewer GPUs were visible); load with generators = false, or make as many "
                 "GPUs visible as when it was saved");
      s.cuda_generators.push_back(read_generator(f, cuda_group(i)));
    }
  }
  if (parts.loader != nullptr) {
    require_group(f, "/loader", "loader position");
    s.loader = {f.attr_uint("/loader", "epoch"), f.attr_int("/loader", "batch")};
  }
  if (parts.metadata != nullptr) {
    require_group(f, "/metadata", "metadata");
    for (const std::string& key : f.attr_names("/metadata")) {
      if (f.attr_is_string("/metadata", key)) {
        s.metadata.strings[key] = f.attr_string("/metadata", key);
      } else {
        s.metadata.numbers[key] = f.attr_double("/metadata", key);
      }
    }
  }
  // The model last: its tensors are the largest read, after the cheap checks above have passed.
  if (parts.model != nullptr) s.model = stage_model(f, *parts.model);
  return s;
}

void apply_parts(StagedParts& staged, const CheckpointParts& parts) {
  // The parts that validate themselves (and may still refuse a state): restored as they were if one refuses.
  optim::OptimizerState old_optimizer;
  optim::SchedulerState old_scheduler;
  std::map<std::string, double> old_scaler;
  int applied = 0;
  try {
    if (parts.optimizer != nullptr) {
      old_optimizer = parts.optimizer->state_dict();
      for (auto& [key, t] : old_optimizer.tensors) t = t.clone();  // state_dict gives the live tensors
      parts.optimizer->load_state_dict(staged.optimizer);
    }
    applied = 1;
    if (parts.scheduler != nullptr) {
      old_scheduler = parts.scheduler->state_dict();
      parts.scheduler->load_state_dict(staged.scheduler);
    }
    applied = 2;
    if (parts.scaler != nullptr) {
      old_scaler = parts.scaler->state_dict();
      parts.scaler->load_state_dict(staged.scaler);
    }
  } catch (...) {
    if (applied >= 2 && parts.scheduler != nullptr) parts.scheduler->load_state_dict(old_scheduler);
    if (applied >= 1 && parts.optimizer != nullptr) parts.optimizer->load_state_dict(old_optimizer);
    throw;
  }
  // Checked in full while staging: these cannot refuse.
  if (parts.model != nullptr) parts.model->load_state_dict(staged.model, /*strict=*/true);
  if (parts.generators) {
    default_generator(Device::cpu()).set_state(staged.cpu_generator);
    for (size_t i = 0; i < staged.cuda_generators.size(); ++i) {
      default_generator(Device::cuda(static_cast<int>(i))).set_state(staged.cuda_generators[i]);
    }
  }
  if (parts.loader != nullptr) *parts.loader = staged.loader;
  if (parts.metadata != nullptr) *parts.metadata = std::move(staged.metadata);
}

}  // namespace kiln::io::detail
