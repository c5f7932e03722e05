// `leasehold`: the operator and runtime CLI (DESIGN.md "Programs").
#include "tools/command.hpp"

#include <cstdio>
#include <exception>

namespace leasehold::cli {
std::vector<Registrar>& registry() {
  static std::vector<Registrar> r;
  return r;
}
}  // namespace leasehold::cli

int main(int argc, char** argv) {
  using namespace leasehold::cli;
  CLI::App app{"leasehold: named, fenced leases for sandboxes"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok; 1 check failed / answer is no; 2 usage or malformed argument;\n"
      "3 refused (by lockd or the supervisor: held, stale epoch, table full, busy, ...); 4 not found\n"
      "(unknown name, sandbox, slot or command); 5 lockd unreachable; 6 shm table missing, corrupt or\n"
      "writer dead; 7 no supervisor answering on the control socket; 70 internal error.\n"
      "Environment: LEASEHOLD_LOCKD, LEASEHOLD_KEY_FILE, LEASEHOLD_SUPERVISOR (defaults for\n"
      "--lockd, --key-file, --supervisor); LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_EPOCH (check).");
  int exit_code = kOk;
  for (auto& reg : registry()) reg(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold: internal error: %s\n", e.what());
    return kInternal;
  }
  return exit_code;
}
