// leasehold/harness: the network between two workers and lockd - each worker in its own
// network namespace linked to lockd by a veth pair (on a free /24 of 10.213.0.0/16, subnet.hpp),
// or all on loopback - and how to cut one worker off lockd and reconnect it (host-side link
// down, or nftables/iptables drop rules for the supervisor's UDP port). Needs root for
// everything but loopback without a cut. Errors are returned as a Status whose message names the
// command that failed.
#pragma once

#include "leasehold/lease/result.hpp"

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace leasehold::harness {

/// The link between one worker and lockd, and how to cut it.
struct Network {
  enum class Mode { netns, loopback };
  Mode mode = Mode::loopback;
  std::string why;                 ///< why this mode (e.g. why namespaces were not used)
  std::string filter;              ///< loopback: "nft" or "iptables" ("" = none available)
  std::string netns[2];            ///< netns names (netns mode)
  std::string host_if[2];          ///< host-side veth names
  std::string host_ip[2];          ///< lockd's address as worker i sees it
  std::string worker_ip[2];        ///< worker i's address
  std::string tag;                 ///< unique per run: names the namespaces, links, filter table
  std::vector<std::string> filter_rules;  ///< iptables rules added (for removal)
  bool cut[2] = {false, false};
  /// Called while setup() waits for the machine-wide subnet lock (it may throw, e.g. on Ctrl-C).
  std::function<void()> tick;

  /// Sets up namespaces and veth pairs if possible (`want`: "auto", "netns", "loopback");
  /// otherwise loopback, and says why. invalid_argument (`want`), unsupported ("netns" asked
  /// for and impossible).
  Status setup(const std::string& want, const std::string& tag);
  /// The lockd address worker i uses.
  std::string lockd_address(int i, std::uint16_t port) const;
  /// Cuts worker i off lockd (netns: host-side link down; loopback: drop rules for the
  /// supervisor's UDP port, found from its pid). unsupported (no way to cut here), not_found
  /// (no UDP port of that pid), io_error (ip/nft/iptables failed, with its output).
  Status cut_off(int i, pid_t supervisor_pid, std::uint16_t lockd_port);
  Status reconnect(int i);
  /// Removes everything setup/cut_off created. Idempotent, never throws.
  void teardown();
  /// One line: how the workers are connected and how a cut is made.
  std::string describe() const;
};

}  // namespace leasehold::harness
