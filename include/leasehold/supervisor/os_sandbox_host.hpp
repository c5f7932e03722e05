// leasehold/supervisor: OsSandboxHost, the production SandboxHost (ports.hpp).
//
// One sandbox is a cgroup leaf (when the tree is delegated), a child created with clone3 that
// stops at its gate before its exec (spawn.hpp: prepare_sandbox / release_sandbox), a pipe its
// stdout and stderr write into (copied by the OutputPump into a file of its own, 0600, under
// the log directory), its own token channel (a memfd only it inherits, read-only), and a
// oneshot poll on its pidfd that reports its exit. The sandbox sees LEASEHOLD_SHM (the table's
// read-only descriptor), LEASEHOLD_TOKENS, LEASEHOLD_SLOT, LEASEHOLD_EPOCH, LEASEHOLD_SANDBOX and
// LEASEHOLD_NAME. Single-threaded: the io thread.
#pragma once

#include "leasehold/io/loop.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/output_pump.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/supervisor/spawn.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

namespace leasehold {

struct OsSandboxHostConfig {
  EventLoop* loop = nullptr;        ///< where the pidfd polls run; outlives the host
  CgroupTree* cgroups = nullptr;    ///< a leaf per sandbox when its mode is cgroup_v2_delegated
  OutputPump* output = nullptr;     ///< copies each sandbox's pipe into its log file
  std::string log_dir;              ///< <log_dir>/<sandbox id>.log
  std::uint64_t log_max_bytes = 0;  ///< per sandbox (--sandbox-log-max-bytes)
  int table_ro_fd = -1;             ///< the shm table, read-only, inherited; -1: by its path
  std::string shm_path;             ///< LEASEHOLD_SHM when table_ro_fd < 0
  int stdin_fd = -1;                ///< /dev/null
  const BwrapConfig* bwrap = nullptr;
  /// The isolation of a sandbox in `slot` started by a caller; empty: no isolation.
  std::function<Isolation(uid_t caller_uid, gid_t caller_gid, std::uint32_t slot)> isolation;
  /// Ablation (LEASEHOLD_ABLATE=arm-after-exec): the command execs at once, no gate.
  bool exec_at_once = false;
  /// Test hook (LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS): the calling thread sleeps this long once
  /// the child exists, at the start of release() (ablated: at the end of create(), after the
  /// exec), between `event=test_stall` and `event=test_stall_end` log lines. 0: never.
  std::uint64_t test_stall_ms = 0;
  /// One log event ("event=... k=v") per call.
  std::function<void(const std::string& event)> log;
};

class OsSandboxHost final : public SandboxHost {
 public:
  OsSandboxHost(OsSandboxHostConfig config, ExitHandler on_exit);
  OsSandboxHost(const OsSandboxHost&) = delete;
  OsSandboxHost& operator=(const OsSandboxHost&) = delete;

  std::optional<PortError> open_tokens(const SandboxId& id) override;
  shm::TableErrc publish_token(const SandboxId& id, Epoch epoch, std::span<const std::uint8_t> token) override;
  void clear_tokens(const SandboxId& id) override;
  /// Errors: exec_failed (the command or its directory: ENOENT, EACCES, ENOEXEC, ENOTDIR,
  /// ELOOP), killswitch (killed at its gate: ESRCH), internal (the leaf, the log file, the
  /// pipe, the token channel, clone3, ...).
  std::optional<PortError> create(const SandboxSpec& spec, HostedSandbox& out) override;
  KillTarget kill_target(const SandboxId& id) const override;
  /// Errors as create()'s. The deadline is checked against CLOCK_BOOTTIME right before the
  /// exec is let go (a stall of the calling thread since the arm counts).
  std::optional<PortError> release(const SandboxId& id, std::uint64_t exec_by_ns) override;
  void abandon(const SandboxId& id) override;
  void kill(const SandboxId& id, std::uint64_t now_ns) override;
  void terminate(const SandboxId& id) override;
  ReapedSandbox reap(const SandboxId& id) override;
  bool leaf_emptied(const SandboxId& id) override;
  void forget(const SandboxId& id) override;
  /// The daemon's end (after the rt thread stopped): kills every sandbox still here, waits for
  /// and reaps each, removes its leaf, and forgets them all.
  void stop_all(std::uint64_t now_ns);

 private:
  struct Record {
    std::optional<shm::TokenChannel> tokens;
    CgroupLeaf leaf;
    SandboxProcess process;  // owns the pidfd
    std::optional<PreparedSandbox> prepared;  // at its gate until release() or abandon()
    PollId exit_poll;
  };
  Record* find(const SandboxId& id);
  const Record* find(const SandboxId& id) const;
  void log(const std::string& event) const;
  void test_stall() const;
  OsSandboxHostConfig cfg_;
  ExitHandler on_exit_;
  std::unordered_map<SandboxId, Record> records_;
};

}  // namespace leasehold
