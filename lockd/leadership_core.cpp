#include "leasehold/lockd/leadership_core.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

namespace leasehold::lockd {
namespace {
constexpr std::int64_t kNsPerS = 1'000'000'000;
}  // namespace

std::int64_t serve_until_ns(std::int64_t sent_ns, std::int64_t lease_s, double clock_rate_bound,
                            std::int64_t margin_ns) noexcept {
  const auto lease_ns = static_cast<double>(lease_s * kNsPerS);
  return sent_ns + static_cast<std::int64_t>(std::floor(lease_ns * (1.0 - clock_rate_bound))) - margin_ns;
}

std::int64_t step_down_backoff_ns(unsigned n, std::uint64_t random) noexcept {
  std::int64_t base = kStepDownBackoffMinNs;
  for (unsigned i = 1; i < n && base < kStepDownBackoffMaxNs; ++i) base *= 2;
  base = std::min(base, kStepDownBackoffMaxNs);
  const std::int64_t half = base / 2;
  return base - static_cast<std::int64_t>(random % static_cast<std::uint64_t>(half + 1));
}

Status validate(const LeadershipConfig& cfg) {
  if (cfg.lease_s <= 0 || cfg.lease_s > kLeaderLeaseSMax)
    return Status(Errc::invalid_argument, "--leader-lease-s " + std::to_string(cfg.lease_s) + " is outside 1.." +
                                              std::to_string(kLeaderLeaseSMax));
  if (cfg.clock_rate_bound < 0 || cfg.clock_rate_bound >= 0.1)
    return Status(Errc::invalid_argument, "the clock rate bound must be in [0, 0.1)");
  // The keep-alive period (L/4) must fit inside the serving window with room for three misses.
  const std::int64_t window = serve_until_ns(0, cfg.lease_s, cfg.clock_rate_bound, cfg.margin_ns);
  if (window <= cfg.lease_s * kNsPerS / 2)
    return Status(Errc::invalid_argument,
                  "--leader-lease-s " + std::to_string(cfg.lease_s) + ": the serving window " +
                      std::to_string(window / 1'000'000) + " ms (L*(1-rho) - margin) is not above half the lease");
  if (cfg.advertise.empty()) return Status(Errc::invalid_argument, "no advertised address for the election key");
  if (cfg.election_key.empty()) return Status(Errc::invalid_argument, "no election key");
  if (!cfg.cluster_key_path.empty() && cfg.keys_mismatch == nullptr)
    return Status(Errc::invalid_argument, "a cluster key record without its check");
  return Status{};
}

std::string signing_key_id_of(std::string_view record) {
  const std::size_t at = record.find("key_id=");
  if (at == std::string_view::npos) return "?";
  const std::size_t end = record.find(' ', at);
  return std::string(record.substr(at + 7, end == std::string_view::npos ? std::string_view::npos : end - at - 7));
}

bool may_take_over(const LeadershipView& v, std::int64_t refused_revision, std::int64_t now_ns) noexcept {
  return v.leading && v.revision != refused_revision && now_ns >= v.serve_from_ns && now_ns < v.serve_until_ns;
}

bool load_still_leads(const LeadershipView& v, std::int64_t revision, std::int64_t now_ns) noexcept {
  return v.leading && v.revision == revision && now_ns < v.serve_until_ns;
}

std::int64_t fence_of(const LeadershipView& v, std::int64_t leading) noexcept {
  return v.leading && v.revision == leading ? v.serve_until_ns : 0;
}

// ---- the coroutine machinery ------------------------------------------------------------------

/// A coroutine that starts suspended and, when awaited, runs until its first call and hands
/// control back to its awaiter when it ends (symmetric transfer: no stack grows).
struct LeadershipCore::Task {
  struct promise_type {
    std::coroutine_handle<> continuation;
    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct Final {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        if (std::coroutine_handle<> c = h.promise().continuation) return c;
        return std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    Final final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit Task(std::coroutine_handle<promise_type> h) : handle(h) {}
  Task(Task&& o) noexcept : handle(std::exchange(o.handle, {})) {}
  Task& operator=(Task&&) = delete;
  ~Task() {
    if (handle) handle.destroy();
  }
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) noexcept {
    handle.promise().continuation = awaiter;
    return handle;
  }
  void await_resume() const noexcept {}
  std::coroutine_handle<promise_type> handle;
};

/// co_await call(c): suspends until the driver resume()s with c's reply.
struct LeadershipCore::Await {
  LeadershipCore* core;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept { core->resume_at_ = h; }
  ElectionReply await_resume() { return std::move(core->reply_); }
};

LeadershipCore::Await LeadershipCore::call(ElectionCall c) {
  pending_ = std::move(c);
  reply_ = ElectionReply{};
  return Await{this};
}

LeadershipCore::LeadershipCore(LeadershipConfig cfg, Clock now, std::uint64_t jitter_seed,
                               std::function<void()> interrupt, std::function<void()> wake)
    : cfg_(std::move(cfg)),
      now_(std::move(now)),
      interrupt_(std::move(interrupt)),
      wake_(std::move(wake)),
      election_(cfg_.election_key),
      jitter_state_(jitter_seed) {
  cluster_keys_ = cfg_.cluster_keys;
  Task t = run();
  top_ = std::exchange(t.handle, {});
  resume_at_ = top_;
  top_.resume();  // to the first call
}

LeadershipCore::~LeadershipCore() {
  if (top_) top_.destroy();
}

void LeadershipCore::resume(ElectionReply reply) {
  if (pending_.kind == ElectionCall::Kind::done) return;
  reply_ = std::move(reply);
  resume_at_.resume();
}

bool LeadershipCore::interrupted() const {
  std::lock_guard lock(mu_);
  return stop_ || (step_down_ != 0 && step_down_ == view_.revision) || (keys_dirty_ && view_.leading);
}

LeadershipView LeadershipCore::view() const {
  std::lock_guard lock(mu_);
  return view_;
}

bool LeadershipCore::serving(std::int64_t revision, std::int64_t now_ns) const {
  std::lock_guard lock(mu_);
  return view_.leading && view_.revision == revision && now_ns >= view_.serve_from_ns && now_ns < view_.serve_until_ns;
}

void LeadershipCore::interrupt() {
  if (interrupt_) interrupt_();
}

void LeadershipCore::step_down(std::int64_t revision, StepDown why) {
  {
    std::lock_guard lock(mu_);
    if (!view_.leading || view_.revision != revision) return;
    step_down_ = revision;
    step_down_why_ = why;
  }
  interrupt();
}

void LeadershipCore::set_cluster_keys(std::string value) {
  {
    std::lock_guard lock(mu_);
    if (value == cluster_keys_) return;
    cluster_keys_ = std::move(value);
    keys_dirty_ = true;
  }
  interrupt();
}

void LeadershipCore::set_signing_key(std::string value) {
  std::lock_guard lock(mu_);
  signing_key_ = std::move(value);
}

void LeadershipCore::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  interrupt();
}

void LeadershipCore::publish(const LeadershipView& v) {
  {
    std::lock_guard lock(mu_);
    view_ = v;
  }
  if (wake_) wake_();
}

// ---- the election ---------------------------------------------------------------------------

LeadershipCore::Task LeadershipCore::campaign(bool& won) {
  won = false;
  const std::int64_t sent = now_();
  LeadershipView v = view();
  // A linearizable read first: while a leader holds the key, a follower's poll is a read, not a
  // transaction that etcd would put through raft every poll interval.
  ElectionCall read;
  read.kind = ElectionCall::Kind::read_key;
  read.key = election_;
  read.until_ns = sent + cfg_.call_timeout_ns;
  if (ElectionReply key = co_await call(std::move(read)); key.status.ok() && key.found) {
    if (key.value != v.leader || !v.last_error.empty()) {
      v.leader = key.value;
      v.last_error.clear();
      publish(v);
    }
    co_return;
  }
  ElectionCall c;
  c.kind = ElectionCall::Kind::campaign;
  c.key = election_;
  c.value = cfg_.advertise;
  c.lease_id = lease_id_;
  c.until_ns = sent + cfg_.call_timeout_ns;
  // Only a lockd holding every key the cluster accepts may lead, and every leader signs with the
  // key the cluster's resources keep (etcd_store.hpp): each record is checked as read, and the
  // election compares its revision, so a record changed in between makes this round lose.
  bool may_lead = true;
  if (!cfg_.cluster_key_path.empty()) {
    std::string mine;
    {
      std::lock_guard lock(mu_);
      mine = cluster_keys_;
    }
    co_await campaign_record(cfg_.cluster_key_path, mine,
                             [&](std::string_view recorded) { return cfg_.keys_mismatch(mine, recorded); }, v,
                             c, may_lead);
    if (!may_lead) co_return;
  }
  if (!cfg_.signing_key_path.empty()) {
    std::string mine;
    {
      std::lock_guard lock(mu_);
      mine = signing_key_;
    }
    if (mine.empty()) co_return;  // its signer is not loaded yet (the daemon sets it at start)
    co_await campaign_record(
        cfg_.signing_key_path, mine,
        [&](std::string_view recorded) {
          return recorded == mine ? std::string()
                                  : cfg_.signing_key_path + " records token signing key id " +
                                        signing_key_id_of(recorded) + ", this lockd signs with key id " +
                                        signing_key_id_of(mine) + " (resources would refuse its tokens as unknown_key)";
        },
        v, c, may_lead);
    if (!may_lead) co_return;
  }
  ElectionReply r = co_await call(std::move(c));
  if (!r.status.ok()) {
    v.last_error = "campaign: " + r.status.message();
    publish(v);
    // Unless etcd said no (not_found: no such lease), the transaction may have been applied with
    // its answer lost or late: the key would then be this lockd's, attached to the lease it keeps
    // alive as a follower, and every later poll would read it as another leader's - a shard with
    // no leader for as long as this lockd runs. run() gives that lease up.
    if (r.status.code() != Errc::not_found) campaign_outcome_unknown_ = true;
    co_return;
  }
  if (r.won) {
    won_ns_ = now_();
    last_key_check_ns_ = won_ns_;
    // The previous leader's key may have been deleted by hand rather than have expired: that
    // leader learns it at its next key check (every key_check_ns). Serving starts after that.
    v.serve_from_ns = won_ns_ + cfg_.key_check_ns + cfg_.margin_ns;
    v.leading = true;
    v.revision = r.revision;  // the transaction's one put created the key at this revision
    v.serve_until_ns = serve_until_ns(last_ack_sent_ns_, cfg_.lease_s, cfg_.clock_rate_bound, cfg_.margin_ns);
    v.leader = cfg_.advertise;
    v.last_error.clear();
    publish(v);
    won = true;
    co_return;
  }
  const std::string leader = r.found ? r.value : std::string();
  if (leader != v.leader || !v.last_error.empty()) {
    v.leader = leader;
    v.last_error.clear();
    publish(v);
  }
}

LeadershipCore::Task LeadershipCore::campaign_record(const std::string& path, const std::string& mine,
                                                     std::function<std::string(std::string_view)> why_not,
                                                     LeadershipView& v, ElectionCall& election, bool& may_lead) {
  ElectionCall read;
  read.kind = ElectionCall::Kind::read_key;
  read.key = path;
  read.until_ns = election.until_ns;
  ElectionReply rec = co_await call(std::move(read));
  if (!rec.status.ok()) {
    v.last_error = "campaign: " + rec.status.message();
    publish(v);
    may_lead = false;
    co_return;
  }
  if (rec.found) {
    if (std::string why = why_not(rec.value); !why.empty()) {
      why = "refusing to campaign: " + why;
      if (why != v.last_error || !v.leader.empty()) {
        v.leader.clear();
        v.last_error = std::move(why);
        publish(v);
      }
      may_lead = false;
      co_return;
    }
  }
  // The winner records its own (a record absent, or one this lockd may lead but does not match).
  election.records.push_back(ElectionRecord{path, rec.found ? rec.mod_revision : 0,
                                            !rec.found || rec.value != mine ? mine : std::string()});
}

LeadershipCore::Task LeadershipCore::run() {
  bool keep_alive_open = false;
  const std::int64_t beat_ns = cfg_.lease_s * kNsPerS / 4;
  auto stopped = [this] {
    std::lock_guard lock(mu_);
    return stop_;
  };
  auto note = [&](const std::string& what, const Status& s) {
    LeadershipView v = view();
    v.last_error = what + ": " + s.message();
    publish(v);
  };
  auto wait = [this](std::int64_t ns) {
    ElectionCall w;
    w.kind = ElectionCall::Kind::wait;
    w.until_ns = now_() + std::max<std::int64_t>(ns, 0);
    return call(std::move(w));
  };
  auto revoke = [this] {
    ElectionCall c;
    c.kind = ElectionCall::Kind::lease_revoke;
    c.lease_id = lease_id_;
    c.until_ns = now_() + cfg_.call_timeout_ns;
    return call(std::move(c));
  };
  auto read_election_key = [this](std::int64_t until_ns) {
    ElectionCall c;
    c.kind = ElectionCall::Kind::read_key;
    c.key = election_;
    c.until_ns = until_ns;
    return call(std::move(c));
  };
  // Leaves the leadership (if held) and the lease: a lease etcd still has is revoked (best
  // effort), and with it the election key goes at once. (Inline below: publish(resigned(...)),
  // then the revoke.)
  auto resigned = [this](std::string leader, std::string why, std::int64_t campaign_after_ns = -1,
                         unsigned failed = 0) {
    LeadershipView v = view();
    if (campaign_after_ns >= 0) {
      v.campaign_after_ns = campaign_after_ns;
      v.failed_in_a_row = failed;
    }
    v.leading = false;
    v.revision = 0;
    v.serve_until_ns = 0;
    v.leader = std::move(leader);
    v.last_error = std::move(why);
    publish(v);
  };
#define LEASEHOLD_RESIGN(...)                            \
  do {                                                   \
    resigned(__VA_ARGS__);                               \
    if (lease_id_ != 0) (void)co_await revoke();         \
    lease_id_ = 0;                                       \
    keep_alive_open = false;                             \
  } while (false)

  for (;;) {
    if (stopped()) break;
    if (lease_id_ == 0) {
      const std::int64_t sent = now_();
      ElectionCall g;
      g.kind = ElectionCall::Kind::lease_grant;
      g.ttl_s = cfg_.lease_s;
      g.until_ns = sent + cfg_.call_timeout_ns;
      ElectionReply granted = co_await call(std::move(g));
      if (!granted.status.ok()) {
        note("lease grant", granted.status);
        co_await wait(cfg_.poll_ns);
        continue;
      }
      lease_id_ = granted.lease_id;
      last_ack_sent_ns_ = sent;
    }
    if (!keep_alive_open) {
      ElectionCall o;
      o.kind = ElectionCall::Kind::keep_alive_open;
      o.until_ns = now_() + cfg_.call_timeout_ns;
      ElectionReply opened = co_await call(std::move(o));
      if (!opened.status.ok()) {
        note("keep-alive stream", opened.status);
        co_await wait(cfg_.poll_ns);
        continue;
      }
      keep_alive_open = true;
    }
    if (!view().leading) {
      const LeadershipView now_view = view();
      if (now_() >= now_view.campaign_after_ns) {
        bool won = false;
        co_await campaign(won);
        if (std::exchange(campaign_outcome_unknown_, false)) {
          // Revoked, the key goes with the lease if the election was applied; a revoke that
          // fails leaves the lease to expire within L (it is no longer kept alive).
          if (lease_id_ != 0) (void)co_await revoke();
          lease_id_ = 0;
          keep_alive_open = false;
          continue;
        }
      } else if (ElectionReply key = co_await read_election_key(now_() + cfg_.call_timeout_ns); key.status.ok()) {
        // Backing off: no campaign, but the hint stays current.
        const std::string leader = key.found ? key.value : std::string();
        if (leader != now_view.leader) {
          LeadershipView v = now_view;
          v.leader = leader;
          publish(v);
        }
      }
    }

    // Sleep until the next keep-alive is due (a follower: at most a poll interval, to find a
    // free key quickly), or until the io side steps down.
    const bool leading = view().leading;
    std::int64_t due = last_ack_sent_ns_ + beat_ns;
    if (!leading) due = std::min(due, now_() + cfg_.poll_ns);
    else due = std::min(due, last_key_check_ns_ + cfg_.key_check_ns);
    if (due > now_() && !interrupted()) co_await wait(due - now_());
    if (stopped()) break;

    LeadershipView v = view();
    std::int64_t asked = 0;
    StepDown why = StepDown::failed;
    {
      std::lock_guard lock(mu_);
      asked = step_down_;
      why = step_down_why_;
      step_down_ = 0;
    }
    if (v.leading && asked == v.revision) {
      if (why == StepDown::fenced) {
        LEASEHOLD_RESIGN(std::string(), "stepped down: no keep-alive acknowledged within the leadership lease (fenced)");
        continue;
      }
      // Its own store failed: winning again at once would fail again. Back off, longer after
      // each failed leadership in a row; another lockd may take over meanwhile.
      const std::int64_t now = now_();
      const unsigned n = now - won_ns_ >= kStepDownBackoffResetNs ? 1 : v.failed_in_a_row + 1;
      jitter_state_ += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = jitter_state_;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      const std::int64_t backoff = step_down_backoff_ns(n, z ^ (z >> 31));
      LEASEHOLD_RESIGN(std::string(),
                       "stepped down: the store refused or failed a write, or the takeover failed; no campaign for " +
                           std::to_string(backoff / 1'000'000) + " ms (" + std::to_string(n) + " in a row)",
                       now + backoff, n);
      continue;
    }
    if (v.leading && !cfg_.cluster_key_path.empty()) {
      // A rotation while leading: the cluster's record follows the leader's keys.
      std::string keys;
      {
        std::lock_guard lock(mu_);
        if (keys_dirty_) keys = cluster_keys_;
        keys_dirty_ = false;
      }
      if (!keys.empty()) {
        ElectionCall w;
        w.kind = ElectionCall::Kind::write_record;
        w.key = election_;
        w.guard_revision = v.revision;
        w.records.push_back(ElectionRecord{cfg_.cluster_key_path, 0, keys});
        w.until_ns = std::max(now_() + cfg_.call_timeout_ns / 10,
                              std::min(now_() + cfg_.call_timeout_ns, last_ack_sent_ns_ + beat_ns));
        if (ElectionReply written = co_await call(std::move(w)); !written.status.ok()) {
          std::lock_guard lock(mu_);
          keys_dirty_ = true;  // again at the next keep-alive
        }
      }
    }
    if (v.leading && now_() >= v.serve_until_ns) {
      LEASEHOLD_RESIGN(std::string(), "stepped down: no keep-alive acknowledged within the leadership lease (fenced)");
      continue;
    }
    if (v.leading && now_() >= last_key_check_ns_ + cfg_.key_check_ns && now_() < last_ack_sent_ns_ + beat_ns) {
      // Between keep-alives: is the election key still this leadership's? Only the lease's
      // expiry or an operator (etcdctl del) removes it; deleted by hand, another lockd can win
      // at its next poll while this one still answers from memory. Fenced at once instead.
      last_key_check_ns_ = now_();
      // Never past the next keep-alive: a slow read must not delay what keeps the fence open.
      ElectionReply key =
          co_await read_election_key(std::min(last_key_check_ns_ + cfg_.call_timeout_ns, last_ack_sent_ns_ + beat_ns));
      if (key.status.ok() && (!key.found || key.create_revision != v.revision))
        LEASEHOLD_RESIGN(key.found ? key.value : std::string(),
                         "stepped down: the election key is gone or no longer this lockd's (deleted by hand?)");
      continue;
    }
    if (now_() < last_ack_sent_ns_ + beat_ns) continue;  // a follower's poll: campaign again

    const std::int64_t sent = now_();
    ElectionCall k;
    k.kind = ElectionCall::Kind::keep_alive;
    k.lease_id = lease_id_;
    k.until_ns = sent + beat_ns;
    ElectionReply r = co_await call(std::move(k));
    if (r.status.ok()) {
      last_ack_sent_ns_ = sent;
      if (!v.leading) continue;
      // The key must still be ours (only the lease's expiry or an operator removes it).
      ElectionReply key = co_await read_election_key(sent + beat_ns);
      if (key.status.ok() && (!key.found || key.create_revision != v.revision)) {
        LEASEHOLD_RESIGN(key.found ? key.value : std::string(), "stepped down: the election key is no longer this lockd's");
        continue;
      }
      v = view();
      v.serve_until_ns = serve_until_ns(sent, cfg_.lease_s, cfg_.clock_rate_bound, cfg_.margin_ns);
      v.last_error.clear();
      publish(v);
    } else if (r.status.code() == Errc::not_found) {
      // etcd no longer has the lease: the election key went with it.
      lease_id_ = 0;
      LEASEHOLD_RESIGN(std::string(), "the leadership lease expired in etcd");
    } else {
      note("keep-alive", r.status);
      // A broken stream: open another, on the next member (this one may hold its connection
      // and answer nothing), after a short pause.
      if (r.status.code() == Errc::timeout) {
        ElectionCall n;
        n.kind = ElectionCall::Kind::next_endpoint;
        co_await call(std::move(n));
      }
      keep_alive_open = false;
      co_await wait(std::min<std::int64_t>(cfg_.poll_ns, 100'000'000));
    }
  }
#undef LEASEHOLD_RESIGN
  // Stopping: a leader hands over at once instead of making the others wait out its lease.
  if (lease_id_ != 0) (void)co_await revoke();
  lease_id_ = 0;
  pending_ = ElectionCall{};
  pending_.kind = ElectionCall::Kind::done;
}

}  // namespace leasehold::lockd
