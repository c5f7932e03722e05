// leasehold/io: the io_uring event loop shared by the supervisor's io thread and lockd.
//
// What it is optimised for: a few UDP sockets carrying many small datagrams, a few thousand
// timeouts and a few hundred polled fds (pidfds, unix sockets), on one thread, with one
// io_uring_enter per iteration (submit + wait) and no allocation on the receive/send path.
//
//   receive  one multishot recvmsg per socket over a provided buffer ring shared by all
//            sockets (liburing 2.3 has no io_uring_setup_buf_ring, so the ring is mmap'ed and
//            registered here). A datagram's buffer goes back to the ring after its handler
//            returns. The request is re-armed when a completion arrives without
//            IORING_CQE_F_MORE, which includes -ENOBUFS (all buffers in use): the datagram
//            then waits in the socket's receive queue and is read after the re-arm; only a full
//            receive queue loses datagrams, and the kernel's drop count (SO_RXQ_OVFL) is added
//            to LoopStats::kernel_drops.
//   send     sendmsg from a bounded pool of send slots (the payload is copied into the slot, so
//            the caller's buffer may go at once). When all slots are in flight the datagram is
//            dropped and counted (LoopStats::sends_dropped_in_flight_full) and send_to returns
//            -EAGAIN: UDP is lossy anyway, and every request above it is retried by its client.
//   timers   IORING_OP_TIMEOUT with absolute CLOCK_BOOTTIME deadlines (DESIGN.md "Time"); when
//            the kernel lacks IORING_TIMEOUT_BOOTTIME (< 5.15) relative CLOCK_MONOTONIC timeouts
//            are used instead. One-shot or periodic (re-armed at deadline + period, so the
//            cadence does not drift), cancelable; a cancelled timer's handler never runs.
//   polls    IORING_OP_POLL_ADD, one-shot or multishot, for pidfds and unix sockets.
//   wake     an eventfd polled by the ring; wake() and stop() may be called from any thread,
//            and wake() is async-signal-safe (one write(2)).
// Every pool is bounded by LoopConfig; a full pool refuses (invalid handle, counted).
// Handlers run on the loop thread, one at a time; they may call any method of the loop
// (send, add/cancel timers, close their own socket) except run()/run_once(). Handlers must not
// throw: completion dispatch is noexcept, so an escaping exception terminates the process
// instead of leaving buffers and slots half-returned.
#pragma once

#include "leasehold/io/clock.hpp"
#include "leasehold/io/ports.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/io/udp.hpp"

#include <liburing.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace leasehold {

/// Limits of one loop. All pools are allocated once in EventLoop::create.
struct LoopConfig {
  unsigned sq_entries = 256;           ///< submission queue; the CQ gets 4x (power of two)
  unsigned recv_buffer_count = 256;    ///< provided buffers shared by all sockets (power of two, <= 32768)
  unsigned recv_buffer_bytes = 2048;   ///< per buffer; must hold kRecvOverheadBytes + a datagram
  unsigned sends_in_flight_max = 256;  ///< send slots; a send beyond this is dropped + counted
  unsigned timers_max = 4096;          ///< live timers (one-shot + periodic)
  unsigned sockets_max = 256;          ///< UDP sockets with a multishot recvmsg
  unsigned polls_max = 256;            ///< polled fds
  unsigned recv_error_rearms_max = 8;  ///< consecutive receive errors before a socket is given up
  /// IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN (Linux 6.1): completion work runs only when the
  /// loop waits, which costs less CPU per round trip (see perf/loop). Then the thread that calls create() must
  /// be the one that runs the loop (the kernel refuses submissions from any other thread).
  /// Falls back to the default mode on older kernels.
  bool single_issuer = false;
  /// The clock of the loop's turns and timers (not owned; must outlive the loop). nullptr: the
  /// loop's own BootClock.
  Clock* clock = nullptr;
};

/// Bytes of each receive buffer taken by the multishot recvmsg layout: io_uring_recvmsg_out,
/// a sockaddr_storage for the source and room for the SO_RXQ_OVFL control message.
inline constexpr unsigned kRecvOverheadBytes = 16 + 128 + 24;

/// A handle to a socket, timer or poll of one loop. Value 0 is "none". A handle is never
/// reused for another object (a generation count is part of it).
template <class Tag>
struct LoopHandle {
  std::uint64_t value = 0;
  constexpr bool valid() const noexcept { return value != 0; }
  friend constexpr bool operator==(LoopHandle, LoopHandle) = default;
};
using SocketId = LoopHandle<struct SocketTag>;
using TimerId = LoopHandle<struct TimerTag>;
using PollId = LoopHandle<struct PollTag>;

/// One received datagram. Everything points into a loop buffer that is reused as soon as the
/// handler returns: copy what you keep.
struct Datagram {
  SocketId socket;
  std::span<const std::byte> payload;
  const sockaddr* source = nullptr;  ///< the sender's address (IPv4 or IPv6)
  socklen_t source_length = 0;

  SocketAddress source_address() const noexcept {
    return SocketAddress::from(source, source_length).value_or(SocketAddress{});
  }
};

using RecvHandler = std::function<void(const Datagram&)>;
/// Timer handlers take no arguments. Keep captures to two pointers (16 bytes) and libstdc++
/// stores them inline: adding a timer then does not allocate.
using TimerHandler = std::function<void()>;
/// `result` is the poll's revents mask (>= 0) or -errno.
using PollHandler = std::function<void(int result)>;
using WakeHandler = std::function<void()>;

enum class PollMode : std::uint8_t { oneshot, multishot };

/// Counters since create(). Read on the loop thread.
struct LoopStats {
  std::uint64_t iterations = 0;            ///< run_once calls that entered the kernel
  std::uint64_t completions = 0;           ///< CQEs handled
  std::uint64_t datagrams_received = 0;    ///< delivered to a handler
  std::uint64_t datagrams_truncated = 0;   ///< larger than a buffer: dropped (MSG_TRUNC)
  std::uint64_t datagrams_malformed = 0;   ///< recvmsg layout did not validate: dropped
  std::uint64_t kernel_drops = 0;          ///< dropped by the kernel on a full receive queue (SO_RXQ_OVFL)
  std::uint64_t recv_rearms = 0;           ///< multishot recvmsg re-submitted
  std::uint64_t recv_enobufs = 0;          ///< multishot ended because the buffer ring was empty
  std::uint64_t recv_errors = 0;           ///< other receive errors
  std::uint64_t sends_submitted = 0;
  std::uint64_t sends_completed = 0;
  std::uint64_t send_errors = 0;           ///< sendmsg completed with -errno (last one in last_send_error)
  std::uint64_t sends_dropped_in_flight_full = 0;  ///< send_to while sends_in_flight_max were in flight
  std::uint64_t timers_fired = 0;
  std::uint64_t timer_ticks_missed = 0;    ///< periodic deadlines skipped because the loop was late
  std::uint64_t refused_pool_full = 0;     ///< add_* refused: its pool was full
  std::uint64_t wakes = 0;                 ///< wake-ups that drained the eventfd (<= wake() calls)
  int last_send_error = 0;
};

class EventLoop {
 public:
  /// Probes io_uring (probe.hpp), sets up the ring, the buffer ring and the pools.
  /// Returns nullptr and fills `*error` (cause + fix) when io_uring is unusable or the config
  /// is invalid (ProbeFailure::setup_failed with error EINVAL and a message naming the field).
  static std::unique_ptr<EventLoop> create(const LoopConfig& config, ProbeResult* error);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // --- UDP sockets -------------------------------------------------------------------------
  /// Takes ownership of a non-blocking UDP socket (open_udp_socket) and starts receiving.
  /// Any datagram socket works the same way (AF_UNIX SOCK_DGRAM too, e.g. a local control
  /// socket); SO_RXQ_OVFL drop counting applies where the socket has it enabled.
  /// Invalid handle if `fd` is invalid or sockets_max sockets are registered.
  SocketId add_udp_socket(UniqueFd fd, RecvHandler on_datagram);
  /// Stops receiving; the fd is closed once the kernel let go of it. No handler runs for this
  /// socket after the call. Returns false for an unknown or already-closed handle.
  bool close_socket(SocketId socket);
  /// The socket's fd (still owned by the loop), or -1.
  int socket_fd(SocketId socket) const noexcept;
  /// The socket's last receive error as -errno (0: none yet; -EBADF: unknown handle). Errors
  /// are counted and the receive re-armed; after recv_error_rearms_max consecutive errors the
  /// socket is given up (no longer receives) and this tells why.
  int socket_error(SocketId socket) const noexcept;

  /// Queues one datagram (copied; <= kUdpPayloadBytesMax bytes). `to` = nullptr for a connected
  /// socket. Submitted with the next run_once. Returns 0, -EAGAIN when sends_in_flight_max
  /// sends are in flight (dropped, counted), -EMSGSIZE, or -EBADF for an unknown socket.
  int send_to(SocketId socket, std::span<const std::byte> payload, const SocketAddress* to);

  // --- timers (CLOCK_BOOTTIME, boottime_ns()) ----------------------------------------------
  /// One-shot timer at an absolute CLOCK_BOOTTIME deadline (ns). Invalid if the pool is full.
  TimerId add_timer_at(std::int64_t deadline_boottime_ns, TimerHandler on_fire);
  /// One-shot timer `delay_ns` from now.
  TimerId add_timer_after(std::int64_t delay_ns, TimerHandler on_fire);
  /// Periodic timer: fires at first_deadline, first_deadline + period, ... (period_ns > 0).
  /// A late loop skips missed deadlines (counted in timer_ticks_missed), it does not burst.
  TimerId add_periodic(std::int64_t period_ns, std::int64_t first_deadline_boottime_ns,
                       TimerHandler on_fire);
  /// Cancels: its handler will not run after this returns true. False if unknown, already
  /// fired (one-shot) or already cancelled. May be called from the timer's own handler.
  bool cancel_timer(TimerId timer);
  std::size_t timers_live() const noexcept { return timers_live_; }

  // --- polls ---------------------------------------------------------------------------
  /// Polls `fd` (not owned; keep it open until the poll ends) for `events` (POLLIN, ...).
  /// One-shot polls end after one call; multishot ones are re-armed until cancelled.
  PollId add_poll(int fd, std::uint32_t events, PollMode mode, PollHandler on_ready);
  /// Same contract as cancel_timer.
  bool cancel_poll(PollId poll);

  // --- cross-thread --------------------------------------------------------------------
  /// Runs on the loop thread after wake() (coalesced: several wakes may give one call).
  void set_wake_handler(WakeHandler on_wake);
  /// Any thread, async-signal-safe: makes the loop return from its wait and run the wake handler.
  void wake() const noexcept;
  /// Any thread: run() returns after the current iteration.
  void stop() noexcept;

  // --- running (loop thread only) --------------------------------------------------------
  /// Submits queued work, waits up to `timeout_ns` (< 0: no limit, 0: do not wait) for at least
  /// one completion, runs the handlers of all completions ready. Returns how many completions
  /// were handled (0 on timeout or a signal) or -errno from io_uring_enter.
  int run_once(std::int64_t timeout_ns);
  /// Hands what is queued (sends, ...) to the kernel now, without waiting for completions:
  /// run_once would do it only at its start. For a turn's answers before slower work of the same
  /// turn. Returns how many were submitted (0: nothing queued) or -errno.
  int submit_queued();
  /// run_once until stop(). Returns 0, or -errno if io_uring_enter failed.
  int run();

  /// The clock reading of the current turn (ns, CLOCK_BOOTTIME domain): taken by run_once after
  /// its wait and again after each batch of completions is peeked (up to kCompletionBatch),
  /// before their handlers run: every handler of a batch sees one `now_ns`, never earlier than
  /// its own completion. After run_once returns: the last reading of that call.
  std::int64_t turn_now_ns() const noexcept { return turn_now_ns_; }
  /// The clock the loop reads (LoopConfig::clock or its own BootClock).
  Clock& clock() noexcept { return *clock_; }

  const LoopStats& stats() const noexcept { return stats_; }
  const LoopConfig& config() const noexcept { return config_; }
  /// True when timers use IORING_TIMEOUT_BOOTTIME (probe result).
  bool boottime_timers() const noexcept { return boottime_; }
  std::size_t sends_in_flight() const noexcept;

 private:
  struct SocketSlot;
  struct SendSlot;
  struct TimerSlot;
  struct PollSlot;
  struct Completion {
    std::uint64_t user_data;
    std::int32_t res;
    std::uint32_t flags;
  };

  EventLoop() = default;
  int init(const LoopConfig& config, ProbeResult* error);
  io_uring_sqe* sqe();
  void arm_recv(std::uint32_t index);
  void arm_timer(std::uint32_t index);
  void arm_poll(std::uint32_t index);
  void arm_wake();
  void dispatch(const Completion& c) noexcept;
  void on_recv(std::uint32_t index, const Completion& c);
  void deliver(SocketSlot& s, std::uint32_t index, std::byte* buf, int len);
  void on_send(std::uint32_t index, const Completion& c);
  void on_timer(std::uint32_t index, const Completion& c);
  void on_poll(std::uint32_t index, const Completion& c);
  void on_wake(const Completion& c);
  void return_buffer(unsigned bid);
  void finish_iteration();
  void free_socket(std::uint32_t index);
  void free_timer(std::uint32_t index);
  void free_poll(std::uint32_t index);

  LoopConfig config_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool defer_taskrun_ = false;
  bool boottime_ = false;
  bool dispatching_ = false;

  io_uring_buf_ring* buf_ring_ = nullptr;
  std::size_t buf_ring_bytes_ = 0;
  std::byte* buffers_ = nullptr;
  std::size_t buffers_bytes_ = 0;
  unsigned buffers_to_return_ = 0;

  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  WakeHandler on_wake_;

  std::vector<SocketSlot> sockets_;
  std::vector<std::uint32_t> free_sockets_;
  std::vector<std::uint32_t> rearm_;
  std::vector<SendSlot> sends_;
  std::vector<std::uint32_t> free_sends_;
  std::vector<TimerSlot> timers_;
  std::vector<std::uint32_t> free_timers_;
  std::size_t timers_live_ = 0;
  std::vector<PollSlot> polls_;
  std::vector<std::uint32_t> free_polls_;
  std::vector<Completion> batch_;

  LoopStats stats_;
  BootClock own_clock_;
  Clock* clock_ = &own_clock_;
  std::int64_t turn_now_ns_ = 0;
};

/// The production DatagramPort: one UDP socket registered with an EventLoop (not owned; both
/// must outlive the port). send() queues through EventLoop::send_to (never blocks; false when
/// the loop refused it: sends_in_flight_max in flight, too large, socket closed).
class UdpDatagramPort final : public DatagramPort {
 public:
  UdpDatagramPort(EventLoop& loop, SocketId socket, SocketAddress local) noexcept
      : loop_(loop), socket_(socket), local_(local) {}
  bool send(const SocketAddress& to, std::span<const std::uint8_t> bytes) override {
    return loop_.send_to(socket_, std::as_bytes(bytes), &to) == 0;
  }
  SocketAddress local_address() const override { return local_; }
  DatagramPortStats stats() const override {
    const LoopStats& s = loop_.stats();
    return DatagramPortStats{s.kernel_drops, s.datagrams_truncated, s.send_errors};
  }

 private:
  EventLoop& loop_;
  SocketId socket_;
  SocketAddress local_;
};

}  // namespace leasehold
