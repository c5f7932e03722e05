// The io_uring probe: error mapping (injected facts) and the real probe on this kernel.
#include "leasehold/io/probe.hpp"

#include <liburing.h>

#include <gtest/gtest.h>

#include <cerrno>

namespace leasehold {
namespace {

ProbeFacts healthy() {
  ProbeFacts f;
  f.io_uring_disabled = 0;
  f.features = required_features();
  return f;
}

// The probe's verdict on a healthy kernel whose io_uring_setup failed with `setup_errno`
// (0: it worked), with kernel.io_uring_disabled at `io_uring_disabled` (-1: no such sysctl).
ProbeResult classify_setup(int setup_errno, int io_uring_disabled = 0) {
  ProbeFacts f = healthy();
  f.io_uring_disabled = io_uring_disabled;
  f.setup_errno = setup_errno;
  return classify_probe(f);
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(Probe, HealthyFactsAreOk) {
  ProbeResult r = classify_probe(healthy());
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.message, "");
  EXPECT_TRUE(r.boottime_timeouts);
}

TEST(Probe, SysctlTwoWithEpermSaysDisabledAndHowToEnable) {
  const ProbeResult r = classify_setup(EPERM, 2);
  EXPECT_EQ(r.failure, ProbeFailure::disabled_by_sysctl);
  EXPECT_EQ(r.error, EPERM);
  EXPECT_TRUE(contains(r.message, "io_uring_disabled=2")) << r.message;
  EXPECT_TRUE(contains(r.message, "sysctl -w kernel.io_uring_disabled=0")) << r.message;
}

TEST(Probe, SysctlOneWithEpermNamesTheGroup) {
  const ProbeResult r = classify_setup(EPERM, 1);
  EXPECT_EQ(r.failure, ProbeFailure::disabled_by_sysctl);
  EXPECT_TRUE(contains(r.message, "io_uring_group")) << r.message;
}

TEST(Probe, EpermWithSysctlZeroIsSeccomp) {
  const ProbeResult r = classify_setup(EPERM);
  EXPECT_EQ(r.failure, ProbeFailure::blocked_eperm);
  EXPECT_TRUE(contains(r.message, "seccomp")) << r.message;
  EXPECT_TRUE(contains(r.message, "fix:")) << r.message;
}

TEST(Probe, EpermWithoutTheSysctlFileIsSeccomp) {
  // kernels before 6.6 have no such sysctl
  EXPECT_EQ(classify_setup(EPERM, -1).failure, ProbeFailure::blocked_eperm);
}

TEST(Probe, SysctlTwoWinsEvenIfSetupSomehowWorked) {
  EXPECT_EQ(classify_setup(0, 2).failure, ProbeFailure::disabled_by_sysctl);
}

TEST(Probe, EnosysNamesKernelConfigAndSeccomp) {
  const ProbeResult r = classify_setup(ENOSYS);
  EXPECT_EQ(r.failure, ProbeFailure::unsupported_enosys);
  EXPECT_TRUE(contains(r.message, "CONFIG_IO_URING")) << r.message;
  EXPECT_TRUE(contains(r.message, "seccomp")) << r.message;
}

TEST(Probe, EnomemIsMemlock) {
  const ProbeResult r = classify_setup(ENOMEM);
  EXPECT_EQ(r.failure, ProbeFailure::memlock);
  EXPECT_TRUE(contains(r.message, "RLIMIT_MEMLOCK")) << r.message;
  EXPECT_TRUE(contains(r.message, "LimitMEMLOCK")) << r.message;
}

TEST(Probe, OtherSetupErrnoIsReportedWithItsText) {
  const ProbeResult r = classify_setup(EFAULT);
  EXPECT_EQ(r.failure, ProbeFailure::setup_failed);
  EXPECT_EQ(r.error, EFAULT);
  EXPECT_TRUE(contains(r.message, "Bad address")) << r.message;
}

TEST(Probe, MissingOpcodesAreNamed) {
  std::size_t count = 0;
  const RequiredOpcode* ops = required_opcodes(&count);
  ASSERT_GE(count, 7u);
  std::size_t recvmsg_bit = count;
  std::size_t cancel_bit = count;
  for (std::size_t i = 0; i < count; ++i) {
    if (ops[i].opcode == IORING_OP_RECVMSG) recvmsg_bit = i;
    if (ops[i].opcode == IORING_OP_ASYNC_CANCEL) cancel_bit = i;
  }
  ASSERT_LT(recvmsg_bit, count);
  ASSERT_LT(cancel_bit, count);
  ProbeFacts f = healthy();
  f.opcodes_missing = (std::uint64_t{1} << recvmsg_bit) | (std::uint64_t{1} << cancel_bit);
  ProbeResult r = classify_probe(f);
  EXPECT_EQ(r.failure, ProbeFailure::opcode_missing);
  EXPECT_TRUE(contains(r.message, "IORING_OP_RECVMSG")) << r.message;
  EXPECT_TRUE(contains(r.message, "IORING_OP_ASYNC_CANCEL")) << r.message;
  EXPECT_FALSE(contains(r.message, "IORING_OP_SENDMSG")) << r.message;
  EXPECT_TRUE(contains(r.message, "Linux >= 6.0")) << r.message;
}

TEST(Probe, MissingFeatureIsNamed) {
  ProbeFacts f = healthy();
  f.features &= ~static_cast<std::uint32_t>(IORING_FEAT_FAST_POLL);
  ProbeResult r = classify_probe(f);
  EXPECT_EQ(r.failure, ProbeFailure::feature_missing);
  EXPECT_TRUE(contains(r.message, "IORING_FEAT_FAST_POLL")) << r.message;

  f = healthy();
  f.features &= ~static_cast<std::uint32_t>(IORING_FEAT_NODROP);
  r = classify_probe(f);
  EXPECT_EQ(r.failure, ProbeFailure::feature_missing);
  EXPECT_TRUE(contains(r.message, "IORING_FEAT_NODROP")) << r.message;
}

TEST(Probe, BufferRingAndMultishotFailuresAreNamed) {
  ProbeFacts f = healthy();
  f.buf_ring_errno = EINVAL;
  ProbeResult r = classify_probe(f);
  EXPECT_EQ(r.failure, ProbeFailure::buf_ring_missing);
  EXPECT_TRUE(contains(r.message, "IORING_REGISTER_PBUF_RING")) << r.message;

  f = healthy();
  f.multishot_recvmsg_errno = EINVAL;
  r = classify_probe(f);
  EXPECT_EQ(r.failure, ProbeFailure::multishot_recvmsg_missing);
  EXPECT_TRUE(contains(r.message, "multishot recvmsg")) << r.message;
}

TEST(Probe, BoottimeTimeoutsMissingIsNotFatal) {
  ProbeFacts f = healthy();
  f.boottime_timeout_errno = EINVAL;
  ProbeResult r = classify_probe(f);
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.boottime_timeouts);
}

// The real probe agrees with itself: either usable (and then with BOOTTIME timeouts, which
// every kernel with multishot recvmsg has), or a failure with a message.
TEST(Probe, RealKernel) {
  const ProbeResult& r = probe_io_uring();
  const Status usable = io_uring_usable();
  EXPECT_EQ(usable.ok(), r.ok());
  EXPECT_EQ(usable.message(), r.message);
  if (!r.ok()) {
    EXPECT_FALSE(r.message.empty());
    GTEST_SKIP() << r.message;
  }
  EXPECT_TRUE(r.boottime_timeouts);
  EXPECT_EQ(r.features & required_features(), required_features());
}

}  // namespace
}  // namespace leasehold
