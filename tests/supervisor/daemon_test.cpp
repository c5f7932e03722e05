// leasehold-supervisor as a real process against a real leasehold-lockd on loopback
// (DESIGN.md "The supervisor", "Time"). Short TTLs keep every test to a few seconds:
//   lockd --ttl-ms 1000; supervisor --ttl-ms 1000 --kill-after-ms 600 --heartbeat-interval-ms 100
//   --kill-latency-budget-ms 50 → pause budget 1000 − (600.6 + 1 + 50) = 348.4 ms.
// Timestamps on both sides are CLOCK_BOOTTIME (one machine): the supervisor's log lines, lockd's
// log lines, the lease_probe sandbox's log, and this test's own clock reads.
#include "daemon_process.hpp"

#include "leasehold/io/probe.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/control.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>

#include <fstream>

#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace leasehold {
namespace {

using namespace supervisor_testing;

const std::vector<std::string> kSupTiming = {"--ttl-ms", "1000", "--kill-after-ms", "600",
                                             "--heartbeat-interval-ms", "100", "--kill-latency-budget-ms", "50"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

json run_req(const std::string& name, std::vector<std::string> argv) {
  json r = {{"v", 1}, {"op", "run"}, {"argv", argv}, {"env", {{"PATH", "/usr/bin:/bin"}}}};
  if (!name.empty()) r["name"] = name;
  return r;
}

class SupervisorProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
  }
  void start_lockd(std::vector<std::string> extra = {"--ttl-ms", "1000"}) {
    std::string err;
    ASSERT_TRUE(lockd_.start(dir_.path(), key_, std::move(extra), &err)) << err;
  }
  void start_sup(Supervisor& s, std::vector<std::string> extra = {}, const std::string& tag = "sup") {
    std::string err;
    if (std::find(extra.begin(), extra.end(), "--slots") == extra.end()) extra.insert(extra.end(), {"--slots", "16"});
    ASSERT_TRUE(s.start(dir_.path(), lockd_.address, key_, with(kSupTiming, extra), &err, tag)) << err;
  }
  // A supervisor that reaches lockd through `relay` (the relay then decides what gets through).
  void start_sup_via(Supervisor& s, const harness::UdpRelay& relay, std::vector<std::string> extra = {}) {
    std::string err;
    extra.insert(extra.end(), {"--slots", "16"});
    ASSERT_TRUE(s.start(dir_.path(), relay.address(), key_, with(kSupTiming, extra), &err)) << err;
  }
  // Two unnamed sandboxes on `sup`, one that writes nothing and one that writes "kept\n"; their
  // run answers, once both have exited (their logs answer "running": false).
  std::pair<json, json> quiet_and_chatty(const Supervisor& sup) {
    const json quiet = sup.call(run_req("", {"true"}));
    const json chatty = sup.call(run_req("", {"sh", "-c", "echo kept"}));
    EXPECT_TRUE(eventually([&] {
      for (const json& a : {quiet, chatty})
        if (!a.contains("sandbox") || sup.call({{"v", 1}, {"op", "logs"}, {"sandbox", a["sandbox"]}}).value("running", true))
          return false;
      return true;
    }, 10'000));
    return {quiet, chatty};
  }
  void seq_top_attack(bool defended);  // OneDatagramAtTheTopSeq... below
  void commit_before_spawn_attack(bool defended);  // PreemptibleCommitsOnly... below
  lockd::AdminClient admin() { return lockd::AdminClient(lockd_.socket_address(), load_key(key_)); }
  std::string probe_log(const std::string& tag) const { return (dir_.sandbox_dir() / (tag + ".probe")).string(); }
  json run_probe(const Supervisor& s, const std::string& name, const std::string& tag) {
    return s.call(run_req(name, {LEASEHOLD_PROBE_BINARY, probe_log(tag)}));
  }
  // The killed event of a sandbox, once it is in the supervisor's log.
  std::optional<std::map<std::string, std::string>> killed(const Supervisor& s, const std::string& sandbox,
                                                           int timeout_ms = 5000) {
    std::optional<std::map<std::string, std::string>> found;
    eventually([&] {
      for (auto& e : s.events("killed"))
        if (e["sandbox"] == sandbox) found = e;
      return found.has_value();
    }, timeout_ms);
    return found;
  }

  TempDir dir_;
  std::string key_;
  Lockd lockd_;
};

// ---- the lease ------------------------------------------------------------------------------

TEST_F(SupervisorProcess, LeaseStaysAliveAcrossManyIntervals) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json a = run_probe(sup, "alive", "alive");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const Epoch epoch = a["epoch"];
  EXPECT_GE(epoch, 1u);
  sleep_ms(2000);  // 20 heartbeat intervals, 2 TTLs
  const json list = sup.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
  EXPECT_EQ(list["sandboxes"][0]["state"], "running");
  EXPECT_GT(list["sandboxes"][0]["valid_until_ms"].get<std::int64_t>(), 0);
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_GE(st["counters"]["refreshed"].get<int>(), 10) << st.dump();
  EXPECT_EQ(st["counters"]["kills_deadline"], 0);
  EXPECT_EQ(st["counters"]["lost"], 0);
  // The sandbox's own check said "valid" once and never changed its mind.
  const auto lines = probe_lines(probe_log("alive"));
  ASSERT_EQ(lines.size(), 1u) << slurp(probe_log("alive")) << sup.log_text();
  EXPECT_EQ(lines[0].valid, 1);
  // lockd agrees: held by this sandbox at this epoch, on this worker.
  auto ad = admin();
  const lockd::Answer show = ad.show("alive");
  const auto* info = show.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << show.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.epoch, epoch);
  EXPECT_EQ(info->record.holder.str(), a["sandbox"].get<std::string>());
  EXPECT_EQ(info->record.worker.str(), sup.worker);
}

// A supervisor that died under a random worker id leaves its worker lock (and, from an older
// version or with --shm leasehold-<id>, its table file in /dev/shm) for ever: nobody starts that
// worker again. The next supervisor to start removes them, and keeps a lock that is held.
TEST_F(SupervisorProcess, StaleWorkerLocksAreSweptAtStartAndHeldOnesKept) {
  if (::geteuid() != 0) GTEST_SKIP() << "root's runtime directory (/run/leasehold) is where the locks are";
  start_lockd();
  std::random_device rd;
  auto random_id = [&] { return WorkerId{(std::uint64_t{rd()} << 32) | rd(), (std::uint64_t{rd()} << 32) | rd() | 1}; };
  // Every supervisor sweeps at its start, and other tests start root supervisors in parallel:
  // one of them may sweep the stale files first. Then this supervisor logs nothing for them, and
  // the attempt is repeated with fresh ids; a supervisor that never sweeps fails every attempt.
  bool logged = false;
  std::string log;
  for (int attempt = 0; attempt < 5 && !logged; ++attempt) {
    const WorkerId dead = random_id(), live = random_id();
    const std::string dead_lock = "/run/leasehold/worker-" + dead.str() + ".lock";
    const std::string dead_shm = "/dev/shm/leasehold-" + dead.str();
    const std::string live_lock = "/run/leasehold/worker-" + live.str() + ".lock";
    const std::string live_shm = "/dev/shm/leasehold-" + live.str();
    fs::create_directories("/run/leasehold");
    for (const std::string& p : {dead_lock, dead_shm, live_lock, live_shm}) std::ofstream(p) << "4242\n";
    const int held = ::open(live_lock.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(held, 0);
    ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
    {
      Supervisor sup;
      start_sup(sup, {}, "sup" + std::to_string(attempt));
      EXPECT_FALSE(fs::exists(dead_lock));
      EXPECT_FALSE(fs::exists(dead_shm));
      EXPECT_TRUE(fs::exists(live_lock));  // held: no supervisor may sweep it
      EXPECT_TRUE(fs::exists(live_shm));
      for (auto& e : sup.events("stale_worker_swept"))
        logged |= e["worker"] == dead.str() && e["removed"] == dead_shm + "," + dead_lock;
      log = sup.log_text();
    }
    ::close(held);
    fs::remove(live_shm);
    fs::remove(live_lock);
  }
  EXPECT_TRUE(logged) << log;
}

// --lockd as a list (a replicated lockd's addresses): the first one is dead (a socket nobody
// reads), so the start-up probe's retry moves on to the real lockd, which the supervisor then
// uses for the lease; status and the start-up summary show the list, the switch and the
// failover margin (kill_after 600 − heartbeat 100 − (failover 300 + retry gap 120) = 80 ms).
TEST_F(SupervisorProcess, ADeadFirstLockdAddressIsPassedOver) {
  start_lockd();
  const int dead = open_udp_socket_blocking(SocketAddress::loopback_v4(0));
  ASSERT_GE(dead, 0);
  const std::string dead_addr = local_address(dead).value_or(SocketAddress{}).str();
  Supervisor sup;
  std::string err;
  ASSERT_TRUE(sup.start(dir_.path(), dead_addr + "," + lockd_.address, key_,
                        with(kSupTiming, {"--slots", "16", "--lockd-failover-ms", "300"}), &err))
      << err;
  const std::string out = sup.child.out();
  EXPECT_NE(out.find("lockd            " + dead_addr + ", " + lockd_.address), std::string::npos) << out;
  EXPECT_NE(out.find("failover margin  80.000 ms"), std::string::npos) << out;
  const json a = run_probe(sup, "listed", "listed");
  ASSERT_EQ(a["ok"], true) << a.dump() << sup.log_text();
  sleep_ms(300);
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(st["lockd_addresses"], json::array({dead_addr, lockd_.address})) << st.dump();
  EXPECT_GE(st["counters"]["lockd_leader_switches"].get<int>(), 1) << st.dump();
  EXPECT_EQ(st["counters"]["lockd_not_leader_answers"], 0) << st.dump();
  EXPECT_EQ(st["failover_margin_ms"], 80.0) << st.dump();
  EXPECT_EQ(st["counters"]["kills_deadline"], 0) << st.dump();
  auto ad = admin();
  const lockd::Answer show = ad.show("listed");
  const auto* info = show.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << show.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.worker.str(), sup.worker);
  ::close(dead);
}

// A failover bound the kill-switch cannot survive is refused at start, with the numbers.
TEST_F(SupervisorProcess, SeveralLockdsWithTooLongAFailoverAreRefused) {
  Supervisor sup;
  std::string err;
  EXPECT_FALSE(sup.start(dir_.path(), "127.0.0.1:9,127.0.0.1:10", key_,
                         with(kSupTiming, {"--slots", "16", "--lockd-failover-ms", "3000"}), &err));
  EXPECT_EQ(sup.child.wait(), 2);
  EXPECT_NE(sup.child.err().find("unsafe failover"), std::string::npos) << sup.child.err();
  EXPECT_NE(sup.child.err().find("3120.000 ms is not below"), std::string::npos) << sup.child.err();
}

TEST_F(SupervisorProcess, LockdStoppedKillsBeforeLockdCouldExpire) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json a = run_probe(sup, "partition", "partition");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const Epoch epoch = a["epoch"];
  const std::string sandbox = a["sandbox"];
  sleep_ms(300);
  // lockd's own view just before it stops: the lease expires no earlier than this.
  auto ad = admin();
  const std::int64_t t_show = now_ns();
  const lockd::Answer show = ad.show("partition");
  const auto* info = show.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << show.message();
  const std::int64_t lockd_expiry_at_least = t_show + std::int64_t{info->record.ttl_left_ms} * 1'000'000;
  lockd_.child.signal(SIGSTOP);
  const std::int64_t t_stop = now_ns();
  auto k = killed(sup, sandbox, 3000);
  ASSERT_TRUE(k.has_value()) << sup.log_text();
  EXPECT_EQ((*k)["cause"], "deadline");
  const std::int64_t kill_confirmed = std::stoll((*k)["confirmed_ns"]);
  EXPECT_GT(kill_confirmed, t_stop);
  // The safety property: dead before lockd could have let the lease expire.
  EXPECT_LT(kill_confirmed, lockd_expiry_at_least)
      << "killed " << (kill_confirmed - lockd_expiry_at_least) / 1000 << " us after lockd's earliest expiry";
  sleep_ms(800);  // let lockd's TTL run out on its (stopped) clock
  const std::int64_t t_cont = now_ns();
  lockd_.child.signal(SIGCONT);
  EXPECT_LT(kill_confirmed, t_cont);
  // Another acquirer gets the name, only at a higher epoch, and only after the kill.
  const SandboxId other{0x1111, 0x2222};
  const wire::Grant* g = nullptr;
  lockd::Answer ans;
  ASSERT_TRUE(eventually([&] {
    ans = ad.acquire("partition", other, WorkerId{0x3333, 0x4444});
    g = ans.as<wire::Grant>();
    return g != nullptr;
  }, 5000)) << ans.message();
  EXPECT_GT(g->epoch, epoch);
  // lockd writes its log through a bounded queue on its own thread: the answer can arrive
  // before the grant's log line does.
  std::int64_t grant_ns = 0;
  eventually([&] {
    for (auto& e : lockd_events(lockd_.log_text(), "grant"))
      if (e["name"] == "partition" && e["holder"] == other.str()) grant_ns = std::stoll(e["ts_boot_ns"]);
    return grant_ns != 0;
  }, 5000);
  ASSERT_NE(grant_ns, 0) << lockd_.log_text();
  EXPECT_LT(kill_confirmed, grant_ns);
  // The sandbox's own check never said "valid" past its valid_until: it either saw the lease
  // end (revoke / deadline) or was killed first (the wheel rounds kill deadlines down).
  const auto lines = probe_lines(probe_log("partition"));
  ASSERT_GE(lines.size(), 1u);
  EXPECT_EQ(lines[0].valid, 1);
  if (lines.size() > 1) {
    EXPECT_EQ(lines[1].valid, 0);
    EXPECT_LE(lines[1].t, lines[1].valid_until + 2'000'000);
  }
  EXPECT_LE(lines.size(), 2u) << slurp(probe_log("partition"));
  // The name was released (refused: it had expired) and nothing is left.
  EXPECT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty(); }));
}

// lockd makes the grant durable, but its answer is lost; lockd is killed and restarted (the
// lease restored with a fresh TTL); the supervisor's retry is answered idempotently with less
// than the full TTL left. That grant is kept, counted from the first send moved earlier by the
// shortfall (so the kill-switch keeps the start-up margin), not refused as a misconfigured lockd.
TEST_F(SupervisorProcess, GrantWhoseAnswerWasLostAcrossALockdRestartIsKept) {
  const std::vector<std::string> lockd_args = {"--ttl-ms", "3000"};
  start_lockd(lockd_args);
  const auto relay = start_relay(lockd_.socket_address());
  Supervisor sup;
  std::string err;
  ASSERT_TRUE(sup.start(dir_.path(), relay->address(), key_,
                        {"--ttl-ms", "3000", "--kill-after-ms", "2400", "--heartbeat-interval-ms", "100",
                         "--kill-latency-budget-ms", "50", "--slots", "16"},
                        &err))
      << err;
  relay->cut_answers(true);
  json a;
  std::thread t([&] { a = run_probe(sup, "lost-answer", "lost"); });
  std::string epoch;
  const bool durable = eventually([&] {
    for (auto& e : lockd_events(lockd_.log_text(), "grant"))
      if (e["name"] == "lost-answer") epoch = e["epoch"];
    return !epoch.empty();
  }, 2000);
  if (!durable) {
    relay->cut_answers(false);
    t.join();
    FAIL() << "lockd logged no durable grant: " << lockd_.log_text();
  }
  // The grant's log line can come before the relay has dropped its answer.
  EXPECT_TRUE(eventually([&] { return relay->answers_dropped() >= 1u; }, 2000));
  lockd_.child.kill9();
  fs::remove(dir_.path() / "lockd.out");  // the restarted lockd prints its new port there
  start_lockd(lockd_args);
  EXPECT_TRUE(relay->retarget(lockd_.socket_address()).ok());
  relay->cut_answers(false);
  t.join();
  ASSERT_EQ(a["ok"], true) << a.dump() << "\n" << sup.log_text();
  EXPECT_EQ(std::to_string(a["epoch"].get<Epoch>()), epoch);
  const auto short_grants = sup.events("short_grant");
  ASSERT_EQ(short_grants.size(), 1u) << sup.log_text();
  EXPECT_LT(std::stoul(short_grants[0].at("ttl_left_ms")), 3000u);
  // The kill-switch is timed from the first send minus the shortfall, and the first send came
  // before lockd's grant: valid_until <= grant + kill_after - shortfall.
  std::int64_t grant_ns = 0;
  for (auto& e : lockd_events(lockd_.log_text(), "grant"))
    if (e["name"] == "lost-answer") grant_ns = std::stoll(e["ts_boot_ns"]);
  const std::int64_t shortfall_ns = (3000 - std::stoll(short_grants[0].at("ttl_left_ms"))) * 1'000'000;
  EXPECT_LE(std::stoll(short_grants[0].at("valid_until_ns")), grant_ns + 2'400'000'000 - shortfall_ns);
  // Heartbeats to the restarted lockd keep it: still running past the first grant's kill deadline.
  sleep_ms(static_cast<int>(std::max<std::int64_t>(0, grant_ns + 2'600'000'000 - now_ns()) / 1'000'000));
  const json list = sup.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
  EXPECT_EQ(list["sandboxes"][0]["state"], "running");
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["counters"]["kills_deadline"], 0);
  auto ad = admin();
  const lockd::Answer show = ad.show("lost-answer");
  const auto* info = show.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << show.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.holder.str(), a["sandbox"].get<std::string>());
}

TEST_F(SupervisorProcess, FrozenSupervisorIsRecoveredAndItsSandboxRefusedMeanwhile) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  const double budget_ms = st["pause_budget_ms"];
  EXPECT_NEAR(budget_ms, 348.4, 0.01);
  // The inputs of the safety inequality are all in the status, so an operator can redo it.
  EXPECT_EQ(st["ttl_ms"], 1000);
  EXPECT_EQ(st["kill_after_ms"], 600);
  EXPECT_EQ(st["kill_latency_budget_ms"], 50);
  EXPECT_DOUBLE_EQ(st["clock_rate_bound"].get<double>(), 1e-3);
  const json a = run_probe(sup, "frozen", "frozen");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const Epoch epoch = a["epoch"];
  const std::string sandbox = a["sandbox"];
  sleep_ms(300);
  sup.child.signal(SIGSTOP);  // a pause far longer than the budget: longer than the TTL
  const std::int64_t t_stop = now_ns();
  // While it is frozen lockd expires the lease and hands the name to someone else: the
  // mutual-exclusion window the pause budget warns about.
  auto ad = admin();
  const SandboxId other{0x5555, 0x6666};
  const wire::Grant* g = nullptr;
  lockd::Answer ans;
  ASSERT_TRUE(eventually([&] {
    ans = ad.acquire("frozen", other, WorkerId{0x7777, 0x8888});
    g = ans.as<wire::Grant>();
    return g != nullptr;
  }, 3000)) << ans.message();
  EXPECT_GT(g->epoch, epoch);
  const std::int64_t t_other_grant = now_ns();
  sleep_ms(200);
  // Read the clock before resuming it: its SCHED_FIFO rt thread may run before we do.
  const std::int64_t t_cont = now_ns();
  sup.child.signal(SIGCONT);
  // Recovery: on resume the lapsed lease (and the `lost` answer) kill the sandbox.
  auto k = killed(sup, sandbox, 3000);
  ASSERT_TRUE(k.has_value()) << sup.log_text();
  const std::int64_t kill_confirmed = std::stoll((*k)["confirmed_ns"]);
  EXPECT_GE(kill_confirmed, t_cont);
  EXPECT_LT(kill_confirmed - t_cont, 1'000'000'000) << "recovery took longer than one TTL";
  // Meanwhile the sandbox's own check_deadline refused: it turned false at valid_until (or
  // earlier, when the writer's heartbeat went stale), while the supervisor was still frozen,
  // before the other holder was granted, and never turned true again.
  const auto lines = probe_lines(probe_log("frozen"));
  ASSERT_GE(lines.size(), 2u) << slurp(probe_log("frozen"));
  EXPECT_EQ(lines[0].valid, 1);
  const ProbeLine& flip = lines[1];
  EXPECT_EQ(flip.valid, 0);
  // The last sample that still saw it valid came before valid_until (however late the probe's
  // samples run on a loaded machine, none saw it valid past its deadline).
  EXPECT_LT(flip.previous_t, flip.valid_until);
  EXPECT_GT(static_cast<std::int64_t>(flip.t), t_stop);
  EXPECT_LT(static_cast<std::int64_t>(flip.t), t_cont);
  EXPECT_LT(static_cast<std::int64_t>(flip.t), t_other_grant);
  for (std::size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i].valid, 0) << "line " << i;
}

TEST_F(SupervisorProcess, SameNameOnTwoSupervisorsExactlyOneRuns) {
  start_lockd();
  Supervisor s1, s2;
  start_sup(s1, {}, "s1");
  start_sup(s2, {}, "s2");
  json a1, a2;
  std::atomic<int> ready{0};
  std::thread t1([&] {
    ++ready;
    while (ready.load() < 2) {
    }
    a1 = s1.call(run_req("contested", {"sleep", "30"}));
  });
  std::thread t2([&] {
    ++ready;
    while (ready.load() < 2) {
    }
    a2 = s2.call(run_req("contested", {"sleep", "30"}));
  });
  t1.join();
  t2.join();
  ASSERT_NE(a1["ok"], a2["ok"]) << a1.dump() << "\n" << a2.dump();
  const json& win = a1["ok"] == true ? a1 : a2;
  const json& lose = a1["ok"] == true ? a2 : a1;
  EXPECT_EQ(lose["error"], "held") << lose.dump();
  EXPECT_EQ(lose["holder"], win["sandbox"]);
  EXPECT_EQ(lose["epoch"], win["epoch"]);
  sleep_ms(300);
  const Supervisor& winner = a1["ok"] == true ? s1 : s2;
  const Supervisor& loser = a1["ok"] == true ? s2 : s1;
  EXPECT_EQ(winner.call({{"v", 1}, {"op", "list"}})["sandboxes"].size(), 1u);
  EXPECT_TRUE(loser.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty());
  EXPECT_EQ(loser.call({{"v", 1}, {"op", "status"}})["counters"]["spawned"], 0);
}

TEST_F(SupervisorProcess, ExitReleasesTheNameForTheNextEpoch) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json a = sup.call(run_req("short", {"sleep", "0.2"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const Epoch epoch = a["epoch"];
  ASSERT_TRUE(eventually([&] {
    for (auto& e : sup.events("released"))
      if (e["name"] == "short") return true;
    return false;
  }, 5000)) << sup.log_text();
  EXPECT_TRUE(sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty());
  auto ad = admin();
  const lockd::Answer g = ad.acquire("short", SandboxId{0x9, 0x9}, WorkerId{0x9, 0xa});
  const auto* grant = g.as<wire::Grant>();
  ASSERT_NE(grant, nullptr) << g.message();
  EXPECT_EQ(grant->epoch, epoch + 1);
  // And the same name runs again on this supervisor once the other holder lets go.
  ASSERT_TRUE(ad.release(name_id_of("short"), SandboxId{0x9, 0x9}, grant->epoch).ok());
  const json again = sup.call(run_req("short", {"sleep", "30"}));
  ASSERT_EQ(again["ok"], true) << again.dump();
  EXPECT_EQ(again["epoch"], epoch + 2);
  EXPECT_NE(again["slot"], a["slot"]) << "a freed slot cools down before reuse";
}

// Three sandboxes on two workers take turns at one name through lockd's FIFO of waiters: each
// runs at a new epoch, in the order it asked, and the shared file each appends to while it holds
// the name shows no overlap (every "start" is followed by its own "end" before the next start).
TEST_F(SupervisorProcess, QueuedRunsOnTwoWorkersAreServedInOrderWithoutOverlap) {
  start_lockd();
  Supervisor s1, s2;
  start_sup(s1, {}, "s1");
  start_sup(s2, {}, "s2");
  const std::string audit = (dir_.sandbox_dir() / "turns").string();
  std::ofstream(audit).close();
  ::chmod(audit.c_str(), 0666);  // the sandboxes run as different uids
  auto turn = [&](const std::string& who) {
    json r = run_req("turns", {"/bin/sh", "-c",
                               "echo start " + who + " $LEASEHOLD_EPOCH >> " + audit + "; sleep 0.4; echo end " + who +
                                   " $LEASEHOLD_EPOCH >> " + audit});
    r["queue"] = true;
    return r;
  };
  const json first = s1.call(turn("a"));
  ASSERT_EQ(first["ok"], true) << first.dump();
  json second, third;
  std::vector<json> places;  // what `leasehold run --wait` prints while it waits
  std::thread t2([&] { second = s2.call_with_progress(turn("b"), places, 20'000); });
  ASSERT_TRUE(eventually([&] { return !s2.events("queued").empty(); }, 5000)) << s2.log_text();
  std::thread t3([&] { third = s1.call(turn("c"), 20'000); });
  t2.join();
  t3.join();
  ASSERT_EQ(second["ok"], true) << second.dump() << s2.log_text();
  ASSERT_EQ(third["ok"], true) << third.dump() << s1.log_text();
  const Epoch e1 = first["epoch"], e2 = second["epoch"], e3 = third["epoch"];
  EXPECT_LT(e1, e2);
  EXPECT_LT(e2, e3);
  ASSERT_TRUE(eventually([&] { return slurp(audit).find("end c") != std::string::npos; }, 5000)) << slurp(audit);
  const std::string want = "start a " + std::to_string(e1) + "\nend a " + std::to_string(e1) + "\nstart b " +
                           std::to_string(e2) + "\nend b " + std::to_string(e2) + "\nstart c " + std::to_string(e3) +
                           "\nend c " + std::to_string(e3) + "\n";
  EXPECT_EQ(slurp(audit), want);
  const json status2 = s2.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(status2["counters"]["queue_grants"], 1);
  // b's client heard its place before its answer: first in line, behind a's sandbox.
  ASSERT_FALSE(places.empty());
  EXPECT_EQ(places[0]["progress"], "queued");
  EXPECT_EQ(places[0]["position"], 1);
  EXPECT_EQ(places[0]["holder"], first["sandbox"]);
}

// A queued run whose worker is cut off from lockd loses its place: the next waiter is served.
// Here its supervisor is frozen (SIGSTOP) while it waits, so its Wait is not re-sent.
TEST_F(SupervisorProcess, AWaiterWhoseWorkerGoesSilentIsSkipped) {
  start_lockd();
  Supervisor s1, s2, s3;
  start_sup(s1, {}, "s1");
  start_sup(s2, {}, "s2");
  start_sup(s3, {}, "s3");
  const json held = s1.call(run_req("skip", {"sleep", "30"}));
  ASSERT_EQ(held["ok"], true) << held.dump();
  json silent, next;
  std::thread t2([&] {
    json r = run_req("skip", {"sleep", "30"});
    r["queue"] = true;
    silent = s2.call(r, 15'000);
  });
  ASSERT_TRUE(eventually([&] { return !s2.events("queued").empty(); }, 5000)) << s2.log_text();
  std::thread t3([&] {
    json r = run_req("skip", {"sleep", "30"});
    r["queue"] = true;
    next = s3.call(r, 15'000);
  });
  ASSERT_TRUE(eventually([&] { return !s3.events("queued").empty(); }, 5000)) << s3.log_text();
  s2.child.signal(SIGSTOP);
  sleep_ms(1500);  // more than lockd's TTL (1 s): s2's place lapses
  const json rel = s1.call({{"v", 1}, {"op", "release"}, {"name", "skip"}});
  EXPECT_EQ(rel["ok"], true) << rel.dump();
  t3.join();
  ASSERT_EQ(next["ok"], true) << next.dump() << s3.log_text();
  EXPECT_EQ(next["epoch"], held["epoch"].get<Epoch>() + 1);
  // s3's place outlived lockd's TTL (1 s) through the entries its heartbeats carried.
  EXPECT_GE(s3.call({{"v", 1}, {"op", "status"}})["counters"]["places_renewed"].get<int>(), 2);
  // s2, resumed, asks again and joins behind s3: served once s3 lets go, at the next epoch.
  s2.child.signal(SIGCONT);
  sleep_ms(300);
  const json rel3 = s3.call({{"v", 1}, {"op", "release"}, {"name", "skip"}});
  EXPECT_EQ(rel3["ok"], true) << rel3.dump();
  t2.join();
  ASSERT_EQ(silent["ok"], true) << silent.dump() << s2.log_text();
  EXPECT_EQ(silent["epoch"], held["epoch"].get<Epoch>() + 2);
}

TEST_F(SupervisorProcess, ReleaseKillsTheHolderAndFreesTheName) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json a = sup.call(run_req("rel", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const json r = sup.call({{"v", 1}, {"op", "release"}, {"name", "rel"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["released"], true) << r.dump();
  EXPECT_EQ(r["exit_status"], -SIGKILL);
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);
  const json again = sup.call({{"v", 1}, {"op", "release"}, {"name", "rel"}});
  EXPECT_EQ(again["error"], "not_found");
}

TEST_F(SupervisorProcess, NamingAnUnnamedSandboxAndTwoPhaseCommit) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  // (2) give a name to a running unnamed sandbox.
  const json u = sup.call(run_req("", {"sleep", "30"}));
  ASSERT_EQ(u["ok"], true) << u.dump();
  EXPECT_EQ(u["epoch"], 0);
  const json n = sup.call({{"v", 1}, {"op", "name"}, {"sandbox", u["sandbox"]}, {"name", "later"}});
  ASSERT_EQ(n["ok"], true) << n.dump();
  EXPECT_GE(n["epoch"].get<int>(), 1);
  EXPECT_EQ(n["pid"], u["pid"]);
  const json twice = sup.call({{"v", 1}, {"op", "name"}, {"sandbox", u["sandbox"]}, {"name", "other"}});
  EXPECT_EQ(twice["error"], "refused") << twice.dump();
  EXPECT_NE(twice["message"].get<std::string>().find("already has the name \"later\""), std::string::npos);
  // (3) 2-phase: a control plane acquires (Acquiring); this worker commits on its next heartbeat.
  auto ad = admin();
  const SandboxId planned{0xabc, 0xdef};
  const lockd::Answer acq = ad.acquire("planned", planned, WorkerId{}, 0, /*two_phase=*/true);
  const auto* g = acq.as<wire::Grant>();
  ASSERT_NE(g, nullptr) << acq.message();
  ASSERT_EQ(g->state, LockPhase::acquiring);
  const json c = sup.call({{"v", 1}, {"op", "expect-commit"}, {"name", "planned"}, {"sandbox", planned.str()},
                           {"epoch", g->epoch}, {"argv", {"sleep", "30"}}});
  ASSERT_EQ(c["ok"], true) << c.dump();
  EXPECT_EQ(c["epoch"], g->epoch);
  EXPECT_EQ(c["sandbox"], planned.str());
  const lockd::Answer shown = ad.show("planned");
  const auto* info = shown.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.worker.str(), sup.worker);
  const json dup = sup.call({{"v", 1}, {"op", "expect-commit"}, {"name", "planned"}, {"sandbox", planned.str()},
                             {"epoch", g->epoch}, {"argv", {"sleep", "30"}}});
  EXPECT_EQ(dup["error"], "refused") << dup.dump();
  // A commit for an epoch that is not the Acquiring one starts nothing.
  const lockd::Answer acq2 = ad.acquire("planned2", SandboxId{0x1, 0x2}, WorkerId{}, 0, true);
  ASSERT_NE(acq2.as<wire::Grant>(), nullptr);
  const json bad = sup.call({{"v", 1}, {"op", "expect-commit"}, {"name", "planned2"}, {"sandbox", SandboxId{0x1, 0x2}.str()},
                             {"epoch", acq2.as<wire::Grant>()->epoch + 5}, {"argv", {"sleep", "30"}}});
  EXPECT_EQ(bad["ok"], false);
  EXPECT_EQ(bad["error"], "refused") << bad.dump();
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].size(), 2u);
}

TEST_F(SupervisorProcess, NamingThatTimesOutKeepsTheSandboxAndGivesBackTheLateGrant) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json u = sup.call(run_req("", {"sleep", "30"}));
  ASSERT_EQ(u["ok"], true) << u.dump();
  // lockd paused with the acquire in its socket queue: the naming times out here...
  lockd_.child.signal(SIGSTOP);
  const json n = sup.call({{"v", 1}, {"op", "name"}, {"sandbox", u["sandbox"]}, {"name", "late"}});
  EXPECT_EQ(n["ok"], false);
  EXPECT_EQ(n["error"], "unreachable") << n.dump();
  // ...and the sandbox is still tracked, running and unnamed (its process is alive).
  json list = sup.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
  EXPECT_EQ(list["sandboxes"][0]["sandbox"], u["sandbox"]);
  EXPECT_EQ(list["sandboxes"][0]["state"], "running");
  EXPECT_EQ(::kill(u["pid"].get<pid_t>(), 0), 0);
  // lockd resumes and grants the queued acquire after all: nobody would heartbeat that lease,
  // so the supervisor gives it back at once instead of leaving the name held for a TTL.
  lockd_.child.signal(SIGCONT);
  EXPECT_TRUE(eventually([&] {
    return sup.call({{"v", 1}, {"op", "status"}})["counters"]["late_grants_released"] == 1;
  }, 5000)) << sup.log_text();
  auto ad = admin();
  EXPECT_TRUE(eventually([&] {
    const lockd::Answer sh = ad.show("late");
    const auto* i = sh.as<wire::NameInfo>();
    return sh.message().empty() && (i == nullptr || i->record.state == LockPhase::free);
  }, 3000)) << sup.log_text();
  // The same sandbox can be named now.
  const json again = sup.call({{"v", 1}, {"op", "name"}, {"sandbox", u["sandbox"]}, {"name", "late"}});
  ASSERT_EQ(again["ok"], true) << again.dump();
  EXPECT_EQ(again["pid"], u["pid"]);
  EXPECT_EQ(again["epoch"], 2) << "the late grant used epoch 1";
}

TEST_F(SupervisorProcess, PreemptibleCreateRightAfterTheKillSwitchIsRefused) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  Supervisor sup;
  start_sup(sup, {"--mode", "preemptible"});
  const json a = sup.call(run_req("pre", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  // Another acquirer while the worker is live: lockd asks this worker whether the holder still
  // runs (IsRunning); it does, so the name is not preempted.
  {
    auto ad = admin();
    const lockd::Answer d = ad.acquire("pre", SandboxId{0xfe, 0xed}, WorkerId{}, 0, /*two_phase=*/true);
    const auto* deny = d.as<wire::Deny>();
    ASSERT_NE(deny, nullptr) << d.message();
    EXPECT_EQ(deny->refusal, Refusal::held);
    EXPECT_TRUE(eventually([&] {
      return sup.call({{"v", 1}, {"op", "status"}})["counters"]["is_running_answered"].get<int>() >= 1;
    }, 3000));
    sleep_ms(200);
    const lockd::Answer again = ad.acquire("pre", SandboxId{0xfe, 0xed}, WorkerId{}, 0, true);
    EXPECT_NE(again.as<wire::Deny>(), nullptr) << again.message();
    EXPECT_EQ(sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].size(), 1u);
  }
  lockd_.child.signal(SIGSTOP);
  // Wait for the worker-wide kill-switch, then create at once.
  ASSERT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "status"}})["killswitch_engaged"] == true; }, 3000));
  const json refused = sup.call(run_req("pre2", {"sleep", "30"}));
  EXPECT_EQ(refused["ok"], false);
  EXPECT_EQ(refused["error"], "killswitch") << refused.dump();
  // The named sandbox was killed by the kill-switch; unnamed creation is still allowed.
  EXPECT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty(); }, 3000));
  const json unnamed = sup.call(run_req("", {"sleep", "30"}));
  EXPECT_EQ(unnamed["ok"], true) << unnamed.dump();
  lockd_.child.signal(SIGCONT);
  // Named creation comes back once a worker heartbeat sent after the kill-switch succeeds.
  ASSERT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "status"}})["may_create_named"] == true; }, 5000));
  json ok;
  // Unpaced retries: a refused create never published its slot, so the slot is free again at
  // once and the default 16-slot table cannot fill up with cooling slots.
  ASSERT_TRUE(eventually([&] {
    ok = sup.call(run_req("pre2", {"sleep", "30"}));
    return ok["ok"] == true;
  }, 10000)) << ok.dump();
}

// The type and body of a datagram from lockd (not authenticated: the relay only looks).
std::optional<wire::Body> peek(std::span<const std::uint8_t> d) {
  wire::DecodeResult r = wire::decode(d, nullptr);
  if (!r) return std::nullopt;
  return std::move(r.body);
}

// Preemptible mode, commit after spawn. lockd's answer to the Commit is held back (the relay
// drops Grant{held}), so lockd has the name Held on this worker while the supervisor still
// waits; meanwhile another acquirer makes lockd ask this worker whether the sandbox runs. In
// the old order (commit, spawn on the answer) the sandbox did not run yet: "not running",
// the name was preempted and granted to the other acquirer, and the commit's answer then
// started the sandbox anyway. Now the sandbox runs before the Commit is sent: "running".
// Ablated (leasehold-supervisor-ablate-commit-before-spawn, the simulator's switch for that old
// order): the same scenario preempts the name while its Commit is in flight.
void SupervisorProcess::commit_before_spawn_attack(bool defended) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  const auto relay = start_relay(lockd_.socket_address());
  Supervisor sup;
  if (!defended) sup.binary = LEASEHOLD_SUPERVISOR_ABLATE_COMMIT_BEFORE_SPAWN_BINARY;
  start_sup_via(sup, *relay, {"--mode", "preemptible"});
  std::atomic<bool> hold_commit{true};
  relay->set_answer_filter([&](std::span<const std::uint8_t> d) {
    const auto b = peek(d);
    const auto* g = b ? std::get_if<wire::Grant>(&*b) : nullptr;
    return hold_commit && g != nullptr && g->state == LockPhase::held;
  });
  json a;
  std::thread t([&] { a = run_probe(sup, "pc", "pc"); });
  const bool committed = eventually([&] { return !lockd_events(lockd_.log_text(), "commit").empty(); }, 2000);
  // Another acquirer while the Commit's answer is held back: refused, and lockd asks the worker.
  auto ad = admin();
  const SandboxId other{0xc0, 0xde};
  int other_grants = 0;
  if (committed) {
    const lockd::Answer first = ad.acquire("pc", other, WorkerId{0xc1, 0xc2}, 0, /*two_phase=*/true);
    if (first.as<wire::Grant>() != nullptr) ++other_grants;
    eventually([&] { return sup.call({{"v", 1}, {"op", "status"}})["counters"]["is_running_answered"].get<int>() >= 1; },
               2000);
    for (int i = 0; i < 5; ++i) {  // a preemption would let one of these through
      sleep_ms(40);
      const lockd::Answer again = ad.acquire("pc", other, WorkerId{0xc1, 0xc2}, 0, true);
      if (again.as<wire::Grant>() != nullptr) ++other_grants;
    }
  }
  hold_commit = false;
  t.join();
  ASSERT_TRUE(committed) << lockd_.log_text();
  EXPECT_GE(relay->answers_dropped(), 1u);
  if (!defended) {
    // The sandbox did not run when lockd asked: "not running", and the name went to the other.
    EXPECT_GE(other_grants, 1) << "ablation: the name was not preempted\n" << lockd_.log_text() << sup.log_text();
    EXPECT_FALSE(lockd_events(lockd_.log_text(), "preempt").empty()) << lockd_.log_text();
    return;
  }
  EXPECT_EQ(other_grants, 0) << "the name was preempted while its commit was in flight\n" << lockd_.log_text();
  EXPECT_TRUE(lockd_events(lockd_.log_text(), "preempt").empty()) << lockd_.log_text();
  EXPECT_GE(sup.call({{"v", 1}, {"op", "status"}})["counters"]["is_running_answered"].get<int>(), 1);
  ASSERT_EQ(a["ok"], true) << a.dump() << "\n" << sup.log_text();
  // lockd and the worker agree on the one holder, and its check says valid.
  const lockd::Answer show = ad.show("pc");
  const auto* info = show.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << show.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.holder.str(), a["sandbox"].get<std::string>());
  EXPECT_EQ(info->record.worker.str(), sup.worker);
  EXPECT_TRUE(eventually([&] {
    const auto lines = probe_lines(probe_log("pc"));
    return !lines.empty() && lines.back().valid == 1;
  }, 3000)) << slurp(probe_log("pc"));
  // The sandbox started before lockd committed it: its start is logged before the commit.
  const auto started = sup.events("started");
  const auto commit = lockd_events(lockd_.log_text(), "commit");
  ASSERT_EQ(started.size(), 1u) << sup.log_text();
  ASSERT_EQ(commit.size(), 1u);
  EXPECT_EQ(started[0].at("commit"), "pending");
  EXPECT_LT(std::stoll(started[0].at("ts_boot_ns")), std::stoll(commit[0].at("ts_boot_ns")));
}
TEST_F(SupervisorProcess, PreemptibleCommitsOnlyASandboxThatAlreadyRuns) { commit_before_spawn_attack(true); }
TEST_F(SupervisorProcess, PreemptibleCommitBeforeSpawnLetsTheNameBePreemptedAblated) {
  commit_before_spawn_attack(false);
}

// Preemptible mode, mutex-violation recovery for a committed sandbox: the worker heartbeat
// carries the names the worker believes it holds and its answer lists those that are not its
// own any more. A transfer begun away from the holder (epoch + 1 at the start) kills it, also
// when the first answers that say so are lost: the next beat carries the name again.
TEST_F(SupervisorProcess, PreemptibleWorkerBeatAnswerKillsANameTransferredAway) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  const auto relay = start_relay(lockd_.socket_address());
  Supervisor sup;
  start_sup_via(sup, *relay, {"--mode", "preemptible"});
  const json a = run_probe(sup, "moved", "moved");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const std::string sandbox = a["sandbox"];
  // The first two answers that report the name lost are dropped (200 ms of beats, well within
  // kill_after: the worker's liveness does not lapse meanwhile).
  // lockd's Revoked push of the transfer is dropped throughout, so only the beat answer can
  // tell the worker.
  std::atomic<int> to_drop{2};
  relay->set_answer_filter([&](std::span<const std::uint8_t> d) {
    const auto b = peek(d);
    if (b && std::holds_alternative<wire::Revoked>(*b)) return true;
    const auto* w = b ? std::get_if<wire::WorkerAck>(&*b) : nullptr;
    if (w == nullptr || w->not_held.empty() || to_drop <= 0) return false;
    --to_drop;
    return true;
  });
  auto ad = admin();
  const SandboxId to{0x70, 0x70};
  const lockd::Answer tb = ad.transfer_begin(name_id_of("moved"), SandboxId::parse(sandbox).value(),
                                             a["epoch"].get<Epoch>(), to, WorkerId{0x70, 0x70});
  ASSERT_NE(tb.as<wire::TransferState>(), nullptr) << tb.message();
  auto k = killed(sup, sandbox, 3000);
  ASSERT_TRUE(k.has_value()) << sup.log_text();
  EXPECT_EQ((*k)["cause"], "request");
  EXPECT_EQ(to_drop.load(), 0) << "the lost answers were not repeated";
  bool recovered = false;
  for (auto& e : sup.events("recovery"))
    recovered |= e["sandbox"] == sandbox;
  EXPECT_TRUE(recovered) << sup.log_text();
  EXPECT_EQ((*k)["reason"], "\"heartbeat") << sup.log_text();  // "heartbeat answer lost", not the kill-switch
  EXPECT_NE(sup.log_text().find("reason=\"heartbeat answer lost\""), std::string::npos) << sup.log_text();
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["counters"]["worker_killswitch"], 0);
  EXPECT_GE(relay->answers_dropped(), 2u);
}

// Preemptible mode: a revoke reaches the holder. After revoke, acquire and commit by another
// worker, the old sandbox is killed on its worker's next beat answer; before, it kept running
// and its check said valid.
TEST_F(SupervisorProcess, PreemptibleRevokeStopsTheOldHolder) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  Supervisor sup;
  start_sup(sup, {"--mode", "preemptible"});
  const json a = run_probe(sup, "rv", "rv");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const std::string sandbox = a["sandbox"];
  // It starts before its commit (its first check may say "not valid"), then holds the name.
  auto holds = [&] {
    const auto lines = probe_lines(probe_log("rv"));
    return !lines.empty() && lines.back().valid == 1;
  };
  ASSERT_TRUE(eventually(holds, 3000)) << slurp(probe_log("rv"));
  auto ad = admin();
  const lockd::Answer rv = ad.revoke(name_id_of("rv"));
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  const SandboxId other{0x5e, 0x5e};
  const WorkerId w2{0x5f, 0x5f};
  const wire::Grant* g = nullptr;
  lockd::Answer acq;
  ASSERT_TRUE(eventually([&] {
    acq = ad.acquire("rv", other, w2, 0, /*two_phase=*/true);
    g = acq.as<wire::Grant>();
    return g != nullptr;
  }, 3000)) << acq.message();
  const lockd::Answer committed = ad.commit(name_id_of("rv"), other, g->epoch, w2);
  ASSERT_NE(committed.as<wire::Grant>(), nullptr) << committed.message();
  auto k = killed(sup, sandbox, 3000);
  ASSERT_TRUE(k.has_value()) << "the revoked holder kept running\n" << sup.log_text();
  const std::int64_t kill_confirmed = std::stoll((*k)["confirmed_ns"]);
  EXPECT_GT(kill_confirmed, 0);
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["counters"]["worker_killswitch"], 0);
  EXPECT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty(); }, 3000));
}

// ---- bad input ------------------------------------------------------------------------------

TEST_F(SupervisorProcess, BadControlRequestsGetClearErrors) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  json r = sup.call({{"v", 1}, {"op", "reboot"}});
  EXPECT_EQ(r["error"], "unknown_op");
  r = sup.call({{"v", 7}, {"op", "list"}});
  EXPECT_EQ(r["error"], "bad_version");
  r = sup.call({{"v", 1}, {"op", "run"}, {"name", "no spaces"}, {"argv", {"true"}}});
  EXPECT_EQ(r["error"], "bad_request");
  r = sup.call({{"v", 1}, {"op", "name"}, {"sandbox", SandboxId{1, 2}.str()}, {"name", "x"}});
  EXPECT_EQ(r["error"], "not_found");
  r = sup.call({{"v", 1}, {"op", "kill"}, {"sandbox", SandboxId{1, 2}.str()}});
  EXPECT_EQ(r["error"], "not_found");
  r = sup.call({{"v", 1}, {"op", "run"}, {"name", "ttl"}, {"argv", {"true"}}, {"ttl_ms", 10}});
  EXPECT_EQ(r["error"], "bad_request");
  EXPECT_NE(r["message"].get<std::string>().find("ttl_ms"), std::string::npos);
  // Still serving.
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["ok"], true);
  EXPECT_GE(sup.call({{"v", 1}, {"op", "status"}})["counters"]["control_bad_requests"].get<int>(), 2);
}

TEST_F(SupervisorProcess, CommandsThatCannotRunLeakNothing) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  const std::string cg_parent = st["cgroup_parent"];
  // Not found: refused before the name is acquired.
  json r = sup.call(run_req("nx", {"/nonexistent/prog"}));
  EXPECT_EQ(r["error"], "exec_failed");
  EXPECT_NE(r["message"].get<std::string>().find("/nonexistent/prog"), std::string::npos) << r.dump();
  // Found but not executable as a program (no #! and not ELF): fails at exec, after the
  // name was acquired and the slot published.
  const fs::path bogus = dir_.path() / "bogus";
  { std::ofstream(bogus) << "this is not a program\n"; }
  ::chmod(bogus.c_str(), 0755);
  r = sup.call(run_req("nx", {bogus.string()}));
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"], "exec_failed") << r.dump();
  // Nothing leaked: no sandbox, no slot, no cgroup leaf, and the name is free.
  EXPECT_TRUE(sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty());
  if (!cg_parent.empty()) {
    std::size_t leaves = 0;
    for (const auto& e : fs::directory_iterator(cg_parent))
      if (e.is_directory()) ++leaves;
    EXPECT_EQ(leaves, 0u) << cg_parent;
  }
  auto ad = admin();
  EXPECT_TRUE(eventually([&] {
    const lockd::Answer s = ad.show("nx");
    const auto* i = s.as<wire::NameInfo>();
    return i == nullptr || i->record.state == LockPhase::free;
  }, 3000));
}

TEST_F(SupervisorProcess, FullTableRefusesAndAcquiresNothing) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--slots", "2"});
  ASSERT_EQ(sup.call(run_req("", {"sleep", "30"}))["ok"], true);
  ASSERT_EQ(sup.call(run_req("", {"sleep", "30"}))["ok"], true);
  const json r = sup.call(run_req("overflow", {"sleep", "30"}));
  EXPECT_EQ(r["error"], "table_full") << r.dump();
  EXPECT_NE(r["message"].get<std::string>().find("full"), std::string::npos);
  auto ad = admin();
  const lockd::Answer g = ad.acquire("overflow", SandboxId{0x42, 0x42}, WorkerId{0x42, 0x43});
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << "the name must not have been taken: " << g.message();
  EXPECT_EQ(g.as<wire::Grant>()->epoch, 1u);
}

TEST_F(SupervisorProcess, RefusedCreatesDoNotUseUpTheTable) {
  // Each create refused by lockd claims a slot and gives it back unpublished; a burst of them
  // must leave both slots usable at once (no cooldown for a slot no reader was ever shown an
  // epoch in).
  start_lockd();
  auto ad = admin();
  const lockd::Answer g = ad.acquire("busy", SandboxId{0x42, 0x42}, WorkerId{0x42, 0x43});
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  Supervisor sup;
  start_sup(sup, {"--slots", "2"});
  for (int i = 0; i < 6; ++i) {
    const json r = sup.call(run_req("busy", {"sleep", "30"}));
    EXPECT_EQ(r["error"], "held") << "attempt " << i << ": " << r.dump();
  }
  EXPECT_EQ(sup.call(run_req("one", {"sleep", "30"}))["ok"], true);
  EXPECT_EQ(sup.call(run_req("two", {"sleep", "30"}))["ok"], true);
}

TEST_F(SupervisorProcess, UnreachableLockdAtStartLeavesNothing) {
  // A UDP port that is bound but never answers.
  const int fd = open_udp_socket_blocking(SocketAddress::loopback_v4(0));
  ASSERT_GE(fd, 0);
  const SocketAddress silent = *local_address(fd);
  Supervisor sup;
  const fs::path shm = dir_.path() / "table";
  std::string err;
  EXPECT_FALSE(sup.start(dir_.path(), silent.str(), key_, with(kSupTiming, {"--shm", shm.string()}), &err));
  EXPECT_EQ(sup.child.wait(), 2);
  EXPECT_NE(sup.child.err().find("unreachable"), std::string::npos) << sup.child.err();
  EXPECT_FALSE(fs::exists(shm));
  EXPECT_FALSE(fs::exists(sup.socket));
  ::close(fd);
  // And an unsafe configuration is refused with the numbers.
  Supervisor bad;
  EXPECT_FALSE(bad.start(dir_.path(), silent.str(), key_, {"--ttl-ms", "1000", "--kill-after-ms", "990"}, &err, "bad"));
  EXPECT_EQ(bad.child.wait(), 2);
  EXPECT_NE(bad.child.err().find("unsafe timing"), std::string::npos) << bad.child.err();
}

TEST_F(SupervisorProcess, LockdInAnotherModeOrWithAShorterTtlIsRefusedAtStart) {
  // A preemptible supervisor on a lease-mode lockd would keep sandboxes whose names expire at
  // lockd: refused before anything starts, naming both modes.
  start_lockd();
  Supervisor pre;
  std::string err;
  EXPECT_FALSE(pre.start(dir_.path(), lockd_.address, key_, with(kSupTiming, {"--mode", "preemptible"}), &err, "pre"));
  EXPECT_EQ(pre.child.wait(), 2);
  EXPECT_NE(pre.child.err().find("lockd runs in lease mode, this supervisor in preemptible mode"), std::string::npos)
      << pre.child.err();
  // lockd's TTL below ours: the kill-switch could fire after lockd's expiry.
  Supervisor longer;
  EXPECT_FALSE(longer.start(dir_.path(), lockd_.address, key_,
                            {"--ttl-ms", "2000", "--kill-after-ms", "1200", "--heartbeat-interval-ms", "100"}, &err,
                            "longer"));
  EXPECT_EQ(longer.child.wait(), 2);
  EXPECT_NE(longer.child.err().find("lockd's lease TTL is 1000 ms, below --ttl-ms 2000"), std::string::npos)
      << longer.child.err();
  // A matching one starts, and a requested TTL outside [ours, lockd's] is refused with both.
  Supervisor ok;
  start_sup(ok);
  json r = run_req("t", {"sleep", "30"});
  r["ttl_ms"] = 5000;
  const json a = ok.call(r);
  EXPECT_EQ(a["error"], "bad_request") << a.dump();
  EXPECT_NE(a["message"].get<std::string>().find("must be in [1000, 1000]"), std::string::npos) << a.dump();
}

TEST_F(SupervisorProcess, RtWakeUpsLaterThanTheKillLatencyBudgetAreReported) {
  // A budget of 0 ms: every real wake-up is later than that, so the premise of the pause
  // budget is reported (status counter and a rate-limited log line) instead of assumed.
  start_lockd();
  Supervisor sup;
  std::string err;
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key_,
                        {"--ttl-ms", "1000", "--kill-after-ms", "600", "--heartbeat-interval-ms", "100",
                         "--kill-latency-budget-ms", "0", "--slots", "16"},
                        &err))
      << err;
  ASSERT_EQ(sup.call(run_req("late", {"sleep", "30"}))["ok"], true);
  EXPECT_TRUE(eventually([&] {
    return sup.call({{"v", 1}, {"op", "status"}})["counters"]["rt_late_over_budget"].get<int>() >= 1;
  }, 5000));
  const auto ev = sup.events("rt_late");
  ASSERT_GE(ev.size(), 1u) << sup.log_text();
  EXPECT_EQ(ev[0].at("kill_latency_budget_ms"), "0");
  EXPECT_GT(std::stod(ev[0].at("lateness_ms")), 0.0);
}

TEST_F(SupervisorProcess, LeaseSupervisorOnAPreemptibleLockdIsRefusedAtStart) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  Supervisor sup;
  std::string err;
  EXPECT_FALSE(sup.start(dir_.path(), lockd_.address, key_, kSupTiming, &err));
  EXPECT_EQ(sup.child.wait(), 2);
  EXPECT_NE(sup.child.err().find("lockd runs in preemptible mode, this supervisor in lease mode"), std::string::npos)
      << sup.child.err();
}

TEST_F(SupervisorProcess, SecondSupervisorOfTheSameWorkerIsRefused) {
  // Another supervisor with the same worker id (other socket, other table) would sweep the
  // first one's cgroup leaves, killing its sandboxes: refused, naming the live one's pid.
  start_lockd();
  Supervisor first;
  start_sup(first);
  const json a = first.call(run_req("mine", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  Supervisor second;
  std::string err;
  EXPECT_FALSE(second.start(dir_.path(), lockd_.address, key_, with(kSupTiming, {"--worker-id", first.worker}), &err,
                            "second"));
  EXPECT_EQ(second.child.wait(), 2);
  EXPECT_NE(second.child.err().find("already has a live supervisor (pid " + std::to_string(first.child.pid())),
            std::string::npos)
      << second.child.err();
  EXPECT_FALSE(fs::exists(second.socket));
  // The first one and its sandbox are untouched.
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), 0);
  const json list = first.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
  EXPECT_EQ(list["sandboxes"][0]["state"], "running");
  // The lock file exists while the supervisor lives and is removed when it stops (random worker
  // ids must not leave a file per run behind).
  if (::geteuid() == 0) {
    const fs::path lock = "/run/leasehold/worker-" + first.worker + ".lock";
    EXPECT_TRUE(fs::exists(lock)) << lock;
    // Owner only: anyone who may open it could flock it and block this worker's restart.
    EXPECT_EQ(fs::status(lock).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
    first.child.signal(SIGTERM);
    EXPECT_EQ(first.child.wait(10'000), 0);
    EXPECT_FALSE(fs::exists(lock)) << lock;
  }
}

// A supervisor restarted with the same worker id after its wall clock was stepped back starts its
// sequence numbers below lockd's replay window for that worker (LEASEHOLD_TEST_SEQ_SEED stands in
// for the stepped clock). It must reconnect and run named sandboxes without a lockd restart: the
// authenticated stale_seq answer carries the window's floor and the supervisor continues above it.
// With the resync switched off (LEASEHOLD_ABLATE=no-seq-resync) the restarted supervisor is locked
// out, which is what this test would see on a build without the resync.
TEST_F(SupervisorProcess, RestartAfterTheWallClockSteppedBackReconnects) {
  struct EnvGuard {
    ~EnvGuard() {
      ::unsetenv("LEASEHOLD_TEST_SEQ_SEED");
      ::unsetenv("LEASEHOLD_ABLATE");
    }
  } env_guard;
  start_lockd();
  const std::string worker = "00000000000000070000000000000007";
  // Ten minutes ahead of the wall clock (inside lockd's kSeqAheadMaxNs).
  ::setenv("LEASEHOLD_TEST_SEQ_SEED", std::to_string(wire::realtime_ns() + 600'000'000'000ull).c_str(), 1);
  {
    Supervisor before;
    start_sup(before, {"--worker-id", worker}, "before");
    const json a = before.call(run_req("clock/step", {"sleep", "0.1"}));
    ASSERT_EQ(a["ok"], true) << a.dump();
    before.child.signal(SIGTERM);
    ASSERT_EQ(before.child.wait(10'000), 0) << before.log_text();
  }
  // The wall clock went back: every seq of the restarted supervisor is below lockd's window.
  ::setenv("LEASEHOLD_TEST_SEQ_SEED", "1000", 1);
  {
    ::setenv("LEASEHOLD_ABLATE", "no-seq-resync", 1);
    Supervisor ablated;
    std::string err;
    const bool started = ablated.start(dir_.path(), lockd_.address, key_,
                                       with(kSupTiming, {"--worker-id", worker, "--slots", "16"}), &err, "ablated");
    ::unsetenv("LEASEHOLD_ABLATE");
    if (started) {
      const json r = ablated.call(run_req("clock/step", {"sleep", "30"}));
      EXPECT_NE(r["ok"], true) << "without the resync a stepped-back supervisor is locked out: " << r.dump();
    } else {
      EXPECT_NE(err.find("stale_seq"), std::string::npos) << err;
    }
  }
  Supervisor after;
  start_sup(after, {"--worker-id", worker}, "after");
  const json r = after.call(run_req("clock/step", {"sleep", "30"}));
  ASSERT_EQ(r["ok"], true) << r.dump() << after.log_text() << lockd_.log_text();
  EXPECT_EQ(::kill(r["pid"].get<pid_t>(), 0), 0);
  // Its leases keep being refreshed above the floor: still running after several TTLs.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const json list = after.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
  EXPECT_EQ(list["sandboxes"][0]["state"], "running") << list.dump() << after.log_text();
}

// One datagram under the worker's own key with seq 2^63-1 (lab repro_seq_max_brick.sh) moved
// lockd's replay window for that worker to the top: every later datagram of its supervisor was
// below it, its named sandbox died by the kill-switch, and a restarted supervisor could not reach
// lockd until lockd restarted. lockd refuses a seq more than kSeqAheadMaxNs above its wall clock
// (seq_jump, counted): the supervisor's leases go on being refreshed, a new name is granted, and a
// restarted supervisor of the worker is granted too. With the bound switched off
// (LEASEHOLD_ABLATE=seq-jump) the attack works.
void SupervisorProcess::seq_top_attack(bool defended) {
  {
    if (!defended) ::setenv("LEASEHOLD_ABLATE", "seq-jump", 1);
    start_lockd();
    ::unsetenv("LEASEHOLD_ABLATE");
    const WorkerId w{0x5E0, defended ? 2u : 1u};
    Supervisor sup;
    start_sup(sup, {"--worker-id", w.str()}, defended ? "top-on" : "top-off");
    const json a = sup.call(run_req("seq/victim", {"sleep", "30"}));
    ASSERT_EQ(a["ok"], true) << a.dump();
    auto counter = [&](const char* k) { return sup.call({{"v", 1}, {"op", "status"}})["counters"][k].get<std::uint64_t>(); };
    // The attacker's datagram: W's key, the highest seq below 2^63.
    const wire::WireKey kw = load_key(make_worker_key(dir_.path(), key_, w));
    wire::Sender top(w, wire::kSeqLimit - 1, kw);
    wire::Datagram d;
    ASSERT_TRUE(top.seal(1, wire::Stats{}, d));
    const int fd = open_udp_socket_blocking(*SocketAddress::parse("127.0.0.1:0"));
    ASSERT_GE(fd, 0);
    const SocketAddress to = lockd_.socket_address();
    ASSERT_EQ(::sendto(fd, d.bytes.data(), d.size, 0, to.sa(), to.length), static_cast<ssize_t>(d.size));
    pollfd p{fd, POLLIN, 0};
    std::vector<std::uint8_t> answer(wire::kDatagramBytesMax);
    // Accepted, it is answered; refused, its error goes only to the address W's supervisor
    // sends from (replay.hpp), so this socket hears nothing.
    ssize_t n = ::poll(&p, 1, defended ? 1000 : 5000) == 1 ? ::recv(fd, answer.data(), answer.size(), 0) : -1;
    ::close(fd);
    if (!defended) {
      ASSERT_GT(n, 0) << "the ablated lockd was expected to accept seq 2^63-1";
      answer.resize(static_cast<std::size_t>(n));
      wire::Authenticator auth(kw);
      const wire::DecodeResult r = wire::decode(answer, &auth);
      ASSERT_TRUE(r) << r.detail;
      EXPECT_EQ(std::get_if<wire::Error>(&r.body), nullptr) << "the ablated lockd was expected to accept seq 2^63-1";
      // The victim is killed: lockd hears nothing of W any more.
      ASSERT_TRUE(killed(sup, a["sandbox"], 15'000)) << sup.log_text();
      EXPECT_NE(sup.call(run_req("seq/again", {"sleep", "30"}))["ok"], true);
      return;
    }
    EXPECT_EQ(n, -1);
    // The worker's leases keep being refreshed (several rounds after the attack), nothing is
    // killed, and it is granted a new name.
    const std::uint64_t from = counter("refreshed");
    ASSERT_TRUE(eventually([&] { return counter("refreshed") >= from + 10; }, 20'000)) << sup.log_text();
    EXPECT_EQ(counter("kills_deadline"), 0u);
    const json again = sup.call(run_req("seq/again", {"sleep", "30"}));
    EXPECT_EQ(again["ok"], true) << again.dump();
    auto ad = admin();
    const auto counters = ad.counters();
    ASSERT_TRUE(counters) << counters.message();
    std::uint64_t jumps = 0;
    for (const auto& k : *counters)
      if (k.key == "reject_seq_jump") jumps = k.value;
    EXPECT_EQ(jumps, 1u);
    // A restarted supervisor of the worker reaches lockd (the window is where the clock is).
    sup.child.signal(SIGTERM);
    ASSERT_EQ(sup.child.wait(15'000), 0) << sup.log_text();
    Supervisor restarted;
    start_sup(restarted, {"--worker-id", w.str()}, "top-restarted");
    const json third = restarted.call(run_req("seq/victim", {"sleep", "30"}));
    EXPECT_EQ(third["ok"], true) << third.dump();
  }
}
TEST_F(SupervisorProcess, OneDatagramAtTheTopSeqCannotLockTheWorkerOut) { seq_top_attack(true); }
TEST_F(SupervisorProcess, OneDatagramAtTheTopSeqLocksTheWorkerOutWithTheBoundAblated) { seq_top_attack(false); }

TEST_F(SupervisorProcess, SecondSupervisorOnTheSameTableIsRefused) {
  start_lockd();
  Supervisor a, b;
  const fs::path shm = dir_.path() / "shared-table";
  start_sup(a, {"--shm", shm.string()}, "a");
  std::string err;
  EXPECT_FALSE(b.start(dir_.path(), lockd_.address, key_, with(kSupTiming, {"--shm", shm.string()}), &err, "b"));
  EXPECT_EQ(b.child.wait(), 2);
  EXPECT_NE(b.child.err().find("alive"), std::string::npos) << b.child.err();
  EXPECT_EQ(a.call({{"v", 1}, {"op", "status"}})["ok"], true);
}

// Root's sandboxes run as one uid per slot from --uid-range: two live supervisors on one host
// with overlapping ranges would run sandboxes as the same uid (each could signal or read the
// other's), so the second is refused, naming both ranges and the holder; a disjoint range starts,
// and a range is free again once its holder is gone (SIGKILL included: the lock is the kernel's).
TEST_F(SupervisorProcess, OverlappingUidRangesOfTwoLiveSupervisorsAreRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "uid ranges are a root supervisor's (a non-root one runs sandboxes as its uid)";
  start_lockd();
  const std::string base = std::to_string(20'000'000 + (::getpid() % 30000) * 4096);
  const std::string next = std::to_string(20'000'000 + (::getpid() % 30000) * 4096 + 512);
  Supervisor a, b, c, d;
  start_sup(a, {"--uid-range", base + ":1024", "--slots", "16"}, "a");
  std::string err;
  EXPECT_FALSE(b.start(dir_.path(), lockd_.address, key_,
                       with(kSupTiming, {"--uid-range", next + ":1024", "--slots", "16"}), &err, "b"));
  EXPECT_EQ(b.child.wait(), 2);
  EXPECT_NE(b.child.err().find("uid range " + next + ":1024 overlaps " + base + ":1024 of a live supervisor"),
            std::string::npos)
      << b.child.err();
  EXPECT_NE(b.child.err().find("pid " + std::to_string(a.child.pid()) + ", worker " + a.worker), std::string::npos)
      << b.child.err();
  start_sup(c, {"--uid-range", std::to_string(std::stoull(base) + 2048) + ":1024", "--slots", "16"}, "c");
  EXPECT_EQ(a.call({{"v", 1}, {"op", "status"}})["ok"], true);
  a.child.kill9();
  start_sup(d, {"--uid-range", next + ":1024", "--slots", "16"}, "d");
  EXPECT_EQ(d.call({{"v", 1}, {"op", "status"}})["ok"], true);
}

// A --uid-range over an existing account: root's sandboxes would run as that account (issue:
// `--uid-range 33:4` ran them as www-data). The supervisor refuses it at start, naming the account
// and a subordinate range; with the check ablated (LEASEHOLD_ABLATE=uid-range-accounts) it starts
// and a sandbox root starts runs as the account's uid.
TEST_F(SupervisorProcess, AUidRangeOverAnExistingAccountIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "uid ranges are a root supervisor's (a non-root one runs sandboxes as its uid)";
  // An account of this host, not root, with no live supervisor's range over it (4 uids from it).
  std::optional<std::pair<uid_t, std::string>> account;
  ::setpwent();
  while (const passwd* pw = ::getpwent())
    if (pw->pw_uid != 0 && pw->pw_uid < 60000 && !account) account = std::make_pair(pw->pw_uid, std::string(pw->pw_name));
  ::endpwent();
  if (!account) GTEST_SKIP() << "no account besides root in the passwd database";
  const std::string range = std::to_string(account->first) + ":4";
  start_lockd();
  for (const bool defended : {false, true}) {
    SCOPED_TRACE(defended ? "defended" : "ablated");
    if (!defended) ::setenv("LEASEHOLD_ABLATE", "uid-range-accounts", 1);
    Supervisor sup;
    std::string err;
    const bool started = sup.start(dir_.path(), lockd_.address, key_,
                                   with(kSupTiming, {"--uid-range", range, "--slots", "4"}), &err,
                                   defended ? "defended" : "ablated");
    ::unsetenv("LEASEHOLD_ABLATE");
    if (!defended) {  // the attack: root's sandbox runs as the account
      ASSERT_TRUE(started) << err;
      const json a = sup.call(run_req("", {"sleep", "30"}));
      ASSERT_EQ(a["ok"], true) << a.dump();
      EXPECT_EQ(a["uid"], account->first) << a.dump();
      EXPECT_EQ(sup.call({{"v", 1}, {"op", "kill"}, {"sandbox", a["sandbox"]}})["ok"], true);
      continue;
    }
    EXPECT_FALSE(started);
    EXPECT_EQ(sup.child.wait(), 2);
    const std::string text = sup.child.err();
    EXPECT_NE(text.find("--uid-range: uid range " + range + " contains uid " + std::to_string(account->first) +
                        " (account " + account->second + ")"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("/etc/subuid"), std::string::npos) << text;
  }
}

// Stopped supervisors used to leave a directory under /run/leasehold each (sandbox-logs-<worker
// id>, with a file per sandbox, empty or not). At a clean exit a supervisor removes the log files
// of its sandboxes that wrote nothing, then the default directory once it is empty; a file with
// output stays (and so its directory). A supervisor that cannot start leaves none either.
TEST_F(SupervisorProcess, ACleanExitRemovesEmptySandboxLogsAndTheEmptyDefaultDirectory) {
  start_lockd();
  const std::string worker = WorkerId{0x1c9e5d7a, std::uint64_t(::getpid()) << 8 | 1}.str();
  const fs::path logs = fs::path(runtime_dir()) / ("sandbox-logs-" + worker);
  fs::remove_all(logs);
  const std::vector<std::string> flags = {"--worker-id", worker, "--sandbox-log-dir", ""};  // "": the default
  std::string quiet_log, chatty_log;
  {
    Supervisor sup;
    start_sup(sup, flags, "first");
    const auto [quiet, chatty] = quiet_and_chatty(sup);
    ASSERT_EQ(quiet["ok"], true) << quiet.dump();
    ASSERT_EQ(chatty["ok"], true) << chatty.dump();
    quiet_log = quiet["log"];
    chatty_log = chatty["log"];
    EXPECT_EQ(fs::path(quiet_log).parent_path(), logs);
    EXPECT_TRUE(fs::exists(quiet_log));
    sup.child.signal(SIGTERM);
    EXPECT_EQ(sup.child.wait(), 0) << sup.log_text();
  }
  EXPECT_FALSE(fs::exists(quiet_log)) << "an empty log outlived its supervisor";
  EXPECT_EQ(slurp(chatty_log), "kept\n");
  EXPECT_TRUE(fs::is_directory(logs));
  // Once the kept file is gone, the next supervisor of the worker leaves no directory at all.
  fs::remove(chatty_log);
  {
    Supervisor sup;
    start_sup(sup, flags, "second");
    EXPECT_TRUE(fs::is_directory(logs));
    sup.child.signal(SIGTERM);
    EXPECT_EQ(sup.child.wait(), 0) << sup.log_text();
  }
  EXPECT_FALSE(fs::exists(logs));
  // A supervisor that creates the directory and then cannot start (no lockd answers).
  Supervisor refused;
  std::string err;
  EXPECT_FALSE(refused.start(dir_.path(), "127.0.0.1:9", key_, with(kSupTiming, flags), &err, "refused"));
  EXPECT_NE(refused.child.wait(), 0);
  EXPECT_FALSE(fs::exists(logs)) << refused.child.err();
  fs::remove_all(logs);
}

// A sandbox's stdout and stderr go to a file of its own, not into the supervisor's output: there
// a sandbox could write lines that read as the supervisor's events (here a forged "killed"
// event). `logs` shows them to the owner, by sandbox id or name, also once it has exited.
TEST_F(SupervisorProcess, SandboxOutputGoesToItsOwnLogNotTheSupervisors) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const std::string forged = "event=killed sandbox=00000000-0000-4000-8000-000000000001 forged=1";
  const json a = sup.call(run_req("chatty", {"sh", "-c", "echo to-stdout; echo to-stderr >&2; echo '" + forged +
                                                        "'; echo '" + forged + "' >&2; exec sleep 30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const std::string sandbox = a["sandbox"];
  ASSERT_TRUE(a["log"].is_string()) << a.dump();
  ASSERT_TRUE(eventually([&] { return slurp(a["log"].get<std::string>()).find("to-stderr") != std::string::npos; },
                         10'000));
  json by_name = sup.call({{"v", 1}, {"op", "logs"}, {"name", "chatty"}});
  ASSERT_EQ(by_name["ok"], true) << by_name.dump();
  EXPECT_EQ(by_name["sandbox"], sandbox);
  EXPECT_EQ(by_name["running"], true);
  const std::string out = by_name["output"];
  EXPECT_NE(out.find("to-stdout\n"), std::string::npos) << out;
  EXPECT_NE(out.find("to-stderr\n"), std::string::npos) << out;
  const json tail = sup.call({{"v", 1}, {"op", "logs"}, {"sandbox", sandbox}, {"bytes", 5}});
  ASSERT_EQ(tail["ok"], true) << tail.dump();
  EXPECT_EQ(tail["output"], "ed=1\n");
  EXPECT_EQ(tail["output"].get<std::string>().size(), 5u);
  EXPECT_EQ(tail["truncated"], true);
  // Nothing of it in the supervisor's own stdout or stderr.
  for (const std::string& text : {sup.child.out(), sup.log_text()}) {
    EXPECT_EQ(text.find("to-stdout"), std::string::npos) << text;
    EXPECT_EQ(text.find("forged=1"), std::string::npos) << text;
  }
  EXPECT_TRUE(sup.events("killed").empty());
  ASSERT_EQ(sup.call({{"v", 1}, {"op", "kill"}, {"sandbox", sandbox}})["ok"], true);
  ASSERT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty(); }, 10'000));
  const json after = sup.call({{"v", 1}, {"op", "logs"}, {"sandbox", sandbox}});
  ASSERT_EQ(after["ok"], true) << after.dump();
  EXPECT_EQ(after["running"], false);
  EXPECT_NE(after["output"].get<std::string>().find("to-stdout"), std::string::npos);
  const json none = sup.call({{"v", 1}, {"op", "logs"}, {"name", "never-ran"}});
  EXPECT_EQ(none["error"], "not_found") << none.dump();
}

// A sandbox that floods its output cannot fill the log directory's filesystem (a tmpfs under /run
// for root): its log keeps the first --sandbox-log-max-bytes and one line saying the rest was
// discarded, and the sandbox is not stalled by it (it finishes writing and exits). Before the
// output pump the sandbox wrote the file itself, without a bound.
TEST_F(SupervisorProcess, AFloodingSandboxsLogStopsAtItsCap) {
  start_lockd();
  Supervisor sup;
  constexpr std::uint64_t kCap = 65536;
  start_sup(sup, {"--sandbox-log-max-bytes", std::to_string(kCap)});
  constexpr int kFlood = 4 << 20;
  const json a = sup.call(run_req("", {"sh", "-c", "head -c " + std::to_string(kFlood) + " /dev/zero | tr '\\0' x; echo done >&2"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const std::string sandbox = a["sandbox"];
  const std::string log = a["log"];
  ASSERT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "list"}})["sandboxes"].empty(); }, 20'000))
      << "the flooding sandbox did not finish: its output stalled it";
  std::string text;
  ASSERT_TRUE(eventually([&] {
    text = slurp(log);
    return text.find("the rest is discarded") != std::string::npos;
  }, 10'000)) << text.size();
  const std::string head = text.substr(0, kCap);
  EXPECT_EQ(head, std::string(kCap, 'x'));
  EXPECT_LT(text.size(), kCap + 200) << "the log passed its cap";
  EXPECT_EQ(text.find("done"), std::string::npos) << "output after the cap is discarded";
  std::uint64_t discarded = 0;
  EXPECT_TRUE(eventually([&] {
    const json st = sup.call({{"v", 1}, {"op", "status"}});
    discarded = st["counters"].value("sandbox_output_discarded_bytes", std::uint64_t{0});
    return discarded == kFlood + 5 - kCap;
  }, 10'000)) << discarded;
}

TEST_F(SupervisorProcess, SigtermKillsReleasesAndCleansUp) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  const std::string cg_parent = st["cgroup_parent"];
  const json a = sup.call(run_req("bye", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true);
  ASSERT_EQ(sup.call(run_req("", {"sleep", "30"}))["ok"], true);
  sup.child.signal(SIGTERM);
  EXPECT_EQ(sup.child.wait(10'000), 0) << sup.log_text();
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);
  EXPECT_FALSE(fs::exists(sup.shm)) << sup.shm;
  EXPECT_FALSE(fs::exists(sup.socket));
  if (!cg_parent.empty()) {
    EXPECT_FALSE(fs::exists(cg_parent));
  }
  auto ad = admin();
  const lockd::Answer g = ad.acquire("bye", SandboxId{0x77, 0x77}, WorkerId{0x77, 0x78});
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  EXPECT_EQ(g.as<wire::Grant>()->epoch, a["epoch"].get<Epoch>() + 1);
}


// ---- stopping with a grace period, and wait ------------------------------------------------

// A command that traps SIGTERM (sh, the init of its pid namespace, with a handler) to a file in
// `dir`, then runs until stopped; `ready` is written once the trap is set. `on_term` "" ignores it.
std::vector<std::string> trapping(const fs::path& dir, const std::string& on_term) {
  const std::string ready = (dir / "ready").string();
  return {"sh", "-c", "trap '" + on_term + "' TERM; : > " + ready + "; while :; do sleep 0.05; done"};
}

// A release sends SIGTERM to every process of the sandbox; one that handles it (writes a marker,
// exits 7) ends by itself, and the release is answered only after that, with its exit status.
TEST_F(SupervisorProcess, ReleaseSendsSigtermAndIsAnsweredAfterATrappingSandboxExits) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--stop-grace-ms", "20000"});
  const fs::path marker = dir_.sandbox_dir() / "marker";
  const json a = sup.call(run_req("graceful", trapping(dir_.sandbox_dir(), "echo bye > " + marker.string() + "; exit 7")));
  ASSERT_EQ(a["ok"], true) << a.dump();
  ASSERT_TRUE(eventually([&] { return fs::exists(dir_.sandbox_dir() / "ready"); })) << sup.log_text();
  EXPECT_FALSE(fs::exists(marker));
  const json r = sup.call({{"v", 1}, {"op", "release"}, {"name", "graceful"}}, 30'000);
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_TRUE(fs::exists(marker)) << "the release was answered before the sandbox's handler ran";
  EXPECT_EQ(slurp(marker.string()), "bye\n");
  EXPECT_EQ(r["exit_status"], 7) << r.dump();
  EXPECT_EQ(r["exit_code"], 7);
  EXPECT_EQ(r["reason"], "released (exited after SIGTERM)");
  EXPECT_EQ(r["released"], true) << r.dump();
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);
  EXPECT_TRUE(sup.events("grace_expired").empty()) << sup.log_text();
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(st["counters"]["stops_graceful"], 1) << st.dump();
  // The name is free at lockd: the next holder gets the next epoch.
  auto ad = admin();
  const lockd::Answer g = ad.acquire("graceful", SandboxId{0x71, 0x72}, WorkerId{0x73, 0x74});
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  EXPECT_EQ(g.as<wire::Grant>()->epoch, a["epoch"].get<Epoch>() + 1);
}

// One that ignores SIGTERM is killed (cgroup.kill where there is a leaf) at the grace deadline.
TEST_F(SupervisorProcess, ASandboxIgnoringSigtermIsKilledAtTheGraceDeadline) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--stop-grace-ms", "300"});
  const json a = sup.call(run_req("stubborn", trapping(dir_.sandbox_dir(), "")));
  ASSERT_EQ(a["ok"], true) << a.dump();
  ASSERT_TRUE(eventually([&] { return fs::exists(dir_.sandbox_dir() / "ready"); })) << sup.log_text();
  const json r = sup.call({{"v", 1}, {"op", "release"}, {"name", "stubborn"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["exit_status"], -SIGKILL) << r.dump();
  EXPECT_EQ(r["exit_code"], 128 + SIGKILL);
  EXPECT_EQ(r["reason"], "released (still running at the end of its grace period after SIGTERM)");
  EXPECT_EQ(r["released"], true);
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);
  // SIGTERM first, the kill after the deadline, through the rt thread as any requested kill.
  const auto stopping = sup.events("stopping");
  ASSERT_EQ(stopping.size(), 1u) << sup.log_text();
  EXPECT_EQ(stopping[0].at("grace_ms"), "300");
  ASSERT_EQ(sup.events("grace_expired").size(), 1u) << sup.log_text();
  auto k = killed(sup, a["sandbox"]);
  ASSERT_TRUE(k.has_value()) << sup.log_text();
  EXPECT_EQ((*k)["cause"], "request");
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  if (!st.value("cgroup_parent", std::string()).empty()) {
    EXPECT_EQ((*k)["path"], "cgroup.kill");
  }
  EXPECT_EQ(st["counters"]["stops_grace_expired"], 1) << st.dump();
}

// The grace period never holds the kill-switch back: lockd stops answering while a sandbox that
// ignores SIGTERM has 20 s of grace, and its kill-switch fires at its lease's deadline as always.
TEST_F(SupervisorProcess, AHeartbeatLossDuringTheGracePeriodStillFiresTheKillSwitch) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--stop-grace-ms", "20000"});
  const json a = sup.call(run_req("cutoff", trapping(dir_.sandbox_dir(), "")));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const std::string sandbox = a["sandbox"];
  ASSERT_TRUE(eventually([&] { return fs::exists(dir_.sandbox_dir() / "ready"); })) << sup.log_text();
  json r;
  std::thread releaser([&] { r = sup.call({{"v", 1}, {"op", "release"}, {"name", "cutoff"}}, 60'000); });
  const bool stopping = eventually([&] {
    const json l = sup.call({{"v", 1}, {"op", "list"}});
    return l["sandboxes"].size() == 1 && l["sandboxes"][0]["state"] == "stopping";
  });
  if (stopping) lockd_.child.signal(SIGSTOP);
  auto k = stopping ? killed(sup, sandbox, 10'000) : std::nullopt;
  releaser.join();
  lockd_.child.signal(SIGCONT);
  ASSERT_TRUE(stopping) << sup.log_text();
  ASSERT_TRUE(k.has_value()) << sup.log_text();
  EXPECT_EQ((*k)["cause"], "deadline");
  EXPECT_NE((*k)["reason"].find("kill-switch"), std::string::npos) << (*k)["reason"];
  EXPECT_TRUE(sup.events("grace_expired").empty()) << sup.log_text();
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["exit_status"], -SIGKILL);
  EXPECT_EQ(r["reason"], "kill-switch: lease not refreshed in time");
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);
}

// `wait` answers when the sandbox is gone with its exit status and why it ended; once it is
// gone, from the record `logs` keeps; an unknown sandbox is not_found.
TEST_F(SupervisorProcess, WaitAnswersWithTheExitStatusBeforeAndAfterTheExit) {
  start_lockd();
  Supervisor sup;
  start_sup(sup);
  const json a = sup.call(run_req("", {"sh", "-c", "sleep 0.3; exit 3"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const json w = sup.call({{"v", 1}, {"op", "wait"}, {"sandbox", a["sandbox"]}, {"id", 5}}, 30'000);
  ASSERT_EQ(w["ok"], true) << w.dump();
  EXPECT_EQ(w["id"], 5);
  EXPECT_EQ(w["exit_status"], 3);
  EXPECT_EQ(w["exit_code"], 3);
  EXPECT_EQ(w["reason"], "exited");
  const json again = sup.call({{"v", 1}, {"op", "wait"}, {"sandbox", a["sandbox"]}});
  EXPECT_EQ(again["exit_status"], 3) << again.dump();
  EXPECT_EQ(again["reason"], "exited");
  const json none = sup.call({{"v", 1}, {"op", "wait"}, {"sandbox", SandboxId{0x5, 0x6}.str()}});
  EXPECT_EQ(none["error"], "not_found") << none.dump();
  // Killed on request meanwhile: the wait says so.
  const json b = sup.call(run_req("", {"sleep", "30"}));
  ASSERT_EQ(b["ok"], true) << b.dump();
  json killed_wait;
  std::thread waiter([&] { killed_wait = sup.call({{"v", 1}, {"op", "wait"}, {"sandbox", b["sandbox"]}}, 60'000); });
  ASSERT_TRUE(eventually([&] { return sup.call({{"v", 1}, {"op", "status"}}).dump().find("\"waits\":1") != std::string::npos; }))
      << sup.log_text();
  const json k = sup.call({{"v", 1}, {"op", "kill"}, {"sandbox", b["sandbox"]}, {"grace_ms", 0}});
  waiter.join();
  ASSERT_EQ(k["ok"], true) << k.dump();
  EXPECT_EQ(killed_wait["exit_status"], -SIGKILL) << killed_wait.dump();
  EXPECT_EQ(killed_wait["reason"], "killed on request");
}

// A supervisor killed with SIGKILL leaves its sandboxes' log files behind; the next one of the
// worker removes the empty ones at start and keeps the others for `logs`.
TEST_F(SupervisorProcess, AKilledSupervisorsEmptySandboxLogsAreRemovedAtTheNextStart) {
  start_lockd();
  const std::string worker = WorkerId{0x1c9e5d7b, std::uint64_t(::getpid()) << 8 | 2}.str();
  const fs::path logs = fs::path(runtime_dir()) / ("sandbox-logs-" + worker);
  fs::remove_all(logs);
  const std::vector<std::string> flags = {"--worker-id", worker, "--sandbox-log-dir", ""};  // "": the default
  std::string quiet_log, chatty_log, chatty_id;
  {
    Supervisor sup;
    start_sup(sup, flags, "killed");
    const auto [quiet, chatty] = quiet_and_chatty(sup);
    ASSERT_EQ(quiet["ok"], true) << quiet.dump();
    ASSERT_EQ(chatty["ok"], true) << chatty.dump();
    quiet_log = quiet["log"];
    chatty_log = chatty["log"];
    chatty_id = chatty["sandbox"];
    sup.child.signal(SIGKILL);
    sup.child.wait();
  }
  EXPECT_TRUE(fs::exists(quiet_log)) << "a killed supervisor cleans nothing up";
  {
    Supervisor sup;
    start_sup(sup, flags, "next");
    EXPECT_FALSE(fs::exists(quiet_log)) << "the empty log of a gone sandbox outlived the next start";
    EXPECT_EQ(slurp(chatty_log), "kept\n");
    const json l = sup.call({{"v", 1}, {"op", "logs"}, {"sandbox", chatty_id}});
    EXPECT_EQ(l["output"], "kept\n") << l.dump();
    EXPECT_EQ(l["running"], false);
    sup.child.signal(SIGTERM);
    EXPECT_EQ(sup.child.wait(), 0) << sup.log_text();
  }
  fs::remove_all(logs);
}

// Under keep only unnamed processes outlive the supervisor: a named one would outlive the
// kill-switch of its lease and run beside the name's next holder, so it is killed first and its
// name given back once it is dead.
TEST_F(SupervisorProcess, SigtermWithKeepLeavesUnnamedProcessesRunningAndKillsNamedOnes) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--on-shutdown", "keep"});
  const std::string cg_parent = sup.call({{"v", 1}, {"op", "status"}})["cgroup_parent"];
  const json n = sup.call(run_req("kept", {"sleep", "30"}));
  ASSERT_EQ(n["ok"], true) << n.dump();
  const json a = sup.call(run_req("", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const pid_t pid = a["pid"];
  const pid_t named_pid = n["pid"];
  auto gone = [](pid_t p) {  // reaped by init, or a zombie until then
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const auto rp = line.rfind(')');
    return rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] == 'Z';
  };
  sup.child.signal(SIGTERM);
  EXPECT_EQ(sup.child.wait(10'000), 0) << sup.log_text();
  EXPECT_EQ(::kill(pid, 0), 0) << "a kept sandbox must survive the supervisor";
  EXPECT_TRUE(gone(named_pid)) << "a named sandbox must not survive the supervisor";
  EXPECT_FALSE(fs::exists(sup.shm));
  // Its name was released: the next holder gets the next epoch.
  auto ad = admin();
  const lockd::Answer g = ad.acquire("kept", SandboxId{0x88, 0x88}, WorkerId{0x88, 0x89});
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  EXPECT_EQ(g.as<wire::Grant>()->epoch, n["epoch"].get<Epoch>() + 1);
  if (cg_parent.empty()) {  // no delegated cgroup here: nothing to sweep at restart
    ::kill(pid, SIGKILL);
    return;
  }
  // The same worker's next supervisor stops what was kept: nothing watches it any more.
  Supervisor again;
  start_sup(again, {"--worker-id", sup.worker}, "again");
  const std::string leaf = a.value("cgroup", std::string());
  EXPECT_TRUE(eventually([&] { return gone(pid); }, 5000)) << again.log_text();
  EXPECT_FALSE(fs::exists(leaf)) << leaf;
  const auto swept = again.events("stale_leaf_swept");
  ASSERT_EQ(swept.size(), 1u) << again.log_text();
  EXPECT_EQ(swept[0].at("path"), leaf);
  EXPECT_EQ(swept[0].at("had_processes"), "1");
  EXPECT_EQ(swept[0].at("result"), "removed");
}

// ---- isolation and ownership (issue 14) -------------------------------------------------------

// The processes whose command line starts with `sleep <mark>` (the host's view).
std::vector<pid_t> processes_marked(const std::string& mark) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e.path().filename().c_str()));
    if (pid <= 0) continue;
    Result<std::string> read = read_small_file((e.path() / "cmdline").string());
    if (!read) continue;  // a process that just exited reads as an error: skipped
    std::string& cmd = *read;
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.rfind("sleep " + mark, 0) == 0) out.push_back(pid);
  }
  return out;
}

// Issue 14: "a grandchild that called setsid survived release and the kill-switch". Started
// by the supervisor, released through the control socket: with isolation (the default) the
// grandchild dies with the sandbox; with --isolation off (the ablation) it survives.
TEST_F(SupervisorProcess, ASetsidGrandchildDoesNotSurviveRelease) {
  start_lockd();
  const std::string mark = std::to_string(8'000'000 + ::getpid() % 1'000'000);
  for (const bool isolated : {true, false}) {
    SCOPED_TRACE(isolated ? "isolated" : "--isolation off");
    Supervisor sup;
    // The process-group kill (no cgroup): where the setsid escape worked.
    std::vector<std::string> extra = {"--slots", "16", "--no-cgroup"};
    if (!isolated) extra.insert(extra.end(), {"--isolation", "off", "--allow-unsafe-kill"});
    std::string err;
    ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key_, with(kSupTiming, extra), &err,
                          isolated ? "iso" : "legacy"))
        << err;
    const std::string name = isolated ? "escape-iso" : "escape-legacy";
    const json a = sup.call(run_req(name, {"sh", "-c", "setsid sleep " + mark + " </dev/null >/dev/null 2>&1 & "
                                                       "exec sleep " + mark}));
    ASSERT_EQ(a["ok"], true) << a.dump();
    EXPECT_EQ(a["isolation"], isolated);
    if (isolated && ::geteuid() == 0) {
      EXPECT_NE(a["uid"], 0) << "root's sandbox runs as an unprivileged uid";
    }
    ASSERT_TRUE(eventually([&] { return processes_marked(mark).size() == 2; }, 10'000));
    const json r = sup.call({{"v", 1}, {"op", "release"}, {"name", name}});
    ASSERT_EQ(r["ok"], true) << r.dump();
    if (isolated) {
      EXPECT_TRUE(processes_marked(mark).empty()) << "the grandchild died before the release was answered";
    } else {
      EXPECT_FALSE(eventually([&] { return processes_marked(mark).empty(); }, 1'000))
          << "ablation: the legacy spawn's grandchild survives the release";
      for (pid_t p : processes_marked(mark)) ::kill(p, SIGKILL);
    }
  }
}

// Issue 14: "No named sandbox without an unescapable kill": without a pid namespace (isolation
// off) and without a delegated cgroup, a named run is refused naming cause and fix;
// --allow-unsafe-kill overrides and the status says so.
TEST_F(SupervisorProcess, ANamedSandboxWithoutAnUnescapableKillIsRefused) {
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--isolation", "off", "--no-cgroup"});
  const json st = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(st["unsafe_kill"], true);
  const json r = sup.call(run_req("unsafe", {"sleep", "30"}));
  EXPECT_EQ(r["ok"], false);
  Supervisor isolated;  // isolation on: the pid namespace is an unescapable kill without a cgroup
  start_sup(isolated, {"--no-cgroup"}, "isolated");
  EXPECT_EQ(isolated.call({{"v", 1}, {"op", "status"}})["unsafe_kill"], false);
  EXPECT_EQ(isolated.call(run_req("safe", {"sleep", "30"}))["ok"], true);
  EXPECT_EQ(r["error"], "refused");
  EXPECT_NE(r["message"].get<std::string>().find("no unescapable kill"), std::string::npos) << r.dump();
  EXPECT_NE(r["message"].get<std::string>().find("--allow-unsafe-kill"), std::string::npos) << r.dump();
  EXPECT_EQ(sup.call(run_req("", {"sleep", "30"}))["ok"], true) << "an unnamed sandbox holds no name";

  Supervisor allowed;
  start_sup(allowed, {"--isolation", "off", "--no-cgroup", "--allow-unsafe-kill"}, "allowed");
  const json a = allowed.call(run_req("unsafe", {"sleep", "30"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  EXPECT_EQ(a["unsafe_kill"], true);
  const json list = allowed.call({{"v", 1}, {"op", "list"}});
  EXPECT_EQ(list["sandboxes"][0]["unsafe_kill"], true);
  EXPECT_NE(allowed.child.out().find("kill             UNSAFE"), std::string::npos) << allowed.child.out();
}

// Issue 14: "a member of --group ran a command as uid 0 and released root's sandbox". The
// member's command runs as the member's uid, and root's sandbox is not the member's to release,
// kill, name or list.
TEST_F(SupervisorProcess, AGroupMemberRunsAsItselfAndCannotTouchRootsSandboxes) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  start_lockd();
  Supervisor sup;
  start_sup(sup, {"--group", "users"});
  const json mine = sup.call(run_req("roots", {"sleep", "30"}));
  ASSERT_EQ(mine["ok"], true) << mine.dump();
  const json unnamed = sup.call(run_req("", {"sleep", "30"}));
  ASSERT_EQ(unnamed["ok"], true) << unnamed.dump();
  const gid_t users = 100;
  const uid_t member = 4242;
  const std::vector<json> requests = {
      run_req("", {"sh", "-c", "id -u > /dev/null; exec sleep 30"}),
      {{"v", 1}, {"op", "release"}, {"name", "roots"}},
      {{"v", 1}, {"op", "kill"}, {"sandbox", mine["sandbox"]}},
      {{"v", 1}, {"op", "name"}, {"sandbox", unnamed["sandbox"]}, {"name", "stolen"}},
      {{"v", 1}, {"op", "list"}}};
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(out[0]);
    if (::setgroups(1, &users) != 0 || ::setresgid(users, users, users) != 0 ||
        ::setresuid(member, member, member) != 0)
      ::_exit(3);
    std::string lines;
    for (const auto& req : requests) {
      auto a = control_call(sup.socket.string(), req, 10'000);
      lines += (a ? a->dump() : json{{"client_error", a.message()}}.dump()) + "\n";
    }
    [[maybe_unused]] const ssize_t n = ::write(out[1], lines.data(), lines.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::vector<json> answers;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) answers.push_back(json::parse(line));
  ASSERT_EQ(answers.size(), requests.size()) << text;
  ASSERT_EQ(answers[0]["ok"], true) << answers[0].dump();
  EXPECT_EQ(answers[0]["uid"], member) << "a command runs as its caller's uid, never as the supervisor's";
  for (std::size_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(answers[i]["ok"], false) << answers[i].dump();
    EXPECT_EQ(answers[i]["error"], "forbidden") << answers[i].dump();
  }
  ASSERT_EQ(answers[4]["sandboxes"].size(), 1u) << "the member sees only its own: " << answers[4].dump();
  EXPECT_EQ(answers[4]["sandboxes"][0]["sandbox"], answers[0]["sandbox"]);
  // Root's sandboxes were untouched; root may act on the member's.
  const json list = sup.call({{"v", 1}, {"op", "list"}});
  EXPECT_EQ(list["sandboxes"].size(), 3u) << list.dump();
  EXPECT_EQ(::kill(mine["pid"].get<pid_t>(), 0), 0);
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "kill"}, {"sandbox", answers[0]["sandbox"]}})["ok"], true);
}

// Issue 14: "it set another slot's revoked bit in the shm table, and truncating the table killed
// the supervisor with SIGBUS". An isolated sandbox gets the table as a read-only descriptor
// (LEASEHOLD_SHM=3) of a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE, mode
// 0440) and tries every way it can see to write it: reopening the descriptor or the path readers
// outside use for writing (after a chmod too, which the owner may do: a non-root supervisor's
// sandbox shares its uid), a writable mapping, truncation. Every one fails; the supervisor and its
// neighbour keep running, the neighbour's lease stays valid. The ablation (the seals off,
// LEASEHOLD_ABLATE=unsealed-table, and --isolation off so a root sandbox may override the mode)
// shows the attack it stops: the truncation succeeds and the supervisor dies of it.
TEST_F(SupervisorProcess, AnIsolatedSandboxCannotWriteTheShmTable) {
  start_lockd();
  const std::string script =
      "echo shm=$LEASEHOLD_SHM; "
      "python3 -c 'import os; os.open(\"/proc/self/fd/3\", os.O_RDWR); print(\"reopened-rw\")' 2>/dev/null; "
      "python3 -c 'import os; os.open(os.environ[\"TABLE\"], os.O_RDWR); print(\"path-rw\")' 2>/dev/null; "
      "python3 -c 'import mmap; mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_WRITE); print(\"mapped-rw\")' 2>/dev/null; "
      "python3 -c 'import os; os.ftruncate(3, 0); print(\"truncated-fd\")' 2>/dev/null; "
      "truncate -s 0 \"$TABLE\" 2>/dev/null && echo truncated-path; "
      "python3 -c 'import os\ntry: os.fchmod(3, 0o600)\nexcept OSError: pass\n"
      "fd = os.open(\"/proc/self/fd/3\", os.O_RDWR); print(\"chmod-reopened-rw\", flush=True)\n"
      "os.ftruncate(fd, 0); print(\"truncated-rw\", flush=True)' 2>/dev/null; "
      "echo done; exec sleep 30";
  for (const bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "isolated, sealed" : "ablation: unsealed, --isolation off");
    Supervisor sup;
    std::vector<std::string> extra = {"--slots", "16"};
    if (!sealed) {
      extra.insert(extra.end(), {"--isolation", "off"});
      ::setenv("LEASEHOLD_ABLATE", "unsealed-table", 1);
    }
    std::string err;
    const bool started =
        sup.start(dir_.path(), lockd_.address, key_, with(kSupTiming, extra), &err, sealed ? "iso" : "unsealed");
    ::unsetenv("LEASEHOLD_ABLATE");
    ASSERT_TRUE(started) << err;
    EXPECT_EQ(sup.shm.rfind("/proc/" + std::to_string(sup.child.pid()) + "/fd/", 0), 0u)
        << "a memfd, reachable from outside through the supervisor's /proc: " << sup.shm;
    const json neighbour = run_probe(sup, sealed ? "nb-iso" : "nb-unsealed", sealed ? "nb-iso" : "nb-unsealed");
    ASSERT_EQ(neighbour["ok"], true) << neighbour.dump();
    const fs::path out = dir_.sandbox_dir() / (sealed ? "attack-iso.out" : "attack-unsealed.out");
    json req = run_req(sealed ? "attacker-iso" : "attacker-unsealed",
                       {"sh", "-c", "exec > " + out.string() + " 2>&1; " + script});
    req["env"]["TABLE"] = sup.shm;
    const json a = sup.call(req);
    ASSERT_EQ(a["ok"], true) << a.dump();
    // The ablated supervisor can die of the truncation (and take the attacker with it) before
    // the script's last line: there the truncation is what the attacker reaches.
    ASSERT_TRUE(eventually([&] {
      const std::string got = slurp(out);
      return got.find("done") != std::string::npos || (!sealed && got.find("truncated-rw\n") != std::string::npos);
    }, 20'000)) << slurp(out);
    const std::string said = slurp(out);
    EXPECT_NE(said.find("shm=3\n"), std::string::npos) << said;
    if (sealed) {
      for (const char* attack : {"reopened-rw", "path-rw", "mapped-rw", "truncated-fd", "truncated-path", "truncated-rw"})
        EXPECT_EQ(said.find(attack + std::string("\n")), std::string::npos) << attack << " succeeded:\n" << said;
      const json st = sup.call({{"v", 1}, {"op", "status"}});
      EXPECT_EQ(st["sandboxes"], 2) << st.dump();
      EXPECT_FALSE(sup.child.exited());
      // The neighbour logs its first answer on its own schedule: wait for that line, not a while.
      ASSERT_TRUE(harness::wait_for_log_line(probe_log("nb-iso"), "t=", std::chrono::milliseconds(20'000)).has_value())
          << slurp(probe_log("nb-iso"));
      const auto lines = probe_lines(probe_log("nb-iso"));
      ASSERT_FALSE(lines.empty());
      EXPECT_EQ(lines.back().valid, 1) << "the neighbour's lease stays valid";
    } else {
      EXPECT_NE(said.find("truncated-rw\n"), std::string::npos) << "ablation: the table was truncated:\n" << said;
      // Died at its next store into the table: SIGBUS (a sanitizer build reports it, then exits).
      const int code = sup.child.wait(20'000);
      EXPECT_TRUE(code == 128 + SIGBUS || (code > 0 && sup.log_text().find("BUS") != std::string::npos))
          << "exit " << code << "\n" << sup.log_text();
    }
  }
}

// ---- revoke: lock-delay, pushed revocation, kill confirmation ------------------------------

std::uint64_t counter(lockd::AdminClient& ad, const std::string& key) {
  const auto cs = ad.counters();
  if (!cs) return 0;
  for (const auto& c : *cs)
    if (c.key == key) return c.value;
  return 0;
}

// Timing where the next heartbeat is seconds away, so the kill can only come that early from
// the pushed revocation: lockd and supervisors with a 10 s TTL, heartbeats every 2 s.
const std::vector<std::string> kSlowBeats = {"--ttl-ms", "10000", "--kill-after-ms", "6000",
                                             "--heartbeat-interval-ms", "2000", "--kill-latency-budget-ms", "50",
                                             "--slots", "16"};

// issue 13: `revoke` freed the name at once; another worker acquired it and started a sandbox
// while the old holder still ran (killed only on its next heartbeat answer). Now the name is not
// grantable until the old holder's supervisor confirms the kill (pushed by lockd at once) or the
// old lease would have expired: whenever the second worker gets the name, the first sandbox is
// already dead.
TEST_F(SupervisorProcess, RevokedNameIsGrantedAgainOnlyAfterTheOldHolderIsDead) {
  start_lockd({"--ttl-ms", "10000"});
  Supervisor s1, s2;
  std::string err;
  ASSERT_TRUE(s1.start(dir_.path(), lockd_.address, key_, kSlowBeats, &err, "s1")) << err;
  ASSERT_TRUE(s2.start(dir_.path(), lockd_.address, key_, kSlowBeats, &err, "s2")) << err;
  const json a = s1.call(run_req("rv", {"sleep", "60"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const pid_t old_pid = a["pid"];
  const Epoch epoch = a["epoch"];
  auto ad = admin();
  // lockd learns s1's address from its heartbeats: wait for one.
  ASSERT_TRUE(eventually([&] { return counter(ad, "refresh_entries") > 0; }, 10'000));
  const lockd::Answer rv = ad.revoke(name_id_of("rv"), epoch);
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  EXPECT_EQ(rv.as<wire::Ok>()->epoch, epoch + 1);
  // The other worker tries at once and keeps trying: each time it gets the name, the old
  // sandbox must already be gone.
  json got;
  ASSERT_TRUE(eventually([&] {
    got = s2.call(run_req("rv", {"sleep", "60"}));
    if (got["ok"] == true) return true;
    EXPECT_EQ(got["reason"], "lock_delay") << got.dump();
    return false;
  }, 20'000)) << got.dump() << "\n" << s1.log_text();
  EXPECT_EQ(::kill(old_pid, 0), -1) << "the old holder still ran when the name was granted again";
  EXPECT_EQ(got["epoch"], epoch + 1);
  // The kill came from the push, and its confirmation lifted the lock-delay.
  EXPECT_GE(counter(ad, "revoke_pushes_acked"), 1u);
  EXPECT_EQ(counter(ad, "revoke_ended_kill_confirmed"), 1u);
  EXPECT_EQ(counter(ad, "revoke_ended_lease_expired"), 0u);
  EXPECT_FALSE(s1.events("revoked").empty()) << s1.log_text();
  EXPECT_FALSE(s1.events("kill_confirmed").empty()) << s1.log_text();
}

// issue 13, review finding 5: a preemptible revoke with every datagram lockd -> worker lost.
// The worker's beats still reach lockd, so its liveness never lapses; the old code kept the
// revoke pending (its bound followed that liveness) and ignored the Release the supervisor
// sent after its kill-switch killed the sandbox. Now that Release confirms the kill, and the
// bound (revoke + liveness TTL + lock-delay) is fixed: it only counts down.
TEST_F(SupervisorProcess, PreemptibleRevokeEndsUnderOneWayLoss) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible", "--lock-delay-ms", "200"});
  const auto relay = start_relay(lockd_.socket_address());
  Supervisor sup;
  start_sup_via(sup, *relay, {"--mode", "preemptible"});
  const json a = run_probe(sup, "ow", "ow");
  ASSERT_EQ(a["ok"], true) << a.dump();
  const pid_t pid = a["pid"];
  auto ad = admin();
  ASSERT_TRUE(eventually([&] {
    const lockd::Answer sh = ad.show("ow");
    const auto* i = sh.as<wire::NameInfo>();
    return i != nullptr && i->record.state == LockPhase::held;
  }, 5000));
  relay->cut_answers(true);  // lockd -> worker lost from here on; worker -> lockd arrives
  const lockd::Answer rv = ad.revoke(name_id_of("ow"));
  ASSERT_NE(rv.as<wire::Ok>(), nullptr) << rv.message();
  const lockd::Answer first = ad.show("ow");
  ASSERT_NE(first.as<wire::NameInfo>(), nullptr) << first.message();
  const std::uint32_t bound_ms = first.as<wire::NameInfo>()->record.ttl_left_ms;
  EXPECT_LE(bound_ms, 1200u) << "revoke + liveness TTL (1000 ms) + lock-delay (200 ms)";
  // The bound never moves forward while the worker beats; the name ends the revoke.
  std::uint32_t last = bound_ms;
  wire::NameRecord rec;
  ASSERT_TRUE(eventually([&] {
    const lockd::Answer sh = ad.show("ow");
    const auto* i = sh.as<wire::NameInfo>();
    if (i == nullptr) return false;
    rec = i->record;
    if (!rec.revoke_pending) return true;
    EXPECT_LE(rec.ttl_left_ms, last) << "the revoke's bound moved forward";
    last = rec.ttl_left_ms;
    return false;
  }, 10'000)) << sup.log_text();
  EXPECT_GT(relay->answers_dropped(), 0u);
  EXPECT_EQ(::kill(pid, 0), -1) << "the revoked sandbox still runs";
  // Killed by its kill-switch (it never heard of the revoke), then released: a confirmation.
  EXPECT_EQ(rec.revoke_ended, wire::RevokeEnd::kill_confirmed) << sup.log_text();
  EXPECT_EQ(counter(ad, "revoke_ended_kill_confirmed"), 1u);
  const SandboxId other{0x6e, 0x6e};
  const lockd::Answer acq = ad.acquire("ow", other, WorkerId{0x6f, 0x6f}, 0, /*two_phase=*/true);
  EXPECT_NE(acq.as<wire::Grant>(), nullptr) << acq.message();
}

#ifdef LEASEHOLD_CLI_BINARY
struct CliRun {
  int code = -1;
  std::string out, err;
};
CliRun run_cli(const fs::path& dir, const std::vector<std::string>& args) {
  static int runs = 0;
  const std::string tag = "cli" + std::to_string(++runs);
  Child c;
  c.start(LEASEHOLD_CLI_BINARY, args, dir / (tag + ".out"), dir / (tag + ".err"));
  CliRun r;
  r.code = c.wait(60'000);
  r.out = slurp(dir / (tag + ".out"));
  r.err = slurp(dir / (tag + ".err"));
  return r;
}

// `leasehold revoke --wait` returns once the name is grantable again and says which ended the
// wait: the old holder's kill confirmed (its supervisor answers), or its lease expired (its
// supervisor is frozen: nothing confirms).
TEST_F(SupervisorProcess, RevokeWaitSaysWhetherTheKillWasConfirmedOrTheLeaseExpired) {
  start_lockd({"--ttl-ms", "3000"});
  Supervisor s1;
  std::string err;
  ASSERT_TRUE(s1.start(dir_.path(), lockd_.address, key_,
                       {"--ttl-ms", "3000", "--kill-after-ms", "1800", "--heartbeat-interval-ms", "600",
                        "--kill-latency-budget-ms", "50", "--slots", "16"},
                       &err, "s1"))
      << err;
  auto ad = admin();
  const std::vector<std::string> lf = {"--lockd", lockd_.address, "--key-file", key_};
  const json a = s1.call(run_req("w1", {"sleep", "60"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  ASSERT_TRUE(eventually([&] { return counter(ad, "refresh_entries") > 0; }, 10'000));
  const CliRun c = run_cli(dir_.path(), with({"revoke", "w1", "--wait", "--json"}, lf));
  ASSERT_EQ(c.code, 0) << c.err << c.out;
  const json j = json::parse(c.out);
  EXPECT_EQ(j["ended_by"], "kill_confirmed") << c.out;
  EXPECT_EQ(j["epoch"], a["epoch"].get<Epoch>() + 1);
  EXPECT_EQ(::kill(a["pid"].get<pid_t>(), 0), -1);

  // A frozen supervisor confirms nothing: the wait ends when the old lease would have expired.
  const json b = s1.call(run_req("w2", {"sleep", "60"}));
  ASSERT_EQ(b["ok"], true) << b.dump();
  s1.child.signal(SIGSTOP);
  const CliRun d = run_cli(dir_.path(), with({"revoke", "w2", "--wait"}, lf));
  s1.child.signal(SIGCONT);
  ASSERT_EQ(d.code, 0) << d.err << d.out;
  EXPECT_NE(d.out.find("not grantable until worker " + s1.worker), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("lease expired"), std::string::npos) << d.out;
  EXPECT_EQ(counter(ad, "revoke_ended_lease_expired"), 1u);
  // Shown while pending, and how it ended afterwards.
  const CliRun shown = run_cli(dir_.path(), with({"show", "w2", "--json"}, lf));
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_EQ(json::parse(shown.out)["revoke_ended"], "lease_expired") << shown.out;
}

// The hand-over a holder cannot refuse: an operator's revoke. Its worker confirms the kill and
// the first waiter has the name at once (passed); a frozen worker confirms nothing and the
// waiter has it only when the old lease's bound has passed (seized), never before.
TEST_F(SupervisorProcess, ARevokeHandsTheNameToTheFirstWaiterPassedOrSeizedAtTheBound) {
  start_lockd();
  Supervisor s1, s2;
  start_sup(s1, {}, "s1");
  start_sup(s2, {}, "s2");
  auto ad = admin();
  const std::vector<std::string> lf = {"--lockd", lockd_.address, "--key-file", key_};
  auto queued = [&](const std::string& name) {
    json r = run_req(name, {"sleep", "30"});
    r["queue"] = true;
    return r;
  };
  for (const bool frozen : {false, true}) {
    SCOPED_TRACE(frozen ? "holder's supervisor frozen" : "holder's supervisor live");
    const std::string name = frozen ? "seized" : "passed";
    const json held = s1.call(run_req(name, {"sleep", "30"}));
    ASSERT_EQ(held["ok"], true) << held.dump();
    json next;
    std::thread waiter([&] { next = s2.call(queued(name), 20'000); });
    ASSERT_TRUE(eventually([&] {
      for (const auto& e : s2.events("queued"))
        if (e.at("name") == name) return true;
      return false;
    }, 5000)) << s2.log_text();
    if (frozen) s1.child.signal(SIGSTOP);
    const CliRun rv = run_cli(dir_.path(), with({"revoke", name, "--json"}, lf));
    EXPECT_EQ(rv.code, 0) << rv.err << rv.out;
    // A frozen holder: within the bound the name stays with nobody, the waiter has not started.
    if (frozen) {
      EXPECT_EQ(s2.events("queue_granted").size(), 1u) << "only the live round's" << s2.log_text();
    }
    waiter.join();
    if (frozen) s1.child.signal(SIGCONT);
    ASSERT_EQ(next["ok"], true) << next.dump() << s2.log_text();
    EXPECT_EQ(next["epoch"], held["epoch"].get<Epoch>() + 1) << "the epoch the revoke announced";
    if (!frozen) {
      EXPECT_EQ(counter(ad, "revoke_ended_kill_confirmed"), 1u);
    }
    EXPECT_EQ(counter(ad, "revoke_ended_lease_expired"), frozen ? 1u : 0u);
    EXPECT_EQ(counter(ad, "waiters_granted"), frozen ? 2u : 1u);
  }
}

// A waiter whose client is killed (kill -9 of `leasehold run --wait`) leaves the line at once:
// the next waiter is served when the holder lets go, and the killed one never runs.
TEST_F(SupervisorProcess, AWaiterWhoseClientIsKilledLeavesTheLine) {
  start_lockd();
  Supervisor s1, s2;
  start_sup(s1, {}, "s1");
  start_sup(s2, {}, "s2");
  const json held = s1.call(run_req("gone", {"sleep", "30"}));
  ASSERT_EQ(held["ok"], true) << held.dump();
  Child killed;  // `leasehold run --wait` on s2's worker
  killed.start(LEASEHOLD_CLI_BINARY, {"run", "--wait", "--name", "gone", "--supervisor", s2.socket.string(), "--", "sleep", "30"},
               dir_.path() / "killed.out", dir_.path() / "killed.err");
  ASSERT_TRUE(eventually([&] { return !s2.events("queued").empty(); }, 5000)) << s2.log_text();
  json next;
  std::thread t([&] {
    json r = run_req("gone", {"sleep", "30"});
    r["queue"] = true;
    next = s1.call(r, 15'000);
  });
  ASSERT_TRUE(eventually([&] { return s1.events("queued").size() >= 1; }, 5000)) << s1.log_text();
  killed.signal(SIGKILL);
  killed.wait(5'000);
  auto ad = admin();
  ASSERT_TRUE(eventually([&] { return counter(ad, "waiters_left") == 1u; }, 5000));
  const json rel = s1.call({{"v", 1}, {"op", "release"}, {"name", "gone"}});
  EXPECT_EQ(rel["ok"], true) << rel.dump();
  t.join();
  ASSERT_EQ(next["ok"], true) << next.dump() << s1.log_text();
  EXPECT_EQ(next["epoch"], held["epoch"].get<Epoch>() + 1);
  EXPECT_TRUE(s2.events("queue_granted").empty()) << s2.log_text();
}

// Reconcile before recover: a supervisor killed (-9) while it held one name and waited for
// another resumes neither when it restarts. Its leftover sandbox is killed before it serves
// anything, the name stays the old grant's at lockd until that lease ends (a new run is refused
// `held`, not handed the old belief), and the old place lapses instead of being granted.
TEST_F(SupervisorProcess, ASupervisorRestartedWhileHoldingAndWaitingResumesNothing) {
  // A 3 s TTL: the restart (about a second here) happens while lockd still has the old grant.
  start_lockd({"--ttl-ms", "3000"});
  const std::vector<std::string> timing = {"--ttl-ms", "3000", "--kill-after-ms", "1800", "--heartbeat-interval-ms",
                                           "600", "--kill-latency-budget-ms", "50", "--slots", "16"};
  const std::string worker = "00000000000000090000000000000009";
  auto start = [&](Supervisor& s, std::vector<std::string> extra, const std::string& tag) {
    std::string err;
    extra.insert(extra.end(), timing.begin(), timing.end());
    ASSERT_TRUE(s.start(dir_.path(), lockd_.address, key_, extra, &err, tag)) << err;
  };
  Supervisor other;
  start(other, {}, "other");
  const json theirs = other.call(run_req("recon/theirs", {"sleep", "30"}));
  ASSERT_EQ(theirs["ok"], true) << theirs.dump();
  json mine;
  {
    Supervisor before;
    start(before, {"--worker-id", worker}, "before");
    mine = before.call(run_req("recon/mine", {"sleep", "30"}));
    ASSERT_EQ(mine["ok"], true) << mine.dump();
    std::thread queued([&] {
      json r = run_req("recon/theirs", {"sleep", "30"});
      r["queue"] = true;
      (void)before.call(r, 5'000);
    });
    const bool placed = eventually([&] { return !before.events("queued").empty(); }, 5000);
    before.child.signal(SIGKILL);
    before.child.wait(5'000);
    queued.join();
    ASSERT_TRUE(placed) << before.log_text();
  }
  Supervisor after;
  start(after, {"--worker-id", worker}, "after");
  // Dead (a zombie of whoever reaps it now is dead too), killed by its death signal or the sweep.
  const std::string stat = "/proc/" + std::to_string(mine["pid"].get<pid_t>()) + "/stat";
  EXPECT_TRUE(eventually([&] {
    const std::string st = slurp(stat);
    const auto paren = st.rfind(')');
    return st.empty() || (paren != std::string::npos && paren + 2 < st.size() && st[paren + 2] == 'Z');
  }, 5000)) << "the old sandbox still runs: " << slurp(stat);
  EXPECT_EQ(after.call({{"v", 1}, {"op", "list"}})["sandboxes"].size(), 0u);
  json again = after.call(run_req("recon/mine", {"sleep", "30"}));
  EXPECT_EQ(again["error"], "held") << again.dump() << "\n" << lockd_.log_text();
  EXPECT_EQ(again["epoch"], mine["epoch"]) << "still the old grant, which nobody here resumed";
  // The old place is renewed by nobody: once it lapsed, a release passes over it.
  auto ad = admin();
  sleep_ms(3200);
  const json rel = other.call({{"v", 1}, {"op", "release"}, {"name", "recon/theirs"}});
  EXPECT_EQ(rel["ok"], true) << rel.dump();
  EXPECT_EQ(counter(ad, "waiters_lapsed"), 1u);
  EXPECT_EQ(counter(ad, "waiters_granted"), 0u);
  EXPECT_TRUE(after.events("queue_granted").empty()) << after.log_text();
}

// issue 13, review finding 1: lockd completed a transfer as soon as asked, so the receiver
// could be named while the old holder still ran. lockd now keeps the name Transferring (not
// grantable, not even to the receiver) until the old holder's worker confirmed the kill, or
// the old lease + lock-delay would have ended. Each test runs with the guard on and ablated
// (LEASEHOLD_ABLATE=transfer-unguarded), where the attack must succeed.
class TransferGuard : public SupervisorProcess, public ::testing::WithParamInterface<bool> {
 protected:
  bool defended() const { return GetParam(); }
  void TearDown() override { ::unsetenv("LEASEHOLD_ABLATE"); }
  void start_guarded_lockd(std::vector<std::string> extra) {
    if (!defended()) ::setenv("LEASEHOLD_ABLATE", "transfer-unguarded", 1);
    start_lockd(std::move(extra));
    ::unsetenv("LEASEHOLD_ABLATE");
  }
  bool alive(pid_t pid) const { return ::kill(pid, 0) == 0; }
};

// Scenario (a): `transfer --wait-ms 0 --to-supervisor`: the receiver must not be named while
// the old holder runs. Defended, a complete before the kill confirmation is refused
// (lock_delay, exit 1, the name stays transferring) and the same command completes it once
// worker 1 confirmed the kill; ablated, the receiver is named at once beside the old holder.
TEST_P(TransferGuard, ReceiverIsNotNamedWhileTheOldHolderRuns) {
  start_guarded_lockd({"--ttl-ms", "10000"});
  Supervisor s1, s2;
  std::string err;
  ASSERT_TRUE(s1.start(dir_.path(), lockd_.address, key_, kSlowBeats, &err, "s1")) << err;
  ASSERT_TRUE(s2.start(dir_.path(), lockd_.address, key_, kSlowBeats, &err, "s2")) << err;
  const json a = s1.call(run_req("xa", {"sleep", "60"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const pid_t old_pid = a["pid"];
  const json b = s2.call(run_req("", {"sleep", "60"}));
  ASSERT_EQ(b["ok"], true) << b.dump();
  const std::string to = b["sandbox"];
  const pid_t new_pid = b["pid"];
  auto ad = admin();
  ASSERT_TRUE(eventually([&] { return counter(ad, "refresh_entries") > 0; }, 10'000));  // s1's address
  const std::vector<std::string> lf = {"--lockd", lockd_.address, "--key-file", key_};
  const std::vector<std::string> args =
      with({"transfer", "xa", "--to", to, "--to-supervisor", s2.socket.string(), "--json"}, lf);
  CliRun c = run_cli(dir_.path(), with(args, {"--wait-ms", "0"}));
  if (!defended()) {
    ASSERT_EQ(c.code, 0) << c.err << c.out;
    // The receiver was named; lockd never waited for worker 1: nothing was pushed, nothing
    // confirmed, and the old holder is killed only by its next heartbeat answer (up to 2 s on).
    EXPECT_EQ(json::parse(c.out)["state"], "held") << c.out;
    EXPECT_TRUE(alive(old_pid) && alive(new_pid)) << "ablation: the receiver started beside the old holder";
    EXPECT_EQ(counter(ad, "revoke_pushes_sent"), 0u);
    return;
  }
  int tries = 0;
  while (c.code != 0 && ++tries < 50) {
    EXPECT_EQ(c.code, 1) << c.err << c.out;  // refused lock_delay, left transferring
    EXPECT_NE(c.err.find("refused lock_delay"), std::string::npos) << c.err;
    EXPECT_TRUE(alive(new_pid));
    c = run_cli(dir_.path(), args);  // the same command again resumes it
  }
  ASSERT_EQ(c.code, 0) << c.err << c.out;
  const json j = json::parse(c.out);
  EXPECT_EQ(j["state"], "held") << c.out;
  EXPECT_EQ(j["ended_by"], "kill_confirmed") << c.out;
  EXPECT_FALSE(alive(old_pid)) << "the receiver was named while the old holder still ran";
  EXPECT_GE(counter(ad, "revoke_pushes_sent"), 1u);
  EXPECT_EQ(counter(ad, "revoke_ended_kill_confirmed"), 1u);
  EXPECT_FALSE(s1.events("kill_confirmed").empty()) << s1.log_text();
  EXPECT_TRUE(alive(new_pid));
}

// Scenario (b): `--from-supervisor` naming a supervisor that does not run the holder, and the
// holder's own supervisor frozen (SIGSTOP: nothing can confirm or kill). The CLI refuses the
// wrong socket before anything moves; without it, lockd completes only once the old lease +
// lock-delay would have ended (defended), or at once (ablated).
TEST_P(TransferGuard, FrozenOldSupervisorDelaysTheReceiverUntilTheOldLeaseAndLockDelayEnd) {
  start_guarded_lockd({"--ttl-ms", "3000", "--lock-delay-ms", "500"});
  Supervisor s1, s2;
  std::string err;
  const std::vector<std::string> timing = {"--ttl-ms", "3000", "--kill-after-ms", "1800", "--heartbeat-interval-ms",
                                           "600", "--kill-latency-budget-ms", "50", "--slots", "16"};
  ASSERT_TRUE(s1.start(dir_.path(), lockd_.address, key_, timing, &err, "s1")) << err;
  ASSERT_TRUE(s2.start(dir_.path(), lockd_.address, key_, timing, &err, "s2")) << err;
  const json a = s1.call(run_req("xb", {"sleep", "60"}));
  ASSERT_EQ(a["ok"], true) << a.dump();
  const json b = s2.call(run_req("", {"sleep", "60"}));
  ASSERT_EQ(b["ok"], true) << b.dump();
  const std::string to = b["sandbox"];
  auto ad = admin();
  ASSERT_TRUE(eventually([&] { return counter(ad, "refresh_entries") > 0; }, 10'000));
  const std::vector<std::string> lf = {"--lockd", lockd_.address, "--key-file", key_};
  // The wrong supervisor: refused, nothing moved.
  const CliRun wrong = run_cli(dir_.path(), with({"transfer", "xb", "--to", to, "--from-supervisor",
                                                  s2.socket.string(), "--to-supervisor", s2.socket.string()},
                                                 lf));
  EXPECT_EQ(wrong.code, 3) << wrong.err << wrong.out;
  EXPECT_NE(wrong.err.find("is the supervisor of worker " + s2.worker), std::string::npos) << wrong.err;
  EXPECT_NE(wrong.err.find("runs on worker " + s1.worker), std::string::npos) << wrong.err;
  const lockd::Answer still = ad.show("xb");
  ASSERT_NE(still.as<wire::NameInfo>(), nullptr) << still.message();
  EXPECT_EQ(still.as<wire::NameInfo>()->record.state, LockPhase::held);
  // Freeze the holder's supervisor; the old lease ends at most its TTL after its last refresh.
  s1.child.signal(SIGSTOP);
  // A lower bound of lockd's expiry: read before the show, which rounds the time left down
  // (a refresh in flight at the SIGSTOP can only move it later).
  const std::int64_t t0 = boottime_ns();
  const lockd::Answer frozen = ad.show("xb");
  ASSERT_NE(frozen.as<wire::NameInfo>(), nullptr) << frozen.message();
  const std::int64_t expiry = t0 + std::int64_t{frozen.as<wire::NameInfo>()->record.ttl_left_ms} * 1'000'000;
  const CliRun c = run_cli(dir_.path(), with({"transfer", "xb", "--to", to, "--to-supervisor", s2.socket.string(),
                                              "--json"}, lf));
  const std::int64_t t_done = boottime_ns();
  const bool old_alive = alive(a["pid"].get<pid_t>());
  s1.child.signal(SIGCONT);
  ASSERT_EQ(c.code, 0) << c.err << c.out;
  const json j = json::parse(c.out);
  EXPECT_EQ(j["state"], "held") << c.out;
  if (!defended()) {
    EXPECT_LT(t_done, expiry) << "ablation: the receiver was named before the old lease's expiry";
    EXPECT_TRUE(old_alive) << "ablation: both sandboxes alive";
    return;
  }
  // Named no earlier than the old lease's expiry + the lock-delay (lockd's own clock; the
  // show above read the expiry no later than lockd's).
  EXPECT_GE(t_done, expiry + 500'000'000) << "named " << (expiry + 500'000'000 - t_done) / 1'000'000
                                          << " ms before the old lease + lock-delay ended";
  EXPECT_EQ(j["ended_by"], "lease_expired") << c.out;
  EXPECT_EQ(counter(ad, "revoke_ended_lease_expired"), 1u);
}

INSTANTIATE_TEST_SUITE_P(DefenceOnAndAblated, TransferGuard, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "defended" : "ablated"; });
#endif

// ---- a non-root supervisor: what its sandboxes (its own uid) must not reach ------------------

constexpr uid_t kNobody = 65534;

/// A supervisor run as uid/gid 65534 (setpriv), with `env` set, against `lockd`.
struct NobodySupervisor {
  Child child;
  fs::path socket;
  ~NobodySupervisor() {
    if (!child.exited()) {
      child.signal(SIGTERM);
      if (child.wait(10'000) == -1) child.kill9();
    }
  }
  bool start(const fs::path& dir, const std::string& lockd, const fs::path& key, const fs::path& sock,
             const std::vector<std::string>& env, const std::string& tag) {
    socket = sock;
    std::vector<std::string> args = {"--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/env"};
    args.insert(args.end(), env.begin(), env.end());
    args.insert(args.end(), {LEASEHOLD_SUPERVISOR_BINARY, "--no-config", "--lockd", lockd, "--key-file", key.string(),
                             "--control-socket", sock.string(), "--slots", "16"});
    args.insert(args.end(), kSupTiming.begin(), kSupTiming.end());
    child.start("/usr/bin/setpriv", args, dir / (tag + ".out"), dir / (tag + ".err"));
    return child.wait_stdout("ready\n");
  }
  /// A control call made as uid 65534 (a client checks that the server is root or itself).
  json call(const json& req) const {
    int p[2];
    if (::pipe(p) != 0) return json{{"ok", false}, {"message", "pipe"}};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(10);
      const auto a = control_call(socket.string(), req, 10'000);
      const std::string out = a ? a->dump() : json{{"ok", false}, {"message", a.message()}}.dump();
      (void)!::write(p[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(p[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(p[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return json::parse(out, nullptr, false);
  }
};

/// A directory owned by 65534 with `mode`.
fs::path nobody_dir(const fs::path& p, mode_t mode = 0700) {
  fs::create_directories(p);
  EXPECT_EQ(::chown(p.c_str(), kNobody, kNobody), 0);
  EXPECT_EQ(::chmod(p.c_str(), mode), 0);
  return p;
}

/// The worker key of `worker` at `path`, 0600, owned by 65534.
void nobody_key(const std::string& cluster_key, const WorkerId& worker, const fs::path& path) {
  const Status err = wire::write_key_file(path.string(), wire::derive_worker_key(load_key(cluster_key), worker));
  ASSERT_TRUE(err.ok()) << err.message();
  ASSERT_EQ(::chown(path.c_str(), kNobody, kNobody), 0);
}

class NonRootSupervisor : public SupervisorProcess {
 protected:
  void SetUp() override {
    SupervisorProcess::SetUp();
    if (IsSkipped()) return;
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to start a supervisor as uid 65534";
    if (!fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "needs /usr/bin/setpriv (util-linux)";
    start_lockd();
    xdg_ = nobody_dir(dir_.path() / "nb-xdg");
  }
  std::vector<std::string> env() const {
    return {"ASAN_OPTIONS=detect_leaks=0", "XDG_RUNTIME_DIR=" + xdg_.string(), "HOME=" + xdg_.string()};
  }
  // A sandbox of `sup` running `script` (sh -c); its answer.
  json run_sh(const NobodySupervisor& sup, const std::string& script) const {
    return sup.call({{"v", 1}, {"op", "run"}, {"argv", {"/bin/sh", "-c", script}}, {"env", {{"PATH", "/usr/bin:/bin"}}}});
  }
  fs::path xdg_;
};

// C1. A non-root supervisor's sandboxes share its uid, so only the cover hides the worker key.
// A cover on the key *file* is detached in the sandbox's namespace when the host renames a new
// key over it (README's rotation): the sandbox then read the new key. The key's directory is
// covered instead, and renames inside it stay unseen. LEASEHOLD_ABLATE=key-dir-cover covers the
// file only, as before, and the sandbox reads the rotated key.
TEST_F(NonRootSupervisor, RotatedKeyStaysHiddenFromItsSandboxes) {
  for (const bool defended : {false, true}) {
    SCOPED_TRACE(defended ? "defended" : "ablated");
    const std::string tag = defended ? "on" : "off";
    const fs::path keys = nobody_dir(dir_.path() / ("nb-keys-" + tag));
    const fs::path key = keys / "worker.key";
    const WorkerId w{0xC1, defended ? 2u : 1u};
    nobody_key(key_, w, key);
    const fs::path run = nobody_dir(dir_.path() / ("nb-run-" + tag));
    std::vector<std::string> e = env();
    if (!defended) e.push_back("LEASEHOLD_ABLATE=key-dir-cover");
    NobodySupervisor sup;
    ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, key, run / "sup.sock", e, "nb-key-" + tag)) << sup.child.err();
    // The sandbox: every 20 ms, copies the key out if it can read one, and counts its rounds.
    const fs::path out = dir_.sandbox_dir() / ("stolen-" + tag);
    const fs::path rounds = dir_.sandbox_dir() / ("rounds-" + tag);
    const json a = run_sh(sup, "i=0; while :; do i=$((i+1)); if [ -s " + key.string() + " ]; then cat " +
                                   key.string() + " > " + out.string() + "; fi; echo $i > " + rounds.string() +
                                   ".t && mv " + rounds.string() + ".t " + rounds.string() + "; sleep 0.02; done");
    ASSERT_EQ(a["ok"], true) << a.dump() << sup.child.err();
    auto round = [&] {
      const std::string t = slurp(rounds);
      return t.empty() ? 0 : std::stoi(t);
    };
    ASSERT_TRUE(eventually([&] { return round() >= 3; })) << sup.child.err();
    EXPECT_FALSE(fs::exists(out)) << "the key was readable before the rotation";
    // The rotation, as README says: write the new key, rename it over the old one.
    nobody_key(key_, w, keys / "worker.key.new");
    fs::rename(keys / "worker.key.new", key);
    const int after = round();
    ASSERT_TRUE(eventually([&] { return round() >= after + 10 || fs::exists(out); }, 20'000));
    if (!defended) {
      ASSERT_TRUE(eventually([&] { return slurp(out).find("leasehold-key") != std::string::npos; }))
          << "the ablated supervisor's sandbox was expected to read the rotated key";
      continue;
    }
    EXPECT_FALSE(fs::exists(out)) << slurp(out);
    // The supervisor itself still reads its key (a reload loads the rotated file).
    EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["ok"], true);
  }
}

// A non-root supervisor refuses a key whose directory it cannot cover as its own (here 0755, and
// one below a directory the supervisor's uid may rename), naming the directory and the fix.
TEST_F(NonRootSupervisor, RefusesAKeyDirectoryItCannotCover) {
  const fs::path run = nobody_dir(dir_.path() / "nb-run");
  {
    const fs::path shared = nobody_dir(dir_.path() / "nb-shared", 0755);
    nobody_key(key_, WorkerId{0xC1, 3}, shared / "worker.key");
    NobodySupervisor sup;
    EXPECT_FALSE(sup.start(dir_.path(), lockd_.address, shared / "worker.key", run / "sup.sock", env(), "nb-shared"));
    EXPECT_EQ(sup.child.wait(), 2);
    EXPECT_NE(sup.child.err().find("directory " + shared.string() + " has mode 0755, not 0700"), std::string::npos)
        << sup.child.err();
    EXPECT_NE(sup.child.err().find("fix: keep the key alone in a directory of its own"), std::string::npos)
        << sup.child.err();
  }
  {
    const fs::path home = nobody_dir(dir_.path() / "nb-home");
    const fs::path movable = nobody_dir(home / "sub");
    const fs::path keys = nobody_dir(movable / "keys");
    nobody_key(key_, WorkerId{0xC1, 4}, keys / "worker.key");
    NobodySupervisor sup;
    EXPECT_FALSE(sup.start(dir_.path(), lockd_.address, keys / "worker.key", run / "sup.sock", env(), "nb-movable"));
    EXPECT_EQ(sup.child.wait(), 2);
    EXPECT_NE(sup.child.err().find("directory " + movable.string() + " can be renamed by uid 65534"), std::string::npos)
        << sup.child.err();
  }
}

// H4. A non-root supervisor's sandbox renamed the directory above the control socket's (covers
// move along with it), made its own there and listened at the socket's path: the owner's next
// `run` (argv, environment) went to it. Such a layout is refused at start (the ancestor can be
// renamed by the supervisor's uid); with LEASEHOLD_ABLATE=socket-dir-cover it starts and the
// sandbox takes the path. In an accepted layout the sandbox cannot rename the socket's directory
// (a mount point in its namespace: EBUSY), nor the one above (not its uid's).
TEST_F(NonRootSupervisor, SandboxCannotReplaceTheControlSocketsDirectory) {
  const fs::path keys = nobody_dir(dir_.path() / "nb-keys");
  nobody_key(key_, WorkerId{0x44, 1}, keys / "worker.key");
  // As in the report: $XDG_RUNTIME_DIR/leasehold/supervisor.sock with XDG_RUNTIME_DIR inside a
  // directory of the supervisor's uid.
  const fs::path parent = nobody_dir(dir_.path() / "nb-parent");
  const fs::path run = nobody_dir(parent / "run");
  const fs::path sockdir = nobody_dir(run / "leasehold");
  const fs::path sock = sockdir / "supervisor.sock";
  {
    NobodySupervisor sup;
    EXPECT_FALSE(sup.start(dir_.path(), lockd_.address, keys / "worker.key", sock, env(), "nb-sock-on"));
    EXPECT_EQ(sup.child.wait(), 2);
    EXPECT_NE(sup.child.err().find("control socket " + sock.string()), std::string::npos) << sup.child.err();
    EXPECT_NE(sup.child.err().find("directory " + run.string() + " can be renamed by uid 65534"), std::string::npos)
        << sup.child.err();
  }
  const fs::path marker = dir_.sandbox_dir() / "replaced";
  {
    std::vector<std::string> e = env();
    e.push_back("LEASEHOLD_ABLATE=socket-dir-cover");
    NobodySupervisor sup;
    ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, keys / "worker.key", sock, e, "nb-sock-off")) << sup.child.err();
    const json a = run_sh(sup, "mv " + run.string() + " " + parent.string() + "/moved && mkdir -p -m 700 " +
                                   sockdir.string() + " && echo fake > " + sock.string() + " && touch " + marker.string());
    ASSERT_EQ(a["ok"], true) << a.dump();
    ASSERT_TRUE(eventually([&] { return fs::exists(marker); })) << "the ablated layout was expected to let it move";
    EXPECT_EQ(slurp(sock), "fake\n");  // what the owner's CLI would now connect to
  }
  // An accepted layout: the socket's directory may sit in a directory of the uid's, as long as
  // nothing above that one is the uid's to rename. The sandbox cannot move the socket's
  // directory: it is a mount point in its namespace (EBUSY), and it sees it empty.
  const fs::path own_parent = nobody_dir(dir_.path() / "nb-own");
  const fs::path own = nobody_dir(own_parent / "run");
  NobodySupervisor sup;
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, keys / "worker.key", own / "sup.sock", env(), "nb-sock-ok"))
      << sup.child.err();
  const fs::path result = dir_.sandbox_dir() / "mv-result";
  const json a = run_sh(sup, "ls -A " + own.string() + " | wc -l > " + result.string() + ".ls; mv " + own.string() + " " +
                                 own_parent.string() + "/moved 2>" + result.string() + ".err; echo $? > " +
                                 result.string());
  ASSERT_EQ(a["ok"], true) << a.dump();
  ASSERT_TRUE(eventually([&] { return !slurp(result).empty(); }));
  EXPECT_NE(slurp(result), "0\n") << slurp(result.string() + ".err");
  EXPECT_NE(slurp(result.string() + ".err").find("busy"), std::string::npos) << slurp(result.string() + ".err");
  EXPECT_EQ(slurp(result.string() + ".ls"), "0\n");  // the sandbox sees an empty directory
  EXPECT_TRUE(fs::exists(own / "sup.sock"));
  EXPECT_EQ(sup.call({{"v", 1}, {"op", "status"}})["ok"], true);
}

// ---- key rotation -----------------------------------------------------------------------------

/// Runs leasehold-lockd to exit (key generation and derivation); its exit code.
int lockd_tool(const fs::path& dir, const std::vector<std::string>& args, std::string* err) {
  Child c;
  c.start(LEASEHOLD_LOCKD_BINARY, args, dir / "tool.out", dir / "tool.err");
  const int rc = c.wait();
  *err = c.err();
  return rc;
}

// The rotation procedure of README "Rotating keys", under load: a supervisor heartbeats four
// names throughout while lockd gets a second cluster key, the supervisor its new worker key, and
// lockd drops the old key, each by a reload (SIGHUP), never a restart. Nothing is killed, no
// lease is lost or changes epoch, and a tag under the removed key is refused as unknown_key.
TEST_F(SupervisorProcess, KeyRotationUnderLoadKillsNothingAndLosesNoLease) {
  const fs::path keys = dir_.path() / "keys";
  fs::create_directory(keys);
  fs::permissions(keys, fs::perms::owner_all, fs::perm_options::replace);
  std::string err;
  ASSERT_EQ(lockd_tool(dir_.path(), {"--generate-key", "--out", (keys / "cluster-1.key").string(), "--key-id", "1"}, &err), 0) << err;
  ASSERT_TRUE(lockd_.start(dir_.path(), "", {"--ttl-ms", "1000", "--key-dir", keys.string()}, &err)) << err;
  const WorkerId w{0x5EED, 0x1};
  const fs::path worker_key = dir_.path() / "worker.key";
  ASSERT_EQ(lockd_tool(dir_.path(), {"--derive-worker-key", "--worker-id", w.str(), "--key-file",
                                     (keys / "cluster-1.key").string(), "--out", worker_key.string()}, &err), 0) << err;
  const wire::WireKey old_worker_key = load_key(worker_key.string());
  ASSERT_EQ(old_worker_key.key_id, 1u);
  Supervisor sup;
  ASSERT_TRUE(sup.start(dir_.path(), lockd_.address, worker_key.string(), with(kSupTiming, {"--slots", "16"}), &err)) << err;
  std::map<std::string, Epoch> epochs;
  for (int i = 0; i < 4; ++i) {
    const std::string name = "rot-" + std::to_string(i);
    const json a = run_probe(sup, name, name);
    ASSERT_EQ(a["ok"], true) << a.dump();
    epochs[name] = a["epoch"];
  }
  auto status = [&] { return sup.call({{"v", 1}, {"op", "status"}}); };
  auto refreshed = [&] { return status()["counters"]["refreshed"].get<std::uint64_t>(); };
  // `n` more refreshes acknowledged from now on.
  auto refreshes_go_on = [&](std::uint64_t n) {
    const std::uint64_t from = refreshed();
    return eventually([&] { return refreshed() >= from + n; }, 20'000);
  };
  auto lockd_reloaded = [&](const std::string& ids) {
    return eventually([&] { return lockd_.log_text().find("event=keys_reloaded cluster_key_ids=" + ids + " ") != std::string::npos; });
  };

  // 1. A new cluster key (the next key id) joins lockd's keys: tags under 1 or 2 are accepted.
  ASSERT_EQ(lockd_tool(dir_.path(), {"--generate-key", "--out", (keys / "cluster-2.key").string(), "--key-id", "2"}, &err), 0) << err;
  lockd_.child.signal(SIGHUP);
  ASSERT_TRUE(lockd_reloaded("1,2")) << lockd_.log_text();
  ASSERT_TRUE(refreshes_go_on(8)) << sup.log_text();
  // 2. The worker's key derived from it replaces its key file (atomically), and the supervisor
  // loads it.
  const fs::path next = dir_.path() / "worker.key.next";
  ASSERT_EQ(lockd_tool(dir_.path(), {"--derive-worker-key", "--worker-id", w.str(), "--key-file",
                                     (keys / "cluster-2.key").string(), "--out", next.string()}, &err), 0) << err;
  fs::rename(next, worker_key);
  sup.child.signal(SIGHUP);
  ASSERT_TRUE(eventually([&] { return status()["key_id"] == 2; })) << sup.log_text();
  ASSERT_TRUE(refreshes_go_on(8)) << sup.log_text();
  // 3. The old key leaves lockd.
  fs::remove(keys / "cluster-1.key");
  lockd_.child.signal(SIGHUP);
  ASSERT_TRUE(lockd_reloaded("2")) << lockd_.log_text();
  ASSERT_TRUE(refreshes_go_on(16)) << sup.log_text();

  // Nothing was killed or lost, and every name is held where it was, at the same epoch.
  const json st = status();
  EXPECT_EQ(st["counters"]["kills_deadline"], 0) << st.dump();
  EXPECT_EQ(st["counters"]["lost"], 0) << st.dump();
  EXPECT_EQ(st["counters"]["key_reloads"], 1) << st.dump();
  const json list = sup.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), 4u) << list.dump();
  for (const auto& sb : list["sandboxes"]) EXPECT_EQ(sb["state"], "running") << list.dump();
  const wire::WireKey cluster2 = load_key((keys / "cluster-2.key").string());
  lockd::AdminClient ad(lockd_.socket_address(), cluster2);
  for (const auto& [name, epoch] : epochs) {
    const lockd::Answer show = ad.show(name);
    const auto* info = show.as<wire::NameInfo>();
    ASSERT_NE(info, nullptr) << name << ": " << show.message();
    EXPECT_EQ(info->record.state, LockPhase::held) << name;
    EXPECT_EQ(info->record.epoch, epoch) << name;
    EXPECT_EQ(info->record.worker, w) << name;
  }
  // The removed key: its tags are dropped and counted, never answered. lockd's key-rejected
  // notice (at most one a second, for all senders) may name the cause, or may have gone to
  // another sender this second.
  lockd::AdminClient stale(lockd_.socket_address(), old_worker_key, {}, 300'000'000);
  const lockd::Answer refused = stale.show("rot-0");
  EXPECT_EQ(refused.as<wire::NameInfo>(), nullptr);
  if (refused.key_rejected) {
    EXPECT_EQ(refused.code(), Errc::permission_denied) << refused.message();
    EXPECT_EQ(refused.key_rejected->reason, wire::KeyRejectReason::unknown_key) << refused.message();
    EXPECT_NE(refused.message().find("rejected our key (key id 1, unknown_key"), std::string::npos) << refused.message();
  } else {
    EXPECT_EQ(refused.code(), Errc::timeout) << refused.message();
    EXPECT_EQ(refused.message().rfind("no answer", 0), 0u) << refused.message();
  }
  const auto counters = ad.counters();
  ASSERT_TRUE(counters) << counters.message();
  std::map<std::string, std::uint64_t> c;
  for (const auto& k : *counters) c[k.key] = k.value;
  EXPECT_GE(c["reject_unknown_key"], 1u);
  EXPECT_EQ(c["cluster_keys"], 1u);
  EXPECT_EQ(c["key_reloads"], 2u);
  EXPECT_TRUE(lockd_events(lockd_.log_text(), "expire").empty()) << lockd_.log_text();
}

// ---- issue 14: a new sandbox's deadline is armed before its exec ----------------------------

// The io thread stalls (LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS, 4 s) right after it created a named
// sandbox's child: longer than the lease's kill_after (600 ms) and lockd's TTL (1000 ms), so lockd
// expires the lease meanwhile and a second supervisor gets the name. Defended, the child waits at
// its gate with its deadline armed: the rt thread kills it at the deadline, before its command's
// first instruction and before lockd could grant the name to anyone else, and the run is answered
// `killswitch`. Ablated (LEASEHOLD_ABLATE=arm-after-exec: exec first, arm after, the old order),
// the command runs unwatched through the stall, past its deadline, while the second supervisor's
// sandbox holds the name: two holders at once.
class ArmBeforeExec : public SupervisorProcess, public ::testing::WithParamInterface<bool> {
 protected:
  bool defended() const { return GetParam(); }
  void TearDown() override {
    ::unsetenv("LEASEHOLD_ABLATE");
    ::unsetenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS");
  }
  static std::uint64_t field(const std::map<std::string, std::string>& e, const char* key) {
    auto it = e.find(key);
    return it == e.end() ? 0 : std::stoull(it->second);
  }
};

TEST_P(ArmBeforeExec, AStartStalledPastTheDeadlineNeverRunsUnwatched) {
  start_lockd();
  Supervisor s1, s2;
  ::setenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS", "4000", 1);
  if (!defended()) ::setenv("LEASEHOLD_ABLATE", "arm-after-exec", 1);
  start_sup(s1, {}, "s1");
  ::unsetenv("LEASEHOLD_ABLATE");
  ::unsetenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS");
  start_sup(s2, {}, "s2");
  // s1 gets the grant and stalls in its start. Under load a grant can come back too late to be
  // used ("unreachable", before any start): then the run is asked again.
  json a1;
  std::thread t1;
  std::atomic<bool> answered{false};
  auto stalled = [&] { return !s1.events("test_stall").empty(); };
  for (int attempt = 0; attempt < 5 && !stalled(); ++attempt) {
    if (t1.joinable()) t1.join();
    answered = false;
    t1 = std::thread([&] {
      a1 = s1.call(run_req("stalled", {LEASEHOLD_PROBE_BINARY, probe_log("s1")}), 30'000);
      answered = true;
    });
    eventually([&] { return stalled() || answered.load(); }, 20'000);
  }
  if (!stalled()) {
    if (t1.joinable()) t1.join();
    FAIL() << a1.dump() << s1.log_text();
  }
  // s1's io thread is stalled; s2 asks until lockd has expired s1's lease.
  json a2;
  std::int64_t t_asked = 0;
  const bool granted = eventually([&] {
    t_asked = now_ns();
    a2 = s2.call(run_req("stalled", {"sleep", "60"}));
    return a2["ok"] == true;
  }, 20'000);
  const std::int64_t t_granted = now_ns();
  t1.join();
  ASSERT_TRUE(granted) << a2.dump() << s1.log_text();
  EXPECT_GT(a2["epoch"].get<std::uint64_t>(), 0u);
  // Log lines go out through the supervisor's writer thread, so the stall's end may reach the
  // log a little after the answer that followed it.
  eventually([&] { return !s1.events("test_stall_end").empty(); }, 10'000);
  const auto stall_end = s1.events("test_stall_end");
  ASSERT_EQ(stall_end.size(), 1u) << s1.log_text();
  const std::uint64_t t_resumed = field(stall_end[0], "ts_boot_ns");
  ASSERT_TRUE(a1.contains("sandbox")) << a1.dump();
  auto k = killed(s1, a1["sandbox"]);
  ASSERT_TRUE(k.has_value()) << a1.dump() << s1.log_text();
  // Not its `cause`: that says whether the io thread had asked for a kill by the time it read
  // the record, and after the stall its heartbeat tick may have. When it was issued says more.
  const std::uint64_t deadline = field(*k, "deadline_ns"), issued = field(*k, "issued_ns");
  const std::uint64_t confirmed = field(*k, "confirmed_ns");
  ASSERT_GT(confirmed, 0u) << s1.log_text();
  const json st = s1.call({{"v", 1}, {"op", "status"}});
  if (defended()) {
    EXPECT_EQ(a1["ok"], false) << a1.dump();
    EXPECT_EQ(a1["error"], "killswitch") << a1.dump();
    // Its command never ran: the probe writes its log first thing.
    EXPECT_FALSE(fs::exists(probe_log("s1"))) << slurp(probe_log("s1"));
    // The rt thread killed it at its deadline, while the io thread was stalled, and it was dead
    // before s2 asked for the name lockd was free to give.
    EXPECT_LT(issued, t_resumed) << s1.log_text();
    EXPECT_GE(issued + 1'000'000, deadline) << "never more than the wheel's 1 ms tick early";
    EXPECT_LT(confirmed, static_cast<std::uint64_t>(t_asked)) << s1.log_text();
    EXPECT_EQ(st["counters"]["spawn_failures"], 1) << st.dump();
    EXPECT_EQ(st["counters"]["spawned"], 0) << st.dump();
  } else {
    EXPECT_EQ(a1["ok"], true) << a1.dump();
    // It ran: it started (before its kill), checked its lease past its deadline, and was killed
    // only once the io thread resumed and armed it, after s2 held the name.
    const std::string text = slurp(probe_log("s1"));
    std::uint64_t started = 0;
    ASSERT_EQ(std::sscanf(text.c_str(), "start t=%lu", &started), 1) << text;
    EXPECT_LT(started, issued);
    const auto lines = probe_lines(probe_log("s1"));
    ASSERT_FALSE(lines.empty()) << text;
    EXPECT_GE(lines.back().t, deadline) << "ablation: the sandbox ran past its deadline\n" << text;
    EXPECT_GE(issued, t_resumed) << s1.log_text();
    EXPECT_GT(confirmed, static_cast<std::uint64_t>(t_granted)) << "ablation: two holders at once";
  }
}

// The same stall in preemptible mode, where the sandbox starts before its Commit, unpublished,
// under the worker's kill deadline (kill_after from the last acknowledged liveness beat): defended,
// the rt thread kills it at its gate when that deadline passes during the stall, and its command
// never runs; ablated, it runs past the worker's deadline until the io thread resumes.
TEST_P(ArmBeforeExec, APreemptibleStartStalledPastTheWorkersDeadlineNeverRunsUnwatched) {
  start_lockd({"--ttl-ms", "1000", "--mode", "preemptible"});
  Supervisor s1;
  ::setenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS", "4000", 1);
  if (!defended()) ::setenv("LEASEHOLD_ABLATE", "arm-after-exec", 1);
  start_sup(s1, {"--mode", "preemptible"}, "s1");
  ::unsetenv("LEASEHOLD_ABLATE");
  ::unsetenv("LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS");
  json a1;  // asked again if a grant came back too late to start at all (under load)
  for (int attempt = 0; attempt < 5 && s1.events("test_stall").empty(); ++attempt)
    a1 = s1.call(run_req("pstalled", {LEASEHOLD_PROBE_BINARY, probe_log("p1")}), 30'000);
  // Log lines go out through the supervisor's writer thread, so the stall's end may reach the
  // log a little after the answer that followed it.
  eventually([&] { return !s1.events("test_stall_end").empty(); }, 10'000);
  const auto stall_end = s1.events("test_stall_end");
  ASSERT_EQ(stall_end.size(), 1u) << a1.dump() << s1.log_text();
  const std::uint64_t t_resumed = field(stall_end[0], "ts_boot_ns");
  const auto started = s1.events(defended() ? "spawn_failed" : "started");
  ASSERT_EQ(started.size(), 1u) << s1.log_text();
  auto k = killed(s1, started[0].at("sandbox"));
  ASSERT_TRUE(k.has_value()) << a1.dump() << s1.log_text();
  const std::uint64_t deadline = field(*k, "deadline_ns"), issued = field(*k, "issued_ns");
  const std::uint64_t confirmed = field(*k, "confirmed_ns");
  ASSERT_GT(confirmed, 0u) << s1.log_text();
  if (defended()) {
    EXPECT_EQ(a1["error"], "killswitch") << a1.dump();
    EXPECT_FALSE(fs::exists(probe_log("p1"))) << slurp(probe_log("p1"));
    EXPECT_LT(issued, t_resumed) << s1.log_text();
    EXPECT_GE(issued + 1'000'000, deadline);
    EXPECT_EQ(started[0].at("name"), "pstalled");
  } else {
    const std::string text = slurp(probe_log("p1"));
    std::uint64_t t_start = 0;
    ASSERT_EQ(std::sscanf(text.c_str(), "start t=%lu", &t_start), 1) << text;
    EXPECT_LT(t_start, deadline) << text;
    EXPECT_GE(issued, t_resumed) << s1.log_text();
    EXPECT_GT(confirmed, deadline) << "ablation: the sandbox ran past the worker's deadline";
  }
}

INSTANTIATE_TEST_SUITE_P(DefendedAndAblated, ArmBeforeExec, ::testing::Bool(),
                         [](const auto& i) { return i.param ? "defended" : "ablated"; });

// Review finding H1: every slot's signed token sat in the shm table every sandbox maps, so a
// sibling read the victim's token (`leasehold check --slot N --epoch E --json`) and a resource
// verifying tokens took its writes as the victim's. Each sandbox now has its own token channel
// (LEASEHOLD_TOKENS=4, a sealed memfd only it inherits): the victim reads its own token, the
// table holds none, and the sibling finds no token of the victim's, neither through `check` nor
// among the descriptors it can reach in /proc. Ablated (LEASEHOLD_ABLATE=shared-tokens: every
// grant's token goes to every sandbox's channel, as every token went to the shared table), the
// sibling's stolen token verifies with lockd's public key as the victim's write.
TEST_F(SupervisorProcess, ASandboxCannotReadASiblingsToken) {
#ifndef LEASEHOLD_CLI_BINARY
  GTEST_SKIP() << "needs the leasehold CLI";
#else
  start_lockd();
  token::TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key_file((dir_.path() / "lockd.db.signing.key.pub").string()).message(), "");
  const std::string cli = LEASEHOLD_CLI_BINARY;
  for (const bool defended : {true, false}) {
    SCOPED_TRACE(defended ? "defended" : "ablation: shared-tokens");
    const std::string tag = defended ? "tok" : "tokab";
    Supervisor sup;
    if (!defended) ::setenv("LEASEHOLD_ABLATE", "shared-tokens", 1);
    std::string err;
    const bool started = sup.start(dir_.path(), lockd_.address, key_, with(kSupTiming, {"--slots", "16"}), &err, tag);
    ::unsetenv("LEASEHOLD_ABLATE");
    ASSERT_TRUE(started) << err;
    const std::string go = (dir_.sandbox_dir() / (tag + ".go")).string();
    const std::string stolen = (dir_.sandbox_dir() / (tag + ".stolen")).string();
    const std::string fds = (dir_.sandbox_dir() / (tag + ".fds")).string();
    const std::string own = (dir_.sandbox_dir() / (tag + ".own")).string();
    // The attacker: unnamed, started first. Told the victim's slot and epoch, it asks for that
    // slot's token, and lists every descriptor it can see in /proc.
    json att = run_req("", {"sh", "-c",
                            "while [ ! -s " + go + " ]; do sleep 0.05; done; read S E < " + go + "; " +
                                "for f in /proc/[0-9]*/fd/*; do echo \"$f $(readlink $f)\"; done > " + fds +
                                " 2>/dev/null; " + cli + " check --slot $S --epoch $E --json > " + stolen +
                                ".tmp 2>&1; mv " + stolen + ".tmp " + stolen + "; exec sleep 30"});
    att["env"]["ASAN_OPTIONS"] = "detect_leaks=0";
    const json a = sup.call(att);
    ASSERT_EQ(a["ok"], true) << a.dump();
    // The victim: named; it reads its own grant's token.
    const std::string name = tag + "-victim";
    json vic = run_req(name, {"sh", "-c", cli + " check --json > " + own + ".tmp 2>&1; mv " + own + ".tmp " + own +
                                              "; exec sleep 30"});
    vic["env"]["ASAN_OPTIONS"] = "detect_leaks=0";
    const json v = sup.call(vic);
    ASSERT_EQ(v["ok"], true) << v.dump();
    const SandboxId victim = *SandboxId::parse(v["sandbox"].get<std::string>());
    const Epoch epoch = v["epoch"].get<Epoch>();
    ASSERT_TRUE(eventually([&] { return fs::exists(own); }, 20'000)) << "the victim never checked";
    const json mine = json::parse(slurp(own));
    ASSERT_TRUE(mine["token"].is_string()) << "the victim reads its own token: " << mine.dump();
    const auto own_bytes = token::from_hex(mine["token"].get<std::string>());
    ASSERT_TRUE(own_bytes.has_value());
    const token::Verdict ok = verifier.verify(*own_bytes, name_id_of(name), epoch, victim);
    EXPECT_TRUE(ok.ok()) << ok.detail;
    // The table every sandbox maps holds no token.
    const std::string table = slurp(sup.shm);
    if (!table.empty()) {
      EXPECT_EQ(table.find(std::string(own_bytes->begin(), own_bytes->end())), std::string::npos)
          << "the shared table holds the victim's token";
    }

    { std::ofstream(go) << v["slot"].get<std::uint32_t>() << " " << epoch << "\n"; }
    ASSERT_TRUE(eventually([&] { return fs::exists(stolen); }, 20'000)) << "the attacker never checked";
    const std::string said = slurp(stolen);
    const json theft = json::parse(said, nullptr, false);
    ASSERT_FALSE(theft.is_discarded()) << said;
    EXPECT_EQ(theft["sandbox"], victim.str()) << "the table shows whose slot it is: " << said;
    const std::string seen = slurp(fds);
    if (defended) {
      EXPECT_TRUE(theft["token"].is_null()) << "a sibling read the victim's token: " << said;
      EXPECT_EQ(seen.find("leasehold-tokens-" + victim.str()), std::string::npos)
          << "the victim's token channel is reachable from the sibling:\n" << seen;
    } else {
      ASSERT_TRUE(theft["token"].is_string()) << "ablation: the sibling reads the victim's token: " << said;
      const auto bytes = token::from_hex(theft["token"].get<std::string>());
      ASSERT_TRUE(bytes.has_value());
      const token::Verdict taken = verifier.verify(*bytes, name_id_of(name), epoch, victim);
      EXPECT_TRUE(taken.ok()) << "ablation: the stolen token verifies as the victim's write: " << taken.detail;
    }
  }
#endif
}

// A worker key lockd does not accept is not reported as an unreachable lockd: lockd's
// key-rejected notice (from lockd's own address) names the key and the reason at start-up.
TEST_F(SupervisorProcess, AWorkerKeyLockdRejectsIsNamedAtStartNotUnreachable) {
  start_lockd();
  std::string err;
  const fs::path other = dir_.path() / "other-cluster.key";
  ASSERT_EQ(lockd_tool(dir_.path(), {"--generate-key", "--out", other.string()}, &err), 0) << err;
  const fs::path wrong = dir_.path() / "wrong-worker.key";
  ASSERT_EQ(lockd_tool(dir_.path(), {"--derive-worker-key", "--worker-id", WorkerId{0x3E2, 7}.str(), "--key-file",
                                     other.string(), "--out", wrong.string()}, &err), 0) << err;
  Supervisor sup;
  EXPECT_FALSE(sup.start(dir_.path(), lockd_.address, wrong.string(), kSupTiming, &err, "wrong-key"));
  EXPECT_EQ(sup.child.wait(), 2);
  EXPECT_NE(sup.child.err().find("rejected this worker's key (key id "), std::string::npos)
      << sup.child.err();
  EXPECT_EQ(sup.child.err().find("unreachable"), std::string::npos) << sup.child.err();
}

// M1. A reload (SIGHUP) onto a worker key derived from a cluster key lockd has not loaded
// (README's steps 3-4 before step 2; lab repro_rotation_unknown_key.sh) switched at once: lockd
// dropped every datagram (unknown key) and each named sandbox died by the kill-switch, the
// supervisor never saying why. Now the new key is used only once lockd answers a request under
// it: until then the supervisor keeps the old key, logs event=key_not_accepted every few seconds
// (counted key_not_accepted, status pending_key_id), and nothing dies; once lockd loads the key
// it switches. LEASEHOLD_ABLATE=unprobed-key-reload switches at once, and the sandbox dies.
TEST_F(SupervisorProcess, ReloadOntoAKeyLockdLacksKillsNothing) {
  for (const bool defended : {false, true}) {
    SCOPED_TRACE(defended ? "defended" : "ablated");
    const std::string tag = defended ? "on" : "off";
    const fs::path keys = dir_.path() / ("keys-" + tag);
    fs::create_directory(keys);
    fs::permissions(keys, fs::perms::owner_all, fs::perm_options::replace);
    std::string err;
    ASSERT_EQ(lockd_tool(dir_.path(), {"--generate-key", "--out", (keys / "cluster-1.key").string(), "--key-id", "1"}, &err), 0) << err;
    Lockd lockd;
    ASSERT_TRUE(lockd.start(dir_.path(), "", {"--ttl-ms", "1000", "--key-dir", keys.string()}, &err, "lockd-" + tag))
        << err;
    const WorkerId w{0x3E1, defended ? 2u : 1u};
    const fs::path worker_key = dir_.path() / ("worker-" + tag + ".key");
    ASSERT_EQ(lockd_tool(dir_.path(), {"--derive-worker-key", "--worker-id", w.str(), "--key-file",
                                       (keys / "cluster-1.key").string(), "--out", worker_key.string()}, &err), 0) << err;
    if (!defended) ::setenv("LEASEHOLD_ABLATE", "unprobed-key-reload", 1);
    Supervisor sup;
    const bool started = sup.start(dir_.path(), lockd.address, worker_key.string(), with(kSupTiming, {"--slots", "16"}),
                                   &err, "reload-" + tag);
    ::unsetenv("LEASEHOLD_ABLATE");
    ASSERT_TRUE(started) << err;
    const json a = sup.call(run_req("reload/" + tag, {"sleep", "60"}));
    ASSERT_EQ(a["ok"], true) << a.dump();
    auto status = [&] { return sup.call({{"v", 1}, {"op", "status"}}); };
    // A cluster key 2 that lockd does not have; the worker's key derived from it, renamed into place.
    const fs::path elsewhere = dir_.path() / ("not-loaded-" + tag + ".key");
    ASSERT_EQ(lockd_tool(dir_.path(), {"--generate-key", "--out", elsewhere.string(), "--key-id", "2"}, &err), 0) << err;
    const fs::path next = dir_.path() / ("worker-" + tag + ".key.next");
    ASSERT_EQ(lockd_tool(dir_.path(), {"--derive-worker-key", "--worker-id", w.str(), "--key-file", elsewhere.string(),
                                       "--out", next.string()}, &err), 0) << err;
    fs::rename(next, worker_key);
    sup.child.signal(SIGHUP);
    if (!defended) {
      ASSERT_TRUE(killed(sup, a["sandbox"], 20'000)) << "the ablated supervisor's sandbox was expected to die: "
                                                      << sup.log_text();
      continue;
    }
    // Refused twice (the first probe and one retry), logged each time, and the old key in use.
    ASSERT_TRUE(eventually([&] { return status()["counters"]["key_not_accepted"].get<std::uint64_t>() >= 2; }, 30'000))
        << sup.log_text();
    const json st = status();
    EXPECT_EQ(st["key_id"], 1) << st.dump();
    EXPECT_EQ(st["pending_key_id"], 2) << st.dump();
    EXPECT_EQ(st["counters"]["kills_deadline"], 0) << st.dump();
    EXPECT_EQ(st["counters"]["lost"], 0) << st.dump();
    EXPECT_EQ(st["counters"]["key_reloads"], 0) << st.dump();
    EXPECT_NE(sup.log_text().find("event=key_not_accepted"), std::string::npos);
    EXPECT_NE(sup.log_text().find("lockd does not know key id 2"), std::string::npos) << sup.log_text();
    const json list = sup.call({{"v", 1}, {"op", "list"}});
    ASSERT_EQ(list["sandboxes"].size(), 1u) << list.dump();
    EXPECT_EQ(list["sandboxes"][0]["state"], "running") << list.dump();
    // lockd gets the key: the next probe is answered and the supervisor switches.
    fs::copy_file(elsewhere, keys / "cluster-2.key");
    fs::permissions(keys / "cluster-2.key", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
    lockd.child.signal(SIGHUP);
    ASSERT_TRUE(eventually([&] { return status()["key_id"] == 2; }, 30'000)) << sup.log_text();
    EXPECT_EQ(status()["pending_key_id"], 0);
    EXPECT_EQ(status()["counters"]["key_reloads"], 1);
    EXPECT_EQ(status()["counters"]["kills_deadline"], 0);
  }
}

// M2. lockd learned where to push a revocation only from a worker's heartbeats, so a revoke
// right after a fresh lockd's first grant (before that worker's first heartbeat) was pushed only
// with the next heartbeat, whose `lost` answer killed the sandbox first (event=recovery; the push
// was acknowledged but found it dying). The worker's first acquire names the address now: the
// push arrives at once and kills (event=revoked). Heartbeats are 4 s apart here, so the revoke
// lands before the first one; LEASEHOLD_ABLATE=first-push-address learns the address as before.
TEST_F(SupervisorProcess, FirstRevokeAfterLockdStartsIsActedOnFromThePush) {
  for (const bool defended : {false, true}) {
    SCOPED_TRACE(defended ? "defended" : "ablated");
    const std::string tag = defended ? "on" : "off";
    if (!defended) ::setenv("LEASEHOLD_ABLATE", "first-push-address", 1);
    Lockd lockd;
    std::string err;
    const bool up = lockd.start(dir_.path(), key_, {"--ttl-ms", "20000"}, &err, "lockd-push-" + tag);
    ::unsetenv("LEASEHOLD_ABLATE");
    ASSERT_TRUE(up) << err;
    Supervisor sup;
    ASSERT_TRUE(sup.start(dir_.path(), lockd.address, key_,
                          {"--ttl-ms", "20000", "--kill-after-ms", "12000", "--heartbeat-interval-ms", "4000",
                           "--kill-latency-budget-ms", "50", "--slots", "16"},
                          &err, "push-" + tag))
        << err;
    const json a = sup.call(run_req("push/" + tag, {"sleep", "60"}));
    ASSERT_EQ(a["ok"], true) << a.dump();
    lockd::AdminClient ad(lockd.socket_address(), load_key(key_));
    const lockd::Answer rv = ad.revoke(name_id_of("push/" + tag));
    ASSERT_TRUE(rv.ok()) << rv.message();
    const auto k = killed(sup, a["sandbox"], 30'000);
    ASSERT_TRUE(k) << sup.log_text();
    auto reasons = [&](const char* ev) {
      std::size_t n = 0;
      for (auto& e : sup.events(ev)) n += e["sandbox"] == a["sandbox"].get<std::string>() ? 1 : 0;
      return n;
    };
    if (!defended) {
      EXPECT_EQ(reasons("revoked"), 0u) << sup.log_text();
      EXPECT_EQ(reasons("recovery"), 1u) << "the ablated lockd was expected to push only after a heartbeat: "
                                         << sup.log_text();
      continue;
    }
    EXPECT_EQ(reasons("revoked"), 1u) << sup.log_text();
    EXPECT_EQ(reasons("recovery"), 0u) << sup.log_text();
    EXPECT_NE(k->at("reason").find("revoked"), std::string::npos) << sup.log_text();
  }
}

}  // namespace
}  // namespace leasehold
