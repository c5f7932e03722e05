#include "leasehold/lockd/leadership.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

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

Result<std::unique_ptr<Leadership>> Leadership::start(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg,
                                                      std::function<void()> wake) {
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
  return std::unique_ptr<Leadership>(new Leadership(std::move(client), std::move(cfg), std::move(wake)));
}

Leadership::Leadership(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg, std::function<void()> wake)
    : client_(std::move(client)), cfg_(std::move(cfg)), election_(election_key(cfg_.shard_prefix)), wake_(std::move(wake)) {
  cluster_keys_ = cfg_.cluster_keys;
  jitter_state_ = static_cast<std::uint64_t>(boottime_ns()) ^ std::hash<std::string>{}(cfg_.advertise);
  thread_ = std::thread([this] { run(); });
}

Leadership::~Leadership() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Leadership::View Leadership::view() const {
  std::lock_guard lock(mu_);
  return view_;
}

bool Leadership::serving(std::int64_t revision, std::int64_t now_ns) const {
  std::lock_guard lock(mu_);
  return view_.leading && view_.revision == revision && now_ns >= view_.serve_from_ns && now_ns < view_.serve_until_ns;
}

void Leadership::step_down(std::int64_t revision, StepDown why) {
  {
    std::lock_guard lock(mu_);
    if (!view_.leading || view_.revision != revision) return;
    step_down_ = revision;
    step_down_why_ = why;
  }
  cv_.notify_all();
}

void Leadership::set_cluster_keys(std::string value) {
  {
    std::lock_guard lock(mu_);
    if (value == cluster_keys_) return;
    cluster_keys_ = std::move(value);
    keys_dirty_ = true;
  }
  cv_.notify_all();
}

void Leadership::publish(const View& v) {
  {
    std::lock_guard lock(mu_);
    view_ = v;
  }
  if (wake_) wake_();
}

bool Leadership::pause(std::int64_t ns) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::nanoseconds(std::max<std::int64_t>(ns, 0)),
               [&] { return stop_ || (step_down_ != 0 && step_down_ == view_.revision) || (keys_dirty_ && view_.leading); });
  return !stop_;
}

bool Leadership::campaign() {
  const std::int64_t sent = boottime_ns();
  View v = view();
  // A linearizable read first: while a leader holds the key, a follower's poll is a read, not a
  // transaction that etcd would put through raft every poll interval.
  if (auto key = client_->range(election_, {}, sent + kNsPerS); key.ok() && !key->kvs.empty()) {
    if (key->kvs.front().value != v.leader || !v.last_error.empty()) {
      v.leader = key->kvs.front().value;
      v.last_error.clear();
      publish(v);
    }
    return false;
  }
  std::vector<etcd::Compare> compares{
      etcd::Compare::of(election_, etcd::Compare::Target::create_revision, etcd::Compare::Op::equal, 0)};
  std::vector<etcd::Op> ops{etcd::Op::put(election_, cfg_.advertise, lease_id_)};
  if (!cfg_.cluster_key_path.empty()) {
    // Only a lockd holding every key the cluster accepts may lead (etcd_store.hpp): checked on
    // the record as read, and the election compares the record's revision with it, so a record
    // changed in between makes this round lose. The winner records its own set.
    std::string mine;
    {
      std::lock_guard lock(mu_);
      mine = cluster_keys_;
    }
    auto rec = client_->range(cfg_.cluster_key_path, {}, sent + kNsPerS);
    if (!rec.ok()) {
      v.last_error = "campaign: " + rec.status().message();
      publish(v);
      return false;
    }
    const std::string recorded = rec->kvs.empty() ? std::string() : rec->kvs.front().value;
    if (!rec->kvs.empty()) {
      if (std::string why = cluster_keys_mismatch(mine, recorded); !why.empty()) {
        why = "refusing to campaign: " + why;
        if (why != v.last_error || !v.leader.empty()) {
          v.leader.clear();
          v.last_error = std::move(why);
          publish(v);
        }
        return false;
      }
    }
    compares.push_back(etcd::Compare::of(cfg_.cluster_key_path, etcd::Compare::Target::mod_revision,
                                         etcd::Compare::Op::equal, rec->kvs.empty() ? 0 : rec->kvs.front().mod_revision));
    if (recorded != mine) ops.push_back(etcd::Op::put(cfg_.cluster_key_path, mine));
  }
  auto r = client_->txn(compares, ops, {etcd::Op::get(election_)}, sent + kNsPerS);
  if (!r.ok()) {
    v.last_error = "campaign: " + r.status().message();
    publish(v);
    return false;
  }
  if (r->succeeded) {
    won_ns_ = boottime_ns();
    last_key_check_ns_ = won_ns_;
    // The previous leader's key may have been deleted by hand rather than have expired: that
    // leader learns it at its next key check (every key_check_ns). Serving starts after that.
    v.serve_from_ns = won_ns_ + cfg_.key_check_ns + cfg_.margin_ns;
    v.leading = true;
    v.revision = r->revision;  // the transaction's one put created the key at this revision
    v.serve_until_ns = serve_until_ns(last_ack_sent_ns_, cfg_.lease_s, cfg_.clock_rate_bound, cfg_.margin_ns);
    v.leader = cfg_.advertise;
    v.last_error.clear();
    publish(v);
    return true;
  }
  const std::string leader =
      !r->ranges.empty() && !r->ranges.front().kvs.empty() ? r->ranges.front().kvs.front().value : std::string();
  if (leader != v.leader || !v.last_error.empty()) {
    v.leader = leader;
    v.last_error.clear();
    publish(v);
  }
  return false;
}

void Leadership::run() {
  std::unique_ptr<etcd::KeepAlive> keep_alive;
  const std::int64_t beat_ns = cfg_.lease_s * kNsPerS / 4;
  auto note = [&](const std::string& what, const Status& s) {
    View v = view();
    v.last_error = what + ": " + s.message();
    publish(v);
  };
  // Leaves the leadership (if held) and the lease: a lease etcd still has is revoked (best
  // effort), and with it the election key goes at once.
  auto resign = [&](std::string leader, std::string why, std::int64_t campaign_after_ns = -1, unsigned failed = 0) {
    View v = view();
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
    if (lease_id_ != 0) (void)client_->lease_revoke(lease_id_, boottime_ns() + kNsPerS);
    lease_id_ = 0;
    keep_alive.reset();
  };
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_) break;
    }
    if (lease_id_ == 0) {
      const std::int64_t sent = boottime_ns();
      auto g = client_->lease_grant(cfg_.lease_s, sent + kNsPerS);
      if (!g.ok()) {
        note("lease grant", g.status());
        if (!pause(cfg_.poll_ns)) break;
        continue;
      }
      lease_id_ = g->id;
      last_ack_sent_ns_ = sent;
    }
    if (keep_alive == nullptr) {
      auto ka = client_->keep_alive(boottime_ns() + kNsPerS);
      if (!ka.ok()) {
        note("keep-alive stream", ka.status());
        if (!pause(cfg_.poll_ns)) break;
        continue;
      }
      keep_alive = std::move(*ka);
    }
    if (!view().leading) {
      const View now_view = view();
      if (boottime_ns() >= now_view.campaign_after_ns) {
        campaign();
      } else if (auto key = client_->range(election_, {}, boottime_ns() + kNsPerS); key.ok()) {
        // Backing off: no campaign, but the hint stays current.
        const std::string leader = key->kvs.empty() ? std::string() : key->kvs.front().value;
        if (leader != now_view.leader) {
          View v = now_view;
          v.leader = leader;
          publish(v);
        }
      }
    }

    // Sleep until the next keep-alive is due (a follower: at most a poll interval, to find a
    // free key quickly), or until the io thread steps down.
    const bool leading = view().leading;
    std::int64_t due = last_ack_sent_ns_ + beat_ns;
    if (!leading) due = std::min(due, boottime_ns() + cfg_.poll_ns);
    else due = std::min(due, last_key_check_ns_ + cfg_.key_check_ns);
    if (!pause(due - boottime_ns())) break;

    View v = view();
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
        resign({}, "stepped down: no keep-alive acknowledged within the leadership lease (fenced)");
        continue;
      }
      // Its own store failed: winning again at once would fail again. Back off, longer after
      // each failed leadership in a row; another lockd may take over meanwhile.
      const std::int64_t now = boottime_ns();
      const unsigned n = now - won_ns_ >= kStepDownBackoffResetNs ? 1 : v.failed_in_a_row + 1;
      jitter_state_ += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = jitter_state_;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      const std::int64_t wait = step_down_backoff_ns(n, z ^ (z >> 31));
      resign({}, "stepped down: the store refused or failed a write, or the takeover failed; no campaign for " +
                     std::to_string(wait / 1'000'000) + " ms (" + std::to_string(n) + " in a row)",
             now + wait, n);
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
        auto w = client_->txn(
            {etcd::Compare::of(election_, etcd::Compare::Target::create_revision, etcd::Compare::Op::equal, v.revision)},
            {etcd::Op::put(cfg_.cluster_key_path, keys)}, {}, boottime_ns() + kNsPerS);
        if (!w.ok()) {
          std::lock_guard lock(mu_);
          keys_dirty_ = true;  // again at the next keep-alive
        }
      }
    }
    if (v.leading && boottime_ns() >= v.serve_until_ns) {
      resign({}, "stepped down: no keep-alive acknowledged within the leadership lease (fenced)");
      continue;
    }
    if (v.leading && boottime_ns() >= last_key_check_ns_ + cfg_.key_check_ns &&
        boottime_ns() < last_ack_sent_ns_ + beat_ns) {
      // Between keep-alives: is the election key still this leadership's? Only the lease's
      // expiry or an operator (etcdctl del) removes it; deleted by hand, another lockd can win
      // at its next poll while this one still answers from memory. Fenced at once instead.
      last_key_check_ns_ = boottime_ns();
      auto key = client_->range(election_, {}, last_key_check_ns_ + kNsPerS);
      if (key.ok() && (key->kvs.empty() || key->kvs.front().create_revision != v.revision)) {
        resign(key->kvs.empty() ? std::string() : key->kvs.front().value,
               "stepped down: the election key is gone or no longer this lockd's (deleted by hand?)");
      }
      continue;
    }
    if (boottime_ns() < last_ack_sent_ns_ + beat_ns) continue;  // a follower's poll: campaign again

    const std::int64_t sent = boottime_ns();
    auto r = keep_alive->refresh(lease_id_, sent + beat_ns);
    if (r.ok()) {
      last_ack_sent_ns_ = sent;
      if (!v.leading) continue;
      // The key must still be ours (only the lease's expiry or an operator removes it).
      auto key = client_->range(election_, {}, sent + beat_ns);
      if (key.ok() && (key->kvs.empty() || key->kvs.front().create_revision != v.revision)) {
        resign(key->kvs.empty() ? std::string() : key->kvs.front().value,
               "stepped down: the election key is no longer this lockd's");
        continue;
      }
      v = view();
      v.serve_until_ns = serve_until_ns(sent, cfg_.lease_s, cfg_.clock_rate_bound, cfg_.margin_ns);
      v.last_error.clear();
      publish(v);
    } else if (r.status().code() == Errc::not_found) {
      // etcd no longer has the lease: the election key went with it.
      lease_id_ = 0;
      resign({}, "the leadership lease expired in etcd");
    } else {
      note("keep-alive", r.status());
      // A broken stream: open another, on the next member (this one may hold its connection
      // and answer nothing), after a short pause.
      if (r.status().code() == Errc::timeout) client_->next_endpoint();
      keep_alive.reset();
      if (!pause(std::min<std::int64_t>(cfg_.poll_ns, 100'000'000))) break;
    }
  }
  // Stopping: a leader hands over at once instead of making the others wait out its lease.
  if (lease_id_ != 0) (void)client_->lease_revoke(lease_id_, boottime_ns() + kNsPerS);
}

}  // namespace leasehold::lockd
