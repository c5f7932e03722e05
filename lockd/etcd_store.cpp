#include "leasehold/lockd/etcd_store.hpp"

#include "leasehold/lockd/leadership_core.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/wire/token.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace leasehold::lockd {
namespace {

template <class T>
bool parse_number(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size() && !text.empty();
}

/// The value of field `key` in a row's words, advancing `rest` past it (fields in order).
std::optional<std::string_view> field(std::string_view& rest, std::string_view key) {
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.size() < key.size() + 1 || rest.substr(0, key.size()) != key || rest[key.size()] != '=')
    return std::nullopt;
  rest.remove_prefix(key.size() + 1);
  const std::size_t end = std::min(rest.find(' '), rest.size());
  const std::string_view v = rest.substr(0, end);
  rest.remove_prefix(end);
  return v;
}

}  // namespace

std::string shard_prefix(std::string_view prefix, unsigned shard) {
  return std::string(prefix) + "/shard/" + std::to_string(shard) + "/";
}

std::string election_key(std::string_view shard_prefix) { return std::string(shard_prefix) + "election"; }

std::string cluster_key_key(std::string_view prefix) { return std::string(prefix) + "/cluster_key"; }

std::string cluster_key_fingerprint(const wire::WireKey& key) {
  static constexpr std::string_view kDomain = "leasehold cluster key v1";
  std::vector<unsigned char> in(kDomain.begin(), kDomain.end());
  in.push_back(0);
  in.push_back(static_cast<unsigned char>(key.key_id >> 8));
  in.push_back(static_cast<unsigned char>(key.key_id & 0xff));
  in.insert(in.end(), key.bytes.begin(), key.bytes.end());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(in.data(), in.size(), md, &len, EVP_sha256(), nullptr) != 1 || len < 8)
    throw std::runtime_error("cannot hash a cluster key (OpenSSL SHA-256 failed)");
  OPENSSL_cleanse(in.data(), in.size());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < 8; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 0xf];
  }
  return out;
}

std::string cluster_keys_value(const std::vector<wire::WireKey>& keys) {
  std::map<std::uint16_t, std::string> by_id;
  for (const wire::WireKey& k : keys)
    if (k.kind == wire::KeyKind::cluster) by_id[k.key_id] = cluster_key_fingerprint(k);
  std::string s = "v=1 keys=";
  bool first = true;
  for (const auto& [id, fp] : by_id) {
    if (!first) s += ',';
    first = false;
    s += std::to_string(id) + ":" + fp;
  }
  return s;
}

namespace {

/// The keys of a cluster_keys_value record (id -> fingerprint); nullopt when it does not parse.
std::optional<std::map<std::uint16_t, std::string>> parse_cluster_keys(std::string_view v) {
  static constexpr std::string_view kHead = "v=1 keys=";
  if (v.substr(0, kHead.size()) != kHead) return std::nullopt;
  v.remove_prefix(kHead.size());
  std::map<std::uint16_t, std::string> out;
  while (!v.empty()) {
    const std::size_t comma = std::min(v.find(','), v.size());
    const std::string_view item = v.substr(0, comma);
    v.remove_prefix(std::min(comma + 1, v.size()));
    const std::size_t colon = item.find(':');
    std::uint16_t id = 0;
    if (colon == std::string_view::npos || !parse_number(item.substr(0, colon), id) || item.size() - colon - 1 != 16)
      return std::nullopt;
    out[id] = std::string(item.substr(colon + 1));
  }
  return out;
}

}  // namespace

std::string cluster_keys_mismatch(std::string_view mine, std::string_view recorded) {
  const auto have = parse_cluster_keys(mine);
  const auto want = parse_cluster_keys(recorded);
  const std::string both = " (this lockd's cluster keys: \"" + std::string(mine) + "\"; the cluster's, recorded in etcd: \"" +
                           std::string(recorded.substr(0, 300)) + "\")";
  if (!want) return "the cluster's key record does not parse" + both;
  if (!have) return "this lockd's key record does not parse" + both;
  for (const auto& [id, fp] : *want) {
    const auto it = have->find(id);
    if (it == have->end()) return "this lockd lacks cluster key " + std::to_string(id) + both;
    if (it->second != fp)
      return "this lockd's cluster key " + std::to_string(id) + " is another key (fingerprint " + it->second +
             ", the cluster's " + fp + ")" + both;
  }
  return {};
}

std::string signing_key_key(std::string_view prefix) { return std::string(prefix) + "/signing_key"; }

std::string signing_key_value(std::span<const std::uint8_t> public_key, std::uint32_t key_id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (const std::uint8_t b : public_key) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return "v=1 key_id=" + token::key_id_text(key_id) + " public=" + hex;
}

namespace {

/// Creates `key` holding `mine` where there is none (a lockd never overwrites a cluster's
/// record); the value it holds otherwise. nullopt: created.
Result<std::optional<std::string>> create_record_if_absent(etcd::Client& client, const std::string& key,
                                                           std::string_view mine, std::int64_t deadline_ns) {
  auto r = client.txn({etcd::Compare::of(key, etcd::Compare::Target::create_revision, etcd::Compare::Op::equal, 0)},
                      {etcd::Op::put(key, std::string(mine))}, {etcd::Op::get(key)}, deadline_ns);
  if (!r.ok()) return r.status();
  if (r->succeeded) return std::optional<std::string>();
  return std::optional<std::string>(
      !r->ranges.empty() && !r->ranges.front().kvs.empty() ? r->ranges.front().kvs.front().value : std::string());
}

}  // namespace

Status check_signing_key(etcd::Client& client, std::string_view prefix, std::string_view mine, std::int64_t deadline_ns,
                         std::string* note) {
  const std::string key = signing_key_key(prefix);
  auto r = create_record_if_absent(client, key, mine, deadline_ns);
  if (!r.ok()) return r.status();
  if (!r->has_value() || **r == mine) {
    if (note != nullptr) *note = r->has_value() ? "matches" : "created";
    return Status{};
  }
  return Status(Errc::permission_denied,
                key + " records token signing key id " + signing_key_id_of(**r) +
                    ", this lockd's --signing-key-file is key id " + signing_key_id_of(mine) +
                    ": resources keep the cluster's one public key and would refuse every token this " +
                    "lockd signs as unknown_key; give it the cluster's signing key (to rotate the key, stop every " +
                    "lockd, delete " + key + " with etcdctl, and start them with the new key)");
}

Status check_cluster_keys(etcd::Client& client, std::string_view prefix, std::string_view mine,
                          std::int64_t deadline_ns, std::string* note) {
  const std::string key = cluster_key_key(prefix);
  auto r = create_record_if_absent(client, key, mine, deadline_ns);
  if (!r.ok()) return r.status();
  if (!r->has_value()) {
    if (note != nullptr) *note = "created";
    return Status{};
  }
  const std::string recorded = **r;
  const std::string why = cluster_keys_mismatch(mine, recorded);
  if (note != nullptr) *note = why.empty() ? "matches" : why;
  if (why.empty()) return Status{};
  // None of the recorded keys at all: another cluster's key (or a wrong --key-file). One of
  // them but not every one: a rotation this lockd was not given yet; it starts and waits.
  const auto have = parse_cluster_keys(mine);
  const auto want = parse_cluster_keys(recorded);
  bool shared = false;
  if (have && want)
    for (const auto& [id, fp] : *want) shared = shared || (have->count(id) != 0 && have->at(id) == fp);
  if (shared) return Status{};
  return Status(Errc::permission_denied, key + ": " + why);
}

std::string encode_row(const StoredName& n) {
  std::string s;
  s.reserve(256);
  s += "v=1 name=";
  s += n.name;
  s += " state=";
  s += to_string(n.state);
  s += " epoch=" + std::to_string(n.epoch);
  s += " old_epoch=" + std::to_string(n.old_epoch);
  s += " owner=" + n.owner.str();
  s += " peer=" + n.peer.str();
  s += " worker=" + n.worker.str();
  s += " peer_worker=" + n.peer_worker.str();
  s += " ttl_ns=" + std::to_string(n.ttl_ns);
  s += n.epoch_fresh ? " fresh=1" : " fresh=0";
  return s;
}

Result<StoredName> decode_row(NameId id, std::string_view value) {
  std::string_view rest = value;
  StoredName n;
  n.id = id;
  auto bad = [&](std::string_view what) {
    return Status(Errc::corrupt, "row of name " + id.str() + ": " + std::string(what) + " in \"" +
                                     std::string(value.substr(0, 300)) + "\"");
  };
  const auto v = field(rest, "v");
  if (!v || *v != "1") return bad("no version v=1");
  const auto name = field(rest, "name");
  if (!name || !validate_name(*name).ok()) return bad("no valid name");
  if (name_id_of(*name) != id) return bad("a name that does not hash to the key's id");
  n.name = std::string(*name);
  const auto state = field(rest, "state");
  std::optional<LockPhase> phase;
  for (LockPhase p : kLockPhases)
    if (state && to_string(p) == *state) phase = p;
  if (!phase) return bad("no valid state");
  n.state = *phase;
  const auto epoch = field(rest, "epoch");
  if (!epoch || !parse_number(*epoch, n.epoch) || n.epoch > kEpochMax) return bad("no valid epoch");
  const auto old_epoch = field(rest, "old_epoch");
  if (!old_epoch || !parse_number(*old_epoch, n.old_epoch) || n.old_epoch > kEpochMax) return bad("no valid old_epoch");
  auto id_field = [&](std::string_view key, auto& out) {
    const auto t = field(rest, key);
    if (!t) return false;
    const auto parsed = std::remove_reference_t<decltype(out)>::parse(*t);
    if (!parsed) return false;
    out = *parsed;
    return true;
  };
  if (!id_field("owner", n.owner)) return bad("no valid owner");
  if (!id_field("peer", n.peer)) return bad("no valid peer");
  if (!id_field("worker", n.worker)) return bad("no valid worker");
  if (!id_field("peer_worker", n.peer_worker)) return bad("no valid peer_worker");
  const auto ttl = field(rest, "ttl_ns");
  if (!ttl || !parse_number(*ttl, n.ttl_ns)) return bad("no valid ttl_ns");
  const auto fresh = field(rest, "fresh");
  if (!fresh || (*fresh != "0" && *fresh != "1")) return bad("no valid fresh");
  n.epoch_fresh = *fresh == "1";
  if (!rest.empty()) return bad("trailing text");
  return n;
}

EtcdStore::EtcdStore(std::shared_ptr<etcd::Client> client, std::string shard_prefix, std::int64_t leader_revision,
                     std::size_t txn_ops_max)
    : client_(std::move(client)),
      prefix_(std::move(shard_prefix)),
      election_(election_key(prefix_)),
      revision_(leader_revision),
      txn_ops_max_(std::max<std::size_t>(txn_ops_max, 4)) {
  LEASEHOLD_ASSERT(revision_ > 0);
}

std::string EtcdStore::describe() const {
  return "etcd://" + client_->endpoints() + prefix_ + " (leader revision " + std::to_string(revision_) + ")";
}

namespace {

/// A restart-rule mark (`key` below the shard prefix: lived/<R> = ns, or seen/<worker> = "R" or
/// "R seq=N") into `t`; false (and `t` unchanged) when the key or the value does not parse.
bool load_mark(std::string_view key, std::string_view value, StoredTable& t) {
  if (key.substr(0, 6) == "lived/") {
    std::uint64_t inc = 0;
    std::int64_t lived = 0;
    if (!parse_number(key.substr(6), inc) || !parse_number(value, lived)) return false;
    t.lived_ns[inc] = lived;
    return true;
  }
  const auto w = WorkerId::parse(key.substr(5));
  if (!w) return false;
  const std::size_t space = value.find(' ');
  std::uint64_t inc = 0;
  if (!parse_number(value.substr(0, space), inc)) return false;
  std::optional<std::uint64_t> floor;
  if (space != std::string_view::npos) {
    const std::string_view f = value.substr(space + 1);
    std::uint64_t seq = 0;
    if (f.substr(0, 4) != "seq=" || !parse_number(f.substr(4), seq)) return false;
    floor = seq;
  }
  t.seen[*w] = inc;
  if (floor) t.replay_floor[*w] = *floor;
  return true;
}

}  // namespace

StoredTable EtcdStore::load() const {
  StoredTable t;
  const std::string begin = prefix_;
  const std::string end = etcd::prefix_end(prefix_);
  constexpr std::int64_t kPage = 4096;
  std::string from = begin;
  std::int64_t at_revision = 0;  // the first page's revision: every page reads the same snapshot
  for (;;) {
    auto page = client_->range(from, end, boottime_ns() + kEtcdCallTimeoutNs * 10, kPage, at_revision);
    if (!page.ok()) throw StoreError(describe() + ": cannot read the table: " + page.status().message());
    if (at_revision == 0) at_revision = page->revision;
    for (const etcd::KeyValue& kv : page->kvs) {
      const std::string_view key = std::string_view(kv.key).substr(prefix_.size());
      auto number = [&](std::string_view text, auto& out) {
        if (!parse_number(text, out))
          throw StoreError(describe() + ": key " + kv.key + ": \"" + kv.value.substr(0, 64) + "\" is not a number");
      };
      if (key.substr(0, 6) == "names/") {
        // A row is exactly names/<name-id>, the only key lockd writes there; anything else
        // under names/ (names/x/y, names/junk) was put there by hand: not a row, skipped and
        // reported. A row that does not decode is corruption: the table cannot be served
        // without it (its epoch, its holder), so the load fails naming the key.
        const auto id = NameId::parse(key.substr(6));
        if (!id) {
          ++t.foreign_keys;
          if (t.foreign_key_samples.size() < kForeignKeySamplesMax) t.foreign_key_samples.push_back(kv.key);
          continue;
        }
        auto row = decode_row(*id, kv.value);
        if (!row.ok())
          throw StoreError(describe() + ": the row at key " + kv.key + " does not decode (" + row.status().message() +
                           "); the table cannot be served without it: repair or delete the key");
        epochs_.note(row->id, row->epoch);
        t.names.push_back(std::move(*row));
      } else if (key == "high_water") {
        number(kv.value, t.epoch_high_water);
        if (t.epoch_high_water > kEpochMax) throw StoreError(describe() + ": high_water above the epoch limit");
      } else if (key.substr(0, 6) == "lived/" || key.substr(0, 5) == "seen/") {
        // The restart rule's marks. One that does not parse was not written by lockd: it is
        // skipped and reported like a stray key under names/, never a reason to refuse the
        // takeover (a shard whose every replica refused would have no leader until someone
        // deleted the key). Skipping is safe: without lived/<R> the rule subtracts less, and
        // without seen/<w> it gives w's leases a full TTL - restored leases only get longer;
        // without a replay floor a captured datagram of w may execute once more here (§9.2).
        if (!load_mark(key, kv.value, t)) {
          ++t.foreign_keys;
          if (t.foreign_key_samples.size() < kForeignKeySamplesMax) t.foreign_key_samples.push_back(kv.key);
        }
      }
      // Other keys (the election key) are not the table's.
    }
    if (!page->more || page->kvs.empty()) break;
    from = page->kvs.back().key + '\0';
  }
  std::sort(t.names.begin(), t.names.end(), [](const StoredName& a, const StoredName& b) { return a.id < b.id; });
  return t;
}

void EtcdStore::commit(std::span<const StoredName> changes, Epoch epoch_high_water, const StoreMarks& marks) {
  if (changes.empty() && epoch_high_water == 0 && marks.empty()) return;
  if (changes.size() > kStoreBatchChangesMax)
    throw StoreError(describe() + ": batch of " + std::to_string(changes.size()) +
                     " changes exceeds kStoreBatchChangesMax");
  // The never-lower check of every store (DurableEpochs): a breach is lockd's own bug.
  epochs_.check(changes, epoch_high_water);
  // etcd refuses a transaction that puts one key twice: the last change of a name in the batch
  // is its state (the rows are whole states, not deltas).
  std::map<NameId, const StoredName*> last;
  for (const StoredName& n : changes) last[n.id] = &n;
  std::vector<etcd::Op> ops;
  ops.reserve(last.size() + marks.seen.size() + 2);
  // The high-water mark first: a crash after it and before a row burns epochs, never reuses one.
  if (epoch_high_water != 0) ops.push_back(etcd::Op::put(prefix_ + "high_water", std::to_string(epoch_high_water)));
  for (const auto& [id, n] : last) ops.push_back(etcd::Op::put(prefix_ + "names/" + id.str(), encode_row(*n)));
  if (marks.lived_ns >= 0)
    ops.push_back(etcd::Op::put(prefix_ + "lived/" + std::to_string(marks.incarnation), std::to_string(marks.lived_ns)));
  // Lived marks no restart needs any more, deleted under the same guard (a deposed leader's
  // view of which are needed is as stale as its table).
  for (const std::uint64_t j : marks.drop_lived)
    if (j != marks.incarnation) ops.push_back(etcd::Op::del(prefix_ + "lived/" + std::to_string(j)));
  for (const WorkerId& w : marks.seen) {
    const auto floor = marks.replay_floor.find(w);
    ops.push_back(etcd::Op::put(prefix_ + "seen/" + w.str(),
                                std::to_string(marks.incarnation) +
                                    (floor == marks.replay_floor.end() ? std::string()
                                                                       : " seq=" + std::to_string(floor->second))));
  }

  const std::vector<etcd::Compare> guard{
      etcd::Compare::of(election_, etcd::Compare::Target::create_revision, etcd::Compare::Op::equal, revision_)};
  const std::int64_t give_up = boottime_ns() + kEtcdCommitDeadlineNs;
  const std::size_t step = txn_ops_max_ - 1;  // room for nothing else: the guard is a compare, not an op
  for (std::size_t at = 0; at < ops.size(); at += step) {
    const std::vector<etcd::Op> chunk(ops.begin() + static_cast<std::ptrdiff_t>(at),
                                      ops.begin() + static_cast<std::ptrdiff_t>(std::min(ops.size(), at + step)));
    for (int attempt = 0;; ++attempt) {
      const std::int64_t now = boottime_ns();
      auto r = client_->txn(guard, chunk, {}, std::min(give_up, now + kEtcdCallTimeoutNs));
      if (r.ok()) {
        if (!r->succeeded) {
          const std::string why = describe() + ": the election key's revision is no longer " +
                                  std::to_string(revision_) + ": this lockd no longer leads";
          // Refused with nothing written only when no earlier transaction of the batch (nor an
          // attempt of this one that timed out) may have been applied.
          if (at == 0 && attempt == 0) throw StoreRejected(why + "; nothing of the batch was written");
          throw StoreError(why + "; a part of the batch may be durable");
        }
        break;
      }
      const Errc code = r.status().code();
      const bool retry = (code == Errc::timeout || code == Errc::io_error || code == Errc::busy) && now < give_up;
      if (!retry) throw StoreError(describe() + ": cannot commit: " + r.status().message());
      // The same puts again: idempotent, and still guarded on the revision.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (attempt + 1), 250)));
    }
  }
  for (const auto& [id, n] : last) epochs_.note(id, n->epoch);
}

}  // namespace leasehold::lockd
