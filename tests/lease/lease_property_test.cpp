// Seeded randomized property test of LeaseTable (issue 2 "Tests"). Thousands of random
// operation sequences over a few names, sandboxes and workers, with time moving forward;
// after every step the safety properties are checked against every token ever issued.
//
// Replay: a failure prints its sequence seed. Environment:
//   LEASEHOLD_PROPERTY_SEED=<n>   first sequence seed (default fixed, so CI is deterministic)
//   LEASEHOLD_PROPERTY_RUNS=<n>   number of sequences (default 2000)
#include "leasehold/lease/lease_table.hpp"

#include "tests/lease/lease_test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace leasehold {
namespace {

using namespace leasehold::testing;

constexpr std::uint64_t kDefaultSeed = 0x1ea5e401d;
constexpr int kDefaultRuns = 2000;
constexpr int kStepsPerRun = 100;
constexpr int kNames = 4;

std::uint64_t env_u64(const char* var, std::uint64_t fallback) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 0);
}

struct Violation {
  std::string what;
};

class Sequence {
 public:
  explicit Sequence(std::uint64_t seed) : rng_(seed), table_(make_config()) {
    for (int n = 0; n < kNames; ++n) {
      texts_.push_back("name-" + std::to_string(n));
      ids_.push_back(name_id_of(texts_.back()));
      last_epoch_.push_back(0);
    }
  }

  // Returns an empty string, or the first violated property with the step that broke it.
  std::string go() {
    for (step_ = 0; step_ < kStepsPerRun; ++step_) {
      try {
        one_step();
        check_invariants();
      } catch (const Violation& v) {
        std::ostringstream os;
        os << "step " << step_ << " (" << last_op_ << "): " << v.what;
        return os.str();
      }
    }
    return {};
  }

 private:
  LeaseConfig make_config() {
    LeaseConfig c = small_config(pick(4) == 0 ? LockMode::preemptible : LockMode::lease);
    c.default_ttl_ns = 3 * kSecondNs;
    c.max_ttl_ns = 6 * kSecondNs;
    c.acquiring_ttl_ns = 2 * kSecondNs;
    c.lock_delay_ns = pick(2) == 0 ? 0 : 2 * kSecondNs;
    c.worker_liveness_ttl_ns = 4 * kSecondNs;
    c.capacity = 3;  // fewer records than names: table_full is reachable
    return c;
  }
  std::uint64_t pick(std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_); }
  static void require(bool ok, const std::string& what) {
    if (!ok) throw Violation{what};
  }
  SandboxId sandbox() {
    static const SandboxId all[] = {kA, kB, kC};
    return all[pick(3)];
  }
  WorkerId worker() { return pick(2) == 0 ? kW1 : kW2; }
  int name() { return static_cast<int>(pick(kNames)); }
  // An epoch argument: usually one the name really had, sometimes a neighbour or junk.
  Epoch epoch_for(int n) {
    const Epoch cur = table_.state(ids_[n]).epoch;
    switch (pick(6)) {
      case 0: return cur > 0 ? cur - 1 : 0;
      case 1: return cur + 1;
      case 2: return pick(8);
      default: return cur;
    }
  }
  std::int64_t ttl() {
    switch (pick(5)) {
      case 0: return 0;
      case 1: return 7 * kSecondNs;  // above max_ttl_ns: bad_request
      default: return static_cast<std::int64_t>(1 + pick(6)) * kSecondNs;
    }
  }

  void record_grant(const Outcome& o, const LockState& before) {
    if (!o.ok() || o.token == Token{}) return;
    const int n = index_of(o.name);
    auto& issued = issued_[n];
    for (const Tracked& t : issued)
      if (t.token == o.token) return;  // idempotent retry of an earlier grant
    Epoch max_issued = 0;
    for (const Tracked& t : issued) max_issued = std::max(max_issued, t.token.epoch);
    require(o.token.epoch > max_issued, "a grant's epoch is not above every earlier grant");
    require(o.token.epoch >= before.epoch, "a grant went below the name's epoch");
    require(!(before.phase == LockPhase::free && before.revoke_pending && now_ < before.lock_delay_until_ns),
            "granted a name whose revoke is pending (the old holder may still run)");
    issued.push_back(Tracked{o.token, false, false});
  }
  int index_of(NameId id) const {
    for (int n = 0; n < kNames; ++n)
      if (ids_[n] == id) return n;
    throw Violation{"outcome for a name the test never used"};
  }
  // A refused single-name transition must leave the name's state as it was.
  void unchanged_if_refused(const Outcome& o, int n, const LockState& before) {
    if (o.ok()) return;
    const LockState after = table_.state(ids_[n]);
    require(after == before, std::string("refused (") + std::string(to_string(o.refusal)) +
                                 ") but the state changed");
  }

  void one_step() {
    const int n = name();
    const NameId id = ids_[n];
    const LockState before = table_.state(id);
    Outcome o;
    switch (pick(15)) {
      case 0:
      case 1:
        last_op_ = "acquire";
        o = table_.acquire(texts_[n], sandbox(), worker(), now_, ttl());
        record_grant(o, before);
        unchanged_if_refused(o, n, before);
        break;
      case 2:
        last_op_ = "acquire_2pc";
        o = table_.acquire_2pc(texts_[n], sandbox(), now_);
        record_grant(o, before);
        unchanged_if_refused(o, n, before);
        break;
      case 3: {
        last_op_ = "commit";
        const SandboxId s = before.phase == LockPhase::acquiring && pick(3) != 0 ? before.owner : sandbox();
        o = table_.commit(id, s, epoch_for(n), worker(), now_, ttl());
        record_grant(o, before);
        unchanged_if_refused(o, n, before);
        break;
      }
      case 4:
      case 5:
        last_op_ = "refresh";
        refresh();
        break;
      case 6: {
        last_op_ = "release";
        const SandboxId s = before.phase == LockPhase::held && pick(3) != 0 ? before.owner : sandbox();
        o = table_.release(id, s, epoch_for(n), now_);
        unchanged_if_refused(o, n, before);
        break;
      }
      case 7:
        last_op_ = "advance";
        advance();
        break;
      case 8: {
        last_op_ = "begin_transfer";
        const SandboxId s = before.phase == LockPhase::held && pick(3) != 0 ? before.owner : sandbox();
        o = table_.begin_transfer(id, s, epoch_for(n), sandbox(), now_);
        unchanged_if_refused(o, n, before);
        if (o.ok() && before.phase == LockPhase::held)
          require(o.state.epoch == before.epoch + 1, "transfer begin did not take epoch + 1");
        break;
      }
      case 9: {
        last_op_ = "complete_release";
        const SandboxId s = before.phase == LockPhase::transferring && pick(3) != 0 ? before.owner : sandbox();
        o = table_.complete_release(id, s, epoch_for(n), now_);
        unchanged_if_refused(o, n, before);
        break;
      }
      case 10:
        last_op_ = "revoke";
        o = table_.revoke(id, now_, pick(4) == 0 ? epoch_for(n) : 0, pick(2) == 0);
        unchanged_if_refused(o, n, before);
        if (o.ok()) require(o.state.epoch == before.epoch + 1, "revoke did not take epoch + 1");
        if (!o.ok() && before.known && before.phase == LockPhase::free && o.refusal != Refusal::not_held &&
            o.refusal != Refusal::stale_epoch && o.refusal != Refusal::epoch_exhausted)
          require(false, "revoke of a free name refused for another reason");
        break;
      case 11:
        last_op_ = "reassign";
        o = table_.reassign(texts_[n], sandbox(), now_);
        unchanged_if_refused(o, n, before);
        if (o.ok()) require(o.state.epoch == before.epoch + 1, "reassign did not take epoch + 1");
        break;
      case 12: {
        last_op_ = "preempt";
        const SandboxId s = before.phase == LockPhase::held && pick(3) != 0 ? before.owner : sandbox();
        o = table_.preempt(id, s, epoch_for(n), pick(2) == 0, now_);
        unchanged_if_refused(o, n, before);
        if (o.ok()) {
          require(before.phase == LockPhase::held, "preempted a name that was not Held");
          require(o.state.epoch == before.epoch, "preempt changed the epoch");
        }
        break;
      }
      case 13:
        if (pick(2) == 0) {
          last_op_ = "confirm_kill";
          const Epoch e = before.revoke_pending && pick(3) != 0 ? before.revoked_epoch : epoch_for(n);
          const WorkerId w = before.revoke_pending && pick(3) != 0 && !before.revoked_worker.is_nil()
                                 ? before.revoked_worker
                                 : worker();
          o = table_.confirm_kill(id, w, e, now_);
          unchanged_if_refused(o, n, before);
          if (o.ok() && before.revoke_pending && !o.state.revoke_pending)
            require(w == before.revoked_worker && e == before.revoked_epoch,
                    "a confirmation from another worker or epoch lifted a revoke");
          break;
        }
        last_op_ = "worker_heartbeat";
        require(table_.worker_heartbeat(worker(), now_) == Refusal::none, "heartbeat refused");
        break;
      case 14:
        if (pick(8) == 0) {
          last_op_ = "restart";
          restart();
        } else {
          last_op_ = "time";
          now_ += static_cast<std::int64_t>(pick(1500)) * 1'000'000;  // 0..1.5 s
        }
        break;
    }
  }

  void refresh() {
    const WorkerId w = worker();
    std::vector<RefreshEntry> entries;
    std::vector<LockState> before;
    const int count = static_cast<int>(1 + pick(4));
    for (int k = 0; k < count; ++k) {
      const int n = name();
      const LockState s = table_.state(ids_[n]);
      const SandboxId sb = s.phase == LockPhase::held && pick(4) != 0 ? s.owner : sandbox();
      entries.push_back(RefreshEntry{ids_[n], sb, epoch_for(n)});
      before.push_back(s);
    }
    std::vector<RefreshAnswer> answers(entries.size());
    require(table_.refresh(w, entries, now_, answers, ttl() % (7 * kSecondNs)) == Refusal::none,
            "refresh batch refused");
    for (std::size_t k = 0; k < entries.size(); ++k) {
      if (answers[k].status != RefreshStatus::refreshed) continue;
      const LockState& b = before[k];
      // Never refreshed back to life: it was Held by exactly this grant and still valid.
      require(b.phase == LockPhase::held, "refreshed a lease that was not Held");
      require(may_mutate(table_.state(entries[k].name), entries[k].sandbox, entries[k].epoch, now_),
              "a refreshed lease does not authorize its holder");
      require(answers[k].epoch == entries[k].epoch, "refresh answered another epoch");
    }
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const LockState& b = before[k];
      if (b.phase == LockPhase::held && now_ >= b.expiry_ns)
        require(answers[k].status != RefreshStatus::refreshed, "an expired lease was refreshed");
    }
  }

  void advance() {
    std::vector<Expiry> out;
    table_.advance(now_, out);
    for (const Expiry& e : out) {
      require(e.deadline_ns <= now_, "advance reported a deadline in the future");
      require(e.deadline_ns >= last_deadline_, "advance reported deadlines out of order");
      last_deadline_ = e.deadline_ns;
    }
  }

  void restart() {
    const DurableSnapshot snap = table_.export_durable(now_);
    std::vector<LockState> before;
    for (int n = 0; n < kNames; ++n) before.push_back(table_.state(ids_[n]));
    const Epoch hw = table_.epoch_high_water();
    LeaseTable fresh(table_.config());
    const Status err = fresh.restore(snap, now_);
    require(err.ok(), "restore failed: " + err.message());
    table_ = std::move(fresh);
    require(table_.epoch_high_water() >= hw, "restart lowered the epoch high-water mark");
    for (int n = 0; n < kNames; ++n) {
      const LockState after = table_.state(ids_[n]);
      require(after.epoch >= before[n].epoch, "restart lowered an epoch");
      if (before[n].phase == LockPhase::held && now_ < before[n].expiry_ns) {
        require(after.phase == LockPhase::held && after.owner == before[n].owner &&
                    after.epoch == before[n].epoch,
                "restart lost a live lease");
        require(after.expiry_ns >= before[n].expiry_ns, "restart shortened a lease");
      }
    }
    last_deadline_ = 0;  // a new table's timers
  }

  void check_invariants() {
    for (int n = 0; n < kNames; ++n) {
      const LockState s = table_.state(ids_[n]);
      require(s.epoch >= last_epoch_[n], "the epoch of " + texts_[n] + " decreased");
      last_epoch_[n] = s.epoch;
      require(s.epoch <= table_.epoch_high_water(), "an epoch is above the high-water mark");
      int authorized = 0;
      Epoch max_issued = 0;
      for (const Tracked& t : issued_[n]) max_issued = std::max(max_issued, t.token.epoch);
      for (Tracked& t : issued_[n]) {
        const bool ok = token_authorized(s, t.token) && now_ < s.expiry_ns;
        require(ok == table_.token_authorized(t.token, now_), "token_authorized disagrees");
        authorized += ok;
        const bool superseded = t.token.epoch < max_issued || t.token.epoch < s.epoch;
        require(!(ok && superseded), "a superseded token authorizes");
        require(!(ok && t.dead), "a token that had lost authority authorizes again");
        if (ok) t.live = true;
        if (!ok && (t.live || superseded)) t.dead = true;
      }
      require(authorized <= 1, "two tokens authorize for " + texts_[n]);
      for (SandboxId sb : {kA, kB, kC}) {
        const bool any = may_mutate(s, sb, s.epoch, now_) || may_mutate(s, sb, s.old_epoch, now_);
        if (s.phase != LockPhase::held) require(!any, "someone may mutate outside Held");
      }
      if (s.phase == LockPhase::held) {
        require(!s.owner.is_nil(), "Held with a nil owner");
        bool issued = false;
        for (const Tracked& t : issued_[n])
          issued |= (t.token.epoch == s.epoch && t.token.holder == s.owner);
        require(issued, "Held by a grant that was never issued");
      }
    }
    std::size_t records = 0, held = 0;
    table_.for_each([&](NameId, const LockState& s) {
      ++records;
      held += s.phase == LockPhase::held;
    });
    require(records == table_.size(), "size() disagrees with the records");
    require(held == table_.held(), "held() disagrees with the records");
    require(records <= table_.config().capacity, "more records than the capacity");
  }

  std::mt19937_64 rng_;
  LeaseTable table_;
  std::vector<std::string> texts_;
  std::vector<NameId> ids_;
  std::vector<Epoch> last_epoch_;
  struct Tracked {
    Token token;
    bool live;  // has authorized at some step
    bool dead;  // lost authority (after being live, or superseded): must never regain it
  };
  std::vector<Tracked> issued_[kNames];
  std::int64_t now_ = 1000 * kSecondNs;
  std::int64_t last_deadline_ = 0;
  int step_ = 0;
  const char* last_op_ = "";
};

TEST(LeaseProperty, RandomSequencesKeepTheSafetyProperties) {
  const std::uint64_t base = env_u64("LEASEHOLD_PROPERTY_SEED", kDefaultSeed);
  const std::uint64_t runs = env_u64("LEASEHOLD_PROPERTY_RUNS", kDefaultRuns);
  for (std::uint64_t i = 0; i < runs; ++i) {
    const std::uint64_t seed = base + i;
    const std::string failure = Sequence(seed).go();
    ASSERT_EQ(failure, "") << "replay: LEASEHOLD_PROPERTY_SEED=" << seed
                           << " LEASEHOLD_PROPERTY_RUNS=1";
  }
}

}  // namespace
}  // namespace leasehold
