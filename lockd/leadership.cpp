#include "leasehold/lockd/leadership.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"

#include <chrono>

namespace leasehold::lockd {

Result<std::unique_ptr<Leadership>> Leadership::start(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg,
                                                      std::function<void()> wake) {
  if (cfg.election_key.empty()) cfg.election_key = election_key(cfg.shard_prefix);
  if (!cfg.cluster_key_path.empty() && cfg.keys_mismatch == nullptr) cfg.keys_mismatch = &cluster_keys_mismatch;
  if (Status s = validate(cfg); !s.ok()) return s;
  return std::unique_ptr<Leadership>(new Leadership(std::move(client), std::move(cfg), std::move(wake)));
}

Leadership::Leadership(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg, std::function<void()> wake)
    : client_(std::move(client)) {
  const std::uint64_t seed = static_cast<std::uint64_t>(boottime_ns()) ^ std::hash<std::string>{}(cfg.advertise);
  core_ = std::make_unique<LeadershipCore>(
      std::move(cfg), [] { return boottime_ns(); }, seed,
      [this] {
        { std::lock_guard lock(mu_); }  // the waiter checks interrupted() under mu_: no lost wake-up
        cv_.notify_all();
      },
      std::move(wake));
  thread_ = std::thread([this] { run(); });
}

Leadership::~Leadership() {
  core_->stop();
  thread_.join();
}

void Leadership::run() {
  std::unique_ptr<etcd::KeepAlive> keep_alive;
  for (;;) {
    const ElectionCall& c = core_->pending();
    ElectionReply r;
    switch (c.kind) {
      case ElectionCall::Kind::done:
        return;
      case ElectionCall::Kind::wait: {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::nanoseconds(std::max<std::int64_t>(c.until_ns - boottime_ns(), 0)),
                     [&] { return core_->interrupted(); });
        break;
      }
      case ElectionCall::Kind::lease_grant: {
        auto g = client_->lease_grant(c.ttl_s, c.until_ns);
        if (g.ok()) r.lease_id = g->id;
        else r.status = g.status();
        break;
      }
      case ElectionCall::Kind::keep_alive_open: {
        auto ka = client_->keep_alive(c.until_ns);
        if (ka.ok()) keep_alive = std::move(*ka);
        else r.status = ka.status();
        break;
      }
      case ElectionCall::Kind::keep_alive: {
        if (keep_alive == nullptr) {
          r.status = Status(Errc::io_error, "no keep-alive stream");
          break;
        }
        auto ttl = keep_alive->refresh(c.lease_id, c.until_ns);
        if (!ttl.ok()) {
          r.status = ttl.status();
          if (r.status.code() != Errc::not_found) keep_alive.reset();  // broken: the core opens another
        }
        break;
      }
      case ElectionCall::Kind::lease_revoke:
        r.status = client_->lease_revoke(c.lease_id, c.until_ns);
        keep_alive.reset();
        break;
      case ElectionCall::Kind::read_key: {
        auto k = client_->range(c.key, {}, c.until_ns);
        if (!k.ok()) {
          r.status = k.status();
        } else if (!k->kvs.empty()) {
          r.found = true;
          r.value = k->kvs.front().value;
          r.create_revision = k->kvs.front().create_revision;
          r.mod_revision = k->kvs.front().mod_revision;
        }
        break;
      }
      case ElectionCall::Kind::campaign: {
        using etcd::Compare;
        std::vector<Compare> compares{Compare::of(c.key, Compare::Target::create_revision, Compare::Op::equal, 0)};
        std::vector<etcd::Op> ops{etcd::Op::put(c.key, c.value, c.lease_id)};
        for (const ElectionRecord& rec : c.records) {
          compares.push_back(Compare::of(rec.key, Compare::Target::mod_revision, Compare::Op::equal, rec.mod_revision));
          if (!rec.value.empty()) ops.push_back(etcd::Op::put(rec.key, rec.value));
        }
        auto t = client_->txn(compares, ops, {etcd::Op::get(c.key)}, c.until_ns);
        if (!t.ok()) {
          r.status = t.status();
          break;
        }
        r.won = t->succeeded;
        r.revision = t->revision;  // the one put of a won election created the key at this revision
        if (!t->succeeded && !t->ranges.empty() && !t->ranges.front().kvs.empty()) {
          r.found = true;
          r.value = t->ranges.front().kvs.front().value;
          r.create_revision = t->ranges.front().kvs.front().create_revision;
        }
        break;
      }
      case ElectionCall::Kind::write_record: {
        using etcd::Compare;
        auto t = client_->txn({Compare::of(c.key, Compare::Target::create_revision, Compare::Op::equal, c.guard_revision)},
                              {etcd::Op::put(c.records.at(0).key, c.records.at(0).value)}, {}, c.until_ns);
        if (!t.ok()) r.status = t.status();  // not succeeded: no longer the leader, which its key check finds
        break;
      }
      case ElectionCall::Kind::next_endpoint:
        client_->next_endpoint();
        break;
    }
    core_->resume(std::move(r));
  }
}

}  // namespace leasehold::lockd
