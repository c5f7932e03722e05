// harness::Deployment: the keys it writes, lockd and a supervisor started and stopped in order.
#include "leasehold/harness/deployment.hpp"

#include "leasehold/supervisor/config.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

namespace leasehold::harness {
namespace {

using namespace std::chrono_literals;

TEST(HarnessDeployment, KeysAreTheClusterKeyAndAWorkerKeyDerivedFromIt) {
  TempDir dir("harness-deployment");
  Deployment d(dir.path());
  EXPECT_FALSE(d.key().has_value());
  EXPECT_EQ(d.make_worker_key("w.key", random_worker_id()).code(), Errc::not_found);  // no cluster key yet
  ASSERT_TRUE(d.make_cluster_key().ok());
  ASSERT_TRUE(d.key().has_value());
  const auto cluster = wire::load_key_file(d.cluster_key_file().string());
  ASSERT_TRUE(cluster) << cluster.message();
  EXPECT_EQ(cluster->key_id, d.key()->key_id);
  EXPECT_EQ(cluster->bytes, d.key()->bytes);
  EXPECT_EQ(cluster->kind, wire::KeyKind::cluster);
  struct stat st {};
  ASSERT_EQ(::stat(d.cluster_key_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const WorkerId worker = random_worker_id();
  ASSERT_TRUE(d.make_worker_key("w.key", worker).ok());
  const auto w = wire::load_key_file((dir.path() / "w.key").string());
  ASSERT_TRUE(w) << w.message();
  const wire::WireKey expected = wire::derive_worker_key(*d.key(), worker);
  EXPECT_EQ(w->key_id, expected.key_id);
  EXPECT_EQ(w->bytes, expected.bytes);
  EXPECT_EQ(w->kind, wire::KeyKind::worker);
  EXPECT_NE(w->bytes, d.key()->bytes);
}

TEST(HarnessDeployment, ALockdThatCannotRunIsNotReady) {
  TempDir dir("harness-deployment");
  Deployment d(dir.path());
  ASSERT_TRUE(d.make_cluster_key().ok());
  LockdSpec spec;
  spec.bin = (dir.path() / "no-such-lockd").string();
  spec.ready_timeout = 10'000ms;
  const Started s = d.start_lockd(spec);
  EXPECT_EQ(s.kind, Started::Kind::not_ready);
  EXPECT_NE(s.error.find("exited during start-up (code 127"), std::string::npos) << s.error;
  EXPECT_NE(s.error.find("cannot execute"), std::string::npos) << s.error;
}

#if defined(LEASEHOLD_LOCKD_BINARY) && defined(LEASEHOLD_SUPERVISOR_BINARY)
TEST(HarnessDeployment, StartsLockdAndASupervisorAndStopsThem) {
  TempDir dir("harness-deployment");
  Deployment d(dir.path());
  ASSERT_TRUE(d.make_cluster_key().ok());
  ASSERT_TRUE(d.make_worker_key("worker.key", random_worker_id()).ok());
  LockdSpec ls;
  ls.bin = LEASEHOLD_LOCKD_BINARY;
  ls.ttl_ms = 2000;
  const Started lockd = d.start_lockd(ls);
  ASSERT_TRUE(lockd.ok()) << lockd.error;
  EXPECT_EQ(d.lockd_text().rfind("127.0.0.1:", 0), 0u) << d.lockd_text();
  EXPECT_EQ(d.lockd_address().str(), d.lockd_text());

  SupervisorSpec ss;
  ss.bin = LEASEHOLD_SUPERVISOR_BINARY;
  ss.key_file = dir.path() / "worker.key";
  ss.control_socket = dir.path() / "sup.sock";
  ss.shm = dir.path() / "table";
  ss.log = dir.path() / "sup.log";
  ss.ttl_ms = 2000;
  ss.kill_after_ms = 1400;
  ss.heartbeat_interval_ms = 200;
  ss.extra_args = {"--isolation", "off"};
  std::size_t index = 99;
  const Started sup = d.start_supervisor(ss, &index);
  if (!sup.ok() && slurp(ss.log).find("io_uring") != std::string::npos)
    GTEST_SKIP() << "the supervisor cannot run here: " << sup.error;
  ASSERT_TRUE(sup.ok()) << sup.error;
  EXPECT_EQ(index, 0u);
  EXPECT_EQ(d.supervisors(), 1u);

  const auto status = Deployment::request(ss.control_socket, {{"op", "status"}});
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(status->value("ok", false), true) << status->dump();
  EXPECT_EQ(status->value("pid", -1), d.supervisor(0).pid());
  EXPECT_EQ(status->value("ttl_ms", 0), 2000);

  d.stop_supervisors();
  EXPECT_FALSE(d.supervisor(0).running());
  EXPECT_TRUE(d.lockd().running());
  d.stop_lockd();
  EXPECT_FALSE(d.lockd().running());
}
#endif

}  // namespace
}  // namespace leasehold::harness
