// leasehold/io: the io_uring event loop (see loop.hpp for the design).
#include "leasehold/io/loop.hpp"

#include "leasehold/io/clock.hpp"
#include "leasehold/lease/assert.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace leasehold {

namespace {

constexpr unsigned kBufGroup = 0;
constexpr unsigned kCompletionBatch = 256;
constexpr unsigned kBufRingEntriesMax = 32768;  // kernel limit for IORING_REGISTER_PBUF_RING

// user_data: kind (8 bits) | slot index (24 bits) | generation (32 bits). 0 = "ignore"
// (the completions of cancel/remove requests, which carry nothing we act on).
enum Kind : std::uint8_t { kIgnore = 0, kRecv = 1, kSend = 2, kTimer = 3, kPoll = 4, kWake = 5 };
constexpr unsigned kIndexBits = 24;
constexpr std::uint32_t kIndexMax = (1u << kIndexBits) - 1;

constexpr std::uint64_t encode(Kind kind, std::uint32_t index, std::uint32_t gen) noexcept {
  return (std::uint64_t{kind} << 56) | (std::uint64_t{index} << 32) | gen;
}
constexpr Kind kind_of(std::uint64_t ud) noexcept { return static_cast<Kind>(ud >> 56); }
constexpr std::uint32_t index_of(std::uint64_t ud) noexcept {
  return static_cast<std::uint32_t>(ud >> 32) & kIndexMax;
}
constexpr std::uint32_t gen_of(std::uint64_t ud) noexcept { return static_cast<std::uint32_t>(ud); }

// Handles: (index + 1) << 32 | generation, so 0 stays "none".
template <class H>
H make_handle(std::uint32_t index, std::uint32_t gen) noexcept {
  return H{(std::uint64_t{index} + 1) << 32 | gen};
}
template <class H>
bool split_handle(H h, std::size_t pool, std::uint32_t* index, std::uint32_t* gen) noexcept {
  if (!h.valid()) return false;
  std::uint64_t i = (h.value >> 32) - 1;
  if (i >= pool) return false;
  *index = static_cast<std::uint32_t>(i);
  *gen = static_cast<std::uint32_t>(h.value);
  return true;
}

bool power_of_two(unsigned v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

__kernel_timespec to_timespec(std::int64_t ns) noexcept {
  if (ns < 0) ns = 0;
  return __kernel_timespec{.tv_sec = ns / kNsPerS, .tv_nsec = ns % kNsPerS};
}

}  // namespace

struct EventLoop::SocketSlot {
  UniqueFd fd;
  RecvHandler on_datagram;
  msghdr msg{};                 // the multishot layout: name + control lengths (no iov)
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(std::uint32_t))]{};
  std::uint32_t gen = 1;
  std::uint32_t kernel_drops_seen = 0;
  unsigned consecutive_errors = 0;
  int error = 0;
  bool used = false;
  bool armed = false;     // a recvmsg is in the kernel
  bool closing = false;
};

struct EventLoop::SendSlot {
  msghdr msg{};
  iovec iov{};
  sockaddr_storage to{};
  std::uint32_t gen = 1;
  std::byte bytes[kUdpPayloadBytesMax];
};

struct EventLoop::TimerSlot {
  __kernel_timespec ts{};
  std::int64_t deadline_ns = 0;
  std::int64_t period_ns = 0;   // 0 = one-shot
  TimerHandler on_fire;
  std::uint32_t gen = 1;
  bool used = false;
  bool in_kernel = false;
  bool in_handler = false;
  bool cancelled = false;
};

struct EventLoop::PollSlot {
  int fd = -1;
  std::uint32_t events = 0;
  PollMode mode = PollMode::oneshot;
  PollHandler on_ready;
  std::uint32_t gen = 1;
  bool used = false;
  bool in_kernel = false;
  bool in_handler = false;
  bool cancelled = false;
};

std::unique_ptr<EventLoop> EventLoop::create(const LoopConfig& config, ProbeResult* error) {
  ProbeResult local;
  ProbeResult* err = error != nullptr ? error : &local;
  std::unique_ptr<EventLoop> loop(new EventLoop());
  if (loop->init(config, err) != 0) return nullptr;
  return loop;
}

int EventLoop::init(const LoopConfig& config, ProbeResult* error) {
  auto invalid = [&](const char* what) {
    error->failure = ProbeFailure::setup_failed;
    error->error = EINVAL;
    error->message = std::string("invalid LoopConfig: ") + what;
    return -EINVAL;
  };
  if (!power_of_two(config.sq_entries) || config.sq_entries > 4096)
    return invalid("sq_entries must be a power of two in 1..4096");
  if (!power_of_two(config.recv_buffer_count) || config.recv_buffer_count > kBufRingEntriesMax)
    return invalid("recv_buffer_count must be a power of two in 1..32768");
  if (config.recv_buffer_bytes < kRecvOverheadBytes + 1 || config.recv_buffer_bytes > 65536)
    return invalid("recv_buffer_bytes must be in kRecvOverheadBytes+1..65536");
  if (config.sends_in_flight_max == 0 || config.sends_in_flight_max > kIndexMax ||
      config.timers_max > kIndexMax || config.sockets_max > kIndexMax || config.polls_max > kIndexMax)
    return invalid("sends_in_flight_max must be >= 1 and every pool < 2^24");

  const ProbeResult& probe = probe_io_uring();
  if (!probe.ok()) {
    *error = probe;
    return -ENOTSUP;
  }
  config_ = config;
  if (config.clock != nullptr) clock_ = config.clock;
  turn_now_ns_ = clock_->now_ns();
  boottime_ = probe.boottime_timeouts;

  // Task work: with single_issuer, completions are processed only when this thread waits
  // (DEFER_TASKRUN, 6.1) — the cheapest mode; otherwise COOP_TASKRUN (5.19) avoids IPIs.
  // Each falls back to the plainer mode on older kernels (-EINVAL).
  unsigned modes[3] = {IORING_SETUP_COOP_TASKRUN, 0u, 0u};
  std::size_t mode_count = 2;
  if (config.single_issuer) {
    modes[0] = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    modes[1] = IORING_SETUP_COOP_TASKRUN;
    mode_count = 3;
  }
  int ret = -EINVAL;
  for (std::size_t m = 0; m < mode_count; ++m) {
    const unsigned mode = modes[m];
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE | mode;
    params.cq_entries = config.sq_entries * 4;
    ret = io_uring_queue_init_params(config.sq_entries, &ring_, &params);
    if (ret != -EINVAL) {
      defer_taskrun_ = ret == 0 && (mode & IORING_SETUP_DEFER_TASKRUN) != 0;
      break;
    }
  }
  if (ret < 0) {
    *error = classify_setup_errno(-ret, 0);  // the probe passed: the sysctl allows us
    return ret;
  }
  ring_ready_ = true;

  // The provided buffer ring: mmap'ed by hand (liburing 2.3 lacks io_uring_setup_buf_ring).
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  buf_ring_bytes_ = (config.recv_buffer_count * sizeof(io_uring_buf) + page - 1) / page * page;
  void* ring_mem = ::mmap(nullptr, buf_ring_bytes_, PROT_READ | PROT_WRITE,
                          MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  buffers_bytes_ = std::size_t{config.recv_buffer_count} * config.recv_buffer_bytes;
  void* buf_mem = ::mmap(nullptr, buffers_bytes_, PROT_READ | PROT_WRITE,
                         MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (ring_mem == MAP_FAILED || buf_mem == MAP_FAILED) {
    int e = errno;
    if (ring_mem != MAP_FAILED) ::munmap(ring_mem, buf_ring_bytes_);
    if (buf_mem != MAP_FAILED) ::munmap(buf_mem, buffers_bytes_);
    *error = classify_setup_errno(ENOMEM, 0);
    error->message = std::string("cannot map the receive buffers (") + std::strerror(e) + ")";
    return -e;
  }
  buf_ring_ = static_cast<io_uring_buf_ring*>(ring_mem);
  buffers_ = static_cast<std::byte*>(buf_mem);
  io_uring_buf_ring_init(buf_ring_);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<std::uint64_t>(ring_mem);
  reg.ring_entries = config.recv_buffer_count;
  reg.bgid = kBufGroup;
  ret = io_uring_register_buf_ring(&ring_, &reg, 0);
  if (ret < 0) {
    error->failure = ProbeFailure::buf_ring_missing;
    error->error = -ret;
    error->message = std::string("io_uring_register_buf_ring failed (") + std::strerror(-ret) + ")";
    return ret;
  }
  for (unsigned bid = 0; bid < config.recv_buffer_count; ++bid) return_buffer(bid);
  io_uring_buf_ring_advance(buf_ring_, static_cast<int>(buffers_to_return_));
  buffers_to_return_ = 0;

  sockets_ = std::vector<SocketSlot>(config.sockets_max);
  sends_ = std::vector<SendSlot>(config.sends_in_flight_max);
  timers_ = std::vector<TimerSlot>(config.timers_max);
  polls_ = std::vector<PollSlot>(config.polls_max);
  for (std::uint32_t i = config.sockets_max; i-- > 0;) free_sockets_.push_back(i);
  for (std::uint32_t i = config.sends_in_flight_max; i-- > 0;) free_sends_.push_back(i);
  for (std::uint32_t i = config.timers_max; i-- > 0;) free_timers_.push_back(i);
  for (std::uint32_t i = config.polls_max; i-- > 0;) free_polls_.push_back(i);
  rearm_.reserve(config.sockets_max);
  batch_.resize(kCompletionBatch);

  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) {
    int e = errno;
    *error = ProbeResult{};
    error->failure = ProbeFailure::setup_failed;
    error->error = e;
    error->message = std::string("eventfd failed (") + std::strerror(e) + ")";
    return -e;
  }
  arm_wake();
  return 0;
}

EventLoop::~EventLoop() {
  if (ring_ready_) io_uring_queue_exit(&ring_);  // cancels everything in flight
  if (buf_ring_ != nullptr) ::munmap(buf_ring_, buf_ring_bytes_);
  if (buffers_ != nullptr) ::munmap(buffers_, buffers_bytes_);
}

std::size_t EventLoop::sends_in_flight() const noexcept { return sends_.size() - free_sends_.size(); }

io_uring_sqe* EventLoop::sqe() {
  io_uring_sqe* s = io_uring_get_sqe(&ring_);
  if (s == nullptr) {  // SQ full: push it to the kernel and take a fresh entry
    io_uring_submit(&ring_);
    s = io_uring_get_sqe(&ring_);
  }
  // The SQ has sq_entries >= 1 slots and was just submitted, so this holds unless the
  // kernel refused the submission outright (ring unusable): a bug worth stopping on.
  LEASEHOLD_ASSERT(s != nullptr);
  return s;
}

void EventLoop::return_buffer(unsigned bid) {
  io_uring_buf_ring_add(buf_ring_, buffers_ + std::size_t{bid} * config_.recv_buffer_bytes,
                        config_.recv_buffer_bytes, static_cast<unsigned short>(bid),
                        io_uring_buf_ring_mask(config_.recv_buffer_count),
                        static_cast<int>(buffers_to_return_));
  ++buffers_to_return_;
}

// --- sockets ----------------------------------------------------------------------------

SocketId EventLoop::add_udp_socket(UniqueFd fd, RecvHandler on_datagram) {
  if (!fd.valid() || !on_datagram) return {};
  if (free_sockets_.empty()) {
    ++stats_.refused_pool_full;
    return {};
  }
  std::uint32_t index = free_sockets_.back();
  free_sockets_.pop_back();
  SocketSlot& s = sockets_[index];
  s.fd = std::move(fd);
  s.on_datagram = std::move(on_datagram);
  s.msg = msghdr{};
  s.msg.msg_namelen = sizeof(sockaddr_storage);
  s.msg.msg_control = s.control;
  s.msg.msg_controllen = sizeof(s.control);
  s.kernel_drops_seen = 0;
  s.consecutive_errors = 0;
  s.error = 0;
  s.used = true;
  s.closing = false;
  arm_recv(index);
  return make_handle<SocketId>(index, s.gen);
}

void EventLoop::arm_recv(std::uint32_t index) {
  SocketSlot& s = sockets_[index];
  io_uring_sqe* e = sqe();
  io_uring_prep_recvmsg_multishot(e, s.fd.get(), &s.msg, 0);
  e->flags |= IOSQE_BUFFER_SELECT;
  e->buf_group = kBufGroup;
  io_uring_sqe_set_data64(e, encode(kRecv, index, s.gen));
  s.armed = true;
}

bool EventLoop::close_socket(SocketId socket) {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(socket, sockets_.size(), &index, &gen)) return false;
  SocketSlot& s = sockets_[index];
  if (!s.used || s.gen != gen || s.closing) return false;
  s.closing = true;
  if (s.armed) {
    io_uring_sqe* e = sqe();
    io_uring_prep_cancel64(e, encode(kRecv, index, s.gen), 0);
    io_uring_sqe_set_data64(e, encode(kIgnore, 0, 0));
  } else {
    free_socket(index);
  }
  return true;
}

void EventLoop::free_socket(std::uint32_t index) {
  SocketSlot& s = sockets_[index];
  // A send to this fd may still sit unsubmitted in the SQ: hand it to the kernel (which then
  // holds its own file reference) before the fd number can be reused.
  io_uring_submit(&ring_);
  s.fd.reset();
  s.on_datagram = nullptr;
  s.used = false;
  s.armed = false;
  s.closing = false;
  ++s.gen;
  free_sockets_.push_back(index);
}

int EventLoop::socket_fd(SocketId socket) const noexcept {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(socket, sockets_.size(), &index, &gen)) return -1;
  const SocketSlot& s = sockets_[index];
  return s.used && s.gen == gen ? s.fd.get() : -1;
}

int EventLoop::socket_error(SocketId socket) const noexcept {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(socket, sockets_.size(), &index, &gen)) return -EBADF;
  const SocketSlot& s = sockets_[index];
  return s.used && s.gen == gen ? s.error : -EBADF;
}

void EventLoop::on_recv(std::uint32_t index, const Completion& c) {
  SocketSlot& s = sockets_[index];
  const bool current = s.used && s.gen == gen_of(c.user_data);
  if (c.flags & IORING_CQE_F_BUFFER) {
    const unsigned bid = c.flags >> IORING_CQE_BUFFER_SHIFT;
    if (current && !s.closing && c.res > 0)
      deliver(s, index, buffers_ + std::size_t{bid} * config_.recv_buffer_bytes, c.res);
    return_buffer(bid);  // after the handler: the payload it saw lived in this buffer
  }
  if (!current) return;
  if (c.res >= 0) {
    s.consecutive_errors = 0;
  } else if (c.res == -ENOBUFS) {
    ++stats_.recv_enobufs;
  } else if (c.res != -ECANCELED) {
    ++stats_.recv_errors;
    ++s.consecutive_errors;
    s.error = c.res;
  }
  if (c.flags & IORING_CQE_F_MORE) return;
  s.armed = false;
  if (s.closing) {
    free_socket(index);
  } else if (s.consecutive_errors <= config_.recv_error_rearms_max) {
    rearm_.push_back(index);  // after this batch's buffers are back in the ring
  }
}

void EventLoop::deliver(SocketSlot& s, std::uint32_t index, std::byte* buf, int len) {
  io_uring_recvmsg_out* out = io_uring_recvmsg_validate(buf, len, &s.msg);
  if (out == nullptr || out->namelen > s.msg.msg_namelen) {
    ++stats_.datagrams_malformed;
    return;
  }
  for (cmsghdr* cm = io_uring_recvmsg_cmsg_firsthdr(out, &s.msg); cm != nullptr;
       cm = io_uring_recvmsg_cmsg_nexthdr(out, &s.msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SO_RXQ_OVFL &&
        cm->cmsg_len >= CMSG_LEN(sizeof(std::uint32_t))) {
      std::uint32_t drops = 0;
      std::memcpy(&drops, CMSG_DATA(cm), sizeof drops);
      stats_.kernel_drops += drops - s.kernel_drops_seen;  // cumulative per socket, wraps
      s.kernel_drops_seen = drops;
    }
  }
  if (out->flags & MSG_TRUNC) {
    ++stats_.datagrams_truncated;
    return;
  }
  const unsigned payload_len = io_uring_recvmsg_payload_length(out, len, &s.msg);
  Datagram d;
  d.socket = make_handle<SocketId>(index, s.gen);
  d.payload = {static_cast<const std::byte*>(io_uring_recvmsg_payload(out, &s.msg)), payload_len};
  d.source = static_cast<const sockaddr*>(io_uring_recvmsg_name(out));
  d.source_length = out->namelen;
  ++stats_.datagrams_received;
  s.on_datagram(d);
}

// --- sends ----------------------------------------------------------------------------

int EventLoop::send_to(SocketId socket, std::span<const std::byte> payload, const SocketAddress* to) {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(socket, sockets_.size(), &index, &gen)) return -EBADF;
  SocketSlot& s = sockets_[index];
  if (!s.used || s.gen != gen || s.closing) return -EBADF;
  if (payload.size() > kUdpPayloadBytesMax) return -EMSGSIZE;
  if (to != nullptr && !to->is_set()) return -EDESTADDRREQ;
  if (free_sends_.empty()) {
    ++stats_.sends_dropped_in_flight_full;
    return -EAGAIN;
  }
  std::uint32_t si = free_sends_.back();
  free_sends_.pop_back();
  SendSlot& slot = sends_[si];
  if (!payload.empty()) std::memcpy(slot.bytes, payload.data(), payload.size());
  slot.iov = iovec{slot.bytes, payload.size()};
  slot.msg = msghdr{};
  slot.msg.msg_iov = &slot.iov;
  slot.msg.msg_iovlen = 1;
  if (to != nullptr) {
    std::memcpy(&slot.to, &to->storage, to->length);
    slot.msg.msg_name = &slot.to;
    slot.msg.msg_namelen = to->length;
  }
  io_uring_sqe* e = sqe();
  io_uring_prep_sendmsg(e, s.fd.get(), &slot.msg, 0);
  io_uring_sqe_set_data64(e, encode(kSend, si, slot.gen));
  ++stats_.sends_submitted;
  return 0;
}

void EventLoop::on_send(std::uint32_t index, const Completion& c) {
  SendSlot& slot = sends_[index];
  // One completion per submitted send: a second one for the slot (or one for a reused slot)
  // would free it twice and hand one buffer to two sends.
  LEASEHOLD_ASSERT(slot.gen == gen_of(c.user_data));
  if (c.res < 0) {
    ++stats_.send_errors;
    stats_.last_send_error = c.res;
  } else {
    ++stats_.sends_completed;
  }
  ++slot.gen;
  free_sends_.push_back(index);
}

// --- timers ----------------------------------------------------------------------------

TimerId EventLoop::add_timer_at(std::int64_t deadline_boottime_ns, TimerHandler on_fire) {
  if (!on_fire) return {};
  if (free_timers_.empty()) {
    ++stats_.refused_pool_full;
    return {};
  }
  std::uint32_t index = free_timers_.back();
  free_timers_.pop_back();
  TimerSlot& t = timers_[index];
  t.deadline_ns = deadline_boottime_ns;
  t.period_ns = 0;
  t.on_fire = std::move(on_fire);
  t.used = true;
  t.cancelled = false;
  t.in_handler = false;
  ++timers_live_;
  arm_timer(index);
  return make_handle<TimerId>(index, t.gen);
}

TimerId EventLoop::add_timer_after(std::int64_t delay_ns, TimerHandler on_fire) {
  return add_timer_at(clock_->now_ns() + (delay_ns < 0 ? 0 : delay_ns), std::move(on_fire));
}

TimerId EventLoop::add_periodic(std::int64_t period_ns, std::int64_t first_deadline_boottime_ns,
                                TimerHandler on_fire) {
  if (period_ns <= 0) return {};
  TimerId id = add_timer_at(first_deadline_boottime_ns, std::move(on_fire));
  if (id.valid()) timers_[static_cast<std::uint32_t>((id.value >> 32) - 1)].period_ns = period_ns;
  return id;
}

void EventLoop::arm_timer(std::uint32_t index) {
  TimerSlot& t = timers_[index];
  unsigned flags = 0;
  if (boottime_) {
    t.ts = to_timespec(t.deadline_ns);
    flags = IORING_TIMEOUT_ABS | IORING_TIMEOUT_BOOTTIME;
  } else {
    t.ts = to_timespec(t.deadline_ns - clock_->now_ns());  // relative, CLOCK_MONOTONIC
  }
  io_uring_sqe* e = sqe();
  io_uring_prep_timeout(e, &t.ts, 0, flags);
  io_uring_sqe_set_data64(e, encode(kTimer, index, t.gen));
  t.in_kernel = true;
}

bool EventLoop::cancel_timer(TimerId timer) {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(timer, timers_.size(), &index, &gen)) return false;
  TimerSlot& t = timers_[index];
  if (!t.used || t.gen != gen || t.cancelled) return false;
  if (t.in_handler && t.period_ns == 0) return false;  // a one-shot that is firing now
  t.cancelled = true;
  if (t.in_kernel) {
    io_uring_sqe* e = sqe();
    io_uring_prep_timeout_remove(e, encode(kTimer, index, t.gen), 0);
    io_uring_sqe_set_data64(e, encode(kIgnore, 0, 0));
  }
  // Freed when its completion arrives (in_kernel) or when its handler returns (in_handler).
  return true;
}

void EventLoop::free_timer(std::uint32_t index) {
  TimerSlot& t = timers_[index];
  t.on_fire = nullptr;
  t.used = false;
  t.in_kernel = false;
  t.in_handler = false;
  ++t.gen;
  --timers_live_;
  free_timers_.push_back(index);
}

void EventLoop::on_timer(std::uint32_t index, const Completion& c) {
  TimerSlot& t = timers_[index];
  if (!t.used || t.gen != gen_of(c.user_data)) return;
  t.in_kernel = false;
  if (t.cancelled || c.res != -ETIME) {  // cancelled (-ECANCELED) or an error: it ends here
    free_timer(index);
    return;
  }
  ++stats_.timers_fired;
  if (t.period_ns > 0) {
    const std::int64_t now = turn_now_ns_;
    t.deadline_ns += t.period_ns;
    while (t.deadline_ns <= now) {
      t.deadline_ns += t.period_ns;
      ++stats_.timer_ticks_missed;
    }
  }
  t.in_handler = true;
  t.on_fire();  // may cancel this timer, add others (the pool does not move)
  t.in_handler = false;
  if (t.period_ns > 0 && !t.cancelled) {
    arm_timer(index);
  } else {
    free_timer(index);
  }
}

// --- polls ----------------------------------------------------------------------------

PollId EventLoop::add_poll(int fd, std::uint32_t events, PollMode mode, PollHandler on_ready) {
  if (fd < 0 || !on_ready) return {};
  if (free_polls_.empty()) {
    ++stats_.refused_pool_full;
    return {};
  }
  std::uint32_t index = free_polls_.back();
  free_polls_.pop_back();
  PollSlot& p = polls_[index];
  p.fd = fd;
  p.events = events;
  p.mode = mode;
  p.on_ready = std::move(on_ready);
  p.used = true;
  p.cancelled = false;
  p.in_handler = false;
  arm_poll(index);
  return make_handle<PollId>(index, p.gen);
}

void EventLoop::arm_poll(std::uint32_t index) {
  PollSlot& p = polls_[index];
  io_uring_sqe* e = sqe();
  if (p.mode == PollMode::multishot) {
    io_uring_prep_poll_multishot(e, p.fd, p.events);
  } else {
    io_uring_prep_poll_add(e, p.fd, p.events);
  }
  io_uring_sqe_set_data64(e, encode(kPoll, index, p.gen));
  p.in_kernel = true;
}

bool EventLoop::cancel_poll(PollId poll) {
  std::uint32_t index = 0, gen = 0;
  if (!split_handle(poll, polls_.size(), &index, &gen)) return false;
  PollSlot& p = polls_[index];
  if (!p.used || p.gen != gen || p.cancelled) return false;
  if (p.in_handler && p.mode == PollMode::oneshot) return false;
  p.cancelled = true;
  if (p.in_kernel) {
    io_uring_sqe* e = sqe();
    io_uring_prep_poll_remove(e, encode(kPoll, index, p.gen));
    io_uring_sqe_set_data64(e, encode(kIgnore, 0, 0));
  }
  return true;
}

void EventLoop::free_poll(std::uint32_t index) {
  PollSlot& p = polls_[index];
  p.on_ready = nullptr;
  p.used = false;
  p.in_kernel = false;
  p.in_handler = false;
  p.fd = -1;
  ++p.gen;
  free_polls_.push_back(index);
}

void EventLoop::on_poll(std::uint32_t index, const Completion& c) {
  PollSlot& p = polls_[index];
  if (!p.used || p.gen != gen_of(c.user_data)) return;
  const bool more = (c.flags & IORING_CQE_F_MORE) != 0;
  if (!more) p.in_kernel = false;
  if (!p.cancelled && c.res != -ECANCELED) {
    p.in_handler = true;
    p.on_ready(c.res);
    p.in_handler = false;
  }
  if (more) return;
  // Ended: a one-shot poll, a cancelled one, or a multishot the kernel terminated (re-arm it
  // unless it failed: a failing fd would spin).
  if (p.mode == PollMode::multishot && !p.cancelled && c.res >= 0) {
    arm_poll(index);
  } else {
    free_poll(index);
  }
}

// --- wake-up ----------------------------------------------------------------------------

void EventLoop::set_wake_handler(WakeHandler on_wake) { on_wake_ = std::move(on_wake); }

void EventLoop::wake() const noexcept {
  const std::uint64_t one = 1;
  // EAGAIN means the counter is saturated: a wake-up is pending anyway.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

void EventLoop::stop() noexcept {
  stop_.store(true, std::memory_order_release);
  wake();
}

void EventLoop::arm_wake() {
  io_uring_sqe* e = sqe();
  io_uring_prep_poll_multishot(e, wake_fd_.get(), POLLIN);
  io_uring_sqe_set_data64(e, encode(kWake, 0, 0));
}

void EventLoop::on_wake(const Completion& c) {
  std::uint64_t count = 0;
  bool drained = false;
  while (::read(wake_fd_.get(), &count, sizeof count) == sizeof count) drained = true;
  if (!(c.flags & IORING_CQE_F_MORE)) arm_wake();
  // A multishot poll can report readiness that an earlier completion's read already
  // consumed; that wake() was handled then, so an empty counter is not a wake-up.
  if (!drained) return;
  ++stats_.wakes;
  if (on_wake_) on_wake_();
}

// --- running ----------------------------------------------------------------------------

void EventLoop::dispatch(const Completion& c) noexcept {
  const std::uint32_t index = index_of(c.user_data);
  switch (kind_of(c.user_data)) {
    case kRecv: on_recv(index, c); break;
    case kSend: on_send(index, c); break;
    case kTimer: on_timer(index, c); break;
    case kPoll: on_poll(index, c); break;
    case kWake: on_wake(c); break;
    case kIgnore: break;
  }
}

void EventLoop::finish_iteration() {
  if (buffers_to_return_ != 0) {
    io_uring_buf_ring_advance(buf_ring_, static_cast<int>(buffers_to_return_));
    buffers_to_return_ = 0;
  }
  for (std::uint32_t index : rearm_) {
    SocketSlot& s = sockets_[index];
    if (s.used && !s.closing && !s.armed) {
      arm_recv(index);
      ++stats_.recv_rearms;
    }
  }
  rearm_.clear();
}

int EventLoop::run_once(std::int64_t timeout_ns) {
  // run_once from inside a handler would reap and dispatch completions under the dispatch in
  // progress: a receive slot handed back twice, a timer fired while its record is being freed.
  LEASEHOLD_ASSERT(!dispatching_);
  int ret = 0;
  io_uring_cqe* cqe = nullptr;
  if (timeout_ns < 0) {
    ret = io_uring_submit_and_wait(&ring_, 1);
  } else if (timeout_ns == 0) {
    ret = io_uring_submit(&ring_);
    // Deferred task work runs only on a GETEVENTS enter: ask for it without waiting.
    if (defer_taskrun_ && ret >= 0) ret = io_uring_get_events(&ring_);
  } else {
    __kernel_timespec ts = to_timespec(timeout_ns);
    ret = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  }
  ++stats_.iterations;
  turn_now_ns_ = clock_->now_ns();  // for a turn without completions (timeouts, ticks)
  if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) return ret;

  int handled = 0;
  dispatching_ = true;
  // Bounded: at most one CQ ring's worth per call, so a flood cannot starve the caller.
  const unsigned limit = ring_.cq.ring_entries;
  while (static_cast<unsigned>(handled) < limit) {
    io_uring_cqe* cqes[kCompletionBatch];
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kCompletionBatch);
    if (n == 0) break;
    // One reading per batch, after the peek: every completion of the batch (a datagram's
    // arrival) happened before it, so no handler sees a time before its event (a lease
    // measured from a receive time must not start before the sender's send).
    turn_now_ns_ = clock_->now_ns();
    for (unsigned i = 0; i < n; ++i)
      batch_[i] = Completion{cqes[i]->user_data, cqes[i]->res, cqes[i]->flags};
    io_uring_cq_advance(&ring_, n);  // copied out: handlers may submit freely
    for (unsigned i = 0; i < n; ++i) dispatch(batch_[i]);
    handled += static_cast<int>(n);
    finish_iteration();
  }
  dispatching_ = false;
  stats_.completions += static_cast<std::uint64_t>(handled);
  return handled;
}

int EventLoop::submit_queued() {
  LEASEHOLD_ASSERT(!dispatching_);
  if (io_uring_sq_ready(&ring_) == 0) return 0;
  return io_uring_submit(&ring_);
}

int EventLoop::run() {
  while (!stop_.load(std::memory_order_acquire)) {
    int ret = run_once(-1);
    if (ret < 0) return ret;
  }
  stop_.store(false, std::memory_order_relaxed);
  return 0;
}

}  // namespace leasehold
