// leasehold/io: the start-up probe for io_uring.
//
// DESIGN.md "The supervisor": if io_uring is unavailable (seccomp, kernel.io_uring_disabled)
// the daemons exit with a message that says which and how to fix it. The probe is split in
// two so the error mapping can be tested on a machine where io_uring works:
//   gather_probe_facts()  reads the sysctl and asks the kernel (setup, opcode probe, a buffer
//                         ring, a multishot recvmsg, a CLOCK_BOOTTIME timeout);
//   classify_probe(facts) is pure: it turns the facts into a ProbeResult with the cause and fix.
// Kernel versions: multishot recvmsg and provided buffer rings need Linux 6.0; everything else
// the loop uses is older (FAST_POLL 5.7, EXT_ARG 5.11, IORING_TIMEOUT_BOOTTIME 5.15).
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstdint>
#include <string>

namespace leasehold {

/// Why io_uring cannot be used. Stable values (they appear in logs and exit messages).
enum class ProbeFailure : std::uint8_t {
  none = 0,
  disabled_by_sysctl = 1,   ///< kernel.io_uring_disabled = 2 (or = 1 and we are not allowed)
  blocked_eperm = 2,        ///< io_uring_setup -> EPERM with the sysctl at 0: a seccomp filter
  unsupported_enosys = 3,   ///< io_uring_setup -> ENOSYS: kernel without io_uring, or seccomp
  memlock = 4,              ///< io_uring_setup -> ENOMEM: RLIMIT_MEMLOCK too low for the rings
  setup_failed = 5,         ///< io_uring_setup failed with another errno
  opcode_missing = 6,       ///< the opcode probe lacks an operation the loop needs
  feature_missing = 7,      ///< an IORING_FEAT_* bit the loop needs is not set
  buf_ring_missing = 8,     ///< IORING_REGISTER_PBUF_RING rejected (Linux < 5.19)
  multishot_recvmsg_missing = 9,  ///< multishot recvmsg rejected with EINVAL (Linux < 6.0)
};

/// What the kernel said; filled by gather_probe_facts() or by a test.
struct ProbeFacts {
  int io_uring_disabled = -1;    ///< /proc/sys/kernel/io_uring_disabled; -1 = file absent
  int setup_errno = 0;           ///< errno of io_uring_setup (0 = it worked)
  std::uint32_t features = 0;    ///< io_uring_params.features
  std::uint64_t opcodes_missing = 0;  ///< bit i set = required opcode #i of kRequiredOpcodes absent
  int buf_ring_errno = 0;        ///< errno of registering a provided buffer ring (0 = ok)
  int multishot_recvmsg_errno = 0;  ///< errno of a multishot recvmsg (0 = ok)
  int boottime_timeout_errno = 0;   ///< errno of an IORING_TIMEOUT_BOOTTIME timeout (0 = ok)
};

/// The probe's verdict. `message` names the cause and the fix ("" when ok).
struct ProbeResult {
  ProbeFailure failure = ProbeFailure::none;
  int error = 0;                   ///< the errno behind the failure, if any
  std::string message;
  bool boottime_timeouts = false;  ///< IORING_TIMEOUT_BOOTTIME works (else CLOCK_MONOTONIC)
  std::uint32_t features = 0;

  bool ok() const noexcept { return failure == ProbeFailure::none; }
};

/// An opcode the loop submits; its index in required_opcodes() is its bit in
/// ProbeFacts::opcodes_missing.
struct RequiredOpcode {
  std::uint8_t opcode;
  const char* name;
};
/// The opcodes the loop needs; `*count` receives the number of entries (< 64).
const RequiredOpcode* required_opcodes(std::size_t* count) noexcept;

/// IORING_FEAT_* bits the loop needs: NODROP (5.5, no lost completions on CQ overflow),
/// FAST_POLL (5.7, sockets are polled internally instead of punted to workers), EXT_ARG
/// (5.11, wait with a timeout without spending an SQE).
std::uint32_t required_features() noexcept;

/// Reads the sysctl and asks the kernel. Never fails itself: problems land in the facts.
ProbeFacts gather_probe_facts() noexcept;

/// Pure mapping from facts to a verdict with cause and fix (see ProbeFailure).
ProbeResult classify_probe(const ProbeFacts& facts);

/// gather + classify, computed once per process (thread-safe) and cached.
const ProbeResult& probe_io_uring();

/// For tests and the CLI: ok when io_uring is usable, otherwise the probe's message with the
/// code of its failure: permission_denied (the sysctl, a seccomp filter's EPERM), unsupported
/// (no io_uring, a missing opcode, feature, buffer ring or multishot recvmsg), errc_of_errno of
/// the setup errno otherwise (ENOMEM, RLIMIT_MEMLOCK: io_error). A test does
/// `if (const Status s = io_uring_usable(); !s.ok()) GTEST_SKIP() << s.message();`.
Status io_uring_usable();

/// Maps an io_uring_setup errno to a verdict (used by the probe and by EventLoop::create when
/// the loop's own io_uring_setup fails). `io_uring_disabled` as in ProbeFacts.
ProbeResult classify_setup_errno(int setup_errno, int io_uring_disabled);

}  // namespace leasehold
