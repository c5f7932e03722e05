// `leasehold version`: the build's version and wire/layout versions.
#include "tools/command.hpp"

#include <cstdio>

namespace leasehold::cli {
namespace {
const Command kVersion([](CLI::App& app, int* exit_code) {
  auto* sub = app.add_subcommand("version", "Print the leasehold version");
  sub->callback([exit_code] {
    std::printf("leasehold %s\n", LEASEHOLD_VERSION);
    *exit_code = kOk;
  });
});
}  // namespace
}  // namespace leasehold::cli
