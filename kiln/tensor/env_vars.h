// kiln/tensor/env_vars.h — how kiln reads its environment variables (KILN_MATMUL_TUNING, KILN_NUM_THREADS, ...).
//
//   const bool timing = kiln::env_flag("KILN_MATMUL_TUNING", true);
//   const int64_t threads = kiln::env_positive_int("KILN_NUM_THREADS", 8);
//
// On/off switches read their value case-insensitively: 1, true, on or yes turn them on; 0, false, off or no turn them
// off. Counts are whole numbers of at least 1, written in decimal digits. Unset or empty keeps the default. Any other
// value keeps the default too, and says so once on standard error (naming the variable, the value and what it
// takes), so that a mistyped setting is not silently ignored. docs/troubleshooting.md lists every variable.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

// What `value` says as a switch: true or false for the spellings above, nullopt for anything else (empty included).
std::optional<bool> parse_flag(std::string_view value);

// What `value` says as a count: a whole number >= 1 in decimal digits (no sign, no spaces), at most 2^31 - 1;
// nullopt for anything else.
std::optional<int64_t> parse_positive_int(std::string_view value);

// The switch `name` in the environment, or `default_value` where it is unset, empty or not understood (the last with
// one warning on standard error per variable and value). Reads the environment on every call: callers cache it.
bool env_flag(const char* name, bool default_value);

// The count `name` in the environment, or `default_value` where it is unset, empty or not a count (the last with one
// warning on standard error per variable and value). Reads the environment on every call: callers cache it.
int64_t env_positive_int(const char* name, int64_t default_value);

}  // namespace kiln
