#include "leasehold/lockd/shards.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <thread>

namespace leasehold::lockd {
namespace {

constexpr std::int64_t kCallNs = 1'000'000'000;
constexpr std::int64_t kRetryPauseNs = 200'000'000;

std::optional<unsigned> parse_count(std::string_view text) {
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::string shard_count_key(std::string_view prefix) { return std::string(prefix) + "/shards"; }

Status ensure_shard_count(etcd::Client& client, std::string_view prefix, unsigned shards, std::int64_t deadline_ns) {
  const std::string key = shard_count_key(prefix);
  const std::string mine = std::to_string(shards);
  const auto compare = [&](const std::string& stored) -> Status {
    const auto theirs = parse_count(stored);
    if (!theirs) return Status(Errc::corrupt, "etcd key " + key + " holds \"" + stored.substr(0, 64) + "\", not a shard count");
    if (*theirs != shards)
      return Status::invalid("the cluster at " + std::string(prefix) + " has " + std::to_string(*theirs) +
                             " shard(s) (etcd key " + key + "), and this lockd was started with --shards " + mine +
                             ": every lockd of a cluster runs with the cluster's --shards " + std::to_string(*theirs));
    return Status{};
  };
  Status last(Errc::timeout, "no answer from etcd");
  for (;;) {
    const std::int64_t now = boottime_ns();
    if (now >= deadline_ns)
      return Status(Errc::timeout, "cannot read or record the cluster's shard count (etcd key " + key +
                                       "): " + last.message());
    const std::int64_t call_deadline = std::min(deadline_ns, now + kCallNs);
    auto current = client.range(key, {}, call_deadline);
    if (current.ok() && !current->kvs.empty()) return compare(current->kvs.front().value);
    if (current.ok()) {
      // No count recorded: a new cluster, or one made before counts were, which had one shard
      // and keys under shard/0/ only. Keys of any other shard mean a count was recorded and
      // then removed (by hand): no count can be trusted then, not even 1 - a lockd of one shard
      // would serve names that other shards' leaders hold.
      const std::string shard_keys = std::string(prefix) + "/shard/";
      const std::string shard0 = shard_prefix(prefix, 0);
      // Any key of a shard other than 0 (below shard/0/ or above it), then any of shard 0.
      auto any = client.range(shard_keys, shard0, call_deadline, 1);
      if (any.ok() && any->kvs.empty())
        any = client.range(etcd::prefix_end(shard0), etcd::prefix_end(shard_keys), call_deadline, 1);
      // A lockd writes a shard's keys only after the count exists: one that started meanwhile
      // may have recorded it since our read, and then its count is the cluster's.
      const auto recorded_since = [&]() -> std::optional<std::string> {
        auto again = client.range(key, {}, call_deadline);
        if (again.ok() && !again->kvs.empty()) return again->kvs.front().value;
        return std::nullopt;
      };
      if (any.ok() && !any->kvs.empty())
        if (const auto since = recorded_since()) return compare(*since);
      if (any.ok() && !any->kvs.empty())
        return Status::invalid("the cluster at " + std::string(prefix) + " has keys of shards other than 0 (" +
                               any->kvs.front().key + ") but no shard count (etcd key " + key +
                               "): it was removed; put the count the cluster was made with back (etcdctl put " +
                               key + " S) before starting a lockd");
      if (any.ok() && shards != 1) any = client.range(shard0, etcd::prefix_end(shard0), call_deadline, 1);
      if (any.ok() && !any->kvs.empty() && shards != 1)
        if (const auto since = recorded_since()) return compare(*since);
      if (any.ok() && !any->kvs.empty() && shards != 1)
        return Status::invalid("the cluster at " + std::string(prefix) + " has keys of shard 0 (" + any->kvs.front().key +
                               ") but no shard count (etcd key " + key + "): it was made with one shard; this lockd "
                               "was started with --shards " + mine + ", under which its names would belong to other "
                               "leaders");
      if (!any.ok()) current = any.status();
    }
    if (current.ok()) {
      auto r = client.txn({etcd::Compare::of(key, etcd::Compare::Target::create_revision, etcd::Compare::Op::equal, 0)},
                          {etcd::Op::put(key, mine)}, {etcd::Op::get(key)}, call_deadline);
      if (r.ok()) {
        if (r->succeeded) return Status{};
        if (!r->ranges.empty() && !r->ranges.front().kvs.empty()) return compare(r->ranges.front().kvs.front().value);
        continue;  // created and deleted meanwhile: look again
      }
      last = r.status();
    } else {
      last = current.status();
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(kRetryPauseNs, std::max<std::int64_t>(deadline_ns - boottime_ns(), 0))));
  }
}

Result<std::vector<std::string>> ShardLeaders::read_leaders(etcd::Client& client, std::string_view prefix,
                                                            unsigned shards, std::size_t txn_ops_max,
                                                            std::int64_t deadline_ns) {
  std::vector<std::string> out(shards);
  const std::size_t step = std::max<std::size_t>(txn_ops_max, 1);
  for (unsigned first = 0; first < shards; first += static_cast<unsigned>(step)) {
    const unsigned last = static_cast<unsigned>(std::min<std::size_t>(shards, first + step));
    std::vector<etcd::Op> reads;
    for (unsigned s = first; s < last; ++s) reads.push_back(etcd::Op::get(election_key(shard_prefix(prefix, s))));
    // No compare: the success branch always runs; a read-only transaction is a linearizable read.
    auto r = client.txn({}, reads, {}, deadline_ns);
    if (!r.ok()) return r.status();
    if (r->ranges.size() != reads.size())
      return Status(Errc::corrupt, "etcd answered " + std::to_string(r->ranges.size()) + " reads of " +
                                       std::to_string(reads.size()) + " election keys");
    for (unsigned s = first; s < last; ++s) {
      const etcd::Range& range = r->ranges[s - first];
      out[s] = range.kvs.empty() ? std::string() : range.kvs.front().value;
    }
  }
  return out;
}

ShardLeaders::ShardLeaders(std::shared_ptr<etcd::Client> client, std::string prefix, unsigned shards,
                           std::size_t txn_ops_max, std::int64_t poll_ns, std::function<void()> wake)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      shards_(shards),
      txn_ops_max_(txn_ops_max),
      poll_ns_(poll_ns),
      wake_(std::move(wake)),
      leaders_(shards) {
  thread_ = std::thread([this] { run(); });
}

ShardLeaders::~ShardLeaders() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<std::string> ShardLeaders::leaders() const {
  std::lock_guard lock(mu_);
  return leaders_;
}

std::uint64_t ShardLeaders::version() const {
  std::lock_guard lock(mu_);
  return version_;
}

std::string ShardLeaders::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

void ShardLeaders::run() {
  for (;;) {
    const std::int64_t started = boottime_ns();
    auto r = read_leaders(*client_, prefix_, shards_, txn_ops_max_, started + std::max<std::int64_t>(poll_ns_, kCallNs));
    bool changed = false;
    {
      std::lock_guard lock(mu_);
      if (r.ok()) {
        last_error_.clear();
        if (*r != leaders_ || version_ == 0) {
          leaders_ = std::move(*r);
          ++version_;
          changed = true;
        }
      } else {
        // The leaders last read stay: a request is then sent where the leader was, and a wrong
        // hint costs the client one more redirect.
        last_error_ = r.status().message();
      }
    }
    if (changed && wake_) wake_();
    std::unique_lock lock(mu_);
    const std::int64_t next = started + poll_ns_;
    cv_.wait_for(lock, std::chrono::nanoseconds(std::max<std::int64_t>(next - boottime_ns(), 0)), [&] { return stop_; });
    if (stop_) return;
  }
}

}  // namespace leasehold::lockd
