// leasehold/harness: the sandbox a pause-probe trial runs (`leasehold pause-probe-sandbox`): it
// polls check_deadline on its own shm slot and logs every change of the answer with CLOCK_BOOTTIME
// times, the log pause::parse_sandbox_log() reads (pause/README.md "One trial").
//
// Log lines, one write(2) each (a kill can only tear the last one, which the parser drops):
//   start t=NS slot=N epoch=E pid=P     valid t=NS vu=NS     refused t=NS last=NS vu=NS
//   late t=NS vu=NS (an accepted check after valid_until)     exit t=NS accepts=N refusals=N late=N
//   # error: WHY
// Beside the log, LOG.last holds the latest accepted check (an int64 in a shared mapping, one
// relaxed store per check) so that a SIGKILL does not lose it (pause::close_open_interval).
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstdint>
#include <string>

namespace leasehold::harness {

/// How the probe sandbox runs.
struct PauseSandboxOptions {
  std::string log;                   ///< its log (truncated at the start); LOG.last beside it
  std::uint64_t poll_us = 1000;      ///< pause between two checks (µs, at most 999999)
  std::uint64_t lifetime_ms = 600'000;  ///< exits after this long (ms)
};

/// Runs the probe sandbox in this process until its lifetime ends. It needs the environment of a
/// named sandbox (LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_EPOCH). Errors, each but the first
/// also logged as "# error: ...": invalid_argument "cannot open LOG: REASON" (nothing logged) or
/// the environment is incomplete; corrupt (the shm table cannot be opened: its message);
/// not_found (the slot is out of range).
Status run_pause_sandbox(const PauseSandboxOptions& options);

}  // namespace leasehold::harness
