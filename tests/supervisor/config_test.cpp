// The start-up checks of the supervisor's configuration (DESIGN.md "Time").
#include "leasehold/supervisor/config.hpp"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <grp.h>
#include <pwd.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <fstream>
#include <string>
#include <vector>

namespace leasehold {
namespace {

SupervisorConfig valid() {
  SupervisorConfig c;
  c.lockd_address = "127.0.0.1:7000";
  c.key_file = "/tmp/key";
  c.ttl_ms = 1000;
  c.kill_after_ms = 600;
  c.heartbeat_interval_ms = 100;
  c.kill_latency_budget_ms = 50;
  c.clock_rate_bound = 1e-3;
  c.wheel_granularity_ns = 1'000'000;
  return c;
}

TEST(SupervisorConfig, ValidConfigReportsPauseBudget) {
  const auto r = check_config(valid());
  ASSERT_TRUE(r.ok()) << r.message();
  // ttl − (kill_after·(1+ρ) + granularity + kill budget) = 1000 − (600.6 + 1 + 50) ms.
  EXPECT_EQ(r->pause_budget_ns, 348'400'000);
  EXPECT_EQ(r->refresh_attempts, 6u);
}

TEST(SupervisorConfig, RefusesUnsafeTimingWithTheNumbers) {
  SupervisorConfig c = valid();
  c.kill_after_ms = 950;  // 950.95 + 1 + 50 > 999
  const auto r = check_config(c);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.message().find("unsafe timing"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("950.950 ms"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("999.000 ms"), std::string::npos) << r.message();
  EXPECT_LT(timing::check_safety(timing::inputs_of(c)).pause_budget_ns, 0);
}

TEST(SupervisorConfig, SafetyBoundaryIsStrict) {
  // Left side exactly equal to ttl·(1−ρ) with ρ = 0: refused (the condition is "<").
  SupervisorConfig c = valid();
  c.clock_rate_bound = 0.0;
  c.ttl_ms = 1000;
  c.kill_after_ms = 900;
  c.kill_latency_budget_ms = 99;
  c.wheel_granularity_ns = 1'000'000;
  EXPECT_FALSE(check_config(c).ok());
  c.kill_latency_budget_ms = 98;
  const auto ok = check_config(c);
  EXPECT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->pause_budget_ns, 1'000'000);
}

TEST(SupervisorConfig, ClockRateBoundShrinksTheBudget) {
  SupervisorConfig c = valid();
  c.clock_rate_bound = 0.05;  // 630 + 1 + 50 = 681 < 950
  const auto r = check_config(c);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->pause_budget_ns, 319'000'000);
  c.clock_rate_bound = 0.2;
  EXPECT_FALSE(check_config(c).ok());
}

// Rounding toward safety (lease/timing.hpp): ρ = 1.5e-9 is 2 ppb, so kill_after·(1+ρ) counts
// 2 ns over 1 s, and the budget is the exact 1'000'001.5 ns rounded down, not to the nearest.
TEST(SupervisorConfig, PauseBudgetRoundsTowardSafety) {
  SupervisorConfig c = valid();
  c.ttl_ms = 3000;
  c.kill_after_ms = 1000;
  c.heartbeat_interval_ms = 100;
  c.clock_rate_bound = 1.5e-9;
  c.wheel_granularity_ns = 99'999'997;
  c.kill_latency_budget_ms = 1899;
  const auto r = check_config(c);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->pause_budget_ns, 1'000'001);
  // A kill budget of 1900 ms: exact left 2'999'999'998.5 ns is above ttl·(1−ρ) =
  // 2'999'999'995.5, though below the TTL (the budget, ttl − left, is 1.5 ns, rounded down).
  c.kill_latency_budget_ms = 1900;
  const auto unsafe = check_config(c);
  EXPECT_FALSE(unsafe.ok());
  EXPECT_EQ(timing::check_safety(timing::inputs_of(c)).pause_budget_ns, 1);
}

TEST(SupervisorConfig, RefusesTooFewRefreshAttempts) {
  SupervisorConfig c = valid();
  c.heartbeat_interval_ms = 250;  // 600 / 250 = 2 attempts
  const auto r = check_config(c);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.message().find("only 2 refresh attempt"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("<= 200 ms"), std::string::npos) << r.message();
  c.heartbeat_interval_ms = 200;
  EXPECT_TRUE(check_config(c).ok());
}

TEST(SupervisorConfig, RefusesOutOfRangeFields) {
  SupervisorConfig c = valid();
  c.ttl_ms = 0;
  EXPECT_NE(check_config(c).message().find("--ttl-ms"), std::string::npos);
  c = valid();
  c.slots = 0;
  EXPECT_NE(check_config(c).message().find("--slots"), std::string::npos);
  c = valid();
  c.rt_priority = 100;
  EXPECT_NE(check_config(c).message().find("--rt-priority"), std::string::npos);
  c = valid();
  c.lockd_address.clear();
  EXPECT_NE(check_config(c).message().find("--lockd"), std::string::npos);
  c = valid();
  c.heartbeat_interval_ms = 0;
  EXPECT_NE(check_config(c).message().find("--heartbeat-interval-ms"), std::string::npos);
  c = valid();
  c.rt_command_poll_ns = 0;
  EXPECT_NE(check_config(c).message().find("--rt-command-poll-us 0 is out of range"), std::string::npos);
}

// Several lockd addresses: failover + longest retry gap < kill_after − heartbeat_interval
// (config.hpp). valid(): kill_after 600 ms, heartbeat 100 ms, so the retry gap is 120 ms (the
// interval + 20 % jitter) and the right side 500 ms.
TEST(SupervisorConfig, RefusesAFailoverBoundTooLongForTheKillSwitch) {
  SupervisorConfig c = valid();
  c.lockd_address = "127.0.0.1:7000,127.0.0.1:7001";
  c.lockd_failover_ms = 3000;
  const auto r = check_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("unsafe failover"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("with 2 lockd addresses"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("3000.000 ms + 120.000 ms = 3120.000 ms is not below"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("600.000 ms - 100.000 ms = 500.000 ms"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("--lockd-failover-ms"), std::string::npos) << r.message();
  // The boundary is strict: 380 + 120 = 500 is refused, 379 leaves a margin of 1 ms.
  c.lockd_failover_ms = 380;
  EXPECT_FALSE(check_config(c).ok());
  c.lockd_failover_ms = 379;
  const auto ok = check_config(c);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->failover_margin_ns, 1'000'000);
  EXPECT_EQ(ok->retry_gap_ns, 120'000'000);
  EXPECT_EQ(ok->lockd_addresses, 2u);
}

TEST(SupervisorConfig, TheFailoverConditionHoldsOnlyForSeveralAddresses) {
  SupervisorConfig c = valid();
  c.lockd_failover_ms = 3000;  // far beyond kill_after: irrelevant with one lockd
  const auto one = check_config(c);
  ASSERT_TRUE(one.ok()) << one.message();
  EXPECT_EQ(one->lockd_addresses, 1u);
  EXPECT_EQ(one->failover_margin_ns, 0);
  c.lockd_address = "127.0.0.1:7000, 127.0.0.1:7000";  // one address written twice
  EXPECT_TRUE(check_config(c).ok());
  // The defaults (ttl 10 s, kill after 7 s, heartbeat 1 s, failover 3 s) leave 1.8 s.
  SupervisorConfig d;
  d.lockd_address = "10.0.0.1:7400,10.0.0.2:7400,10.0.0.3:7400";
  d.key_file = "/k";
  const auto defaults = check_config(d);
  ASSERT_TRUE(defaults.ok()) << defaults.message();
  EXPECT_EQ(defaults->failover_margin_ns, 1'800'000'000);
  c.lockd_failover_ms = 0;
  EXPECT_NE(check_config(c).message().find("--lockd-failover-ms 0 is out of range"), std::string::npos);
}

TEST(SupervisorConfig, RefusesAMalformedLockdListNamingTheEntry) {
  SupervisorConfig c = valid();
  c.lockd_address = "127.0.0.1:7000,lockd-2";
  const auto r = check_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--lockd \"lockd-2\" (entry 2 of 2): expected HOST:PORT"), std::string::npos)
      << r.message();
}

TEST(SupervisorConfig, TheShippedExampleConfigFileIsValid) {
  // packaging/supervisor.toml, what /etc/leasehold/supervisor.toml starts as.
  CLI::App app;
  SupervisorConfig c;
  add_supervisor_flags(app, c);
  const char* argv[] = {"leasehold-supervisor", "--config", LEASEHOLD_SOURCE_DIR "/packaging/supervisor.toml",
                        "--log-level", "debug"};
  app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv));
  EXPECT_EQ(c.lockd_address, "127.0.0.1:7400");
  EXPECT_EQ(c.key_file, "/etc/leasehold/worker.key");
  EXPECT_FALSE(c.worker_id.has_value()) << "the worker id is the key's";
  EXPECT_EQ(c.log.level, LogLevel::debug) << "the command line overrides the file";
  EXPECT_EQ(c.ttl_ms, 10'000u);
}

TEST(SupervisorConfig, FlagsParse) {
  CLI::App app;
  SupervisorConfig c;
  add_supervisor_flags(app, c);
  const char* argv[] = {"leasehold-supervisor", "--no-config", "--lockd", "127.0.0.1:9", "--key-file", "/k", "--lockd-failover-ms", "1500",
                        "--worker-id", "0f8fad5b-d9cb-469f-a165-70867728950e", "--mode",
                        "preemptible", "--on-shutdown", "keep", "--ttl-ms", "2000", "--slots", "7",
                        "--rt-command-poll-us", "2000"};
  app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv));
  EXPECT_EQ(c.lockd_address, "127.0.0.1:9");
  EXPECT_EQ(c.lockd_failover_ms, 1500u);
  ASSERT_TRUE(c.worker_id.has_value());
  EXPECT_EQ(c.worker_id->str(), "0f8fad5b-d9cb-469f-a165-70867728950e");
  EXPECT_EQ(c.mode, SupervisorMode::preemptible);
  EXPECT_EQ(c.on_shutdown, ShutdownPolicy::keep);
  EXPECT_EQ(c.ttl_ms, 2000u);
  EXPECT_EQ(c.slots, 7u);
  EXPECT_EQ(c.rt_command_poll_ns, 2'000'000u);
}

TEST(SupervisorConfig, FlagsRejectBadWorkerIdAndMode) {
  {
    CLI::App app;
    SupervisorConfig c;
    add_supervisor_flags(app, c);
    const char* argv[] = {"s", "--no-config", "--lockd", "a:1", "--key-file", "/k", "--worker-id", "nope"};
    EXPECT_THROW(app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv)),
                 CLI::ParseError);
  }
  {
    CLI::App app;
    SupervisorConfig c;
    add_supervisor_flags(app, c);
    const char* argv[] = {"s", "--no-config", "--lockd", "a:1", "--key-file", "/k", "--mode", "eventual"};
    EXPECT_THROW(app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv)),
                 CLI::ParseError);
  }
}

// The host-wide claim on a sandbox uid range: overlaps with a live holder are refused with both
// ranges and the holder named; adjacent ranges are fine; a dead holder's file is taken over.
TEST(UidRangeLock, RefusesAnOverlapWithALiveHolder) {
  char tmpl[] = "/tmp/leasehold-uid-ranges-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/uid-ranges";
  UidRangeLock a, b, c;
  EXPECT_TRUE(a.claim(dir, 1000, 100, "pid 1, worker A").ok());
  EXPECT_TRUE(a.held());
  const Status why = b.claim(dir, 1050, 100, "pid 2, worker B");
  EXPECT_EQ(why.code(), Errc::refused);
  EXPECT_NE(why.message().find("uid range 1050:100 overlaps 1000:100 of a live supervisor on this host (pid 1, worker A"),
            std::string::npos)
      << why.message();
  EXPECT_FALSE(b.held());
  EXPECT_FALSE(b.claim(dir, 900, 101, "B").ok()) << "ends inside";
  EXPECT_TRUE(c.claim(dir, 1100, 100, "pid 3, worker C").ok()) << "adjacent ranges do not overlap";
  EXPECT_TRUE(b.claim(dir, 900, 100, "pid 2, worker B").ok()) << "adjacent below";
  a.release();
  EXPECT_FALSE(std::filesystem::exists(dir + "/range-1000-100"));
  UidRangeLock a2;
  EXPECT_TRUE(a2.claim(dir, 1000, 100, "pid 4, worker A2").ok()) << "free again once released";
  // A holder that died (its file left, nobody holding the lock) does not block its range.
  { std::ofstream(dir + "/range-5000-10") << "pid 5, worker gone\n"; }
  UidRangeLock d;
  EXPECT_TRUE(d.claim(dir, 5005, 1, "pid 6, worker D").ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/range-5000-10"));
  // A lock directory others may write is refused (anyone could remove a holder's file).
  d.release();
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const Status open_dir = d.claim(dir, 7000, 1, "D");
  EXPECT_EQ(open_dir.code(), Errc::permission_denied);
  EXPECT_NE(open_dir.message().find("neither group nor others may write"), std::string::npos) << open_dir.message();
  std::filesystem::remove_all(tmpl);
}

// A supervisor that died leaves its worker lock (and maybe a file-backed table and an empty log
// directory): the next supervisor to start sweeps them. A lock someone holds is kept with all of
// its worker's files, and so are our own lock and files that only look like locks.
TEST(StaleWorkers, LocksNobodyHoldsAreSweptWithTheirFilesHeldOnesAreKept) {
  char tmpl[] = "/tmp/leasehold-stale-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, locks = dir + "/run", shm = dir + "/shm";
  std::filesystem::create_directories(locks);
  std::filesystem::create_directories(shm);
  const WorkerId dead = random_worker_id(), live = random_worker_id(), self = random_worker_id();
  auto touch = [](const std::string& p) { std::ofstream(p) << "x\n"; };
  for (const WorkerId& w : {dead, live, self}) {
    touch(locks + "/worker-" + w.str() + ".lock");
    touch(shm + "/leasehold-" + w.str());
    std::filesystem::create_directories(locks + "/sandbox-logs-" + w.str());
  }
  touch(locks + "/sandbox-logs-" + live.str() + "/kept.log");
  touch(locks + "/worker-not-a-uuid.lock");
  touch(locks + "/worker-" + dead.str() + ".lock.bak");
  // The live one's lock is held (as its supervisor holds it, by flock on an open descriptor).
  const int held = ::open((locks + "/worker-" + live.str() + ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);

  const std::vector<SweptWorker> swept = sweep_stale_workers(locks, shm, self);
  ASSERT_EQ(swept.size(), 1u);
  EXPECT_EQ(swept[0].worker, dead);
  EXPECT_EQ(swept[0].removed, (std::vector<std::string>{shm + "/leasehold-" + dead.str(),
                                                        locks + "/sandbox-logs-" + dead.str(),
                                                        locks + "/worker-" + dead.str() + ".lock"}));
  for (const std::string& gone : swept[0].removed) EXPECT_FALSE(std::filesystem::exists(gone)) << gone;
  for (const WorkerId& w : {live, self}) {
    EXPECT_TRUE(std::filesystem::exists(locks + "/worker-" + w.str() + ".lock")) << w.str();
    EXPECT_TRUE(std::filesystem::exists(shm + "/leasehold-" + w.str())) << w.str();
    EXPECT_TRUE(std::filesystem::exists(locks + "/sandbox-logs-" + w.str())) << w.str();
  }
  EXPECT_TRUE(std::filesystem::exists(locks + "/worker-not-a-uuid.lock"));
  EXPECT_TRUE(std::filesystem::exists(locks + "/worker-" + dead.str() + ".lock.bak"));
  // Once its holder lets go (dies), the live one's are stale too; a sandbox's output is kept.
  ::close(held);
  const std::vector<SweptWorker> later = sweep_stale_workers(locks, shm, self);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].worker, live);
  EXPECT_FALSE(std::filesystem::exists(locks + "/worker-" + live.str() + ".lock"));
  EXPECT_TRUE(std::filesystem::exists(locks + "/sandbox-logs-" + live.str() + "/kept.log"));
  std::filesystem::remove_all(tmpl);
}

// A sandbox uid range must hold no uid 0, no account's uid and no group's gid (a sandbox runs as
// uid and gid START + slot): the first one found is named, with the subordinate-range fix.
TEST(UidRange, AccountsOfTheHostAreRefused) {
  const Status root = check_uid_range_accounts(0, 10);
  EXPECT_EQ(root.code(), Errc::exists);
  EXPECT_NE(root.message().find("contains uid 0 (root)"), std::string::npos) << root.message();
  std::optional<std::pair<uid_t, std::string>> account;
  ::setpwent();
  while (const passwd* pw = ::getpwent())
    if (pw->pw_uid != 0 && !account) account = std::make_pair(pw->pw_uid, std::string(pw->pw_name));
  ::endpwent();
  ASSERT_TRUE(account) << "no account besides root in the passwd database";
  const std::string why = check_uid_range_accounts(account->first, 1).message();
  EXPECT_NE(why.find("uid range " + std::to_string(account->first) + ":1 contains uid " +
                     std::to_string(account->first) + " (account " + account->second + ")"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("/etc/subuid"), std::string::npos) << why;
  EXPECT_EQ(check_uid_range_accounts(account->first - std::min<uid_t>(account->first - 1, 3), 8).code(), Errc::exists)
      << "a range around the account";
  // A group whose gid no account has as its uid: refused as a group.
  std::optional<std::pair<gid_t, std::string>> group_only;
  ::setgrent();
  while (const group* gr = ::getgrent())
    if (gr->gr_gid != 0 && ::getpwuid(gr->gr_gid) == nullptr && !group_only)
      group_only = std::make_pair(gr->gr_gid, std::string(gr->gr_name));
  ::endgrent();
  if (group_only) {
    const std::string g = check_uid_range_accounts(group_only->first, 1).message();
    EXPECT_NE(g.find("contains gid " + std::to_string(group_only->first) + " (group " + group_only->second + ")"),
              std::string::npos)
        << g;
  }
  // Far above every account (the tests' own ranges): accepted.
  const Status far = check_uid_range_accounts(3'000'000'000u, 1024);
  EXPECT_TRUE(far.ok()) << far.message();
}

TEST(SupervisorConfig, DefaultPaths) {
  const WorkerId w = *WorkerId::parse("0f8fad5b-d9cb-469f-a165-70867728950e");
  EXPECT_EQ(default_shm_path(w), "memfd:leasehold-0f8fad5b-d9cb-469f-a165-70867728950e");
  setenv("LEASEHOLD_CONTROL_SOCKET", "/tmp/x.sock", 1);
  EXPECT_EQ(default_control_socket_path(), "/tmp/x.sock");
  unsetenv("LEASEHOLD_CONTROL_SOCKET");
  EXPECT_FALSE(default_control_socket_path().empty());
  const WorkerId a = random_worker_id();
  const WorkerId b = random_worker_id();
  EXPECT_NE(a, b);
  EXPECT_EQ((a.hi >> 12) & 0xf, 4u);  // UUIDv4
}

}  // namespace
}  // namespace leasehold
