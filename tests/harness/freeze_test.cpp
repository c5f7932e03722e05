// harness::Freezer on a real child: stopped (state T in /proc/<pid>/stat) while frozen by
// SIGSTOP, running again after thaw; the cgroup v2 freeze where this machine allows it.
#include "leasehold/harness/freeze.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/supervisor/cgroup.hpp"

#include <gtest/gtest.h>

#include <signal.h>

namespace leasehold::harness {
namespace {

using namespace std::chrono_literals;

/// A child that sleeps until it is killed.
Process sleeper() {
  Process p;
  Spawn s;
  s.argv = {"/bin/sleep", "600"};
  s.label = "sleeper";
  const Status started = p.start(s);
  EXPECT_TRUE(started.ok()) << started.message();
  return p;
}

bool stopped(pid_t pid) {
  const char s = process_state(pid);
  return s == 'T' || s == 't';
}

std::string cgroup_of(pid_t pid) {
  const Result<std::string> text = read_small_file("/proc/" + std::to_string(pid) + "/cgroup");
  return text ? own_cgroup2_path(*text).value_or("") : "";
}

TEST(HarnessFreeze, SigstopFreezesAndThawsAChild) {
  Process child = sleeper();
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(eventually([&] { return process_state(child.pid()) == 'S'; }));
  auto made = Freezer::make(child.pid(), "sigstop");
  ASSERT_TRUE(made.ok()) << made.message();
  auto f = std::move(made).value();
  EXPECT_EQ(f->kind(), Freezer::Kind::sigstop);
  EXPECT_STREQ(f->name(), "sigstop");
  EXPECT_EQ(f->why(), "SIGSTOP/SIGCONT (asked for)");
  EXPECT_EQ(f->home(), "");

  const std::int64_t before = now_ns();
  const Result<std::int64_t> frozen_ns = f->freeze();
  ASSERT_TRUE(frozen_ns.ok()) << frozen_ns.message();
  EXPECT_GE(*frozen_ns, before);
  EXPECT_TRUE(stopped(child.pid()));
  const Result<std::int64_t> thawed_ns = f->thaw();
  ASSERT_TRUE(thawed_ns.ok()) << thawed_ns.message();
  EXPECT_GE(*thawed_ns, *frozen_ns);
  EXPECT_FALSE(stopped(child.pid()));
  EXPECT_TRUE(child.running());
}

TEST(HarnessFreeze, DestructionThawsAChildLeftFrozen) {
  Process child = sleeper();
  ASSERT_GT(child.pid(), 0);
  {
    auto made = Freezer::make(child.pid(), "sigstop");
    ASSERT_TRUE(made.ok()) << made.message();
    auto f = std::move(made).value();
    ASSERT_TRUE(f->freeze().ok());
    ASSERT_TRUE(stopped(child.pid()));
  }
  EXPECT_TRUE(eventually([&] { return !stopped(child.pid()); }, 2'000ms));
  EXPECT_TRUE(child.running());
}

TEST(HarnessFreeze, ThawIfFrozenIsANoOpWhenNotFrozen) {
  Process child = sleeper();
  auto made = Freezer::make(child.pid(), "sigstop");
  ASSERT_TRUE(made.ok()) << made.message();
  auto f = std::move(made).value();
  EXPECT_TRUE(f->thaw_if_frozen().ok());
  EXPECT_FALSE(stopped(child.pid()));
}

TEST(HarnessFreeze, ProcessStateOfNoProcessIsUnknown) {
  Process child = sleeper();
  const pid_t pid = child.pid();
  child.kill9();
  EXPECT_EQ(process_state(pid), '?');
  EXPECT_EQ(freeze_leaf_name(42), "leasehold-pause-42");
}

TEST(HarnessFreeze, NothingToThawOutsideALeaf) {
  Process child = sleeper();
  EXPECT_FALSE(thaw_left_frozen(child.pid()).has_value());
}

TEST(HarnessFreeze, CgroupFreezeMovesTheChildIntoALeafAndBack) {
  Process child = sleeper();
  ASSERT_GT(child.pid(), 0);
  const std::string home = cgroup_of(child.pid());
  auto made = Freezer::make(child.pid(), "auto");
  ASSERT_TRUE(made.ok()) << made.message();
  auto f = std::move(made).value();
  if (f->kind() != Freezer::Kind::cgroup) GTEST_SKIP() << "no cgroup v2 freeze here: " << f->why();
  EXPECT_EQ(f->why(), "cgroup v2 freeze of " + f->leaf());
  const std::string leaf_name = freeze_leaf_name(child.pid());
  EXPECT_EQ(f->leaf(), f->home() + "/" + leaf_name);
  const std::string in_leaf = cgroup_of(child.pid());
  EXPECT_EQ(in_leaf.substr(in_leaf.size() - leaf_name.size()), leaf_name);

  ASSERT_TRUE(f->freeze().ok());
  Result<std::string> events = read_small_file(f->leaf() + "/cgroup.events");
  ASSERT_TRUE(events.ok()) << events.message();
  EXPECT_EQ(parse_cgroup_keyed(*events, "frozen"), 1);
  ASSERT_TRUE(f->thaw().ok());
  events = read_small_file(f->leaf() + "/cgroup.events");
  ASSERT_TRUE(events.ok()) << events.message();
  EXPECT_EQ(parse_cgroup_keyed(*events, "frozen"), 0);

  // Frozen again and the freezer dropped: a driver that died would leave this; recovered here.
  ASSERT_TRUE(f->freeze().ok());
  const std::string leaf = f->leaf();
  f.reset();
  EXPECT_EQ(cgroup_of(child.pid()), home);
  EXPECT_FALSE(fs::exists(leaf));
  EXPECT_TRUE(child.running());
}

}  // namespace
}  // namespace leasehold::harness
