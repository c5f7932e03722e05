// lockd's log path under a stderr nobody reads: every answer still comes (io/log_writer.hpp).
// Before, lockd wrote each log line with a blocking write(2) on its io thread, so once the pipe
// was full it stopped answering, heartbeating and expiring altogether.
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

namespace leasehold::lockd {
namespace {

using namespace testing;

TEST(LockdLog, AFullStderrPipeDoesNotStallAnswers) {
  if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
  TempDir dir;
  const wire::WireKey key = make_key(dir.path());
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::fcntl(p[1], F_SETPIPE_SZ, 4096);  // full after a page of log lines; nobody reads p[0]
  LockdProcess lockd;
  std::string err;
  ASSERT_TRUE(lockd.start({"--key-file", (dir.path() / "lockd.key").string(), "--store",
                           (dir.path() / "lockd.db").string()},
                          dir.path() / "lockd.log", &err, p[1]))
      << err;
  ::close(p[1]);
  const WorkerId w{0x77, 1};
  AdminClient client(lockd.address(), key, w);
  // Every grant and release is a durable change, and each logs a line: 200 cycles are many
  // pages of log.
  for (int i = 0; i < 200; ++i) {
    const SandboxId sb{0x51, static_cast<std::uint64_t>(i + 1)};
    const std::string name = "log/" + std::to_string(i);
    const Answer a = client.acquire(name, sb, w);
    const auto* g = a.as<wire::Grant>();
    ASSERT_NE(g, nullptr) << "acquire " << i << ": " << a.message();
    const Answer r = client.release(g->name_id, sb, g->epoch);
    ASSERT_TRUE(r.ok()) << "release " << i << ": " << r.message();
    ASSERT_EQ(r.as<wire::Deny>(), nullptr) << "release " << i;
  }
  const auto counters = client.counters();
  ASSERT_TRUE(counters) << counters.message();
  bool found = false;
  for (const auto& c : *counters) found |= c.key == "log_lines_dropped";
  EXPECT_TRUE(found) << "stats name the dropped log lines";
  EXPECT_TRUE(lockd.running());
  ::close(p[0]);
}

}  // namespace
}  // namespace leasehold::lockd
