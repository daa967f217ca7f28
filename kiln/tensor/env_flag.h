// kiln/tensor/env_flag.h — on/off switches read from the environment (KILN_MATMUL_TUNING, KILN_CUDA_ALLOC_DEBUG, ...).
//
//   const bool timing = kiln::env_flag("KILN_MATMUL_TUNING", true);
//
// Every such switch of kiln reads its value the same way, case-insensitively: 1, true, on or yes turn it on; 0, false,
// off or no turn it off; unset or empty keeps the default. Any other value keeps the default too, and says so once on
// standard error (naming the variable, the value and the spellings it takes), so that a mistyped switch is not
// silently ignored.
#pragma once

#include <optional>
#include <string_view>

namespace kiln {

// What `value` says as a switch: true or false for the spellings above, nullopt for anything else (empty included).
std::optional<bool> parse_flag(std::string_view value);

// The switch `name` in the environment, or `default_value` where it is unset, empty or not understood (the last with
// one warning on standard error per variable and value). Reads the environment on every call: callers cache it.
bool env_flag(const char* name, bool default_value);

}  // namespace kiln
