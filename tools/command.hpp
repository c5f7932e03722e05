// leasehold CLI: subcommand registration.
//
// Each `cmd_*.cpp` in tools/ registers its subcommands with a static `Command` object, so a
// new subcommand is one new file. Exit codes are shared by every subcommand (see ExitCode).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace leasehold::cli {

/// Exit codes of the `leasehold` CLI, documented in `leasehold --help`.
enum ExitCode : int {
  kOk = 0,
  kFailure = 1,          ///< the operation ran and its answer is "no" (e.g. a check failed)
  kUsage = 2,            ///< bad command line or malformed argument (e.g. an invalid name)
  kRefused = 3,          ///< lockd refused (held, stale epoch, ...)
  kNotFound = 4,         ///< unknown name, sandbox or slot
  kUnreachable = 5,      ///< lockd did not answer (directly, or as seen by the supervisor)
  kTableError = 6,       ///< shm table missing, corrupt, or its writer is dead
  kNoSupervisor = 7,     ///< no supervisor listens on the control socket, answers in time, or lets us in
  kInternal = 70,        ///< a bug: please report it
};

/// A subcommand's registration hook: adds itself to the app and sets its callback.
/// The callback stores its exit code in `*exit_code`.
using Registrar = std::function<void(CLI::App& app, int* exit_code)>;

/// The registry; a static `Command` in each cmd_*.cpp appends to it before main runs.
std::vector<Registrar>& registry();

struct Command {
  explicit Command(Registrar r) { registry().push_back(std::move(r)); }
};

}  // namespace leasehold::cli
