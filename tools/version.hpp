// leasehold CLI: the build's version, as CMake's project() gives it (LEASEHOLD_VERSION).
#pragma once

#ifndef LEASEHOLD_VERSION
#error "LEASEHOLD_VERSION must be defined by the build (leasehold_version() in CMakeLists.txt)"
#endif

#include <nlohmann/json.hpp>

#include <string>

namespace leasehold::cli {
inline constexpr const char* kVersionText = LEASEHOLD_VERSION;
/// "leasehold 0.1.0 (wire 4, control socket 1, shm layout 3.0)": `version`, `--version`.
std::string version_text();
/// {"version": "0.1.0", "wire_version": 4, "control_version": 1, "shm_layout": "3.0"}.
nlohmann::json version_json();
}  // namespace leasehold::cli
