// leasehold/harness: a userspace UDP relay between one client (a supervisor) and a target (lockd),
// which cuts the client off the target without root: while cut, what the client sends is
// dropped (its refreshes never reach lockd) and answers to datagrams already forwarded still
// come back. The pause-probe's worst phase uses it to let a supervisor's lease run down to
// valid_until; network.hpp is the cut that needs root (namespaces, packet filters). The other
// way, it drops the target's answers (all of them, or those a filter picks) as a lossy network
// would, and it can be pointed at a new target (a restarted lockd on another port); the
// supervisor's process tests use that.
//
// The relay listens on 127.0.0.1 (an ephemeral port) and forwards on a thread of its own.
// Errors come back as a Status (or the Result of start()) whose message names the system call
// and the errno text (DESIGN.md "Errors").
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/wire/address.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

namespace leasehold::harness {

/// How long the relay's thread waits for a datagram before it looks at stop again (ms): the
/// upper bound of the destructor's wait.
inline constexpr int kRelayPollMs = 50;
/// The largest datagram forwarded whole (bytes); a longer one is truncated to this.
inline constexpr std::size_t kRelayDatagramMax = 2048;

/// Forwards datagrams between one client and `target`. The client is whoever sent the latest
/// datagram to address(); answers from the target go to it. Thread-safe: every member may be
/// called from any thread while the relay forwards.
class UdpRelay {
 public:
  /// Binds the client side to 127.0.0.1 (port chosen by the kernel), connects the target side to
  /// `target` and starts forwarding. Errors (the errno's Errc, errc_of_errno): "relay socket:
  /// REASON" when a socket cannot be made, "relay bind/connect: REASON" when the client side
  /// cannot be bound or the target side connected.
  static Result<std::unique_ptr<UdpRelay>> start(const SocketAddress& target);
  /// Stops the thread (within kRelayPollMs) and closes both sockets.
  ~UdpRelay();
  UdpRelay(const UdpRelay&) = delete;
  UdpRelay& operator=(const UdpRelay&) = delete;

  /// The address the client sends to: "127.0.0.1:PORT".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// The client side's port (host order).
  std::uint16_t port() const noexcept { return port_; }
  /// `on`: drop what the client sends from now on (answers from the target still pass);
  /// false: forward again.
  void cut(bool on) noexcept { cut_.store(on, std::memory_order_release); }
  bool is_cut() const noexcept { return cut_.load(std::memory_order_acquire); }
  /// Datagrams of the client dropped while cut, since start().
  std::uint64_t dropped() const noexcept { return dropped_.load(); }

  /// Decides whether an answer of the target (its bytes) is dropped instead of forwarded.
  using AnswerFilter = std::function<bool(std::span<const std::uint8_t>)>;
  /// `on`: drop every answer of the target from now on (what the client sends still passes);
  /// false: forward again (the filter, if any, still applies).
  void cut_answers(bool on) noexcept { cut_answers_.store(on, std::memory_order_release); }
  /// Drops the answers for which `drop` returns true (an empty filter drops none). It runs on the
  /// relay's thread, one answer at a time.
  void set_answer_filter(AnswerFilter drop);
  /// Answers of the target dropped (cut_answers() or the filter), since start().
  std::uint64_t answers_dropped() const noexcept { return answers_dropped_.load(); }
  /// Sends what the client sends to `target` from now on (and takes answers only from it).
  /// Errors (the errno's Errc): "relay connect: REASON", e.g. an address family other than
  /// start()'s target's.
  Status retarget(const SocketAddress& target);

 private:
  UdpRelay() = default;
  void loop();
  bool drop_answer(std::span<const std::uint8_t> answer);
  int front_ = -1, back_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> cut_{false}, cut_answers_{false}, stop_{false};
  std::atomic<std::uint64_t> dropped_{0}, answers_dropped_{0};
  std::mutex filter_mu_;
  AnswerFilter filter_;  ///< guarded by filter_mu_
  std::thread thread_;
};

}  // namespace leasehold::harness
