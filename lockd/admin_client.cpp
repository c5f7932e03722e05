#include "leasehold/lockd/admin_client.hpp"

#include "leasehold/io/address_list.hpp"
#include "leasehold/io/client.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/lease/shard.hpp"

#include <openssl/rand.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <utility>
#include <stdexcept>

namespace leasehold::lockd {
namespace {

// The least time one address of several gets before the next is tried.
constexpr std::int64_t kAdminVisitMinNs = 100'000'000;

WorkerId random_id() {
  WorkerId id;
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) throw std::runtime_error("cannot draw a random client id");
  std::memcpy(&id.hi, b, 8);
  std::memcpy(&id.lo, b + 8, 8);
  if (id.is_nil()) id.lo = 1;
  return id;
}

WorkerId identity_of(const wire::WireKey& key, WorkerId self) {
  if (key.kind == wire::KeyKind::worker) {
    if (!self.is_nil() && self != key.worker)
      throw std::invalid_argument("the key is worker " + key.worker.str() + "'s; it cannot speak as " + self.str());
    return key.worker;
  }
  return self.is_nil() ? random_id() : self;
}

// The key the client signs with: a worker key or an admin key as they are; a cluster key is
// used directly, as an admin key (its key id with kAdminKeyIdBit, wire/auth.hpp).
wire::WireKey signing_key(const wire::WireKey& key) {
  if (key.kind != wire::KeyKind::cluster) return key;
  wire::WireKey k = key;
  k.kind = wire::KeyKind::admin;
  k.key_id = static_cast<std::uint16_t>(key.key_id | wire::kAdminKeyIdBit);
  return k;
}

// The request id of an answer, or of a key-rejected notice (which request_id_of does not
// read: it is shorter than any authenticated datagram), so that a notice naming our request
// reaches the answer check, which refuses it, and the observer, which records it.
std::optional<std::uint64_t> answer_or_notice_id_of(std::span<const std::byte> d) noexcept {
  const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(d.data()), d.size());
  if (const auto n = wire::decode_key_rejected(bytes)) return n->request_id;
  return wire::request_id_of(d);
}

}  // namespace

bool notice_as_answer_ablated() noexcept {
  const char* a = std::getenv("LEASEHOLD_ABLATE");
  return a != nullptr && std::strstr(a, "notice-as-answer") != nullptr;
}

AdminClient::AdminClient(const SocketAddress& lockd, const wire::WireKey& key, WorkerId self,
                         std::int64_t timeout_ns)
    : AdminClient(std::vector<SocketAddress>{lockd}, key, self, timeout_ns) {}

AdminClient::AdminClient(std::vector<SocketAddress> lockds, const wire::WireKey& key, WorkerId self,
                         std::int64_t timeout_ns)
    : AdminClient(std::move(lockds), identity_of(key, self), signing_key(key), wire::key_text(key), timeout_ns) {}

AdminClient::AdminClient(std::vector<SocketAddress> lockds, WorkerId self, const wire::WireKey& signing,
                         std::string key_text, std::int64_t timeout_ns)
    : lockds_(std::move(lockds)),
      key_text_(std::move(key_text)),
      sender_(self, wire::seq_seed(), signing),
      auth_(signing),
      timeout_ns_(timeout_ns),
      rng_(random_jitter_seed()) {
  if (lockds_.empty()) throw std::invalid_argument("no lockd address");
  for (std::size_t i = 0; i < lockds_.size(); ++i) {
    if (!lockds_[i].is_set() || lockds_[i].family() != lockds_.front().family())
      throw std::invalid_argument("lockd addresses " + address_list_text(lockds_) + " are not all of one family");
    for (std::size_t j = 0; j < i; ++j)
      if (lockds_[j] == lockds_[i]) throw std::invalid_argument("lockd address " + lockds_[i].str() + " is given twice");
  }
  const SocketAddress& lockd = lockds_.front();
  SocketAddress any = lockd.family() == AF_INET6 ? *SocketAddress::parse("[::]:0")
                                                 : *SocketAddress::parse("0.0.0.0:0");
  fd_ = open_udp_socket_blocking(any);
  if (fd_ < 0) throw std::runtime_error(std::string("cannot open a UDP socket: ") + std::strerror(-fd_));
  // "Nothing listens at ADDR" (ICMP port unreachable) told apart from silence; without it (a
  // kernel that refuses the option) a dead address is only silent.
  (void)enable_recv_errors(fd_);
  // A random first request id: answers to an earlier client on a recycled port do not match.
  unsigned char b[4];
  if (RAND_bytes(b, sizeof b) == 1) next_request_id_ = (std::uint64_t{b[0]} << 24 | b[1] << 16 | b[2] << 8 | b[3]) << 16 | 1;
}

AdminClient::~AdminClient() {
  if (fd_ >= 0) ::close(fd_);
}

Answer AdminClient::request(const wire::Body& body) {
  Answer out;
  const std::uint64_t rid = next_request_id_++;
  const std::size_t n = lockds_.size();
  // Following a leader happens within one timeout; a resync or a resend under a fresh seq (below)
  // is a new exchange with the lockd that answered, with a timeout of its own, as it always was.
  std::int64_t deadline = boottime_ns() + timeout_ns_;
  // With several addresses, each visit gets a share of the timeout: one that does not answer
  // (a lockd that is gone) leaves time for the others.
  const std::int64_t visit_ns = n > 1 ? std::max<std::int64_t>(timeout_ns_ / static_cast<std::int64_t>(n), kAdminVisitMinNs)
                                      : timeout_ns_;
  std::vector<std::string> said(n);  // what each address last came to, for the no-leader message
  std::vector<bool> unreachable(n);  // ICMP port unreachable seen from each address
  bool not_leader_seen = false;
  std::uint32_t resyncs = 0, replays = 0, redirects = 0, waits = 0;
  RetryPolicy policy;
  policy.first_backoff_ns = 20'000'000;
  policy.backoff_max_ns = 250'000'000;
  for (;;) {
    const std::size_t at = current_;
    const SocketAddress& to = lockds_[at];
    wire::Datagram req;
    if (const auto r = sender_.seal(rid, body, req); !r) {
      out.status = Status{Errc::invalid_argument, "cannot encode the request: " + std::string(wire::to_string(r.error))};
      return out;
    }
    std::array<std::byte, wire::kDatagramBytesMax> buf{};
    // Only lockd's answer ends the wait: a datagram that guesses our request id, or our own
    // request sent back at us, is dropped.
    // A key-rejected notice is not an answer (it carries no tag): it is recorded, and the wait
    // for the authentic answer goes on. The ablation lets it end the request, as an answer.
    const bool notice_ends = notice_as_answer_ablated();
    const auto authentic = [this, notice_ends](std::span<const std::byte> a) {
      const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(a.data()), a.size());
      if (notice_ends && wire::decode_key_rejected(bytes)) return true;
      return wire::is_answer_to(bytes, auth_, sender_.self());
    };
    const auto observe = [&](std::span<const std::byte> d) {
      const auto notice = wire::decode_key_rejected(std::span(reinterpret_cast<const std::uint8_t*>(d.data()), d.size()));
      if (notice && notice->request_id == rid) {
        out.key_rejected = *notice;
        out.rejected_by = to.str();
      }
    };
    const std::int64_t visit_deadline = std::min(deadline, boottime_ns() + visit_ns);
    const BlockingOutcome o = request_blocking(fd_, std::as_bytes(req.view()), to, visit_deadline,
                                               &answer_or_notice_id_of, buf, policy, 0, authentic, observe);
    out.attempts += o.attempts;
    if (o.port_unreachable > 0) unreachable[at] = true;
    const auto next = [&] { current_ = (at + 1) % n; };
    if (o.error != 0 && !(o.error == -ETIMEDOUT && o.attempts == 0)) {
      if (n == 1) {
        out.status = Status{Errc::io_error, std::string("cannot send to lockd at ") + to.str() + ": " + std::strerror(-o.error)};
        return out;
      }
      said[at] = std::string("cannot send: ") + std::strerror(-o.error);
      if (boottime_ns() >= deadline) break;
      next();
      continue;
    }
    if (o.status != RequestStatus::answered) {
      said[at] = unreachable[at] ? "nothing listens (ICMP port unreachable)" : "no answer";
      if (boottime_ns() >= deadline) break;
      next();
      continue;
    }
    if (const auto notice = wire::decode_key_rejected(
            std::span(reinterpret_cast<const std::uint8_t*>(buf.data()), o.answer_bytes))) {
      out.key_rejected = *notice;  // the ablation only: a notice taken for lockd's answer
      out.rejected_by = to.str();
      break;
    }
    wire::DecodeResult d = wire::decode(
        std::span(reinterpret_cast<const std::uint8_t*>(buf.data()), o.answer_bytes), &auth_);
    if (!d) {
      out.status = Status{Errc::corrupt, "bad answer from lockd: " + std::string(wire::to_string(d.error)) + ": " + d.detail};
      return out;
    }
    if (const auto* e = std::get_if<wire::Error>(&d.body)) {
      if (e->code == wire::ErrorCode::not_leader && no_follow_) {
        out.status = Status{Errc::refused, "lockd at " + to.str() + " does not lead" +
                                               (e->message.empty() ? std::string() : " (the leader: " + e->message + ")")};
        out.body = std::move(d.body);
        return out;
      }
      if (e->code == wire::ErrorCode::not_leader) {
        // Authenticated, so a lockd's: it changed nothing and names the leader if it knows one.
        not_leader_seen = true;
        const std::optional<SocketAddress> hinted = e->message.empty() ? std::nullopt : SocketAddress::parse(e->message);
        std::optional<std::size_t> named;
        for (std::size_t i = 0; hinted && i < n; ++i)
          if (lockds_[i] == *hinted) named = i;
        said[at] = "not_leader, " + (e->message.empty() ? std::string("no leader known")
                                                        : "leader \"" + e->message + "\"" +
                                                              (named ? "" : " (not a configured address)"));
        const std::int64_t now = boottime_ns();
        if (now >= deadline) break;
        if (named && *named != at && redirects < n) {
          ++redirects;
          current_ = *named;
          continue;
        }
        redirects = 0;
        next();
        const std::int64_t wait = std::min(backoff_delay_ns(policy, ++waits, &rng_), deadline - now);
        const timespec ts{static_cast<time_t>(wait / kNsPerS), static_cast<long>(wait % kNsPerS)};
        ::clock_nanosleep(CLOCK_BOOTTIME, 0, &ts, nullptr);
        if (boottime_ns() >= deadline) break;
        continue;
      }
      // Our seq started below lockd's window for this sender (a wall clock stepped back):
      // nothing was executed; continue above the floor lockd gave, once per lockd.
      if (resyncs < n && e->seq_floor != 0 && e->code == wire::error_code_of(wire::DecodeError::stale_seq) &&
          !wire::seq_resync_ablated()) {
        ++resyncs;
        sender_.advance_to(e->seq_floor);
        deadline = boottime_ns() + timeout_ns_;
        continue;
      }
      // A retry of ours (the same bytes) reached lockd after the first copy, whose answer is
      // not cached (a heartbeat's): lockd never executes a replayed seq, so send the request
      // again under a fresh one (it is idempotent, as every request is).
      if (replays < 3 && e->code == wire::error_code_of(wire::DecodeError::replayed)) {
        ++replays;
        deadline = boottime_ns() + timeout_ns_;
        continue;
      }
      out.status = Status{Errc::refused, "lockd answered error " + std::string(wire::to_string(e->code)) + ": " + e->message};
      out.body = std::move(d.body);
      return out;
    }
    out.body = std::move(d.body);
    return out;
  }
  // The deadline passed.
  const std::string within = std::to_string(timeout_ns_ / 1'000'000) + " ms (" + std::to_string(out.attempts) + " attempts)";
  if (out.key_rejected) {
    out.status = Status{Errc::permission_denied,
                        "lockd at " + out.rejected_by + " rejected our key (key id " +
                            std::to_string(out.key_rejected->key_id) + ", " +
                            std::string(wire::to_string(out.key_rejected->reason)) + "; " + key_text_ +
                            "): no authentic answer within " + within +
                            ". Check the key file, and that the key was derived for this worker from a cluster key "
                            "lockd has loaded (the notice is unauthenticated: it only explains the missing answer)"};
    return out;
  }
  if (not_leader_seen) {
    std::string each;
    for (std::size_t i = 0; i < n; ++i)
      if (!said[i].empty()) each += (each.empty() ? "" : "; ") + lockds_[i].str() + ": " + said[i];
    out.no_leader = true;
    out.status = Status{Errc::timeout, "no lockd among " + address_list_text(lockds_) + " leads: " + each + " (within " +
                                           within + ")"};
    return out;
  }
  if (std::all_of(unreachable.begin(), unreachable.end(), [](bool u) { return u; })) {
    out.nothing_listens = true;
    out.status = Status{Errc::timeout, "nothing listens at " + address_list_text(lockds_) +
                                           " (ICMP port unreachable; no answer within " + within +
                                           "): is leasehold-lockd running there, on that port?"};
    return out;
  }
  out.status = Status{Errc::timeout, "no answer from lockd at " + address_list_text(lockds_) + " within " + within +
                                         ": is it running, and does it know this key (" + key_text_ +
                                         ")? lockd drops datagrams it cannot authenticate"};
  return out;
}

Answer AdminClient::acquire(const std::string& name, SandboxId sandbox, WorkerId worker,
                            std::uint32_t ttl_ms, bool two_phase) {
  return request(wire::Acquire{name, sandbox, worker, ttl_ms, two_phase});
}
Answer AdminClient::commit(NameId name, SandboxId sandbox, Epoch epoch, WorkerId worker) {
  return request(wire::Commit{name, sandbox, epoch, worker});
}
Answer AdminClient::heartbeat(std::span<const wire::HeartbeatEntry> entries, std::uint32_t ttl_cap_ms) {
  wire::Heartbeat h;
  h.ttl_cap_ms = ttl_cap_ms;
  for (const auto& e : entries.first(std::min(entries.size(), wire::kHeartbeatEntriesMax)))
    h.entries.push_back(e);
  return request(h);
}
Answer AdminClient::release(NameId name, SandboxId sandbox, Epoch epoch) {
  return request(wire::Release{name, sandbox, epoch});
}
Answer AdminClient::transfer_begin(NameId name, SandboxId from, Epoch epoch, SandboxId to, WorkerId to_worker) {
  return request(wire::TransferBegin{name, from, epoch, to, to_worker});
}
Answer AdminClient::transfer_complete(NameId name, Epoch new_epoch) {
  return request(wire::TransferComplete{name, new_epoch});
}
Answer AdminClient::transfer_accept(NameId name, SandboxId to, WorkerId worker) {
  return request(wire::TransferAccept{name, to, worker});
}
Answer AdminClient::revoke(NameId name, Epoch expected_epoch, bool force) {
  return request(wire::Revoke{name, expected_epoch, force});
}
Answer AdminClient::reassign(NameId name, SandboxId to, WorkerId worker) {
  return request(wire::Reassign{name, to, worker});
}
Answer AdminClient::worker_heartbeat(WorkerId worker) { return request(wire::WorkerHeartbeat{worker, {}}); }
Answer AdminClient::show(const std::string& name) { return request(wire::Show{name, NameId{}, std::nullopt}); }
Answer AdminClient::show(NameId name) { return request(wire::Show{std::string(), name, std::nullopt}); }
namespace {
// An older lockd's refusal of a request's trailing field (List::waiters, Show::waiters_from).
bool refused_trailing(const Answer& a) {
  const auto* e = a.code() == Errc::refused ? std::get_if<wire::Error>(&a.body) : nullptr;
  return e != nullptr && e->code == wire::error_code_of(wire::DecodeError::trailing_bytes);
}
}  // namespace

Answer AdminClient::list(std::uint64_t cursor, std::uint16_t limit, bool waiters) {
  if (waiters) {
    Answer a = request(wire::List{cursor, limit, true});
    if (!refused_trailing(a)) return a;
  }
  return request(wire::List{cursor, limit, false});
}

Answer AdminClient::show_waiters(const std::string& name) {
  wire::Show ask{name, NameId{}, 0};
  Answer first = request(ask);
  if (refused_trailing(first)) return show(name);
  auto* info = std::get_if<wire::NameInfo>(&first.body);
  if (!first.ok() || info == nullptr || !info->with_waiters) return first;
  // Further pages while the FIFO is longer than what came; a page that brings nothing ends it
  // (the FIFO got shorter meanwhile).
  while (info->waiters_from + info->waiters.size() < info->record.waiters) {
    ask.waiters_from = static_cast<std::uint32_t>(info->waiters_from + info->waiters.size());
    const Answer more = request(ask);
    first.attempts += more.attempts;
    const auto* page = more.as<wire::NameInfo>();
    if (page == nullptr) {
      Answer out = more;
      out.attempts = first.attempts;
      return out;
    }
    if (page->waiters.empty()) break;
    info->waiters.insert(info->waiters.end(), page->waiters.begin(), page->waiters.end());
  }
  return first;
}
Answer AdminClient::stats() { return request(wire::Stats{}); }

Answer AdminClient::stats_all() {
  wire::StatsAnswer all;
  std::uint32_t attempts = 0;
  for (;;) {
    if (all.counters.size() > UINT16_MAX) {
      Answer out;
      out.status = Status{Errc::corrupt, "lockd's stats pages did not end after " + std::to_string(all.counters.size()) + " counters"};
      return out;
    }
    wire::Stats page_request;
    page_request.first = static_cast<std::uint16_t>(all.counters.size());
    Answer a = request(page_request);
    attempts += a.attempts;
    if (all.counters.empty() && refused_trailing(a)) return stats();  // an older lockd: no paging
    const auto* page = a.as<wire::StatsAnswer>();
    if (page == nullptr) {
      a.attempts = attempts;
      return a;
    }
    if (page->counters.empty()) break;
    all.counters.insert(all.counters.end(), page->counters.begin(), page->counters.end());
  }
  Answer out;
  out.body = std::move(all);
  out.attempts = attempts;
  return out;
}

Result<std::vector<wire::NameRecord>> AdminClient::list_all(std::size_t names_max, bool* waiters) {
  std::vector<wire::NameRecord> all;
  std::uint64_t cursor = 0;
  do {
    Answer a = list(cursor, 0, waiters != nullptr);
    const auto* page = a.as<wire::ListPage>();
    if (page == nullptr) return a.ok() ? Status{Errc::corrupt, "unexpected answer to list"} : a.status;
    if (waiters != nullptr && !page->with_waiters) *waiters = false;
    all.insert(all.end(), page->entries.begin(), page->entries.end());
    if (page->next_cursor != 0 && page->next_cursor <= cursor)
      return Status{Errc::corrupt, "list cursor did not advance"};
    cursor = page->next_cursor;
  } while (cursor != 0 && all.size() < names_max);
  return all;
}

Answer AdminClient::request_at(std::size_t index, const wire::Body& body) {
  if (index >= lockds_.size()) {
    Answer out;
    out.status = Status::invalid("no lockd address number " + std::to_string(index));
    return out;
  }
  // This address alone: a client of one address never moves, and a not_leader is waited out
  // to the deadline there; so it is ended at once instead, as the refusal it is here.
  std::vector<SocketAddress> all = std::exchange(lockds_, std::vector<SocketAddress>{lockds_[index]});
  const std::size_t current = std::exchange(current_, 0);
  no_follow_ = true;
  Answer a = request(body);
  no_follow_ = false;
  lockds_ = std::move(all);
  current_ = current;
  return a;
}

Result<AdminClient::ShardLeaders> AdminClient::shard_leaders() {
  ShardLeaders out;
  out.said.resize(lockds_.size());
  std::vector<std::pair<unsigned, bool>> seen(lockds_.size(), {0, false});  // (shard, leading)
  std::optional<unsigned> shards;
  bool any = false;
  // Each address within its share of the timeout: one that is gone leaves time for the others.
  const std::int64_t timeout = timeout_ns_;
  timeout_ns_ = std::max<std::int64_t>(timeout / static_cast<std::int64_t>(lockds_.size()), kAdminVisitMinNs);
  for (std::size_t i = 0; i < lockds_.size(); ++i) {
    const Answer a = request_at(i, wire::Stats{});
    const auto* st = a.as<wire::StatsAnswer>();
    if (st == nullptr) {
      out.said[i] = a.ok() ? "not a stats answer" : a.message();
      continue;
    }
    any = true;
    std::uint64_t shard = 0, count = 1, leading = 1;
    for (const wire::Counter& c : st->counters) {
      if (c.key == "shard") shard = c.value;
      if (c.key == "shards") count = c.value;
      if (c.key == "leading") leading = c.value;
    }
    if (count < 1 || count > kShardsMax || shard >= count) {
      out.said[i] = "shard " + std::to_string(shard) + " of " + std::to_string(count) + ": not a valid shard";
      continue;
    }
    if (shards && *shards != count) {
      timeout_ns_ = timeout;
      return Status(Errc::corrupt, "lockd at " + lockds_[i].str() + " reports " + std::to_string(count) +
                                       " shards, another " + std::to_string(*shards) + ": one cluster per --lockd list");
    }
    shards = static_cast<unsigned>(count);
    seen[i] = {static_cast<unsigned>(shard), leading != 0};
    out.said[i] = "shard " + std::to_string(shard) + (leading != 0 ? ", leading" : ", not leading");
  }
  timeout_ns_ = timeout;
  if (!any) return Status(Errc::timeout, "no lockd among " + address_list_text(lockds_) + " answered");
  out.shards = shards.value_or(1);
  out.leader.resize(out.shards);
  for (std::size_t i = 0; i < lockds_.size(); ++i)
    if (seen[i].second && seen[i].first < out.shards && !out.leader[seen[i].first])
      out.leader[seen[i].first] = i;
  return out;
}

Result<std::vector<wire::NameRecord>> AdminClient::list_cluster(std::size_t names_max, bool* waiters) {
  auto stats = counters();
  if (!stats.ok()) return stats.status();
  std::uint64_t count = 1;
  for (const wire::Counter& c : *stats)
    if (c.key == "shards") count = c.value;
  if (count <= 1) return list_all(names_max, waiters);
  auto where = shard_leaders();
  if (!where.ok()) return where.status();
  std::vector<wire::NameRecord> all;
  for (unsigned k = 0; k < where->shards && all.size() < names_max; ++k) {
    if (!where->leader[k]) {
      std::string each;
      for (std::size_t i = 0; i < lockds_.size(); ++i)
        each += (each.empty() ? "" : "; ") + lockds_[i].str() + ": " + where->said[i];
      return Status(Errc::timeout, "shard " + std::to_string(k) + " of " + std::to_string(where->shards) +
                                       " has no leader among " + address_list_text(lockds_) + " (" + each + ")");
    }
    const std::size_t at = *where->leader[k];
    std::uint64_t cursor = 0;
    do {
      Answer a = request_at(at, wire::List{cursor, 0, waiters != nullptr});
      if (waiters != nullptr && refused_trailing(a)) a = request_at(at, wire::List{cursor, 0, false});
      const auto* page = a.as<wire::ListPage>();
      if (page == nullptr)
        return a.ok() ? Status{Errc::corrupt, "unexpected answer to list from " + lockds_[at].str()}
                      : Status{a.code(), "shard " + std::to_string(k) + " at " + lockds_[at].str() + ": " + a.message()};
      if (waiters != nullptr && !page->with_waiters) *waiters = false;
      all.insert(all.end(), page->entries.begin(), page->entries.end());
      if (page->next_cursor != 0 && page->next_cursor <= cursor)
        return Status{Errc::corrupt, "list cursor did not advance"};
      cursor = page->next_cursor;
    } while (cursor != 0 && all.size() < names_max);
  }
  if (all.size() > names_max) all.resize(names_max);
  return all;
}

Result<std::vector<wire::Counter>> AdminClient::counters() {
  Answer a = stats_all();
  const auto* s = a.as<wire::StatsAnswer>();
  if (s == nullptr) return a.ok() ? Status{Errc::corrupt, "unexpected answer to stats"} : a.status;
  return s->counters;
}

}  // namespace leasehold::lockd
