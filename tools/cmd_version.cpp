// `leasehold version` (and `leasehold --version`): the build's version and the versions of the
// formats it speaks: the wire protocol (docs/PROTOCOL.md), the supervisor's control socket and
// the shm table's layout.
#include "tools/cmd_common.hpp"
#include "tools/version.hpp"

#include "leasehold/shm/layout.hpp"
#include "leasehold/supervisor/control.hpp"

#include <cstdio>
#include <memory>

namespace leasehold::cli {

nlohmann::json version_json() {
  return {{"version", kVersionText},
          {"wire_version", wire::kVersion},
          {"control_version", kControlProtocolVersion},
          {"shm_layout", std::to_string(shm::kLayoutMajor) + "." + std::to_string(shm::kLayoutMinor)}};
}

std::string version_text() {
  return std::string("leasehold ") + kVersionText + " (wire " + std::to_string(wire::kVersion) + ", control socket " +
         std::to_string(kControlProtocolVersion) + ", shm layout " + std::to_string(shm::kLayoutMajor) + "." +
         std::to_string(shm::kLayoutMinor) + ")";
}

namespace {
const Command kVersion([](CLI::App& app, int* exit_code) {
  auto json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("version", "Print the leasehold version and its wire, control-socket and shm layout versions");
  sub->add_flag("--json", *json, "print {\"version\", \"wire_version\", \"control_version\", \"shm_layout\"}");
  sub->callback([exit_code, json] {
    if (*json) std::printf("%s\n", version_json().dump().c_str());
    else std::printf("%s\n", version_text().c_str());
    *exit_code = kOk;
  });
});
}  // namespace
}  // namespace leasehold::cli
