#include "leasehold/lockd/service.hpp"

#include "leasehold/io/clock.hpp"
#include "leasehold/lease/assert.hpp"
#include "leasehold/wire/shard_route.hpp"

#include <algorithm>
#include <optional>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace leasehold::lockd {
namespace {

std::uint32_t ms_left(std::int64_t deadline_ns, std::int64_t now_ns) noexcept {
  if (deadline_ns == kNoExpiry) return wire::kNoExpiryMs;
  if (deadline_ns <= now_ns) return 0;
  const std::int64_t ms = (deadline_ns - now_ns) / kNsPerMs;
  return ms >= static_cast<std::int64_t>(UINT32_MAX) ? UINT32_MAX - 1 : static_cast<std::uint32_t>(ms);
}

/// Every answer that waits for durability is in the receiver's in-flight set, and a store that
/// is slow (not failed) must not make retries look new before their answer exists.
wire::Receiver::Limits receiver_limits(const LockdConfig& c) {
  wire::Receiver::Limits l;
  l.ablate_reflection_bounds = c.ablate_reflection;
  l.ablate_seq_limit = c.ablate_seq_limit;
  l.ablate_seq_jump = c.ablate_seq_jump;
  l.in_flight_max = kDeferredAnswersMax;
  l.in_flight_expiry_ns = 60'000'000'000;
  return l;
}

LeaseConfig lease_config_of(const LockdConfig& c) {
  LeaseConfig l;
  l.default_ttl_ns = static_cast<std::int64_t>(c.ttl_ms) * kNsPerMs;
  l.max_ttl_ns = l.default_ttl_ns;  // a request may ask for less, never more (clamped)
  l.acquiring_ttl_ns = static_cast<std::int64_t>(c.acquiring_ttl_ms) * kNsPerMs;
  l.lock_delay_ns = static_cast<std::int64_t>(c.lock_delay_ms) * kNsPerMs;
  l.mode = c.mode;
  l.worker_liveness_ttl_ns = static_cast<std::int64_t>(c.effective_worker_ttl_ms()) * kNsPerMs;
  l.capacity = static_cast<std::size_t>(c.max_names);
  l.reservation_ttl_ns = static_cast<std::int64_t>(c.effective_reservation_ttl_ms()) * kNsPerMs;
  l.ablate_transfer_guard = c.ablate_transfer_guard;
  return l;
}

// A Free row keeps a pending revoke in columns Free leaves unused: old_epoch = the revoked
// grant's epoch (0: none), worker = the revoked holder's worker (nil: no confirmation).
bool is_plain_free(const StoredName& n) {
  return n.state == LockPhase::free && n.peer.is_nil() && !n.epoch_fresh && n.old_epoch == 0;
}

std::unique_ptr<wire::ClusterKeyring> keyring_of(const std::vector<wire::WireKey>& keys) {
  auto ring = std::make_unique<wire::ClusterKeyring>();
  bool cluster = false;
  for (const wire::WireKey& k : keys) {
    if (Status err = ring->add(k); !err.ok()) throw std::runtime_error(err.message());
    cluster = cluster || k.kind == wire::KeyKind::cluster;
  }
  if (!cluster) throw std::runtime_error("lockd needs a cluster key (--key-file)");
  return ring;
}

/// The one name a request acts on (its text's id, or its name id); nullopt for those that act
/// on several (heartbeats), none (list, stats) or may name one by text or id (show).
std::optional<NameId> name_of(const wire::Body& body) {
  return std::visit(
      [](const auto& b) -> std::optional<NameId> {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, wire::Acquire> || std::is_same_v<T, wire::Wait>) return name_id_of(b.name);
        else if constexpr (std::is_same_v<T, wire::Show>) return std::nullopt;
        else if constexpr (requires { b.name_id; }) return b.name_id;
        else return std::nullopt;
      },
      body);
}

/// What an admin key may send: the operations on the name table that no worker's key may send,
/// and the read-only queries. Nothing that acts for a worker or a sandbox.
bool is_admin_operation(wire::MessageType t) noexcept {
  switch (t) {
    case wire::MessageType::transfer_begin:
    case wire::MessageType::transfer_complete:
    case wire::MessageType::revoke:
    case wire::MessageType::reassign:
    case wire::MessageType::list:
    case wire::MessageType::show:
    case wire::MessageType::stats:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::int64_t restored_expiry_spread_ns(NameId name, std::int64_t ttl_ns) noexcept {
  if (ttl_ns <= 0) return 0;
  // The id is a UUIDv5 (SHA-1 of the name): its low bits are as good as random, and the same
  // name spreads the same way at every takeover.
  constexpr std::uint64_t kSteps = 4096;
  const std::uint64_t step = (name.lo ^ (name.hi >> 7)) % kSteps;
  const std::int64_t range = ttl_ns / kRestoreSpreadDivisor;
  const auto r = static_cast<std::uint64_t>(range);
  return static_cast<std::int64_t>(r / kSteps * step + r % kSteps * step / kSteps);
}

LockService::LockService(const LockdConfig& cfg, const std::vector<wire::WireKey>& keys,
                         const RestoredTable& restored, DatagramPort& net, DurabilityPort& store,
                         std::int64_t now_ns, const ServiceSeeds& seeds)
    : cfg_(cfg),
      net_(net),
      store_(store),
      table_(lease_config_of(cfg)),
      keys_(nullptr),
      receiver_(
          [this, &keys, &cfg]() -> std::unique_ptr<wire::Keyring> {
            auto ring = keyring_of(keys);
            if (cfg.ablate_shared_worker_key) ring->ablate_shared_worker_key();
            keys_ = ring.get();
            return ring;
          }(),
          receiver_limits(cfg)),
      sender_(seeds.instance, seeds.first_seq, keys.front()),
      incarnation_(restored.incarnation),
      now_ns_(now_ns),
      wall_ns_(seeds.wall_ns ? seeds.wall_ns : [] {
        timespec rt{};
        ::clock_gettime(CLOCK_REALTIME, &rt);
        return static_cast<std::int64_t>(rt.tv_sec) * kNsPerS + rt.tv_nsec;
      }) {
  const std::int64_t now = now_ns;
  {
    const StoredTable& stored = restored.stored;
    DurableSnapshot snap;
    snap.epoch_high_water = stored.epoch_high_water;
    std::size_t held = 0, shortened = 0, expired = 0;
    // The restart rule (service.hpp): a lease whose worker was last acknowledged in incarnation a
    // gets the TTL less the sum of lived/j for a < j < this incarnation.
    const std::int64_t base_ttl_ns = cfg.mode == LockMode::preemptible
                                         ? table_.config().worker_liveness_ttl_ns
                                         : table_.config().max_ttl_ns;
    std::map<std::uint64_t, std::int64_t> served_from;  // j -> sum of lived/i for j <= i < incarnation
    {
      std::int64_t sum = 0;
      for (auto it = stored.lived_ns.rbegin(); it != stored.lived_ns.rend(); ++it) {
        if (it->first >= incarnation_) continue;
        sum = std::min<std::int64_t>(sum + std::max<std::int64_t>(it->second, 0), kLeaseTtlNsMax);
        served_from[it->first] = sum;
      }
    }
    auto restore_left_ns = [&](WorkerId w) -> std::int64_t {
      const auto seen = stored.seen.find(w);
      if (seen == stored.seen.end()) return -1;  // no mark (a store from before marks): a full TTL
      const auto after = served_from.upper_bound(seen->second);
      if (after == served_from.end() || after->second <= 0) return -1;
      return std::max<std::int64_t>(0, base_ttl_ns - after->second);
    };
    // The oldest seen mark of a worker holding a lease: the rule sums lived/j only for j above
    // some held lease's worker's mark, and every later grant marks its worker with this
    // incarnation, so the lived marks at or below it are needed by no restart to come.
    std::uint64_t oldest_needed = incarnation_;
    for (const StoredName& n : stored.names) {
      if (n.state != LockPhase::held) continue;
      const auto seen = stored.seen.find(n.worker);
      if (seen != stored.seen.end()) oldest_needed = std::min(oldest_needed, seen->second);
    }
    for (const auto& [j, lived] : stored.lived_ns)
      if (j <= oldest_needed && j < incarnation_) marks_.drop_lived.push_back(j);
    for (const StoredName& n : stored.names) {
      snap.epoch_high_water = std::max(snap.epoch_high_water, n.epoch);
      // Acquiring records are dropped at restart (their epochs stay burned via the high-water
      // mark); plain Free records carry nothing the high-water mark does not.
      if (n.state == LockPhase::acquiring || is_plain_free(n)) continue;
      DurableRecord r;
      r.name = n.id;
      r.name_fingerprint = name_fingerprint_of(n.name);
      r.phase = n.state;
      r.epoch = n.epoch;
      r.owner = n.owner;
      r.to = n.peer;
      r.worker = n.worker;
      r.to_worker = n.peer_worker;
      r.epoch_fresh = n.epoch_fresh;
      if (n.state == LockPhase::held) {
        ++held;
        r.restore_left_ns = restore_left_ns(n.worker);
        if (cfg.mode == LockMode::lease) r.restore_spread_ns = restored_expiry_spread_ns(n.id, base_ttl_ns);
        if (r.restore_left_ns == 0) ++expired;
        else if (r.restore_left_ns > 0) ++shortened;
      }
      if (n.state == LockPhase::free) r.revoked_epoch = n.old_epoch;
      snap.records.push_back(r);
      names_.emplace(n.id, n.name);
    }
    if (const Status err = table_.restore(snap, now); !err.ok())
      throw std::runtime_error("store " + cfg.store_path + ": cannot rebuild the name table: " + err.message());
    char line[512];
    std::snprintf(line, sizeof line,
                  "ts_boot_ns=%" PRId64 " event=restore names=%zu held=%zu epoch_high_water=%" PRIu64
                  " incarnation=%" PRIu64 " held_shortened=%zu held_expired=%zu store=%s\n",
                  now, snap.records.size(), held, table_.epoch_high_water(), incarnation_, shortened, expired,
                  cfg.store_path.c_str());
    log_ += line;
    // Every worker's replay window starts where an earlier incarnation left it (durably).
    for (const auto& [w, floor] : stored.replay_floor) receiver_.raise_floor(w, floor);
    // Pending revokes are pushed again once their worker's heartbeats show its address.
    table_.for_each([&](NameId id, const LockState& s) { push_revoke(id, s, now); });
  }
  next_tick_ns_ = now;
  rate_window_start_ns_ = now;
  started_ns_ = now;
  lived_interval_ns_ = lived_checkpoint_interval_ns(table_.config().max_ttl_ns);
  next_lived_ns_ = now;
}

std::int64_t LockService::wait_ns(std::int64_t now_ns) const noexcept {
  return std::clamp<std::int64_t>(next_tick_ns_ - now_ns, 0, kTickNs);
}

Status LockService::reload_keys(const std::vector<wire::WireKey>& keys, std::int64_t now_ns) {
  if (Status err = keys_->replace(keys); !err.ok()) {
    ++counters_.key_reloads_refused;
    return err;
  }
  ++counters_.key_reloads;
  auto ids = [&](wire::KeyKind k) {
    std::string t;
    for (const std::uint16_t id : keys_->key_ids(k)) t += (t.empty() ? "" : ",") + std::to_string(id);
    return t.empty() ? std::string("none") : t;
  };
  log_ += "ts_boot_ns=" + std::to_string(now_ns) + " event=keys_reloaded cluster_key_ids=" +
          ids(wire::KeyKind::cluster) + " admin_key_ids=" + ids(wire::KeyKind::admin) + "\n";
  return {};
}

bool LockService::overloaded() const noexcept {
  return pending_.size() + kChangesPerRequestMax > kStoreBatchChangesMax ||
         deferred_.size() >= kDeferredAnswersMax;
}

// ---- receive path --------------------------------------------------------------------------

void LockService::on_datagram(std::span<const std::uint8_t> bytes, const SocketAddress& from,
                              std::int64_t now_ns) {
  if (failed_) return;
  // One clock, never backwards (the loop reads it once per turn): deferred answers, the
  // receiver's windows and the table all order by it.
  LEASEHOLD_ASSERT(now_ns >= now_ns_);
  now_ns_ = now_ns;
  const std::int64_t now = now_ns;
  wire::Admission a = receiver_.admit(bytes, &from, now);
  if (a.verdict != wire::Verdict::drop) {
    caller_ = Caller{a.message.header.sender, a.key_id, a.authority};
    // lockd writes to a worker under the key id that worker last used (a rotation: a worker
    // still on the previous key gets pushes it can check).
    if (a.authority == wire::Authority::worker &&
        (worker_key_ids_.size() < cfg_.max_workers || worker_key_ids_.count(caller_.id) != 0))
      worker_key_ids_[caller_.id] = a.key_id;
  }
  if (a.verdict == wire::Verdict::drop && a.reason == wire::DecodeError::replayed)
    caller_ = Caller{a.message.header.sender, a.key_id, a.authority};
  if (cfg_.ablate_replay_heartbeats && a.reason == wire::DecodeError::replayed &&
      (a.message.header.type == wire::MessageType::heartbeat ||
       a.message.header.type == wire::MessageType::worker_heartbeat)) {
    // The ablation: what lockd did before (a replayed heartbeat was executed again, from
    // whatever address it came).
    wire::DecodeResult again = wire::decode_payload(a.message.header, bytes);
    if (!again) return;
    wire::Message m{a.message.header, std::move(again.body)};
    dispatch(m, a.key, from, now);
    return;
  }
  switch (a.verdict) {
    case wire::Verdict::drop:
      // Counted by the receiver (receiver_.stats()); a wrong key is also logged, rate-limited.
      if (a.reason == wire::DecodeError::unknown_key || a.reason == wire::DecodeError::bad_tag)
        log_key_reject(a.reason, bytes, from, now);
      return;
    case wire::Verdict::resend:
      ++counters_.answers_resent;
      if (!net_.send(from, a.cached_answer)) ++counters_.sends_failed;
      return;
    case wire::Verdict::answer_error:
      // Never executed, replayed heartbeats included (a retry carries a fresh seq). Not
      // cached: an error for a request id must not stick to that id.
      send_now(from, a.message.header.request_id, nullptr, wire::error_answer(a));
      return;
    case wire::Verdict::deliver:
      dispatch(a.message, a.key, from, now);
      return;
  }
}

void LockService::log_key_reject(wire::DecodeError reason, std::span<const std::uint8_t> bytes,
                                 const SocketAddress& from, std::int64_t now_ns) {
  if (key_reject_logged_ns_ != 0 && now_ns - key_reject_logged_ns_ < kKeyRejectLogIntervalNs) {
    ++key_rejects_unlogged_;
    return;
  }
  key_reject_logged_ns_ = now_ns;
  const std::optional<wire::KeyRef> ref = wire::key_ref_of(bytes);
  // The notice: only to a request (an answer or push dropped here asked for nothing), and
  // never larger than what caused it (kKeyRejectedBytes < kDatagramBytesMin <= bytes).
  const std::optional<std::uint64_t> rid = wire::request_id_of(std::as_bytes(bytes));
  if (ref && rid && bytes.size() >= wire::kKeyRejectedBytes && wire::is_request(static_cast<wire::MessageType>(bytes[5]))) {
    const auto notice = wire::encode_key_rejected(
        wire::KeyRejected{*rid, ref->key_id,
                          reason == wire::DecodeError::unknown_key ? wire::KeyRejectReason::unknown_key
                                                                   : wire::KeyRejectReason::bad_mac});
    if (net_.send(from, notice)) ++counters_.key_rejected_notices;
    else ++counters_.sends_failed;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "ts_boot_ns=%" PRId64 " event=datagram_rejected reason=%s from=%s sender=%s key_id=%u"
                " unlogged_since_last=%" PRIu64 "\n",
                now_ns, std::string(wire::to_string(reason)).c_str(), from.str().c_str(),
                ref ? ref->sender.str().c_str() : "?", ref ? static_cast<unsigned>(ref->key_id) : 0u,
                key_rejects_unlogged_);
  key_rejects_unlogged_ = 0;
  log_ += line;
}

Refusal LockService::authorize(const Caller& caller, const wire::Message& m) const {
  if (cfg_.ablate_authz) return Refusal::none;
  const wire::MessageType type = m.header.type;
  const bool operator_key = caller.authority == wire::Authority::admin || caller.authority == wire::Authority::root;
  if (cfg_.ablate_admin_as_worker && operator_key) return Refusal::none;
  switch (caller.authority) {
    case wire::Authority::root:
      // The cluster key: it can derive every worker key, so it may speak for any worker - but a
      // kill confirmation is a statement only the holder's own supervisor can make.
      return type == wire::MessageType::kill_confirmed ? Refusal::forbidden : Refusal::none;
    case wire::Authority::admin:
      return is_admin_operation(type) ? Refusal::none : Refusal::forbidden;
    case wire::Authority::worker: break;
    default: return Refusal::forbidden;
  }
  const WorkerId& self = caller.id;
  // A name another worker's sandbox holds (or is handing over) is not this worker's.
  auto others = [&](NameId id) {
    const LockState st = table_.state(id);
    if (cfg_.ablate_acquiring_unbound && st.phase == LockPhase::acquiring) return false;
    return st.known && !st.worker.is_nil() && st.worker != self;
  };
  switch (type) {
    case wire::MessageType::acquire: {
      const auto& a = std::get<wire::Acquire>(m.body);
      return a.worker.is_nil() || a.worker == self ? Refusal::none : Refusal::forbidden;
    }
    case wire::MessageType::wait: {
      const auto& w = std::get<wire::Wait>(m.body);
      return w.worker.is_nil() || w.worker == self ? Refusal::none : Refusal::forbidden;
    }
    case wire::MessageType::commit: {
      // The commit must name this worker, and an Acquiring record bound to another worker
      // (its 2-phase acquire came from that worker) is not this worker's to commit.
      const auto& c = std::get<wire::Commit>(m.body);
      if (c.worker != self) return Refusal::forbidden;
      return !cfg_.ablate_acquiring_unbound && others(c.name_id) ? Refusal::forbidden : Refusal::none;
    }
    case wire::MessageType::release: {  // also the abort of a 2-phase acquire: bound the same way
      const auto& r = std::get<wire::Release>(m.body);
      // Epoch 0 leaves a FIFO of waiters: leave_queue checks that the waiter is this worker's.
      if (r.epoch == 0) return Refusal::none;
      return others(r.name_id) ? Refusal::forbidden : Refusal::none;
    }
    // Admin operations: a worker's key gives no power over names it does not hold, nor to
    // see the whole table.
    case wire::MessageType::transfer_begin:
    case wire::MessageType::transfer_complete:
    case wire::MessageType::transfer_accept:
    case wire::MessageType::revoke:
    case wire::MessageType::reassign:
    case wire::MessageType::list:
      return Refusal::forbidden;
    case wire::MessageType::show: {
      const auto& sh = std::get<wire::Show>(m.body);
      const LockState st = table_.state(sh.name.empty() ? sh.name_id : name_id_of(sh.name));
      return st.known && st.worker == self ? Refusal::none : Refusal::forbidden;
    }
    case wire::MessageType::worker_heartbeat:
      return std::get<wire::WorkerHeartbeat>(m.body).worker == self ? Refusal::none : Refusal::forbidden;
    default:
      return Refusal::none;  // heartbeat: the table refreshes only this worker's leases
  }
}

void LockService::dispatch(wire::Message& m, const wire::RequestKey& key, const SocketAddress& from,
                           std::int64_t now_ns) {
  const auto rid = m.header.request_id;
  const auto type = m.header.type;
  if (cfg_.shards > 1 && wire::is_request(type)) {
    // A cluster of several shards: only the name's shard may answer for it (lease/shard.hpp).
    // Decided on the request alone, before the table is looked at: nothing changes, nothing is
    // cached (the same request, resent to the right leader, must be served there).
    if (const auto rs = wire::shard_of_request(m.body, cfg_.shards)) {
      if (rs->mixed) {
        ++counters_.mixed_shard_refused;
        send_now(from, rid, nullptr,
                 wire::Error{wire::ErrorCode::unsupported,
                             "a heartbeat of names of shards " + std::to_string(rs->shard) + " and " +
                                 std::to_string(rs->other) + " (of " + std::to_string(cfg_.shards) +
                                 "): send one heartbeat per shard, each to its shard's leader"});
        return;
      }
      if (rs->shard != cfg_.shard) {
        ++counters_.not_leader_answers;
        ++counters_.other_shard_answers;
        std::string hint = rs->shard < shard_leaders_.size() ? shard_leaders_[rs->shard] : std::string();
        if (hint == self_address_) hint.clear();  // never names itself: the client would loop here
        send_now(from, rid, nullptr, wire::Error{wire::ErrorCode::not_leader, std::move(hint)});
        return;
      }
    }
  }
  if (not_leader_) {
    // A follower on etcd: nothing here is the table's truth. Not cached: the same request,
    // resent once this lockd leads, must be served.
    if (type == wire::MessageType::stats) {
      send_now(from, rid, nullptr, stats_answer(std::get<wire::Stats>(m.body).first));
    } else if (wire::is_request(type) && type != wire::MessageType::is_running) {
      ++counters_.not_leader_answers;
      send_now(from, rid, nullptr, wire::Error{wire::ErrorCode::not_leader, *not_leader_});
    }
    return;
  }
  // Expiry first: a request that queued behind a stall (lockd paused, descheduled, a slow
  // store) sees the table as of the time it is served, not as of the last tick. Otherwise an
  // acquire of a name whose lease ran out during the stall is refused `expired` although the
  // tick right after it would free the name. advance() only frees what is past its deadline
  // (the same changes the next tick makes, durable before any answer that depends on them),
  // so it cannot revive or shorten a lease; when nothing is due it is one heap-top compare.
  expire(now_ns);
  if (authorize(caller_, m) != Refusal::none) {
    Outcome o;
    o.refusal = Refusal::forbidden;
    o.name = name_of(m.body).value_or(NameId{});
    if (!wire::is_request(type)) {  // an answer (RunningAnswer, RevokedAck): nothing to answer
      (void)deny(o);  // counted
      return;
    }
    // The name's state is not told: a worker's key must not learn another worker's holders.
    // Not cached: the same request id from the rightful key must still be served.
    send_now(from, rid, nullptr, deny(o));
    return;
  }
  // A worker's acquire or commit before its first heartbeat (the first grant after lockd
  // starts) names where a revocation push can reach it: until now a revoke right after that
  // grant waited for the next heartbeat to learn the address, and the supervisor acted on its
  // `lost` answer, not on the push. Only a first address: heartbeats keep naming the current one
  // (a CLI acquiring with the worker's key does not move an address already known).
  if (caller_.authority == wire::Authority::worker && !cfg_.ablate_first_push_address &&
      (type == wire::MessageType::acquire || type == wire::MessageType::wait || type == wire::MessageType::commit) &&
      worker_addresses_.count(caller_.id) == 0 && worker_addresses_.size() < cfg_.max_workers)
    worker_addresses_[caller_.id] = from;
  // Heartbeats: the hot path, answered at once and not cached (they are idempotent, and
  // caching them would push the answers of ownership changes out of the response cache).
  if (type == wire::MessageType::heartbeat) {
    on_heartbeat(std::get<wire::Heartbeat>(m.body), m.header.sender, from, rid, now_ns);
    return;
  }
  if (type == wire::MessageType::worker_heartbeat) {
    const auto& w = std::get<wire::WorkerHeartbeat>(m.body);
    if (cfg_.mode != LockMode::preemptible) {
      // Acking it would let a preemptible supervisor believe its names are kept by worker
      // liveness while they expire here by TTL: two holders of one name.
      ++counters_.unexpected_messages;
      send_now(from, rid, nullptr,
               wire::Error{wire::ErrorCode::unsupported,
                           "lockd runs in lease mode: worker heartbeats are for --mode preemptible; run the "
                           "supervisor with --mode lease, or lockd with --mode preemptible"});
      return;
    }
    if (table_.worker_heartbeat(w.worker, now_ns) != Refusal::none) {
      send_now(from, rid, &key, wire::Error{wire::ErrorCode::overloaded, "worker table is full"});
      return;
    }
    if (worker_addresses_.size() < cfg_.max_workers || worker_addresses_.count(w.worker) != 0)
      worker_addresses_[w.worker] = from;
    // Liveness is the lease in this mode: its first acknowledgement here waits for the mark.
    answer_after(note_seen(w.worker), from, rid, worker_ack(w, now_ns));
    return;
  }
  if (type == wire::MessageType::running_answer) {
    // Only the asked worker's answer counts: another worker's key cannot preempt its names.
    const auto q = questions_.find(rid);
    if (q != questions_.end() && caller_.authority != wire::Authority::root && q->second.worker != caller_.id) {
      ++counters_.forbidden;
      ++counters_.refusals[static_cast<std::size_t>(Refusal::forbidden)];
      return;
    }
    on_running_answer(std::get<wire::RunningAnswer>(m.body), rid, now_ns);
    // "Not running" preempted the name: its first waiter may have it now. ("Running" changes
    // nothing; serving the FIFO then would only ask again at once, an IsRunning per round trip.)
    if (!queues_.empty() && !std::get<wire::RunningAnswer>(m.body).running)
      serve_queue(std::get<wire::RunningAnswer>(m.body).name_id, now_ns);
    return;
  }
  if (type == wire::MessageType::revoked_ack) {
    // Only the revoked worker's answer stops the push: another worker's key cannot silence it.
    const auto p = push_ids_.find(rid);
    const auto push = p != push_ids_.end() ? pushes_.find(p->second) : pushes_.end();
    if (push != pushes_.end() && caller_.authority != wire::Authority::root && push->second.worker != caller_.id) {
      ++counters_.forbidden;
      ++counters_.refusals[static_cast<std::size_t>(Refusal::forbidden)];
      return;
    }
    on_revoked_ack(std::get<wire::RevokedAck>(m.body), rid);
    return;
  }
  if (!wire::is_request(type) || type == wire::MessageType::is_running) {
    ++counters_.unexpected_messages;
    if (type == wire::MessageType::is_running)
      send_now(from, rid, &key, wire::Error{wire::ErrorCode::unsupported, "lockd runs no sandboxes"});
    return;
  }
  const bool mutating = type != wire::MessageType::list && type != wire::MessageType::show &&
                        type != wire::MessageType::stats;
  if (mutating ? overloaded() : deferred_.size() >= kDeferredAnswersMax) {
    ++counters_.overloaded;
    // Not cached: a retry after the overload must be executed.
    send_now(from, rid, nullptr,
             wire::Error{wire::ErrorCode::overloaded, "lockd is waiting for its store; retry with backoff"});
    return;
  }
  wire::Body answer;
  switch (type) {
    case wire::MessageType::acquire: answer = on_acquire(std::get<wire::Acquire>(m.body), now_ns); break;
    case wire::MessageType::wait: answer = on_wait(std::get<wire::Wait>(m.body), from, rid, now_ns); break;
    case wire::MessageType::commit: answer = on_commit(std::get<wire::Commit>(m.body), now_ns); break;
    case wire::MessageType::release:
      // The worker it speaks for: its own key's, or the one the root key names (as for a
      // kill confirmation); none for any other key.
      answer = on_release(std::get<wire::Release>(m.body),
                          caller_.authority == wire::Authority::worker ? caller_.id
                          : caller_.authority == wire::Authority::root ? m.header.sender
                                                                       : WorkerId{},
                          now_ns);
      break;
    case wire::MessageType::transfer_begin:
      answer = on_transfer_begin(std::get<wire::TransferBegin>(m.body), now_ns);
      break;
    case wire::MessageType::transfer_complete:
      answer = on_transfer_complete(std::get<wire::TransferComplete>(m.body), now_ns);
      break;
    case wire::MessageType::transfer_accept:
      answer = on_transfer_accept(std::get<wire::TransferAccept>(m.body), now_ns);
      break;
    case wire::MessageType::revoke: answer = on_revoke(std::get<wire::Revoke>(m.body), now_ns); break;
    case wire::MessageType::reassign: answer = on_reassign(std::get<wire::Reassign>(m.body), now_ns); break;
    case wire::MessageType::kill_confirmed:
      // The worker whose derived key signed it (authorize() refuses every other key; the
      // ablation lets an admin key speak for the worker its header names).
      answer = on_kill_confirmed(std::get<wire::KillConfirmed>(m.body),
                                 caller_.authority == wire::Authority::worker ? caller_.id : m.header.sender, now_ns);
      break;
    case wire::MessageType::list: answer = on_list(std::get<wire::List>(m.body), now_ns); break;
    case wire::MessageType::show: answer = on_show(std::get<wire::Show>(m.body), now_ns); break;
    case wire::MessageType::stats: answer = stats_answer(std::get<wire::Stats>(m.body).first); break;
    default:
      answer = wire::Error{wire::ErrorCode::unsupported, "lockd does not serve this request type"};
      break;
  }
  answer_gated(from, rid, key, std::move(answer));
  // A change to a name others wait for (a release, a revoke's confirmation, an abort) may let
  // the first of them have it now; its grant is a change of its own, durable before it is sent.
  if (!queues_.empty() && mutating) {
    if (const auto name = name_of(m.body)) serve_queue(*name, now_ns);
  }
}

// ---- answers -------------------------------------------------------------------------------

bool LockService::seal_for(const Caller& to, std::uint64_t request_id, const wire::Body& unsigned_body,
                           wire::Datagram& out) {
  const wire::Authenticator* auth = keys_->find(to.id, to.key_id).auth;
  if (auth == nullptr) {
    ++counters_.answers_unsigned;
    return false;
  }
  // A Grant whose token sign_deferred() did not reach (answered at once, or pushed) is signed now.
  std::optional<wire::Body> signed_copy;
  if (const auto* g = std::get_if<wire::Grant>(&unsigned_body); g != nullptr && !g->token.empty()) {
    signed_copy = unsigned_body;
    if (!sign_grant(*signed_copy)) signed_copy.reset();
  }
  const wire::Body& body = signed_copy ? *signed_copy : unsigned_body;
  if (sender_.seal_with(*auth, to.key_id, request_id, body, out)) return true;
  ++counters_.encode_failed;
  const wire::Error e{wire::ErrorCode::internal, "answer could not be encoded"};
  return static_cast<bool>(sender_.seal_with(*auth, to.key_id, request_id, e, out));
}

void LockService::send_now(const SocketAddress& to, std::uint64_t request_id,
                           const wire::RequestKey* key, const wire::Body& body) {
  wire::Datagram dg;
  if (!seal_for(caller_, request_id, body, dg)) return;
  // Cached before the send: if the send is lost, the client's retry gets these bytes.
  if (key != nullptr) receiver_.remember_answer(*key, dg.view(), to);
  if (!net_.send(to, dg.view())) ++counters_.sends_failed;
}

void LockService::send_to_worker(const WorkerId& worker, const SocketAddress& to, std::uint64_t request_id,
                                 const wire::Body& body) {
  Caller w{worker, 0, wire::Authority::worker};
  if (const auto it = worker_key_ids_.find(worker);
      it != worker_key_ids_.end() && keys_->find(worker, it->second).auth != nullptr) {
    w.key_id = it->second;
  } else if (keys_->for_worker(worker, &w.key_id) == nullptr) {
    ++counters_.answers_unsigned;
    return;
  }
  wire::Datagram dg;
  if (!seal_for(w, request_id, body, dg)) return;
  if (!net_.send(to, dg.view())) ++counters_.sends_failed;
}

void LockService::answer_gated(const SocketAddress& to, std::uint64_t request_id,
                               const wire::RequestKey& key, wire::Body body) {
#if LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE
  // Simulator ablation: answer at once, before the change the answer reports is durable.
  send_now(to, request_id, &key, body);
  return;
#endif
  if (depend_seq_ <= durable_seq_ && deferred_.empty()) {
    send_now(to, request_id, &key, body);
    return;
  }
  ++counters_.answers_deferred;
  // Until its answer is remembered (send_now), the receiver drops retries of this request
  // (wire::Receiver in-flight set): that answer will go out.
  receiver_.defer(key, now_ns_);
  deferred_.push_back(Deferred{depend_seq_, to, caller_, request_id, key, std::move(body)});
  ++deferred_unsigned_;
}

wire::Body LockService::deny(const Outcome& o) {
  ++counters_.refusals[static_cast<std::size_t>(o.refusal) % counters_.refusals.size()];
  wire::Deny d;
  d.name_id = o.name;
  d.refusal = o.refusal;
  if (o.refusal == Refusal::forbidden) {
    // The name is not the caller's: its state is not told (authorize(), or the table's worker
    // checks of a held, bound or reserved name).
    ++counters_.forbidden;
    return d;
  }
  d.holder = o.state.owner;
  d.worker = o.state.worker;
  d.epoch = o.state.epoch;
  d.state = o.state.phase;
  return d;
}

wire::Body LockService::grant(const Outcome& o, std::int64_t now_ns) {
  wire::Grant g;
  g.name_id = o.name;
  g.epoch = o.token.epoch;
  g.holder = o.token.holder;
  g.worker = o.state.worker;
  g.state = o.state.phase;
  g.ttl_ms = o.state.phase == LockPhase::acquiring ? ms_left(o.state.deadline_ns, now_ns)
                                                   : ms_left(o.state.expiry_ns, now_ns);
  if (signer_ != nullptr) {
    token::GrantToken t;
    t.name = o.name;
    t.epoch = o.token.epoch;
    t.holder = o.token.holder;
    t.worker = o.state.worker;
    t.issued_at_ns = wall_ns_();  // informational: nothing is timed by it
    t.key_id = signer_->key_id();
    t.signature.fill(0);  // signed later (sign_grant): after the batch went to the store
    const token::TokenBytes b = token::encode(t);
    g.token.assign(b.begin(), b.end());
  }
  return g;
}

bool LockService::sign_grant(wire::Body& body) {
  auto* g = std::get_if<wire::Grant>(&body);
  if (g == nullptr || g->token.empty() || signer_ == nullptr) return false;
  auto t = token::decode(std::span<const std::uint8_t>(g->token.data(), g->token.size()));
  if (!t.ok()) return false;
  token::GrantToken tok = std::move(t).value();
  if (std::any_of(tok.signature.begin(), tok.signature.end(), [](std::uint8_t x) { return x != 0; }))
    return false;  // signed already
  if (signer_->sign(tok)) {
    const token::TokenBytes b = token::encode(tok);
    g->token.assign(b.begin(), b.end());
    ++counters_.tokens_signed;
  } else {
    g->token.clear();
    ++counters_.token_sign_failures;
  }
  return true;
}

void LockService::sign_deferred() {
  const std::size_t n = std::min(deferred_unsigned_, deferred_.size());
  for (std::size_t i = deferred_.size() - n; i < deferred_.size(); ++i) sign_grant(deferred_[i].body);
  deferred_unsigned_ = 0;
}

const std::string& LockService::text_of(NameId id) const {
  static const std::string none;
  const auto it = names_.find(id);
  return it == names_.end() ? none : it->second;
}

wire::NameRecord LockService::record_of(NameId id, const LockState& s, std::int64_t now_ns) const {
  wire::NameRecord r;
  r.name = text_of(id);
  if (r.name.empty()) r.name = id.str();  // UUID text is a valid name
  r.name_id = id;
  r.state = s.phase;
  r.holder = s.owner;
  r.worker = s.worker;
  r.epoch = s.epoch;
  switch (s.phase) {
    case LockPhase::held: r.ttl_left_ms = ms_left(s.expiry_ns, now_ns); break;
    case LockPhase::acquiring: r.ttl_left_ms = ms_left(s.deadline_ns, now_ns); break;
    case LockPhase::free:
    case LockPhase::transferring: r.ttl_left_ms = ms_left(s.lock_delay_until_ns, now_ns); break;
  }
  r.reserved_for = s.phase == LockPhase::transferring ? s.to : s.reserved_for;
  r.revoke_pending = s.revoke_pending;
  r.revoked_epoch = s.revoked_epoch;
  if (s.revoke_pending) r.worker = s.revoked_worker;
  if (const auto it = revoke_ended_.find(id); it != revoke_ended_.end() && it->second.first == s.epoch)
    r.revoke_ended = it->second.second;
  if (!s.reserved_for.is_nil())
    r.reservation_left_ms = s.reservation_until_ns != 0 ? std::max<std::uint32_t>(1, ms_left(s.reservation_until_ns, now_ns))
                                                        : wire::kNoExpiryMs;
  return r;
}

// ---- ownership changes ---------------------------------------------------------------------

void LockService::record_change(NameId id, const LockState& s, const char* event, std::int64_t now_ns,
                                const char* extra) {
  if (s.phase == LockPhase::held) note_seen(s.worker);  // in the same batch as the grant
  StoredName n;
  n.id = id;
  n.name = text_of(id);
  if (n.name.empty()) n.name = id.str();
  n.state = s.phase;
  n.epoch = s.epoch;
  n.old_epoch = s.old_epoch;
  n.owner = s.owner;
  n.peer = s.phase == LockPhase::transferring ? s.to : s.reserved_for;
  n.worker = s.worker;
  n.peer_worker = s.reserved_worker;
  n.epoch_fresh = s.epoch_fresh;
  if (s.phase == LockPhase::free && s.revoke_pending) {  // see is_plain_free
    n.old_epoch = s.revoked_epoch != 0 ? s.revoked_epoch : s.epoch - 1;
    n.worker = s.revoked_worker;
  }
  if (s.phase == LockPhase::transferring && s.revoke_pending) n.worker = s.revoked_worker;  // the guard's
  if (s.phase == LockPhase::held && s.expiry_ns != kNoExpiry && s.expiry_ns > now_ns)
    n.ttl_ns = static_cast<std::uint64_t>(s.expiry_ns - now_ns);
  pending_.push_back(std::move(n));
  depend_seq_ = ++change_seq_;

  char line[512];
  const int len = std::snprintf(
      line, sizeof line,
      "ts_boot_ns=%" PRId64 " event=%s name=%s epoch=%" PRIu64 " state=%s holder=%s worker=%s%s%s%s\n",
      now_ns, event, pending_.back().name.c_str(), s.epoch, std::string(to_string(s.phase)).c_str(),
      s.owner.str().c_str(), s.worker.str().c_str(),
      s.phase == LockPhase::transferring || !s.reserved_for.is_nil() ? " to=" : "",
      s.phase == LockPhase::transferring ? s.to.str().c_str()
                                         : (!s.reserved_for.is_nil() ? s.reserved_for.str().c_str() : ""),
      extra != nullptr ? extra : "");
  if (len > 0)
    log_pending_.emplace_back(change_seq_,
                              std::string(line, std::min<std::size_t>(static_cast<std::size_t>(len), sizeof line - 1)));
}

wire::Body LockService::on_acquire(const wire::Acquire& a, std::int64_t now_ns) {
  const NameId id = name_id_of(a.name);
  // Waiters first: a name that became grantable since the last event goes to the first of
  // them, never to an acquire that did not wait.
  if (!queues_.empty()) serve_queue(id, now_ns);
  const LockState before = table_.state(id);
  std::int64_t ttl_ns = static_cast<std::int64_t>(a.ttl_ms) * kNsPerMs;
  ttl_ns = std::min(ttl_ns, table_.config().max_ttl_ns);  // clamped; the Grant says what was given
  auto run = [&] {
    // A worker's 2-phase acquire is bound to that worker (named, or else the sender).
    const WorkerId bound = !a.worker.is_nil() || caller_.authority != wire::Authority::worker ? a.worker : caller_.id;
    return a.two_phase ? table_.acquire_2pc(a.name, a.sandbox, now_ns, bound)
                       : table_.acquire(a.name, a.sandbox, a.worker, now_ns, ttl_ns);
  };
  Outcome o = run();
  if (!o.ok() && o.refusal == Refusal::held && cfg_.mode == LockMode::preemptible &&
      try_preempt(id, o.state, now_ns))
    o = run();
  if (!o.ok()) return deny(o);
  if (!(before == o.state)) {
    names_.emplace(id, a.name);
    ++counters_.grants;
    record_change(id, o.state, a.two_phase ? "acquire_2pc" : "grant", now_ns);
  }
  return grant(o, now_ns);
}

// ---- waiters (DESIGN.md "Waiters") ----------------------------------------------------------

namespace {
/// Refusals of a 2-phase acquire that only say "not now": the name is someone else's, being
/// handed over, or in a lock-delay. A Wait meeting one joins the FIFO; a waiter meeting one
/// keeps its place.
bool waits_for(Refusal r) noexcept {
  switch (r) {
    case Refusal::held:
    case Refusal::acquiring:
    case Refusal::transferring:
    case Refusal::reserved:
    case Refusal::lock_delay:
    case Refusal::expired:
      return true;
    default:
      return false;
  }
}
}  // namespace

wire::Queued LockService::queued_answer(NameId name, std::size_t position, const WaitQueue& q,
                                        std::int64_t now_ns) const {
  const LockState st = table_.state(name);
  wire::Queued a;
  a.name_id = name;
  a.position = static_cast<std::uint32_t>(position);
  a.waiters = static_cast<std::uint32_t>(q.waiters.size());
  a.holder = st.owner;
  a.worker = st.worker;
  a.epoch = st.epoch;
  a.state = st.phase;
  a.ttl_ms = ms_left(q.waiters[position - 1].lapse_ns, now_ns);
  return a;
}

wire::Body LockService::on_wait(const wire::Wait& w, const SocketAddress& from, std::uint64_t request_id,
                                std::int64_t now_ns) {
  const NameId id = name_id_of(w.name);
  // As a 2-phase Acquire: bound to the worker named, else to the sender's.
  const WorkerId bound = !w.worker.is_nil() || caller_.authority != wire::Authority::worker ? w.worker : caller_.id;
  Outcome refused;
  refused.name = id;
  if (w.sandbox.is_nil() || bound.is_nil()) {  // a grant must be bound to the worker it runs on
    refused.refusal = Refusal::bad_request;
    refused.state = table_.state(id);
    return deny(refused);
  }
  const std::int64_t ttl_ns = w.ttl_ms == 0 ? static_cast<std::int64_t>(cfg_.ttl_ms) * kNsPerMs
                                            : std::min(static_cast<std::int64_t>(w.ttl_ms) * kNsPerMs,
                                                       table_.config().max_ttl_ns);
  serve_queue(id, now_ns);  // a name grantable since the last event goes to the first waiter
  auto q = queues_.find(id);
  if (q != queues_.end()) {
    auto& ws = q->second.waiters;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].sandbox != w.sandbox) continue;
      if (ws[i].worker != bound) {  // a sandbox id is no secret: its worker is the check
        refused.refusal = Refusal::forbidden;
        return deny(refused);
      }
      if (ws[i].lapse_ns <= now_ns) {
        // Its place lapsed (dropped when it reaches the head): it joins at the back again,
        // as a waiter that left would, not where it stood.
        forget_waiter(ws[i]);
        ws.erase(ws.begin() + static_cast<std::ptrdiff_t>(i));
        ++counters_.waiters_lapsed;
        break;
      }
      ws[i].lapse_ns = now_ns + ttl_ns;
      ws[i].from = from;
      ws[i].request_id = request_id;
      ws[i].caller = caller_;
      return queued_answer(id, i + 1, q->second, now_ns);
    }
  }
  // Not waiting. With nobody ahead (or granted from the FIFO already: the 2-phase acquire is
  // idempotent for it), try the name; with waiters ahead, join behind them.
  const LockState before = table_.state(id);
  const bool granted_to_it = before.phase == LockPhase::acquiring && before.owner == w.sandbox;
  if (q == queues_.end() || granted_to_it) {
    const Outcome o = table_.acquire_2pc(w.name, w.sandbox, now_ns, bound);
    if (o.ok()) {
      if (!(before == o.state)) {
        names_.emplace(id, w.name);
        ++counters_.grants;
        record_change(id, o.state, "acquire_2pc", now_ns);
      }
      return grant(o, now_ns);
    }
    // Its own grant is no reason to wait (a late duplicate of a Wait it was granted by).
    if (!waits_for(o.refusal) || o.state.owner == w.sandbox) return deny(o);
  }
  // Lapsed places count until they reach the head: drop them before refusing.
  if (q != queues_.end() && q->second.waiters.size() >= kWaitersPerNameMax) drop_lapsed(q->second, now_ns);
  std::size_t in_queue = q == queues_.end() ? 0 : q->second.waiters.size();
  auto mine = waiters_of_.find(bound);
  std::size_t of_worker = mine == waiters_of_.end() ? 0 : mine->second;
  if (of_worker >= kWaitersPerWorkerMax || waiters_ >= kWaitersMax) {
    // Lapsed places behind live ones stay until they reach their head: a bound counts only
    // live places, so they are dropped everywhere before a refusal.
    drop_lapsed_waiters(now_ns);
    q = queues_.find(id);
    in_queue = q == queues_.end() ? 0 : q->second.waiters.size();
    mine = waiters_of_.find(bound);
    of_worker = mine == waiters_of_.end() ? 0 : mine->second;
  }
  if (in_queue >= kWaitersPerNameMax || of_worker >= kWaitersPerWorkerMax || waiters_ >= kWaitersMax) {
    ++counters_.waits_refused_full;
    return wire::Error{wire::ErrorCode::overloaded,
                       in_queue >= kWaitersPerNameMax
                           ? "the queue for " + w.name + " is full (" + std::to_string(kWaitersPerNameMax) + " waiters)"
                       : of_worker >= kWaitersPerWorkerMax
                           ? "worker " + bound.str() + " has " + std::to_string(kWaitersPerWorkerMax) + " waiters, its bound"
                           : "lockd holds " + std::to_string(kWaitersMax) + " waiters, its bound"};
  }
  if (q == queues_.end()) q = queues_.emplace(id, WaitQueue{w.name, {}, 0}).first;
  q->second.waiters.push_back(Waiter{w.sandbox, bound, caller_, from, request_id, now_ns + ttl_ns});
  ++waiters_;
  ++waiters_of_[bound];
  ++counters_.waits_queued;
  serve_queue(id, now_ns);  // arms its wake-up (a first waiter behind a lock-delay)
  q = queues_.find(id);
  if (q == queues_.end()) {
    // serve_queue took it off at once (preemptible mode: it preempted a holder on a lapsed
    // worker and granted the name to this waiter): answered as a Wait of a sandbox granted from
    // the FIFO is, by the idempotent 2-phase acquire.
    const LockState was = table_.state(id);
    const Outcome o = table_.acquire_2pc(w.name, w.sandbox, now_ns, bound);
    if (!o.ok()) return deny(o);
    if (!(was == o.state)) record_change(id, o.state, "acquire_2pc", now_ns);
    return grant(o, now_ns);
  }
  return queued_answer(id, q->second.waiters.size(), q->second, now_ns);
}

wire::Body LockService::leave_queue(const wire::Release& r, WorkerId worker, std::int64_t now_ns) {
  Outcome o;
  o.name = r.name_id;
  o.state = table_.state(r.name_id);
  if (worker.is_nil() || r.sandbox.is_nil()) {
    o.refusal = Refusal::bad_request;
    return deny(o);
  }
  if (auto q = queues_.find(r.name_id); q != queues_.end()) {
    auto& ws = q->second.waiters;
    const auto it = std::find_if(ws.begin(), ws.end(), [&](const Waiter& x) { return x.sandbox == r.sandbox; });
    if (it != ws.end()) {
      if (it->worker != worker) {
        o.refusal = Refusal::forbidden;
        return deny(o);
      }
      forget_waiter(*it);
      ws.erase(it);
      ++counters_.waiters_left;
      if (ws.empty()) queues_.erase(q);
      return wire::Ok{r.name_id, o.state.epoch};
    }
  }
  // Granted from the FIFO and not committed: the grant goes back (its epoch stays burned), only
  // by its own worker.
  if (o.state.phase == LockPhase::acquiring && o.state.owner == r.sandbox && o.state.worker != worker) {
    o.refusal = Refusal::forbidden;
    return deny(o);
  }
  if (o.state.phase == LockPhase::acquiring && o.state.owner == r.sandbox) {
    const LockState before = o.state;
    const Outcome back = table_.release(r.name_id, r.sandbox, before.epoch, now_ns);
    if (!back.ok()) return deny(back);
    record_change(r.name_id, back.state, "release", now_ns);
    ++counters_.waiters_left;
    return wire::Ok{r.name_id, back.state.epoch};
  }
  return wire::Ok{r.name_id, o.state.epoch};  // not waiting (any more): nothing to leave
}

void LockService::drop_lapsed(WaitQueue& q, std::int64_t now_ns) {
  const std::size_t was = q.waiters.size();
  std::erase_if(q.waiters, [&](const Waiter& x) {
    if (x.lapse_ns > now_ns) return false;
    forget_waiter(x);
    return true;
  });
  counters_.waiters_lapsed += was - q.waiters.size();
}

void LockService::drop_lapsed_waiters(std::int64_t now_ns) {
  for (auto it = queues_.begin(); it != queues_.end();) {
    drop_lapsed(it->second, now_ns);
    it = it->second.waiters.empty() ? queues_.erase(it) : std::next(it);
  }
}

void LockService::forget_waiter(const Waiter& w) {
  --waiters_;
  if (const auto it = waiters_of_.find(w.worker); it != waiters_of_.end() && --it->second == 0) waiters_of_.erase(it);
}

void LockService::serve_queue(NameId name, std::int64_t now_ns) {
  const auto q = queues_.find(name);
  if (q == queues_.end()) return;
  auto& ws = q->second.waiters;
  while (!ws.empty()) {
    Waiter& head = ws.front();
    if (head.lapse_ns <= now_ns) {  // its worker stopped asking: gone, never granted
      ++counters_.waiters_lapsed;
      forget_waiter(head);
      ws.pop_front();
      continue;
    }
    const LockState before = table_.state(name);
    Outcome o = table_.acquire_2pc(q->second.name, head.sandbox, now_ns, head.worker);
    // Preemptible mode: a holder on a lapsed worker is preempted, a live one asked, as for an
    // acquire (names there do not expire).
    if (!o.ok() && o.refusal == Refusal::held && cfg_.mode == LockMode::preemptible && try_preempt(name, o.state, now_ns))
      o = table_.acquire_2pc(q->second.name, head.sandbox, now_ns, head.worker);
    if (!o.ok()) {
      if (waits_for(o.refusal) && o.state.owner != head.sandbox) break;  // not yet
      ++counters_.waiters_refused;  // this waiter cannot have it (its sandbox holds it elsewhere, ...)
      forget_waiter(head);
      ws.pop_front();
      continue;
    }
    if (!(before == o.state)) {
      names_.emplace(name, q->second.name);
      ++counters_.grants;
      ++counters_.waiters_granted;
      record_change(name, o.state, "grant_waiter", now_ns);
    }
    // Once durable, as the answer to its latest Wait; a lost one is answered again by its next
    // Wait (the 2-phase acquire is idempotent for it).
#if LEASEHOLD_SIM_ABLATE_WAITER_GRANT_BEFORE_DURABLE
    // Simulator ablation: the waiter's grant goes out before the change that made it is durable.
    answer_as_after(head.caller, 0, head.from, head.request_id, grant(o, now_ns));
#else
    answer_as_after(head.caller, depend_seq_, head.from, head.request_id, grant(o, now_ns));
#endif
    forget_waiter(head);
    ws.pop_front();
    break;
  }
  if (ws.empty()) {
    queues_.erase(q);
    return;
  }
  // When to look again without an event: the head's place lapsing, or a lock-delay (an
  // expiry's, or a revoke's bound) ending, which the table does not report.
  const LockState st = table_.state(name);
  std::int64_t wake = ws.front().lapse_ns;
  if (st.lock_delay_until_ns > now_ns) wake = std::min(wake, st.lock_delay_until_ns);
  if (q->second.wake_ns <= now_ns || wake < q->second.wake_ns) {
    q->second.wake_ns = wake;
    queue_wakes_.emplace(wake, name);
  }
}

void LockService::serve_due_queues(std::int64_t now_ns) {
  while (!queue_wakes_.empty() && queue_wakes_.top().first <= now_ns &&
         pending_.size() + kChangesPerRequestMax <= kStoreBatchChangesMax) {
    const auto [at, name] = queue_wakes_.top();
    queue_wakes_.pop();
    const auto q = queues_.find(name);
    if (q == queues_.end() || q->second.wake_ns != at) continue;  // stale
    q->second.wake_ns = 0;
    serve_queue(name, now_ns);
  }
}

wire::Body LockService::on_commit(const wire::Commit& c, std::int64_t now_ns) {
  const LockState before = table_.state(c.name_id);
  const Outcome o = table_.commit(c.name_id, c.sandbox, c.epoch, c.worker, now_ns);
  if (!o.ok()) return deny(o);
  if (!(before == o.state)) {
    ++counters_.grants;
    record_change(c.name_id, o.state, "commit", now_ns);
  }
  return grant(o, now_ns);
}

void LockService::on_heartbeat(const wire::Heartbeat& h, WorkerId worker, const SocketAddress& from,
                               std::uint64_t request_id, std::int64_t now_ns) {
  std::array<RefreshEntry, wire::kHeartbeatEntriesMax> entries;
  std::array<RefreshAnswer, wire::kHeartbeatEntriesMax> answers;
  const std::size_t n = h.entries.size();
  for (std::size_t i = 0; i < n; ++i)
    entries[i] = RefreshEntry{h.entries[i].name_id, h.entries[i].sandbox, h.entries[i].epoch};
  std::int64_t ttl_ns = table_.config().default_ttl_ns;
  if (h.ttl_cap_ms != 0) ttl_ns = std::min(ttl_ns, static_cast<std::int64_t>(h.ttl_cap_ms) * kNsPerMs);
  ++counters_.heartbeats;
  const Refusal r = table_.refresh(worker, std::span(entries.data(), n), now_ns,
                                   std::span(answers.data(), n), ttl_ns);
  if (r != Refusal::none) {
    ++counters_.refusals[static_cast<std::size_t>(r) % counters_.refusals.size()];
    send_now(from, request_id, nullptr,
             wire::Error{wire::ErrorCode::unsupported, "heartbeat refused: " + std::string(to_string(r))});
    return;
  }
  // Both modes: a revocation is pushed to the address the worker's heartbeats come from.
  if (worker_addresses_.size() < cfg_.max_workers || worker_addresses_.count(worker) != 0)
    worker_addresses_[worker] = from;
  wire::HeartbeatAck ack;
  for (std::size_t i = 0; i < n; ++i) {
    if (entries[i].epoch == 0) {  // no grant has epoch 0: a waiter's place, renewed
      ack.entries.push_back(renew_waiter(entries[i].name, entries[i].sandbox, worker, from, ttl_ns, now_ns));
      continue;
    }
    wire::HeartbeatAckEntry e;
    e.name_id = entries[i].name;
    e.status = answers[i].status;
    e.holder = answers[i].holder;
    e.epoch = answers[i].epoch;
    switch (answers[i].status) {
      case RefreshStatus::refreshed:
        ++counters_.refresh_refreshed;
        e.ttl_left_ms = ms_left(answers[i].expiry_ns, now_ns);
        break;
      case RefreshStatus::lost: {
        ++counters_.refresh_lost;
        // A refresh of a name another worker holds (or is bound to) is not this worker's to
        // ask for: counted as forbidden as well (the answer stays `lost`, so a sandbox of this
        // worker that believed it held the name is killed).
        const LockState st = table_.state(entries[i].name);
        if (st.known && !st.worker.is_nil() && st.worker != worker) ++counters_.forbidden;
        break;
      }
      case RefreshStatus::unknown: ++counters_.refresh_unknown; break;
      case RefreshStatus::queued: break;  // the table never answers it
    }
    ack.entries.push_back(e);
  }
  counters_.refresh_entries += n;
  const bool acknowledges = std::any_of(answers.begin(), answers.begin() + static_cast<std::ptrdiff_t>(n),
                                        [](const RefreshAnswer& a) { return a.status == RefreshStatus::refreshed; });
  answer_after(acknowledges ? note_seen(worker) : 0, from, request_id, ack);
}

wire::HeartbeatAckEntry LockService::renew_waiter(NameId name, const SandboxId& sandbox, WorkerId worker,
                                                  const SocketAddress& from, std::int64_t ttl_ns,
                                                  std::int64_t now_ns) {
  ++counters_.waiter_renewals;
  const LockState st = table_.state(name);
  wire::HeartbeatAckEntry e{name, RefreshStatus::lost, st.owner, st.epoch, 0};
  const auto q = queues_.find(name);
  if (q == queues_.end()) return e;
  for (Waiter& w : q->second.waiters) {
    if (w.sandbox != sandbox) continue;
    // Only the worker it will run on keeps its place, and only while the place is live: a
    // lapsed place is never granted (serve_queue drops it), so it is not revived either.
    if (w.worker != worker || w.lapse_ns <= now_ns) return e;
    w.lapse_ns = now_ns + ttl_ns;
    w.from = from;
    e.status = RefreshStatus::queued;
    e.ttl_left_ms = ms_left(w.lapse_ns, now_ns);
    return e;
  }
  return e;
}

std::uint64_t LockService::note_seen(WorkerId worker) {
  if (worker.is_nil()) return 0;
  if (const auto it = seen_seq_.find(worker); it != seen_seq_.end()) return it->second;
  marks_.seen.push_back(worker);
  depend_seq_ = ++change_seq_;
  seen_seq_[worker] = depend_seq_;
  return depend_seq_;
}

void LockService::answer_after(std::uint64_t seq, const SocketAddress& to, std::uint64_t request_id,
                               wire::Body body) {
  answer_as_after(caller_, seq, to, request_id, std::move(body));
}

void LockService::answer_as_after(const Caller& as, std::uint64_t seq, const SocketAddress& to,
                                  std::uint64_t request_id, wire::Body body) {
  if (seq <= durable_seq_) {
    const Caller serving = caller_;
    caller_ = as;
    send_now(to, request_id, nullptr, body);
    caller_ = serving;
    return;
  }
  ++counters_.answers_deferred;
  Deferred d;
  d.seq = seq;
  d.to = to;
  d.caller = as;
  d.request_id = request_id;
  d.body = std::move(body);
  d.cache = false;
  deferred_.push_back(std::move(d));
  ++deferred_unsigned_;
}

wire::WorkerAck LockService::worker_ack(const wire::WorkerHeartbeat& w, std::int64_t now_ns) {
  wire::WorkerAck ack;
  ack.liveness_ttl_ms = static_cast<std::uint32_t>(cfg_.effective_worker_ttl_ms());
  // The names the worker believes it holds: a refresh in preemptible mode only confirms (a Held
  // record has no TTL there) and answers lost / unknown for every name that is not held by that
  // sandbox at that epoch on this worker any more. Those are listed; the supervisor kills them.
  std::array<RefreshEntry, wire::kWorkerBeatEntriesMax> entries;
  std::array<RefreshAnswer, wire::kWorkerBeatEntriesMax> answers;
  const std::size_t n = w.held.size();
  for (std::size_t i = 0; i < n; ++i) entries[i] = RefreshEntry{w.held[i].name_id, w.held[i].sandbox, w.held[i].epoch};
  if (n == 0 || table_.refresh(w.worker, std::span(entries.data(), n), now_ns, std::span(answers.data(), n)) !=
                    Refusal::none)
    return ack;
  counters_.worker_beat_names += n;
  for (std::size_t i = 0; i < n; ++i) {
    if (answers[i].status == RefreshStatus::refreshed) continue;
    ++counters_.worker_beat_not_held;
    ack.not_held.push_back(wire::HeartbeatAckEntry{entries[i].name, answers[i].status,
                                                   answers[i].holder, answers[i].epoch, 0});
  }
  return ack;
}

wire::Body LockService::on_release(const wire::Release& r, WorkerId worker, std::int64_t now_ns) {
  if (r.epoch == 0) return leave_queue(r, worker, now_ns);
  const LockState before = table_.state(r.name_id);
  const Outcome o = table_.release(r.name_id, r.sandbox, r.epoch, now_ns);
  if (!o.ok() && before.revoke_pending && !worker.is_nil() && before.revoked_worker == worker &&
      before.revoked_epoch == r.epoch) {
    // The supervisor releases a grant only after its sandbox died (pidfd exit, empty leaf):
    // from the revoked grant's own worker this is a kill confirmation (its KillConfirmed may
    // be lost, or its kill-switch fired before it learnt of the revoke).
    return on_kill_confirmed(wire::KillConfirmed{r.name_id, r.sandbox, r.epoch}, worker, now_ns);
  }
  if (!o.ok()) return deny(o);
  if (!(before == o.state)) record_change(r.name_id, o.state, "release", now_ns);
  return wire::Ok{r.name_id, o.state.epoch};
}

wire::Body LockService::on_transfer_begin(const wire::TransferBegin& t, std::int64_t now_ns) {
  const LockState before = table_.state(t.name_id);
  if (t.to_worker.is_nil()) {  // the reservation must name the worker that may take it
    Outcome o;
    o.refusal = Refusal::bad_request;
    o.name = t.name_id;
    o.state = before;
    return deny(o);
  }
  const Outcome o = table_.begin_transfer(t.name_id, t.from, t.epoch, t.to, now_ns,
                                          cfg_.ablate_reservation_unbound ? WorkerId{} : t.to_worker);
  if (!o.ok()) return deny(o);
  if (!(before == o.state)) record_change(t.name_id, o.state, "transfer_begin", now_ns);
  // As for a revoke: the outgoing holder's worker is told at once (its heartbeats are answered
  // `lost` too), so the kill, and the confirmation that lets the transfer complete, are prompt.
  note_revoke_end(t.name_id, o.state.epoch, wire::RevokeEnd::none);
  push_revoke(t.name_id, o.state, now_ns);
  return wire::TransferState{t.name_id, o.state.owner, o.state.to, o.state.old_epoch, o.state.epoch,
                             LockPhase::transferring};
}

wire::Body LockService::on_transfer_complete(const wire::TransferComplete& t, std::int64_t now_ns) {
  const LockState before = table_.state(t.name_id);
  // The wire message names the transfer by its new epoch; `from` is the record's.
  const SandboxId from = before.phase == LockPhase::transferring ? before.owner : SandboxId{};
  const Outcome o = table_.complete_release(t.name_id, from, t.new_epoch, now_ns);
  if (!o.ok()) return deny(o);  // lock_delay: the guard is pending; `show` gives its bound
  if (before.phase == LockPhase::transferring && before.revoke_pending) {
    // Its bound passed before `advance` lifted it.
    ++counters_.revoke_ended_lease_expired;
    note_revoke_end(t.name_id, o.state.epoch, wire::RevokeEnd::lease_expired);
  }
  if (!(before == o.state)) record_change(t.name_id, o.state, "transfer_complete", now_ns);
  return wire::TransferState{t.name_id, from, o.state.reserved_for, t.new_epoch == 0 ? 0 : t.new_epoch - 1,
                             o.state.epoch, o.state.phase};
}

wire::Body LockService::on_transfer_accept(const wire::TransferAccept& t, std::int64_t now_ns) {
  const LockState before = table_.state(t.name_id);
  const std::string& text = text_of(t.name_id);
  if (text.empty()) {
    Outcome o;
    o.refusal = Refusal::unknown_name;
    o.name = t.name_id;
    o.state = before;
    return deny(o);
  }
  Outcome o;
  if (cfg_.mode == LockMode::preemptible) {
    // Preemptible mode has no 1-phase acquire: reserve and commit in one step (the worker
    // is in the request, so the name is attached to it at once).
    o = table_.acquire_2pc(text, t.to, now_ns, t.worker);
    if (o.ok()) o = table_.commit(t.name_id, t.to, o.token.epoch, t.worker, now_ns);
  } else {
    o = table_.acquire(text, t.to, t.worker, now_ns);
  }
  if (!o.ok()) return deny(o);
  if (!(before == o.state)) {
    ++counters_.grants;
    record_change(t.name_id, o.state, "transfer_accept", now_ns);
  }
  return grant(o, now_ns);
}

wire::Body LockService::on_revoke(const wire::Revoke& r, std::int64_t now_ns) {
  const Outcome o = table_.revoke(r.name_id, now_ns, r.expected_epoch, r.force);
  if (!o.ok()) return deny(o);
  ++counters_.revokes;
  char extra[96] = "";
  if (o.state.revoke_pending)
    std::snprintf(extra, sizeof extra, " revoke_pending=1 revoked_epoch=%" PRIu64 " bound_ms=%u",
                  o.state.revoked_epoch, ms_left(o.state.lock_delay_until_ns, now_ns));
  record_change(r.name_id, o.state, "revoke", now_ns, extra);
  // Not pending: the old grant's lease had already run out (or there was no grant).
  note_revoke_end(r.name_id, o.state.epoch,
                  o.state.revoke_pending ? wire::RevokeEnd::none : wire::RevokeEnd::lease_expired);
  push_revoke(r.name_id, o.state, now_ns);
  return wire::Ok{r.name_id, o.state.epoch};
}

// ---- revoke: push to the holder's worker, kill confirmation ---------------------------------

void LockService::push_revoke(NameId id, const LockState& s, std::int64_t now_ns) {
  if (!s.revoke_pending || s.revoked_worker.is_nil()) return;
  if (pushes_.size() >= kRevokePushesMax) return;  // its heartbeat answer (`lost`) still tells it
  auto it = pushes_.find(id);
  if (it != pushes_.end()) push_ids_.erase(it->second.request_id);
  const std::uint64_t rid = next_request_id_++;
  pushes_[id] = Push{s.revoked_worker, s.revoked_epoch, s.epoch, rid, now_ns};
  push_ids_[rid] = id;
  send_pushes(now_ns);
}

void LockService::send_pushes(std::int64_t now_ns) {
  next_push_ns_ = kNoExpiry;
  for (auto it = pushes_.begin(); it != pushes_.end();) {
    Push& p = it->second;
    const LockState s = table_.state(it->first);
    if (!s.revoke_pending || s.revoked_epoch != p.epoch || s.revoked_worker != p.worker) {
      push_ids_.erase(p.request_id);  // lifted, its bound passed, or a newer revoke: stop
      it = pushes_.erase(it);
      continue;
    }
    if (p.next_send_ns <= now_ns) {
      const auto addr = worker_addresses_.find(p.worker);
      if (addr != worker_addresses_.end()) {  // else: at the first heartbeat that shows it
        ++counters_.revoke_pushes_sent;
        // Sealed with that worker's own key: only it can read it as from lockd.
        send_to_worker(p.worker, addr->second, p.request_id, wire::Revoked{it->first, p.epoch, p.new_epoch});
        p.next_send_ns = now_ns + kRevokePushRetryNs;
      }
    }
    next_push_ns_ = std::min(next_push_ns_, p.next_send_ns);  // still due: no address yet
    ++it;
  }
}

void LockService::note_revoke_end(NameId id, Epoch epoch, wire::RevokeEnd how) {
  if (revoke_ended_.size() >= kRevokePushesMax && !revoke_ended_.contains(id)) revoke_ended_.clear();
  revoke_ended_[id] = {epoch, how};
}

void LockService::on_revoked_ack(const wire::RevokedAck& a, std::uint64_t request_id) {
  const auto id = push_ids_.find(request_id);
  if (id == push_ids_.end()) {
    ++counters_.unexpected_messages;  // late, or a duplicate answer to a retry
    return;
  }
  const auto it = pushes_.find(id->second);
  if (it != pushes_.end() && a.name_id == it->first && a.epoch == it->second.epoch) {
    ++counters_.revoke_pushes_acked;
    pushes_.erase(it);
    push_ids_.erase(id);
  }
}

wire::Body LockService::on_kill_confirmed(const wire::KillConfirmed& k, WorkerId worker,
                                          std::int64_t now_ns) {
  const LockState before = table_.state(k.name_id);
  const Outcome o = table_.confirm_kill(k.name_id, worker, k.epoch, now_ns);
  if (!o.ok()) {
    ++counters_.kill_confirms_refused;
    return deny(o);
  }
  if (before.revoke_pending && !o.state.revoke_pending) {
    ++counters_.revoke_ended_kill_confirmed;
    note_revoke_end(k.name_id, before.epoch, wire::RevokeEnd::kill_confirmed);
    char extra[160];
    std::snprintf(extra, sizeof extra, " reason=kill_confirmed revoked_epoch=%" PRIu64 " sandbox=%s", k.epoch,
                  k.sandbox.str().c_str());
    LockState s = o.state;
    if (!s.known) {
      s = LockState{};
      s.epoch = before.epoch;
    }
    record_change(k.name_id, s, "revoke_lifted", now_ns, extra);
  }
  return wire::Ok{k.name_id, o.state.epoch};
}

wire::Body LockService::on_reassign(const wire::Reassign& r, std::int64_t now_ns) {
  const std::string text = text_of(r.name_id);
  if (text.empty()) {
    Outcome o;
    o.refusal = Refusal::unknown_name;
    o.name = r.name_id;
    o.state = table_.state(r.name_id);
    return deny(o);
  }
  if (r.worker.is_nil()) {  // the reservation must name the worker that may take it
    Outcome o;
    o.refusal = Refusal::bad_request;
    o.name = r.name_id;
    o.state = table_.state(r.name_id);
    return deny(o);
  }
  const Outcome o = table_.reassign(text, r.to, now_ns, cfg_.ablate_reservation_unbound ? WorkerId{} : r.worker);
  if (!o.ok()) return deny(o);
  record_change(r.name_id, o.state, "reassign", now_ns);
  return wire::Ok{r.name_id, o.state.epoch};
}

// ---- preemptible mode ----------------------------------------------------------------------

bool LockService::try_preempt(NameId id, const LockState& s, std::int64_t now_ns) {
  if (s.phase != LockPhase::held) return false;
#if LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER
  // Simulator ablation, bug class "liveness ignored": a live worker's name is preempted at once,
  // as if that worker had answered "not running", without asking it; its sandbox runs on (two
  // holders).
  constexpr bool ablated = true;
#else
  constexpr bool ablated = false;
#endif
  if (!ablated && table_.worker_alive(s.worker, now_ns)) {
    ask_is_running(id, s, now_ns);
    return false;
  }
  const Outcome o = table_.preempt(id, s.owner, s.epoch, ablated, now_ns);
  if (!o.ok()) return false;
  ++counters_.preemptions;
  record_change(id, o.state, "preempt", now_ns, " reason=worker_lapsed");
  return true;
}

void LockService::ask_is_running(NameId id, const LockState& s, std::int64_t now_ns) {
  if (asked_.count(id) != 0 || questions_.size() >= kIsRunningOutstandingMax) return;
  const auto it = worker_addresses_.find(s.worker);
  if (it == worker_addresses_.end()) return;  // never heard from it: only lapse frees the name
  const std::uint64_t rid = next_request_id_++;
  questions_.emplace(rid, Question{id, s.owner, s.epoch, now_ns + kIsRunningTimeoutNs, s.worker});
  next_question_ns_ = std::min(next_question_ns_, now_ns + kIsRunningTimeoutNs);
  asked_.insert(id);
  ++counters_.is_running_sent;
  send_to_worker(s.worker, it->second, rid, wire::IsRunning{id, s.owner, s.epoch});
}

void LockService::on_running_answer(const wire::RunningAnswer& a, std::uint64_t request_id,
                                    std::int64_t now_ns) {
  const auto it = questions_.find(request_id);
  if (it == questions_.end()) {
    ++counters_.unexpected_messages;
    return;
  }
  const Question q = it->second;
  questions_.erase(it);
  asked_.erase(q.name);
  ++counters_.is_running_answers;
  if (a.running || a.name_id != q.name || a.sandbox != q.sandbox || a.epoch != q.epoch) return;
  if (overloaded()) return;  // the acquirer's retry asks again
  // The table re-checks that the holder and epoch are still the ones asked about.
  const Outcome o = table_.preempt(q.name, q.sandbox, q.epoch, true, now_ns);
  if (!o.ok()) return;
  ++counters_.preemptions;
  record_change(q.name, o.state, "preempt", now_ns, " reason=not_running");
}

// ---- queries ---------------------------------------------------------------------------------

wire::Body LockService::on_list(const wire::List& l, std::int64_t now_ns) const {
  // Paged in NameId order by the id's high half (uniform: SHA-1 derived): cursor = first hi
  // to list. A page is a lower_bound in names_ and a walk of at most a page of known records
  // plus the dropped ones not yet pruned.
  const std::size_t want = l.limit == 0 ? wire::kListEntriesMax
                                        : std::min<std::size_t>(l.limit, wire::kListEntriesMax);
  wire::ListPage page;
  page.with_waiters = l.waiters;
  auto it = names_.lower_bound(NameId{l.cursor, 0});
  for (; it != names_.end() && page.entries.size() < want; ++it) {
    const LockState s = table_.state(it->first);
    if (!s.known) continue;
    page.entries.push_back(record_of(it->first, s, now_ns));
    if (l.waiters) page.entries.back().waiters = waiters_for(it->first);
    if (wire::payload_bytes(page) > wire::kPayloadBytesMax) {
      page.entries.pop_back();
      break;
    }
  }
  if (it != names_.end() && !page.entries.empty()) {
    const std::uint64_t last_hi = page.entries.back().name_id.hi;
    page.next_cursor = last_hi == UINT64_MAX ? 0 : last_hi + 1;
  }
  return page;
}

wire::Body LockService::on_show(const wire::Show& s, std::int64_t now_ns) const {
  const NameId id = s.name.empty() ? s.name_id : name_id_of(s.name);
  const LockState st = table_.state(id);
  if (!st.known) {
    wire::Deny d;
    d.name_id = id;
    d.refusal = Refusal::unknown_name;
    d.epoch = st.epoch;
    return d;
  }
  wire::NameInfo info{record_of(id, st, now_ns), false, 0, {}};
  if (!s.waiters_from) return info;
  // The FIFO in order, from the index asked for, while it fits one datagram.
  info.with_waiters = true;
  info.waiters_from = *s.waiters_from;
  info.record.waiters = waiters_for(id);
  // Who waits is told to the cluster's and the operators' keys; a worker key (Show of a name
  // of its own) learns how many, not which sandboxes of which workers.
  if (caller_.authority == wire::Authority::worker) return info;
  if (const auto q = queues_.find(id); q != queues_.end()) {
    const auto& ws = q->second.waiters;
    for (std::size_t i = *s.waiters_from; i < ws.size(); ++i) {
      info.waiters.push_back(wire::WaiterRecord{ws[i].sandbox, ws[i].worker, ms_left(ws[i].lapse_ns, now_ns)});
      if (wire::payload_bytes(info) > wire::kPayloadBytesMax) {
        info.waiters.pop_back();
        break;
      }
    }
  }
  return info;
}

std::uint32_t LockService::waiters_for(NameId name) const {
  const auto q = queues_.find(name);
  return q == queues_.end() ? 0 : static_cast<std::uint32_t>(q->second.waiters.size());
}

void LockService::metric_samples(std::vector<metrics::Sample>& out) const {
  using metrics::Kind;
  auto counter = [&](std::string_view name, std::uint64_t v, std::string_view help) {
    out.push_back(metrics::Sample{name, Kind::counter, v, {}, help});
  };
  auto gauge = [&](std::string_view name, std::uint64_t v, std::string_view help) {
    out.push_back(metrics::Sample{name, Kind::gauge, v, {}, help});
  };
  const StoreStats st = store_.stats();
  const wire::DecodeStats& rs = receiver_.stats();
  // Configuration first (always within the datagram): a supervisor checks it at start-up.
  {
    // The version first of all: "0.1.0" as 0, 1, 0 (a part that is not a number: 0).
    std::uint64_t part[3] = {0, 0, 0};
    std::size_t k = 0;
    for (const char ch : cfg_.version) {
      if (ch == '.') {
        if (++k == 3) break;
      } else if (ch >= '0' && ch <= '9') {
        part[k] = part[k] * 10 + static_cast<std::uint64_t>(ch - '0');
      } else {
        break;
      }
    }
    gauge("version_major", part[0], "lockd's version, major part");
    gauge("version_minor", part[1], "lockd's version, minor part");
    gauge("version_patch", part[2], "lockd's version, patch part");
    gauge("wire_version", wire::kVersion, "the wire protocol version lockd speaks");
  }
  gauge("mode_preemptible", cfg_.mode == LockMode::preemptible ? 1 : 0, "1 when lockd runs --mode preemptible, 0 in lease mode");
  gauge("ttl_ms", cfg_.ttl_ms, "the lease TTL (--ttl-ms)");
  gauge("names", table_.size(), "names in the table (held, acquiring, transferring, reserved, revoked)");
  gauge("held", table_.held(), "names held now");
  gauge("epoch_high_water", table_.epoch_high_water(), "the highest epoch ever granted");
  gauge("incarnation", incarnation_, "the store's open count (1: a fresh store)");
  if (uses_etcd(cfg_)) {  // a cluster's (the answer is full: a standalone lockd's stays as it was)
    gauge("leading", not_leader_ ? 0 : 1, "1 while this lockd leads its shard and serves, 0 as a follower");
    gauge("failover_bound_ms", failover_bound_ms(cfg_), "the longest a failover to another lockd takes");
    counter("not_leader_answers", counters_.not_leader_answers, "requests answered not_leader");
    gauge("takeover_loading", loading_ ? 1 : 0, "1 while a won election loads the table");
    if (cfg_.shards > 1) {  // one shard's cluster answers as before (a client reads no "shards" as 1)
      gauge("shard", cfg_.shard, "the shard this lockd serves");
      gauge("shards", cfg_.shards, "the cluster's shard count");
      counter("other_shard_answers", counters_.other_shard_answers, "requests for a name of another shard");
      counter("mixed_shard_refused", counters_.mixed_shard_refused, "heartbeats refused: names of several shards");
    }
  }
  counter("log_lines_dropped", log_lines_dropped_, "log lines dropped: stderr was not read");
  gauge("refreshes_per_s", counters_.refreshes_per_s, "lease refreshes per second over the last 10 s, rounded up");
  counter("refresh_entries", counters_.refresh_entries, "heartbeat entries (one per name refreshed or asked)");
  counter("refresh_lost", counters_.refresh_lost, "heartbeat entries answered lost");
  counter("refresh_unknown", counters_.refresh_unknown, "heartbeat entries answered unknown");
  counter("grants", counters_.grants, "names granted");
  counter("expiries", counters_.expiries, "leases and 2-phase acquires expired");
  counter("preemptions", counters_.preemptions, "names preempted (preemptible mode)");
  counter("store_commits", st.commits, "store transactions committed");
  counter("store_changes", st.changes, "ownership changes committed");
  gauge("store_commit_us_p50", st.commit_ns_p50 / 1000, "median commit time over the last commits (us)");
  gauge("store_commit_us_p99", st.commit_ns_p99 / 1000, "99th percentile commit time over the last commits (us)");
  gauge("store_batch_changes_max", st.batch_changes_max, "the largest batch of changes in one commit");
  gauge("store_batch_changes_mean", st.commits == 0 ? 0 : st.changes / st.commits, "changes per commit, on average");
  gauge("store_log_rows", st.log_rows, "change-log rows not yet compacted");
  counter("store_compactions", st.compactions, "change-log compactions");
  gauge("store_compact_ms_max", st.compact_ns_max / 1'000'000, "the longest compaction (ms)");
  counter("overloaded", counters_.overloaded, "requests answered overloaded (the store is behind)");
  counter("answers_deferred", counters_.answers_deferred, "answers that waited for their change to be durable");
  counter("retries_while_pending", rs.in_flight_retries, "retries of a request whose answer was not durable yet");
  counter("decode_accepted", rs.accepted, "datagrams accepted");
  counter("answers_resent", rs.resent, "cached answers resent to a retry");
  counter("is_running_sent", counters_.is_running_sent, "IsRunning questions sent (preemptible mode)");
  counter("worker_beat_names", counters_.worker_beat_names, "names carried by worker heartbeats");
  counter("worker_beat_not_held", counters_.worker_beat_not_held, "of those, answered no longer yours");
  counter("revokes", counters_.revokes, "revokes applied");
  counter("revoke_pushes_sent", counters_.revoke_pushes_sent, "Revoked datagrams sent (with retries)");
  counter("revoke_pushes_acked", counters_.revoke_pushes_acked, "Revoked datagrams answered by the worker");
  counter("revoke_ended_kill_confirmed", counters_.revoke_ended_kill_confirmed,
          "pending revokes and transfer guards lifted by the worker's kill confirmation");
  counter("revoke_ended_lease_expired", counters_.revoke_ended_lease_expired, "pending revokes whose bound passed");
  counter("kill_confirms_refused", counters_.kill_confirms_refused, "kill confirmations from another worker or epoch");
  counter("reservations_lapsed", counters_.reservations_lapsed, "transfer reservations that lapsed");
  counter("key_rejected_notices", counters_.key_rejected_notices,
          "key-rejected notices sent to the source of a request under a wrong key (rate-limited)");
  counter("unexpected_messages", counters_.unexpected_messages, "answers nobody asked for, IsRunning sent to lockd");
  counter("forbidden", counters_.forbidden, "requests refused: the key gives no power over them");
  counter("resends_refused_source", rs.resends_refused_source, "retries from another address than the request's");
  counter("resends_refused_rate", rs.resends_refused_rate, "retries past the resend bound");
  counter("error_answers_suppressed", rs.error_answers_suppressed, "error answers not sent (rate bound)");
  counter("error_answers_refused_source", rs.error_answers_refused_source, "error answers not sent (another address)");
  gauge("derived_keys", keys_->derived(), "worker keys derived so far");
  gauge("cluster_keys", keys_->key_ids(wire::KeyKind::cluster).size(), "cluster keys loaded");
  gauge("admin_keys", keys_->key_ids(wire::KeyKind::admin).size(), "admin keys loaded");
  counter("key_reloads", counters_.key_reloads, "key sets loaded on SIGHUP");
  counter("key_reloads_refused", counters_.key_reloads_refused, "key sets refused on SIGHUP (the old ones stay)");
  // Refusal and rejection reasons, one family each (the datagram keeps only those that occurred).
  for (const Refusal r : kRefusals) {
    if (r == Refusal::none) continue;
    out.push_back(metrics::Sample{"refusal", Kind::counter, counters_.refusals[static_cast<std::size_t>(r)],
                                  to_string(r), "requests refused (Deny), by reason", true});
  }
  for (std::size_t r = 1; r < wire::kDecodeErrorCount; ++r)
    out.push_back(metrics::Sample{"reject", Kind::counter, rs.rejected[r], wire::to_string(static_cast<wire::DecodeError>(r)),
                                  "datagrams rejected by the receiver, by reason", true});
  const DatagramPortStats ls = net_.stats();
  counter("kernel_drops", ls.kernel_drops, "datagrams lost on a full receive queue");
  out.push_back(metrics::Sample{"reject", Kind::counter, ls.truncated, "oversized_datagram",
                                "datagrams rejected by the receiver, by reason", true});  // larger than a buffer
  counter("sends_failed", counters_.sends_failed + ls.send_errors, "sends that failed");
  counter("tokens_signed", counters_.tokens_signed, "grant answers carrying a signed token");
  out.push_back(metrics::Sample{"token_sign_failures", Kind::counter, counters_.token_sign_failures, {},
                                "grants answered without a token: OpenSSL failed", true});
  // Past what one datagram holds: /metrics has them, the Stats answer when room is left.
  counter("heartbeats", counters_.heartbeats, "heartbeat datagrams");
  counter("refresh_refreshed", counters_.refresh_refreshed, "heartbeat entries answered refreshed");
  counter("is_running_answers", counters_.is_running_answers, "IsRunning answers received");
  counter("encode_failed", counters_.encode_failed, "answers that could not be encoded");
  counter("answers_unsigned", counters_.answers_unsigned, "answers dropped: no key to sign them with");
  gauge("store_commit_us_max", st.commit_ns_max / 1000, "the longest commit over the last commits (us)");
  gauge("waiters", waiters_, "sandboxes waiting in a FIFO of waiters (Wait)");
  gauge("waited_names", queues_.size(), "names with at least one waiter");
  counter("waits_queued", counters_.waits_queued, "Waits that joined a FIFO of waiters");
  counter("waiters_granted", counters_.waiters_granted, "waiters granted the name from a FIFO");
  counter("waiters_lapsed", counters_.waiters_lapsed, "waiters dropped: no Wait re-sent within their TTL");
  counter("waiters_left", counters_.waiters_left, "waiters that left their FIFO (Release with epoch 0)");
  counter("waiter_renewals", counters_.waiter_renewals, "heartbeat entries renewing a waiter's place (epoch 0)");
  counter("waiters_refused", counters_.waiters_refused, "waiters passed over: the table refused them the name");
  counter("waits_refused_full", counters_.waits_refused_full, "Waits refused: a FIFO or all of them full");
}

wire::StatsAnswer LockService::stats_answer(std::optional<std::uint16_t> first) const {
  std::vector<metrics::Sample> all;
  metric_samples(all);
  wire::StatsAnswer a;
  if (first) {
    // A page: the exported list (sparse zeros left out) from index `first`, in a row, so the
    // next page starts where this one stopped.
    std::size_t index = 0;
    for (const metrics::Sample& m : all) {
      if (m.sparse && m.value == 0) continue;
      if (index++ < *first) continue;
      if (a.counters.size() >= wire::kCountersMax) break;
      std::string key(m.name);
      if (!m.reason.empty()) key += "_" + std::string(m.reason);
      a.counters.push_back(wire::Counter{std::move(key), m.value});
      if (wire::payload_bytes(a) > wire::kPayloadBytesMax) {
        a.counters.pop_back();
        break;
      }
    }
    return a;
  }
  // In the list's order, while it fits one datagram (a key that does not fit is passed over, a
  // shorter one after it may still); a sparse series only when it is not zero.
  for (const metrics::Sample& m : all) {
    if (m.sparse && m.value == 0) continue;
    if (a.counters.size() >= wire::kCountersMax) break;
    std::string key(m.name);
    if (!m.reason.empty()) key += "_" + std::string(m.reason);
    a.counters.push_back(wire::Counter{std::move(key), m.value});
    if (wire::payload_bytes(a) > wire::kPayloadBytesMax) a.counters.pop_back();
  }
  return a;
}

bool LockService::serving(std::string* why) const {
  std::string text;
  if (failed_) text = "the store failed: " + failure_;
  else if (loading_) text = "taking over: loading the table";
  else if (not_leader_) text = not_leader_->empty() ? "not leading (no leader known)" : "not leading (the leader is " + *not_leader_ + ")";
  if (why != nullptr) *why = text.empty() ? "serving" : text;
  return text.empty();
}

// ---- the turn of the loop ------------------------------------------------------------------

void LockService::expire(std::int64_t now_ns) {
  // Late expiry is safe (the supervisor kills before lockd expires); so past the batch bound
  // the rest waits for the next tick.
  // Each expiry may be followed by a grant to the name's first waiter.
  while (pending_.size() + 2 * kExpiriesPerTickMax <= kStoreBatchChangesMax) {
    expired_.clear();
    const std::size_t n = table_.advance(now_ns, expired_, kExpiriesPerTickMax);
    for (const Expiry& e : expired_) {
      const char* event = "expire";
      const char* extra = nullptr;
      switch (e.kind) {
        case ExpiryKind::lease: ++counters_.expiries; break;
        case ExpiryKind::acquiring: ++counters_.expiries; event = "acquiring_timeout"; break;
        case ExpiryKind::revoke_bound:
          ++counters_.revoke_ended_lease_expired;
          note_revoke_end(e.name, e.epoch, wire::RevokeEnd::lease_expired);
          event = "revoke_lifted";
          extra = " reason=lease_expired";
          break;
        case ExpiryKind::reservation:
          ++counters_.reservations_lapsed;
          event = "reservation_lapsed";
          break;
      }
      LockState s = table_.state(e.name);
      if (!s.known) {  // dropped as plain Free: durable form is Free at the name's own epoch
        s = LockState{};
        s.epoch = e.epoch;
      }
      record_change(e.name, s, event, now_ns, extra);
      if (!s.known) names_.erase(e.name);
      if (!queues_.empty()) serve_queue(e.name, now_ns);
    }
    if (n < kExpiriesPerTickMax) break;
  }
}

void LockService::housekeeping(std::int64_t now_ns) {
  send_pushes(now_ns);
  serve_due_queues(now_ns);
  next_question_ns_ = kNoExpiry;
  for (auto it = questions_.begin(); it != questions_.end();) {
    if (it->second.deadline_ns <= now_ns) {
      asked_.erase(it->second.name);
      it = questions_.erase(it);
    } else {
      next_question_ns_ = std::min(next_question_ns_, it->second.deadline_ns);
      ++it;
    }
  }
  // Names whose record the table dropped (released, plain Free) need no text any more.
  if (names_.size() > 2 * table_.size() + 4096) {
    for (auto it = names_.begin(); it != names_.end();)
      it = table_.state(it->first).known ? std::next(it) : names_.erase(it);
  }
  if (now_ns - rate_window_start_ns_ >= kNsPerS) {
    // Over the last kRateWindows windows, rounded up: a supervisor refreshes a name every few
    // seconds, so one second's count truncated (1 refresh in 1.002 s is 0.998) read as 0 while
    // refresh_entries grew.
    rate_refreshes_[rate_next_] = counters_.refresh_entries - rate_window_refreshes_;
    rate_spans_ns_[rate_next_] = now_ns - rate_window_start_ns_;
    rate_next_ = (rate_next_ + 1) % kRateWindows;
    std::uint64_t done = 0, span = 0;
    for (std::size_t i = 0; i < kRateWindows; ++i) {
      done += rate_refreshes_[i];
      span += static_cast<std::uint64_t>(rate_spans_ns_[i]);
    }
    counters_.refreshes_per_s = (done * static_cast<std::uint64_t>(kNsPerS) + span - 1) / span;
    rate_window_start_ns_ = now_ns;
    rate_window_refreshes_ = counters_.refresh_entries;
  }
}

bool LockService::apply_verdicts() {
  if (failed_) return false;
  verdicts_.clear();
  store_.poll(verdicts_);
  for (const DurabilityVerdict& v : verdicts_) {
    // The durability end of "no answer before its change is durable": a verdict names a change
    // this service submitted. One for a seq never handed to the store (a store bug, or another
    // service's verdicts) would release answers whose changes no disk holds.
    LEASEHOLD_ASSERT(v.seq != 0 && v.seq <= submitted_seq_);
    if (v.kind != DurabilityVerdict::Kind::durable) {
      // The contract (durability.hpp): rejected is treated as failed. The table has moved past
      // what the store holds; nothing that waited for this seq or a later one is answered.
      failed_ = true;
      failure_ = v.kind == DurabilityVerdict::Kind::rejected
                     ? "the store rejected change " + std::to_string(v.seq) + ": " + v.why
                     : v.why;
      if (failure_.empty()) failure_ = "the store failed change " + std::to_string(v.seq);
      return false;
    }
    durable_seq_ = std::max(durable_seq_, v.seq);
    while (!in_flight_.empty() && in_flight_.front() <= durable_seq_) in_flight_.pop_front();
  }
  return true;
}

std::int64_t LockService::tick(std::int64_t now_ns) {
  LEASEHOLD_ASSERT(now_ns >= now_ns_);
  if (!apply_verdicts()) {
    flush_log(durable_seq_);
    return now_ns;
  }
  now_ns_ = now_ns;
  if (now_ns >= next_tick_ns_) {
    expire(now_ns);
    housekeeping(now_ns);
    next_tick_ns_ = now_ns + kTickNs;
  }
  // The restart rule's lived checkpoint when no batch carried one for an interval: a batch of
  // marks only, at a seq no answer waits for, and only while the store is idle, so no change
  // queues behind it for long. Only held leases need it (a lease granted here is marked here);
  // a later write is still a lower bound.
  submit_pending(now_ns, now_ns >= next_lived_ns_ && table_.held() > 0 && in_flight_.empty());
  // The batch is with the store: the grants' tokens are signed while it commits.
  sign_deferred();
  while (!deferred_.empty() && deferred_.front().seq <= durable_seq_) {
    Deferred& d = deferred_.front();
    caller_ = d.caller;
    send_now(d.to, d.request_id, d.cache ? &d.key : nullptr, d.body);
    deferred_.pop_front();
  }
  flush_log(durable_seq_);
  return next_tick_wanted_ns();
}

std::int64_t LockService::next_tick_wanted_ns() const noexcept {
  // The earliest time-driven work: a table deadline, a push or a question due, the restart
  // rule's lived checkpoint, the rate gauge's window. Expiry and housekeeping run at most once
  // per kTickNs (next_tick_ns_), so nothing is handled before that.
  std::int64_t t = std::min({table_.next_due_ns(), next_push_ns_, next_question_ns_,
                             rate_window_start_ns_ + kNsPerS,
                             queue_wakes_.empty() ? kNoExpiry : queue_wakes_.top().first});
  if (table_.held() > 0) t = std::min(t, next_lived_ns_);
  return std::max(next_tick_ns_, t);
}

void LockService::submit_pending(std::int64_t now_ns, bool checkpoint) {
  if (change_seq_ <= submitted_seq_ && !checkpoint) return;
  if (change_seq_ == submitted_seq_) ++change_seq_;  // the checkpoint's own seq: nothing waits for it
  DurableBatch b;
  b.first_seq = submitted_seq_ + 1;
  b.last_seq = change_seq_;
  b.changes = std::move(pending_);
  marks_.incarnation = incarnation_;
  marks_.lived_ns = now_ns - started_ns_;
  // With each worker's seen mark, the highest seq taken from it so far: the next incarnation
  // (a restart, a new leader) refuses what it sent up to there (a captured heartbeat replayed
  // there would refresh its leases once more, and move its seen mark).
  marks_.replay_floor.clear();
  for (const WorkerId& w : marks_.seen)
    if (const std::uint64_t h = receiver_.highest_seq(w); h != 0) marks_.replay_floor[w] = h;
  b.marks = marks_;
  b.epoch_high_water = table_.epoch_high_water();
  if (!store_.submit(std::move(b))) {
    pending_ = std::move(b.changes);  // nothing taken: kept for the next turn
    return;
  }
  pending_.clear();
  submitted_seq_ = b.last_seq;
  in_flight_.push_back(b.last_seq);
  marks_.seen.clear();
  marks_.replay_floor.clear();
  marks_.drop_lived.clear();
  next_lived_ns_ = now_ns + lived_interval_ns_;
}

void LockService::begin_drain() {
  // A last batch with how long this incarnation served, whatever else is pending.
  if (failed_) return;
  ++change_seq_;
  // An orderly stop (a rolling restart, a handover): the seen mark of every worker acknowledged
  // here is written again with the highest seq taken from it by now, so the next incarnation
  // refuses every datagram this one saw (a crash leaves the floors of the first marks).
  // Once per worker, at the stop: the writes stay O(workers).
  std::unordered_set<WorkerId> queued(marks_.seen.begin(), marks_.seen.end());
  for (const auto& [w, seq] : seen_seq_)
    if (queued.insert(w).second) marks_.seen.push_back(w);
}

bool LockService::drained() const noexcept {
  return !failed_ && submitted_seq_ == change_seq_ && in_flight_.empty() && deferred_.empty();
}

void LockService::take_log(std::string& out) {
  out += log_;
  log_.clear();
}

void LockService::flush_log(std::uint64_t durable_seq) {
  while (!log_pending_.empty() && log_pending_.front().first <= durable_seq) {
    log_ += log_pending_.front().second;
    log_pending_.pop_front();
  }
}

}  // namespace leasehold::lockd
