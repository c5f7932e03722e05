// lockd across kill -9: acknowledged grants survive with their epochs, held leases count as
// refreshed at restart, acquiring records are dropped, and no epoch is ever issued twice.
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/lockd/service.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

namespace leasehold::lockd {
namespace {

using namespace testing;

class LockdRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
  }
  void start(LockdProcess& p, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--key-file", (dir_.path() / "lockd.key").string(), "--store",
                                  (dir_.path() / "lockd.db").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string err;
    ASSERT_TRUE(p.start(args, dir_.path() / "lockd.log", &err)) << err;
  }

  TempDir dir_;
  wire::WireKey key_;
};

// A value of the store's meta table (service.hpp: `lived/<n>` is a lower bound of how long
// incarnation n served, in ns), read once lockd is gone (it holds the store exclusively); -1
// when the key is absent.
std::int64_t meta_value(const std::string& store, const std::string& key) {
  sqlite3* db = nullptr;
  std::int64_t v = -1;
  if (sqlite3_open_v2(store.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT v FROM meta WHERE k = ?1", -1, &q, nullptr) == SQLITE_OK) {
      sqlite3_bind_text(q, 1, key.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(q) == SQLITE_ROW) v = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
  }
  sqlite3_close(db);
  return v;
}

// One of lockd's stats counters; nullopt when it does not answer.
std::optional<std::uint64_t> counter(AdminClient& c, std::string_view key) {
  const auto all = c.counters();
  if (!all) return std::nullopt;
  for (const auto& k : *all)
    if (k.key == key) return k.value;
  return std::nullopt;
}

const SandboxId S1{0x51, 1}, S2{0x51, 2}, S3{0x51, 3};
const WorkerId W1{0x77, 1};

TEST_F(LockdRestartTest, StateSurvivesKillNine) {
  LockdProcess p;
  start(p, {"--ttl-ms", "60000"});
  AdminClient c(p.address(), key_, W1);
  const NameId held = name_id_of("r/held"), released = name_id_of("r/released"),
               revoked = name_id_of("r/revoked"), moving = name_id_of("r/moving"),
               acquiring = name_id_of("r/acquiring");
  const Answer a1 = c.acquire("r/held", S1, W1);
  ASSERT_NE(a1.as<wire::Grant>(), nullptr) << a1.message();
  const Epoch e_held = a1.as<wire::Grant>()->epoch;
  const Answer a2 = c.acquire("r/released", S1, W1);
  ASSERT_NE(a2.as<wire::Grant>(), nullptr);
  const Epoch e_released = a2.as<wire::Grant>()->epoch;
  const Answer rel = c.release(released, S1, e_released);
  ASSERT_NE(rel.as<wire::Ok>(), nullptr) << rel.message();
  const Answer a3 = c.acquire("r/revoked", S1, W1);
  ASSERT_NE(a3.as<wire::Grant>(), nullptr);
  const Answer rv = c.revoke(revoked);
  ASSERT_NE(rv.as<wire::Ok>(), nullptr);
  const Epoch e_revoked = rv.as<wire::Ok>()->epoch;
  ASSERT_EQ(e_revoked, a3.as<wire::Grant>()->epoch + 1);
  const Answer a4 = c.acquire("r/moving", S1, W1);
  ASSERT_NE(a4.as<wire::Grant>(), nullptr);
  const Answer tb = c.transfer_begin(moving, S1, a4.as<wire::Grant>()->epoch, S2, W1);
  ASSERT_NE(tb.as<wire::TransferState>(), nullptr);
  const Epoch e_moving = tb.as<wire::TransferState>()->new_epoch;
  const Answer a5 = c.acquire("r/acquiring", S3, W1, 0, true);
  ASSERT_NE(a5.as<wire::Grant>(), nullptr);
  const Epoch e_acquiring = a5.as<wire::Grant>()->epoch;

  p.kill9();
  LockdProcess q;
  start(q, {"--ttl-ms", "60000"});
  AdminClient d(q.address(), key_, W1);

  // The held lease is there, same holder and epoch, refreshed at restart (full TTL left).
  const Answer sh = d.show(held);
  const auto* info = sh.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << sh.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.holder, S1);
  EXPECT_EQ(info->record.worker, W1);
  EXPECT_EQ(info->record.epoch, e_held);
  EXPECT_GT(info->record.ttl_left_ms, 50'000u);
  std::vector<wire::HeartbeatEntry> hb{{held, S1, e_held}};
  const Answer r = d.heartbeat(hb);
  ASSERT_NE(r.as<wire::HeartbeatAck>(), nullptr) << r.message();
  EXPECT_EQ(r.as<wire::HeartbeatAck>()->entries[0].status, RefreshStatus::refreshed);

  // The transfer is still in progress at its new epoch.
  const Answer sm = d.show(moving);
  ASSERT_NE(sm.as<wire::NameInfo>(), nullptr) << sm.message();
  EXPECT_EQ(sm.as<wire::NameInfo>()->record.state, LockPhase::transferring);
  EXPECT_EQ(sm.as<wire::NameInfo>()->record.epoch, e_moving);

  // The acquiring record was dropped; nobody's commit of it succeeds.
  const Answer cm = d.commit(acquiring, S3, e_acquiring, W1);
  ASSERT_NE(cm.as<wire::Deny>(), nullptr) << cm.message();

  // Epochs continue above everything issued before the crash.
  const Answer g1 = d.acquire("r/released", S2, W1);
  ASSERT_NE(g1.as<wire::Grant>(), nullptr) << g1.message();
  EXPECT_GT(g1.as<wire::Grant>()->epoch, e_released);
  // The revoke is still pending after the restart (times are not durable: a full TTL, or the
  // revoked holder's worker's confirmation, which lifts it).
  const Answer srv = d.show(revoked);
  ASSERT_NE(srv.as<wire::NameInfo>(), nullptr) << srv.message();
  EXPECT_TRUE(srv.as<wire::NameInfo>()->record.revoke_pending);
  EXPECT_EQ(srv.as<wire::NameInfo>()->record.revoked_epoch, e_revoked - 1);
  EXPECT_EQ(srv.as<wire::NameInfo>()->record.worker, W1);
  EXPECT_GT(srv.as<wire::NameInfo>()->record.ttl_left_ms, 50'000u);
  const Answer early = d.acquire("r/revoked", S2, W1);
  ASSERT_NE(early.as<wire::Deny>(), nullptr) << early.message();
  EXPECT_EQ(early.as<wire::Deny>()->refusal, Refusal::lock_delay);
  const Answer wrong = AdminClient(q.address(), wire::derive_worker_key(key_, WorkerId{0x2, 0x22}))
                           .request(wire::KillConfirmed{revoked, S1, e_revoked - 1});
  ASSERT_NE(wrong.as<wire::Deny>(), nullptr) << wrong.message();
  EXPECT_EQ(wrong.as<wire::Deny>()->refusal, Refusal::not_holder);
  // Only W1's own key confirms W1's kill.
  const Answer confirmed =
      AdminClient(q.address(), wire::derive_worker_key(key_, W1)).request(wire::KillConfirmed{revoked, S1, e_revoked - 1});
  ASSERT_NE(confirmed.as<wire::Ok>(), nullptr) << confirmed.message();
  const Answer g2 = d.acquire("r/revoked", S2, W1);
  ASSERT_NE(g2.as<wire::Grant>(), nullptr) << g2.message();
  EXPECT_GE(g2.as<wire::Grant>()->epoch, e_revoked);  // the revoke's fresh epoch is granted once
  const Answer g3 = d.acquire("r/acquiring", S2, W1);
  ASSERT_NE(g3.as<wire::Grant>(), nullptr) << g3.message();
  EXPECT_GT(g3.as<wire::Grant>()->epoch, e_acquiring);
  const Answer g4 = d.acquire("r/new", S2, W1);
  ASSERT_NE(g4.as<wire::Grant>(), nullptr);
  EXPECT_GT(g4.as<wire::Grant>()->epoch, std::max({e_held, e_released, e_revoked, e_moving, e_acquiring}));
  // The transfer's reservation is still for S2 on W1 (the store kept the worker): once the
  // old holder's worker confirms its kill and the transfer completes, another worker naming
  // S2 is forbidden, W1 gets it.
  (void)AdminClient(q.address(), wire::derive_worker_key(key_, W1)).request(wire::KillConfirmed{moving, S1, e_moving - 1});
  const Answer done = d.transfer_complete(moving, e_moving);
  ASSERT_NE(done.as<wire::TransferState>(), nullptr) << done.message();
  const Answer other = d.acquire("r/moving", S2, WorkerId{0x2, 0x22});
  ASSERT_NE(other.as<wire::Deny>(), nullptr) << other.message();
  EXPECT_EQ(other.as<wire::Deny>()->refusal, Refusal::forbidden);
  const Answer taken = d.acquire("r/moving", S2, W1);
  ASSERT_NE(taken.as<wire::Grant>(), nullptr) << taken.message();
  EXPECT_EQ(taken.as<wire::Grant>()->epoch, e_moving);
  EXPECT_EQ(q.terminate(), 0);
  EXPECT_NE(q.log().find("event=restore names=3 held=1"), std::string::npos) << q.log();
}

// The restart rule: lockd killed -9 after serving a checkpoint interval or two, more often than
// its 2000 ms TTL. Each
// restart used to give every held lease a fresh TTL, so a holder that died kept its name for
// ever. Now a lease whose worker lockd has not acknowledged since an earlier incarnation gets
// only what is left of a TTL of lockd's served time since then: the dead holder's name is freed
// after about one TTL of uptime, while a holder that refreshes after every restart (the first
// refresh of each incarnation may come late: it is sent only once the new lockd is up) keeps
// its lease throughout, at the same epoch.
// Each incarnation is killed once lockd has made a lived mark of at least five checkpoint
// intervals (500 ms) durable - its eighth store commit; the store says so afterwards - not after
// a fixed time, so a loaded machine changes only how long the test takes: the name must be freed by the restart at which the durable
// lived marks since the dead worker's last acknowledgement sum to a TTL, and never before the
// incarnations since then can have served a TTL (each one's wall-clock time, from the start
// request to the kill, bounds what it served from above).
TEST_F(LockdRestartTest, RestartsMoreOftenThanTheTtlStillFreeADeadHoldersName) {
  constexpr std::int64_t kTtlMs = 2000;  // a heartbeat may be this late before the live lease lapses
  constexpr std::int64_t kLivedIntervalNs = lived_checkpoint_interval_ns(kTtlMs * 1'000'000);  // 100 ms
  // Store commits per incarnation: the first acknowledgement's seen mark, then lived checkpoints
  // an interval apart, so the last one's lived mark is at least kCommits - 3 intervals.
  constexpr int kCommits = 8;
  const WorkerId dead_worker{0x77, 0xdead}, live_worker{0x77, 0x11fe};
  const SandboxId dead{0x51, 0xdead}, live{0x51, 0x11fe};
  const std::string store = (dir_.path() / "lockd.db").string();
  Epoch dead_epoch = 0, live_epoch = 0;
  {
    LockdProcess p;
    start(p, {"--ttl-ms", std::to_string(kTtlMs)});
    AdminClient c(p.address(), key_, live_worker);
    const Answer d = c.acquire("r/dead", dead, dead_worker);
    ASSERT_NE(d.as<wire::Grant>(), nullptr) << d.message();
    dead_epoch = d.as<wire::Grant>()->epoch;
    const Answer g = c.acquire("r/live", live, live_worker);
    ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
    live_epoch = g.as<wire::Grant>()->epoch;
    p.kill9();
  }
  const std::vector<wire::HeartbeatEntry> beat{{name_id_of("r/live"), live, live_epoch}};
  int freed_at = 0;              // restart count at which r/dead was first seen free
  std::int64_t lived_ns = 0;     // durable lived marks of the restarts before this one
  std::int64_t wall_ns = 0;      // wall-clock time of the restarts up to this one
  int must_free_by = 0;          // the restart at which lived_ns first reached a TTL
  for (int restart = 1; restart <= 12 && freed_at == 0; ++restart) {
    if (must_free_by == 0 && lived_ns >= kTtlMs * 1'000'000) must_free_by = restart;
    const auto started = std::chrono::steady_clock::now();
    LockdProcess p;
    start(p, {"--ttl-ms", std::to_string(kTtlMs)});
    AdminClient c(p.address(), key_, live_worker);
    const auto incarnation = counter(c, "incarnation");
    ASSERT_TRUE(incarnation) << p.log();
    const std::string lived_key = "lived/" + std::to_string(*incarnation);
    // kCommits store commits: nothing changes here but the first acknowledgement's seen mark,
    // so the rest are lived checkpoints, a checkpoint interval apart (checked below, from the
    // store, once lockd is gone).
    while (freed_at == 0 && counter(c, "store_commits").value_or(0) < kCommits) {
      // A heartbeat a loaded machine leaves unanswered (the client gives up after its retries)
      // is sent again next time round; every answer must be `refreshed`, and the live holder's
      // lease is checked below at every restart.
      const Answer r = c.heartbeat(beat);
      if (const auto* ack = r.as<wire::HeartbeatAck>()) {
        ASSERT_EQ(ack->entries[0].status, RefreshStatus::refreshed) << "restart " << restart << "\n" << p.log();
      }
      const Answer sh = c.show("r/dead");
      const auto* info = sh.as<wire::NameInfo>();
      if (info == nullptr || info->record.state == LockPhase::free) freed_at = restart;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
    const Answer sl = c.show("r/live");
    ASSERT_NE(sl.as<wire::NameInfo>(), nullptr) << sl.message();
    EXPECT_EQ(sl.as<wire::NameInfo>()->record.state, LockPhase::held);
    EXPECT_EQ(sl.as<wire::NameInfo>()->record.epoch, live_epoch);
    if (freed_at != 0) {
      // Never early: the incarnations since the dead worker's last acknowledgement (the first
      // restart's on) have served a TTL in all.
      EXPECT_GE(wall_ns, kTtlMs * 1'000'000) << "freed at restart " << restart << " after " << wall_ns / 1'000'000
                                             << " ms of uptime since the dead worker's incarnation";
      // The next holder gets it, above the dead holder's epoch.
      const Answer g = c.acquire("r/dead", SandboxId{0x51, 0xbeef}, live_worker);
      ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
      EXPECT_GT(g.as<wire::Grant>()->epoch, dead_epoch);
      EXPECT_EQ(p.terminate(), 0);
      EXPECT_NE(p.log().find("event=expire name=r/dead"), std::string::npos) << p.log();
      break;
    }
    p.kill9();
    const std::int64_t lived_here = meta_value(store, lived_key);
    EXPECT_GE(lived_here, (kCommits - 3) * kLivedIntervalNs) << lived_key << " after " << kCommits << " store commits";
    lived_ns += std::max<std::int64_t>(0, lived_here);
  }
  ASSERT_NE(freed_at, 0) << "12 restarts, each past a lived checkpoint, never freed the dead holder's name";
  // Not late: at the restart where the durable lived marks reach a TTL the restored lease has
  // nothing left. (Not early is checked where it is freed: the first restart restores a full
  // TTL, since the dead worker was acknowledged in the incarnation before it.)
  if (must_free_by != 0) {
    EXPECT_LE(freed_at, must_free_by) << "the dead holder's name outlived a TTL of lived marks";
  }
  EXPECT_LE(freed_at, 5) << "each restart counts >= " << (kCommits - 3) * kLivedIntervalNs / 1'000'000
                         << " ms, so 4 of them make a TTL";
}

// A client acquires, releases and revokes names as fast as it can while lockd is killed -9 at
// random moments. Afterwards: every acknowledged grant whose name saw no later request is in
// the table with its epoch, and per name the acknowledged epochs strictly increase (an epoch is
// never issued twice), across all incarnations.
TEST_F(LockdRestartTest, KillNineTortureLosesNoAcknowledgedGrant) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kRounds = 4;
  constexpr int kNames = 40;
  struct NameLog {
    std::vector<Epoch> acked_epochs;  ///< acknowledged grant/revoke epochs, in order
    std::vector<bool> acked_grant;    ///< per acked_epochs entry: a grant (else a revoke)
    bool last_acked = false;          ///< the last request on it was acknowledged
    bool held = false;                ///< ... and left it held by `holder` at acked_epochs.back()
    SandboxId holder;
  };
  std::map<std::string, NameLog> names;
  std::atomic<std::uint64_t> acked{0};  // acknowledged grants, all rounds (the client counts, the test reads)

  for (int round = 0; round < kRounds; ++round) {
    LockdProcess p;
    start(p);
    std::atomic<bool> stop{false};
    std::thread client([&] {
      AdminClient c(p.address(), key_, W1, 150'000'000);
      AdminClient w1(p.address(), wire::derive_worker_key(key_, W1), {}, 150'000'000);  // W1's kill confirmations
      std::mt19937_64 r(seed + static_cast<std::uint64_t>(round));
      while (!stop.load()) {
        const std::string name = "t/" + std::to_string(r() % kNames);
        NameLog& log = names[name];
        const NameId id = name_id_of(name);
        const SandboxId me{0x99, r()};
        Answer a;
        const int op = static_cast<int>(r() % 4);
        if (log.held && op == 0) {
          a = c.release(id, log.holder, log.acked_epochs.back());
        } else if (op == 1) {
          a = c.revoke(id, 0, /*force=*/true);
          // This client is the holders' worker (W1): it confirms the kill at once, so the
          // revoke's lock-delay does not stall the torture for a TTL (best effort).
          if (const auto* ok = a.as<wire::Ok>(); ok != nullptr && ok->epoch > 1)
            (void)w1.request(wire::KillConfirmed{id, SandboxId{}, ok->epoch - 1});
        } else {
          a = c.acquire(name, me, W1);
        }
        if (!a.ok()) {  // no answer: the request may or may not have taken effect
          log.last_acked = false;
          continue;
        }
        log.last_acked = true;
        if (const auto* g = a.as<wire::Grant>()) {
          log.acked_epochs.push_back(g->epoch);
          log.acked_grant.push_back(true);
          log.held = true;
          log.holder = g->holder;
          ++acked;
        } else if (const auto* ok = a.as<wire::Ok>()) {
          if (op == 1) {
            log.acked_epochs.push_back(ok->epoch);
            log.acked_grant.push_back(false);
          }
          log.held = false;
        } else if (const auto* d = a.as<wire::Deny>()) {
          log.held = d->state == LockPhase::held && log.held && d->holder == log.holder;
        }
      }
    });
    // Kill once this round has made 6..15 acknowledged grants, at a random moment up to 100 ms
    // after (a loaded machine only makes the round take longer); the guard ends a stuck round.
    const std::uint64_t target = acked.load() + 6 + rng() % 10;
    const auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (acked.load() < target && std::chrono::steady_clock::now() < guard)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));
    p.kill9();
    stop = true;
    client.join();
  }

  LockdProcess p;
  start(p);
  AdminClient c(p.address(), key_, W1);
  AdminClient w1(p.address(), wire::derive_worker_key(key_, W1));  // W1's kill confirmations
  auto all = c.list_all();
  ASSERT_TRUE(all) << all.message();
  std::map<std::string, wire::NameRecord> table;
  for (const auto& r : *all) table[r.name] = r;
  EXPECT_GT(acked.load(), 20u) << "the torture made too little progress to mean anything";
  std::size_t checked = 0;
  for (const auto& [name, log] : names) {
    // Epochs never go back; an epoch is granted at most once; the only repeat allowed is a
    // revoke's fresh epoch followed by its grant (DESIGN.md: Revoke → Free, epoch + 1, then
    // the next grant takes that epoch).
    Epoch last_grant = 0;
    for (std::size_t i = 0; i < log.acked_epochs.size(); ++i) {
      if (i > 0) {
        EXPECT_GE(log.acked_epochs[i], log.acked_epochs[i - 1]) << name << " epoch went back";
        if (log.acked_epochs[i] == log.acked_epochs[i - 1]) {
          EXPECT_TRUE(!log.acked_grant[i - 1] && log.acked_grant[i]) << name << " epoch repeated";
        }
      }
      if (log.acked_grant[i]) {
        EXPECT_GT(log.acked_epochs[i], last_grant) << name << " epoch granted twice";
        last_grant = log.acked_epochs[i];
      }
    }
    if (log.last_acked && log.held) {
      ++checked;
      auto it = table.find(name);
      ASSERT_NE(it, table.end()) << name << " acknowledged as held but missing after restart";
      EXPECT_EQ(it->second.state, LockPhase::held) << name;
      EXPECT_EQ(it->second.epoch, log.acked_epochs.back()) << name;
      EXPECT_EQ(it->second.holder, log.holder) << name;
    }
    // Whatever happened to unacknowledged requests, the epoch never went below the last ack.
    if (!log.acked_epochs.empty()) {
      const Answer s = c.show(name);
      const auto* info = s.as<wire::NameInfo>();
      const auto* deny = s.as<wire::Deny>();
      const Epoch now_epoch = info != nullptr ? info->record.epoch : (deny != nullptr ? deny->epoch : 0);
      EXPECT_GE(now_epoch, log.acked_epochs.back()) << name;
    }
  }
  EXPECT_GT(checked, 0u);
  std::printf("torture: %llu acknowledged grants over %d kills, %zu held names verified\n",
              static_cast<unsigned long long>(acked.load()), kRounds, checked);
  // A fresh grant of every name lands above every acknowledged epoch of that name.
  for (const auto& [name, log] : names) {
    if (log.acked_epochs.empty()) continue;
    const Answer rv = c.revoke(name_id_of(name), 0, true);  // unknown_name if the record was dropped
    ASSERT_TRUE(rv.as<wire::Ok>() != nullptr ||
                (rv.as<wire::Deny>() != nullptr && rv.as<wire::Deny>()->refusal == Refusal::unknown_name))
        << name << ": " << rv.message();
    // A pending revoke (the holder may run): W1, the holders' worker, confirms the kill.
    const Answer shown = c.show(name);
    if (const auto* info = shown.as<wire::NameInfo>(); info != nullptr && info->record.revoke_pending) {
      const Answer k = w1.request(wire::KillConfirmed{info->record.name_id, SandboxId{}, info->record.revoked_epoch});
      ASSERT_NE(k.as<wire::Ok>(), nullptr) << name << ": " << k.message();
    }
    const Answer g = c.acquire(name, SandboxId{0xAA, 1}, W1);
    ASSERT_NE(g.as<wire::Grant>(), nullptr) << name << ": " << g.message();
    EXPECT_GT(g.as<wire::Grant>()->epoch, log.acked_epochs.back()) << name;
  }
}

}  // namespace
}  // namespace leasehold::lockd
