// leasehold/io: the start-up probe for io_uring (see probe.hpp).
#include "leasehold/io/probe.hpp"

#include "leasehold/io/udp.hpp"

#include <liburing.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace leasehold {

namespace {

constexpr RequiredOpcode kRequiredOpcodes[] = {
    {IORING_OP_RECVMSG, "IORING_OP_RECVMSG"},
    {IORING_OP_SENDMSG, "IORING_OP_SENDMSG"},
    {IORING_OP_TIMEOUT, "IORING_OP_TIMEOUT"},
    {IORING_OP_TIMEOUT_REMOVE, "IORING_OP_TIMEOUT_REMOVE"},
    {IORING_OP_POLL_ADD, "IORING_OP_POLL_ADD"},
    {IORING_OP_POLL_REMOVE, "IORING_OP_POLL_REMOVE"},
    {IORING_OP_ASYNC_CANCEL, "IORING_OP_ASYNC_CANCEL"},
    {IORING_OP_PROVIDE_BUFFERS, "IORING_OP_PROVIDE_BUFFERS"},
};
constexpr std::size_t kRequiredOpcodeCount = sizeof(kRequiredOpcodes) / sizeof(kRequiredOpcodes[0]);
static_assert(kRequiredOpcodeCount < 64);

struct RequiredFeature {
  std::uint32_t bit;
  const char* name;
  const char* why;
};
constexpr RequiredFeature kRequiredFeatures[] = {
    {IORING_FEAT_NODROP, "IORING_FEAT_NODROP", "Linux 5.5: completions survive a full CQ ring"},
    {IORING_FEAT_FAST_POLL, "IORING_FEAT_FAST_POLL", "Linux 5.7: sockets are polled, not punted"},
    {IORING_FEAT_EXT_ARG, "IORING_FEAT_EXT_ARG", "Linux 5.11: waits with a timeout"},
};

constexpr const char* kKernelFix = "fix: run on Linux >= 6.0 (multishot recvmsg, buffer rings)";

int read_io_uring_disabled() noexcept {
  std::FILE* f = std::fopen("/proc/sys/kernel/io_uring_disabled", "re");
  if (f == nullptr) return -1;
  int v = -1;
  if (std::fscanf(f, "%d", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

// The probe's ring is fresh and submits one request at a time, so an SQE is always free; a
// null here would mean liburing broke its contract.
io_uring_sqe* probe_sqe(io_uring* ring) noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) {
    io_uring_submit(ring);
    sqe = io_uring_get_sqe(ring);
  }
  if (sqe == nullptr) std::abort();
  return sqe;
}

// Waits for one completion (bounded: 1 s) and returns its res, or -ETIME.
int wait_one(io_uring* ring) noexcept {
  __kernel_timespec ts{.tv_sec = 1, .tv_nsec = 0};
  io_uring_cqe* cqe = nullptr;
  int ret = io_uring_submit_and_wait_timeout(ring, &cqe, 1, &ts, nullptr);
  if (ret < 0 || cqe == nullptr) return ret < 0 ? ret : -ETIME;
  int res = cqe->res;
  io_uring_cqe_seen(ring, cqe);
  return res;
}

// Registers a small buffer ring and runs one multishot recvmsg over it on a loopback socket.
void probe_receive(io_uring* ring, ProbeFacts* facts) noexcept {
  constexpr unsigned kEntries = 4;
  constexpr unsigned kBufBytes = 512;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* mem = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (mem == MAP_FAILED) {
    facts->buf_ring_errno = errno;
    return;
  }
  unsigned char bufs[kEntries][kBufBytes];
  auto* br = static_cast<io_uring_buf_ring*>(mem);
  io_uring_buf_ring_init(br);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<std::uint64_t>(mem);
  reg.ring_entries = kEntries;
  reg.bgid = 0;
  int ret = io_uring_register_buf_ring(ring, &reg, 0);
  if (ret < 0) {
    facts->buf_ring_errno = -ret;
    ::munmap(mem, page);
    return;
  }
  for (unsigned i = 0; i < kEntries; ++i)
    io_uring_buf_ring_add(br, bufs[i], kBufBytes, static_cast<unsigned short>(i),
                          io_uring_buf_ring_mask(kEntries), static_cast<int>(i));
  io_uring_buf_ring_advance(br, kEntries);

  // A unix datagram pair, not UDP: the probe must not depend on a loopback interface (a fresh
  // network namespace has none up) or it would blame io_uring for a network problem.
  int pair[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    facts->multishot_recvmsg_errno = errno;
  } else {
    UniqueFd sock(pair[0]);
    UniqueFd peer(pair[1]);
    const char ping = 'p';
    (void)!::send(peer.get(), &ping, 1, 0);
    msghdr msg{};
    msg.msg_namelen = sizeof(sockaddr_storage);
    io_uring_sqe* sqe = probe_sqe(ring);
    io_uring_prep_recvmsg_multishot(sqe, sock.get(), &msg, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = 0;
    sqe->user_data = 1;
    int res = wait_one(ring);
    facts->multishot_recvmsg_errno = res < 0 ? -res : 0;
    if (res >= 0) {
      // Still armed: cancel it and wait (bounded) until both the cancel and the final recvmsg
      // completion are in, so the buffers and the ring memory can go.
      io_uring_sqe* cancel = probe_sqe(ring);
      io_uring_prep_cancel64(cancel, 1, 0);
      cancel->user_data = 2;
      io_uring_submit(ring);
      bool recv_done = false;
      bool cancel_done = false;
      for (int i = 0; i < 8 && !(recv_done && cancel_done); ++i) {
        __kernel_timespec ts{.tv_sec = 1, .tv_nsec = 0};
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe_timeout(ring, &cqe, &ts) < 0 || cqe == nullptr) break;
        if (cqe->user_data == 1 && !(cqe->flags & IORING_CQE_F_MORE)) recv_done = true;
        if (cqe->user_data == 2) cancel_done = true;
        io_uring_cqe_seen(ring, cqe);
      }
    }
  }
  io_uring_unregister_buf_ring(ring, 0);
  ::munmap(mem, page);
}

}  // namespace

const RequiredOpcode* required_opcodes(std::size_t* count) noexcept {
  *count = kRequiredOpcodeCount;
  return kRequiredOpcodes;
}

std::uint32_t required_features() noexcept {
  std::uint32_t bits = 0;
  for (const auto& f : kRequiredFeatures) bits |= f.bit;
  return bits;
}

ProbeFacts gather_probe_facts() noexcept {
  ProbeFacts facts;
  facts.io_uring_disabled = read_io_uring_disabled();
  io_uring ring{};
  io_uring_params params{};
  int ret = io_uring_queue_init_params(8, &ring, &params);
  if (ret < 0) {
    facts.setup_errno = -ret;
    return facts;
  }
  facts.features = params.features;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  for (std::size_t i = 0; i < kRequiredOpcodeCount; ++i) {
    if (probe == nullptr || !io_uring_opcode_supported(probe, kRequiredOpcodes[i].opcode))
      facts.opcodes_missing |= std::uint64_t{1} << i;
  }
  if (probe != nullptr) io_uring_free_probe(probe);

  if (facts.opcodes_missing == 0) {
    probe_receive(&ring, &facts);
    __kernel_timespec zero{};
    io_uring_sqe* sqe = probe_sqe(&ring);
    io_uring_prep_timeout(sqe, &zero, 0, IORING_TIMEOUT_BOOTTIME);
    sqe->user_data = 3;
    // A relative timeout of 0 expires at once (-ETIME); -EINVAL means the clock flag is unknown.
    int res = wait_one(&ring);
    facts.boottime_timeout_errno = res == -ETIME ? 0 : (res < 0 ? -res : EIO);
  }
  io_uring_queue_exit(&ring);
  return facts;
}

ProbeResult classify_setup_errno(int setup_errno, int io_uring_disabled) {
  ProbeResult r;
  r.error = setup_errno;
  const std::string err = std::string(" (io_uring_setup: ") + std::strerror(setup_errno) + ")";
  switch (setup_errno) {
    case 0:
      return r;
    case EPERM:
      if (io_uring_disabled == 2) {
        r.failure = ProbeFailure::disabled_by_sysctl;
        r.message = "io_uring is disabled by kernel.io_uring_disabled=2" + err +
                    "; fix: sysctl -w kernel.io_uring_disabled=0 (or 1 and add this user to the "
                    "group in kernel.io_uring_group)";
      } else if (io_uring_disabled == 1) {
        r.failure = ProbeFailure::disabled_by_sysctl;
        r.message = "io_uring is restricted by kernel.io_uring_disabled=1 and this process is "
                    "not in kernel.io_uring_group" + err +
                    "; fix: add the service user to the group named by kernel.io_uring_group, "
                    "or sysctl -w kernel.io_uring_disabled=0";
      } else {
        r.failure = ProbeFailure::blocked_eperm;
        r.message = "io_uring is blocked by a seccomp filter or LSM (kernel.io_uring_disabled=" +
                    std::to_string(io_uring_disabled) + ")" + err +
                    "; fix: allow io_uring_setup, io_uring_enter and io_uring_register in the "
                    "seccomp profile (e.g. docker --security-opt seccomp=<profile>, or "
                    "SystemCallFilter=@io_uring... in the systemd unit)";
      }
      return r;
    case ENOSYS:
      r.failure = ProbeFailure::unsupported_enosys;
      r.message = "io_uring is not available: the kernel was built without CONFIG_IO_URING, or a "
                  "seccomp filter answers ENOSYS" + err +
                  "; fix: use a kernel with CONFIG_IO_URING=y (Linux >= 6.0), or allow the "
                  "io_uring_* syscalls in the seccomp profile";
      return r;
    case ENOMEM:
      r.failure = ProbeFailure::memlock;
      r.message = "io_uring rings could not be allocated: RLIMIT_MEMLOCK is too low" + err +
                  "; fix: raise the locked-memory limit (ulimit -l, LimitMEMLOCK= in the systemd "
                  "unit, or /etc/security/limits.conf) to at least 8 MiB";
      return r;
    default:
      r.failure = ProbeFailure::setup_failed;
      r.message = "io_uring_setup failed" + err + "; fix: check the kernel log (dmesg) and " +
                  "kernel.io_uring_disabled (currently " + std::to_string(io_uring_disabled) + ")";
      return r;
  }
}

ProbeResult classify_probe(const ProbeFacts& facts) {
  if (facts.io_uring_disabled == 2 && facts.setup_errno == 0) {
    // Should not happen (setup fails with EPERM), but trust the sysctl: the admin disabled it.
    return classify_setup_errno(EPERM, 2);
  }
  if (facts.setup_errno != 0) return classify_setup_errno(facts.setup_errno, facts.io_uring_disabled);

  ProbeResult r;
  r.features = facts.features;
  if (facts.opcodes_missing != 0) {
    r.failure = ProbeFailure::opcode_missing;
    r.message = "io_uring lacks operations the event loop needs:";
    for (std::size_t i = 0; i < kRequiredOpcodeCount; ++i)
      if (facts.opcodes_missing & (std::uint64_t{1} << i))
        r.message += std::string(" ") + kRequiredOpcodes[i].name;
    r.message += std::string("; ") + kKernelFix;
    return r;
  }
  for (const auto& f : kRequiredFeatures) {
    if ((facts.features & f.bit) == 0) {
      r.failure = ProbeFailure::feature_missing;
      r.message = std::string("io_uring lacks feature ") + f.name + " (" + f.why + "); " + kKernelFix;
      return r;
    }
  }
  if (facts.buf_ring_errno != 0) {
    r.failure = ProbeFailure::buf_ring_missing;
    r.error = facts.buf_ring_errno;
    r.message = std::string("io_uring provided buffer rings (IORING_REGISTER_PBUF_RING, Linux 5.19) "
                            "are not available (") + std::strerror(facts.buf_ring_errno) + "); " +
                kKernelFix;
    return r;
  }
  if (facts.multishot_recvmsg_errno != 0) {
    r.failure = ProbeFailure::multishot_recvmsg_missing;
    r.error = facts.multishot_recvmsg_errno;
    r.message = std::string("io_uring multishot recvmsg (Linux 6.0) failed (") +
                std::strerror(facts.multishot_recvmsg_errno) + "); " + kKernelFix;
    return r;
  }
  r.boottime_timeouts = facts.boottime_timeout_errno == 0;
  return r;
}

const ProbeResult& probe_io_uring() {
  static const ProbeResult result = classify_probe(gather_probe_facts());
  return result;
}

Status io_uring_usable() {
  const ProbeResult& r = probe_io_uring();
  switch (r.failure) {
    case ProbeFailure::none: return {};
    case ProbeFailure::disabled_by_sysctl:
    case ProbeFailure::blocked_eperm: return Status{Errc::permission_denied, r.message};
    case ProbeFailure::unsupported_enosys:
    case ProbeFailure::opcode_missing:
    case ProbeFailure::feature_missing:
    case ProbeFailure::buf_ring_missing:
    case ProbeFailure::multishot_recvmsg_missing: return Status{Errc::unsupported, r.message};
    case ProbeFailure::memlock:
    case ProbeFailure::setup_failed: break;
  }
  return Status{r.error != 0 ? errc_of_errno(r.error) : Errc::io_error, r.message};
}

}  // namespace leasehold
