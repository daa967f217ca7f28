// tools/doctor/report.h — the facts and findings as a readable report, or as one JSON document.
//
//   std::cout << doctor::text_report(facts, findings, code);   // sections: system, build, libraries, GPUs,
//   std::cout << doctor::json_report(facts, findings, code);   //   checks, diagnosis
#pragma once

#include <string>
#include <vector>

#include "diagnose.h"
#include "facts.h"

namespace kiln::doctor {

std::string text_report(const Facts& facts, const std::vector<Finding>& findings, int exit_code);
std::string json_report(const Facts& facts, const std::vector<Finding>& findings, int exit_code);

}  // namespace kiln::doctor
