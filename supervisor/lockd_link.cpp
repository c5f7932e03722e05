#include "leasehold/supervisor/lockd_link.hpp"

#include "leasehold/io/address_list.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/wire/shard_route.hpp"

#include <openssl/crypto.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace leasehold {
namespace {

// The key id of a datagram (its header's last two bytes, little-endian); size >= kHeaderBytes.
std::uint16_t key_id_in(std::span<const std::uint8_t> d) {
  return static_cast<std::uint16_t>(d[wire::kHeaderBytes - 2] | (d[wire::kHeaderBytes - 1] << 8));
}

std::uint64_t random_u64() {
  std::uint64_t v = 0;
  while (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}

// The local address (port 0) the kernel sends to `to` from; nullopt if it cannot tell.
std::optional<SocketAddress> local_address_towards(const SocketAddress& to) {
  const int probe = ::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return std::nullopt;
  SocketAddress local{};
  local.length = sizeof local.storage;
  std::optional<SocketAddress> out;
  if (::connect(probe, to.sa(), to.length) == 0 && ::getsockname(probe, local.sa(), &local.length) == 0 &&
      local.family() == to.family()) {
    if (local.family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&local.storage)->sin6_port = 0;
    else reinterpret_cast<sockaddr_in*>(&local.storage)->sin_port = 0;
    out = local;
  }
  ::close(probe);
  return out;
}

}  // namespace

struct LockdLink::Call {
  wire::Datagram datagram;
  std::uint64_t request_id = 0;
  std::int64_t deadline_ns = 0;
  std::int64_t first_send_ns = 0;
  std::uint32_t attempts = 0;
  std::uint32_t resyncs = 0;
  std::uint32_t redirects = 0;  ///< resent at once to a named leader since the last backoff
  std::uint32_t waits = 0;      ///< not_leader backoffs so far
  std::string redirected;       ///< the last not_leader answer, for the failure's text
  unsigned shard = 0;           ///< the shard its target is kept for (wire::shard_of_request)
  TimerId wait_timer;           ///< while in waiting_
  bool probe = false;  ///< signed with the pending key (try_key)
  LockdCallback on_done;
};

LockdLink::LockdLink(EventLoop& loop, std::vector<SocketAddress> lockds, WorkerId self,
                     const wire::WireKey& key, const RetryPolicy& retry)
    : loop_(loop),
      lockds_(std::move(lockds)),
      retry_(retry),
      rng_(random_jitter_seed()),
      sender_(self, wire::seq_seed(), key),
      keys_(nullptr),
      receiver_(
          [&]() -> std::unique_ptr<wire::Keyring> {
            auto ring = std::make_unique<wire::SingleKeyring>(key);
            keys_ = ring.get();
            return ring;
          }(),
          wire::Receiver::Limits{}),
      next_request_id_(random_u64() | 1) {
  ClientLimits limits;
  limits.outstanding_max = 2048;  // 10,000 leases = 345 heartbeat datagrams per round, + retries
  // Requests and answers alike (the client also takes the id of what it sends); lockd's own
  // requests carry lockd's ids, which match none of ours, and end up as unsolicited.
  client_ = std::make_unique<RequestClient>(loop, &wire::request_id_of, retry, limits);
  // A retry is a new datagram: a fresh seq and tag, same request id (lockd never executes a
  // replayed seq, and answers a retry of an answered request from its cache).
  // A probe of a pending key (try_key) is retried under that key.
  // An answer ends its call only if it is lockd's: anyone who reaches this socket can guess a
  // request id, or send our own request back at us (our tag, our id), and a forgery that ended
  // a heartbeat would kill the sandboxes it carried.
  client_->set_answer_check([this](std::span<const std::byte> bytes) {
    const auto d = std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    const wire::Authenticator* a = answer_key(d, true);
    if (a != nullptr && wire::is_answer_to(d, *a, sender_.self())) return true;
    ++stats_.answers_forged;
    return false;
  });
  // A retry means the previous attempt got no answer: if it went to the target, the target
  // moves on (the lockd there may be gone, and another one lead); the retry goes to the target.
  client_->set_retarget_hook([this](std::uint64_t request_id, SocketAddress& to) {
    if (lockds_.size() < 2) return;
    const auto it = call_shards_.find(request_id);
    const unsigned shard = it != call_shards_.end() ? it->second : 0;
    std::size_t& current = target_of(shard);
    if (to == lockds_[current]) move_to(shard, (current + 1) % lockds_.size());
    to = lockds_[target_of(shard)];
  });
  client_->set_resend_hook([this](std::span<std::byte> bytes) {
    const auto d = std::span(reinterpret_cast<std::uint8_t*>(bytes.data()), bytes.size());
    if (pending_ && d.size() >= wire::kHeaderBytes && key_id_in(d) == pending_->key.key_id)
      sender_.restamp(d, pending_->auth, pending_->key.key_id);
    else
      sender_.restamp(d);
  });
}

LockdLink::~LockdLink() {
  for (auto& [id, c] : waiting_)
    if (c->wait_timer.valid()) loop_.cancel_timer(c->wait_timer);
}

LockdLink::PendingKey::~PendingKey() { OPENSSL_cleanse(key.bytes.data(), key.bytes.size()); }

const wire::Authenticator* LockdLink::answer_key(std::span<const std::uint8_t> answer, bool pending_allowed) {
  // The key whose id the answer names: ours, or the previous one for an answer to a request
  // sent before a rekey.
  if (answer.size() < wire::kHeaderBytes) return nullptr;
  const std::uint16_t id = key_id_in(answer);
  if (const wire::Authenticator* a = keys_->find(WorkerId{}, id).auth) return a;
  if (pending_allowed && pending_ && id == pending_->key.key_id) return &pending_->auth;
  return nullptr;
}

Status LockdLink::check_worker_key(const wire::WireKey& key) const {
  if (key.kind != wire::KeyKind::worker) return Status::invalid("not a worker key");
  if (key.worker != sender_.self())
    return Status::invalid("the key of worker " + key.worker.str() + ", not of this worker (" + sender_.self().str() + ")");
  return {};
}

Status LockdLink::rekey(const wire::WireKey& key) {
  if (Status why = check_worker_key(key); !why.ok()) return why;
  keys_->rotate(key);
  sender_.rekey(key);
  pending_.reset();
  return {};
}

Status LockdLink::try_key(const wire::WireKey& key, std::int64_t deadline_ns, KeyProbeDone done) {
  if (Status why = check_worker_key(key); !why.ok()) return why;
  if (pending_ && pending_->probing)
    return Status{Errc::busy, "the previous reload's key (id " + std::to_string(pending_->key.key_id) +
                                  ") is still being tried; reload again in a moment"};
  if (key.key_id == sender_.key_id() && !pending_) return rekey(key);  // same id: nothing to prove
  pending_.reset(new PendingKey{key, wire::Authenticator(key), false});
  try_pending_key(deadline_ns, std::move(done));
  return {};
}

bool LockdLink::try_pending_key(std::int64_t deadline_ns, KeyProbeDone done) {
  if (!pending_ || pending_->probing) return false;
  auto c = std::make_shared<Call>();
  c->deadline_ns = deadline_ns;
  c->probe = true;
  c->request_id = next_request_id_++;
  const std::uint16_t id = pending_->key.key_id;
  const wire::EncodeResult enc = sender_.seal_with(pending_->auth, id, c->request_id, wire::Stats{}, c->datagram);
  if (!enc) return false;
  pending_->probing = true;
  c->on_done = [this, id, done = std::move(done)](LockdReply r) {
    if (!pending_ || pending_->key.key_id != id) return;  // replaced by a rekey meanwhile
    pending_->probing = false;
    if (r.ok() && r.key_id == id) {
      wire::WireKey k = pending_->key;
      const Status rekeyed = rekey(k);  // resets pending_; the key passed check_worker_key in try_key
      OPENSSL_cleanse(k.bytes.data(), k.bytes.size());
      done(rekeyed);
      return;
    }
    if (r.ok())
      done(Status{Errc::refused, "lockd answered under key id " + std::to_string(r.key_id) + ", not " + std::to_string(id)});
    else
      done(Status{Errc::timeout, r.problem.empty() ? "no answer from lockd to the key probe" : r.problem});
  };
  start(std::move(c));
  return true;
}

void LockdLink::restamp(Call& c) {
  const auto d = c.datagram.buffer().first(c.datagram.size);
  if (c.probe && pending_) sender_.restamp(d, pending_->auth, pending_->key.key_id);
  else sender_.restamp(d);
}

Result<std::unique_ptr<LockdLink>> LockdLink::open(EventLoop& loop, std::vector<SocketAddress> lockds,
                                                   WorkerId self, const wire::WireKey& key,
                                                   const RetryPolicy& retry) {
  if (lockds.empty()) return Status::invalid("no lockd address");
  for (const SocketAddress& a : lockds)
    if (!a.is_set() || a.family() != lockds.front().family())
      return Status::invalid("lockd addresses " + address_list_text(lockds) + " are not all of one family");
  // Bound to the local address the kernel routes to lockd from (not the wildcard): only
  // datagrams to that address reach the socket. Found with a connected probe socket per lockd
  // address; if they differ (lockds on different networks), the wildcard.
  std::optional<SocketAddress> common;
  bool differ = false;
  for (const SocketAddress& a : lockds) {
    const std::optional<SocketAddress> local = local_address_towards(a);
    if (!local || (common && !(*common == *local))) differ = true;
    if (local && !common) common = local;
  }
  const SocketAddress lockd = lockds.front();
  std::unique_ptr<LockdLink> link(new LockdLink(loop, std::move(lockds), self, key, retry));
  SocketAddress any{};
  if (lockd.family() == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&any.storage);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    any.length = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&any.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    any.length = sizeof(sockaddr_in);
  }
  if (common && !differ) any = *common;
  const int rc = link->client_->open(any);
  if (rc != 0) return Status::from_errno(rc, "cannot open the UDP socket to lockd");
  set_socket_buffers(link->loop_.socket_fd(link->client_->socket()), 4 << 20, 4 << 20);
  link->client_->set_unsolicited_handler([l = link.get()](const Datagram& d) { l->on_unsolicited(d); });
  return link;
}

std::shared_ptr<LockdLink::Call> LockdLink::new_call(std::int64_t deadline_ns, LockdCallback on_done) {
  auto c = std::make_shared<Call>();
  c->deadline_ns = deadline_ns;
  // The caller's logic reads no clock: the answer brings the time it is handled at.
  c->on_done = [done = std::move(on_done)](LockdReply r) {
    r.now_ns = boottime_ns();
    done(std::move(r));
  };
  c->request_id = next_request_id_++;
  return c;
}

void LockdLink::start_sealed(std::shared_ptr<Call> c, const wire::EncodeResult& enc, wire::MessageType type) {
  if (!enc) {
    LockdReply r;
    r.problem = std::string("cannot encode ") + std::string(wire::to_string(type)) + ": " +
                std::string(wire::to_string(enc.error));
    c->on_done(std::move(r));
    return;
  }
  start(std::move(c));
}

void LockdLink::call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) {
  std::shared_ptr<Call> c = new_call(deadline_ns, std::move(on_done));
  // Routed by name (wire/shard_route.hpp); a request about no name (Stats, List) goes to
  // shard 0's target, which any lockd of the cluster answers for itself.
  if (const auto rs = wire::shard_of_request(body, shards())) c->shard = rs->shard;
  const wire::EncodeResult enc = sender_.seal(c->request_id, body, c->datagram);
  start_sealed(std::move(c), enc, wire::type_of(body));
}

void LockdLink::call_heartbeat(std::span<const wire::HeartbeatEntry> entries, std::uint32_t ttl_cap_ms,
                               std::int64_t deadline_ns, LockdCallback on_done) {
  std::shared_ptr<Call> c = new_call(deadline_ns, std::move(on_done));
  if (const auto rs = wire::shard_of_heartbeat(entries, shards())) c->shard = rs->shard;
  const wire::EncodeResult enc = sender_.seal_heartbeat(c->request_id, ttl_cap_ms, entries, c->datagram);
  start_sealed(std::move(c), enc, wire::MessageType::heartbeat);
}

void LockdLink::start(std::shared_ptr<Call> c) {
  call_shards_[c->request_id] = c->shard;
  const int rc = client_->start(std::as_bytes(c->datagram.view()), lockds_[target_of(c->shard)], c->deadline_ns,
                                [this, c](const RequestOutcome& o) { finish(c, o); });
  if (rc != 0) {
    call_shards_.erase(c->request_id);
    LockdReply r;
    r.first_send_ns = c->first_send_ns;
    r.attempts = c->attempts;
    r.problem = rc != -ETIMEDOUT            ? std::string("cannot send to lockd: ") + std::strerror(-rc)
                : !c->redirected.empty() ? no_leader_text(*c)
                                         : "no answer from lockd before the deadline";
    c->on_done(std::move(r));
  }
}

void LockdLink::fail(const std::shared_ptr<Call>& c, std::string problem) {
  ++stats_.calls_unanswered;
  stats_.last_unanswered_ns = loop_.turn_now_ns();
  LockdReply r;
  r.status = RequestStatus::deadline_passed;
  r.first_send_ns = c->first_send_ns;
  r.attempts = c->attempts;
  r.problem = std::move(problem);
  c->on_done(std::move(r));
}

std::string LockdLink::no_leader_text(const Call& c) const {
  return "no lockd among " + address_list_text(lockds_) + " leads (" + std::to_string(c.attempts) +
         " attempt(s); last: " + c.redirected + ")";
}

std::optional<std::size_t> LockdLink::index_of(const SocketAddress& a) const {
  for (std::size_t i = 0; i < lockds_.size(); ++i)
    if (lockds_[i] == a) return i;
  return std::nullopt;
}

void LockdLink::move_to(unsigned shard, std::size_t index) {
  std::size_t& current = target_of(shard);
  if (index == current || index >= lockds_.size()) return;
  current = index;
  ++stats_.leader_switches;
}

std::size_t& LockdLink::target_of(unsigned shard) { return current_[shard < current_.size() ? shard : 0]; }

void LockdLink::set_shards(unsigned shards) {
  if (shards < 1 || shards > kShardsMax || shards == current_.size()) return;
  // A shard's first target: shard 0's (the lockd that answered so far); hints move it.
  current_.resize(shards, current_.front());
}

void LockdLink::finish(const std::shared_ptr<Call>& c, const RequestOutcome& o) {
  call_shards_.erase(c->request_id);
  if (c->first_send_ns == 0) c->first_send_ns = o.first_send_ns;  // the lease counts from here
  c->attempts += o.attempts;
  if (o.status != RequestStatus::answered) {
    ++stats_.calls_unanswered;
    stats_.last_unanswered_ns = loop_.turn_now_ns();
    LockdReply r;
    r.status = o.status;
    r.first_send_ns = c->first_send_ns;
    r.attempts = c->attempts;
    r.problem = !c->redirected.empty() ? no_leader_text(*c)
                : lockds_.size() > 1
                    ? "no answer from lockd at " + address_list_text(lockds_) + " (" + to_string(o.status) + ", " +
                          std::to_string(c->attempts) + " attempt(s))"
                    : std::string("no answer from lockd (") + to_string(o.status) + ", " +
                          std::to_string(c->attempts) + " attempt(s))";
    c->on_done(std::move(r));
    return;
  }
  on_answer(c, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(o.answer.data()), o.answer.size()),
            o.from);
}

void LockdLink::on_answer(const std::shared_ptr<Call>& c, std::span<const std::uint8_t> span,
                          const SocketAddress& from) {
  LockdReply r;
  r.status = RequestStatus::answered;
  r.first_send_ns = c->first_send_ns;
  r.attempts = c->attempts;
  const std::uint16_t answer_key_id = span.size() >= wire::kHeaderBytes ? key_id_in(span) : 0;
  const wire::Authenticator* verify = answer_key(span, c->probe);
  r.key_id = answer_key_id;
  wire::DecodeResult d = verify != nullptr ? wire::decode(span, verify) : wire::DecodeResult{};
  if (verify == nullptr) {
    d.error = wire::DecodeError::unknown_key;
    d.detail = "an answer under key id " + std::to_string(answer_key_id) + ", which this worker does not have";
  }
  if (!d) {
    ++stats_.answers_bad;
    r.status = RequestStatus::deadline_passed;
    r.problem = "lockd's answer was rejected: " + std::string(wire::to_string(d.error)) + " " + d.detail;
    c->on_done(std::move(r));
    return;
  }
  ++stats_.calls_answered;  // authentic: lockd is reachable, whatever it answered
  stats_.last_answer_ns = loop_.turn_now_ns();
  if (const auto* e = std::get_if<wire::Error>(&d.body); e != nullptr && e->code == wire::ErrorCode::not_leader) {
    // Authenticated, so a lockd's: it changed nothing, and names the leader if it knows one.
    ++stats_.not_leader_answers;
    redirect(c, e->message, from);
    return;
  }
  if (const auto* e = std::get_if<wire::Error>(&d.body);
      e != nullptr && e->seq_floor != 0 && c->resyncs < lockds_.size() + 1 && !wire::seq_resync_ablated() &&
      (e->code == wire::error_code_of(wire::DecodeError::stale_seq) ||
       e->code == wire::error_code_of(wire::DecodeError::replayed))) {
    // Authenticated with our key, so lockd's: our seq restarted below its window (a restart
    // after the wall clock stepped back). Continue above it; nothing was executed. Each lockd
    // has a window of its own: at most one resync per lockd address (and one more) per call.
    ++stats_.seq_resyncs;
    ++c->resyncs;
    sender_.advance_to(e->seq_floor);
    restamp(*c);
    if (boottime_ns() < c->deadline_ns) {
      start(c);
      return;
    }
  }
  r.body = std::move(d.body);
  c->on_done(std::move(r));
}

void LockdLink::redirect(const std::shared_ptr<Call>& c, const std::string& hint, const SocketAddress& from) {
  // Indices into lockds_, kNone for "not a configured address" (plain integers: GCC's -O2 flow
  // analysis reports optionals compared here as maybe-uninitialized).
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  const std::optional<SocketAddress> hinted = hint.empty() ? std::nullopt : SocketAddress::parse(hint);
  const std::size_t named = hinted ? index_of(*hinted).value_or(kNone) : kNone;
  const std::size_t answered_by = index_of(from).value_or(kNone);
  c->redirected = "lockd at " + from.str() + " answered not_leader, " +
                  (hint.empty() ? std::string("no leader known")
                                : "leader \"" + hint + "\"" + (named != kNone ? "" : ", not a configured address"));
  if (hinted && named == kNone) {
    ++stats_.unconfigured_leader_hints;
    if (hint != last_unconfigured_hint_) {
      last_unconfigured_hint_ = hint;
      if (unconfigured_leader_) unconfigured_leader_(hint, from);
    }
  }
  const std::int64_t now = boottime_ns();
  if (now >= c->deadline_ns) {
    fail(c, no_leader_text(*c));
    return;
  }
  if (named != kNone && named != answered_by && c->redirects < lockds_.size()) {
    ++c->redirects;
    move_to(c->shard, named);
    restamp(*c);
    start(c);
    return;
  }
  // No leader to go to by name: past the lockd that answered (if it is still the target), after
  // a backoff that grows with every wait of this call.
  if (answered_by == kNone || answered_by == target_of(c->shard))
    move_to(c->shard, (target_of(c->shard) + 1) % lockds_.size());
  c->redirects = 0;
  ++c->waits;
  ++stats_.not_leader_waits;
  const std::int64_t at = std::min(now + backoff_delay_ns(retry_, std::min<std::uint32_t>(c->waits, 64), &rng_),
                                   c->deadline_ns);
  c->wait_timer = loop_.add_timer_at(at, [this, id = c->request_id] { resume(id); });
  if (!c->wait_timer.valid()) {
    fail(c, no_leader_text(*c) + "; no timer left to wait for a leader");
    return;
  }
  waiting_.emplace(c->request_id, c);
}

void LockdLink::resume(std::uint64_t request_id) {
  const auto it = waiting_.find(request_id);
  if (it == waiting_.end()) return;
  std::shared_ptr<Call> c = std::move(it->second);
  waiting_.erase(it);
  c->wait_timer = {};
  if (boottime_ns() >= c->deadline_ns) {
    fail(c, no_leader_text(*c));
    return;
  }
  restamp(*c);
  start(std::move(c));
}

void LockdLink::on_unsolicited(const Datagram& d) {
  const auto span = std::span<const std::uint8_t>(
      reinterpret_cast<const std::uint8_t*>(d.payload.data()), d.payload.size());
  const SocketAddress from = d.source_address();
  // lockd dropped one of our datagrams for its key. Unauthenticated, so it ends nothing: it
  // only lets the health text name the likely cause when calls then go unanswered. Only from a
  // configured lockd address: a sandbox on this host can send datagrams to our port, but not
  // from lockd's address and port.
  if (const auto notice = wire::decode_key_rejected(span)) {
    if (!index_of(from)) {
      ++stats_.is_running_rejected;
      return;
    }
    ++stats_.key_rejected_notices;
    stats_.last_key_rejected_ns = loop_.turn_now_ns();
    stats_.last_key_rejected = *notice;
    return;
  }
  // An answer to a call that waits out a not_leader backoff (it is in no RequestClient slot):
  // a lockd's authentic answer ends it, as it would have ended the attempt in flight.
  if (!waiting_.empty()) {
    const std::optional<std::uint64_t> id = wire::request_id_of(d.payload);
    const auto it = id ? waiting_.find(*id) : waiting_.end();
    if (it != waiting_.end()) {
      const wire::Authenticator* a = answer_key(span, true);
      if (a != nullptr && wire::is_answer_to(span, *a, sender_.self())) {
        std::shared_ptr<Call> c = std::move(it->second);
        waiting_.erase(it);
        if (c->wait_timer.valid()) loop_.cancel_timer(c->wait_timer);
        c->wait_timer = {};
        on_answer(c, span, from);
        return;
      }
    }
  }
  // Ours, sent back at us (it would pass the tag check: our key): lockd never speaks as us.
  if (const auto k = wire::key_ref_of(span); k && k->sender == sender_.self()) {
    ++stats_.is_running_rejected;
    return;
  }
  wire::Admission a = receiver_.admit(span, &from, boottime_ns());
  wire::Datagram out;
  switch (a.verdict) {
    case wire::Verdict::drop:
      ++stats_.is_running_rejected;
      return;
    case wire::Verdict::resend:
      loop_.send_to(client_->socket(), std::as_bytes(a.cached_answer), &from);
      return;
    case wire::Verdict::answer_error: {
      if (!wire::is_request(a.message.header.type)) return;  // never answer an answer
      ++stats_.is_running_rejected;
      if (sender_.seal(a.message.header.request_id, wire::error_answer(a), out))
        loop_.send_to(client_->socket(), std::as_bytes(out.view()), &from);
      return;
    }
    case wire::Verdict::deliver:
      break;
  }
  if (!wire::is_request(a.message.header.type)) {
    ++stats_.late_answers;
    if (late_answer_) late_answer_(a.message.body);
    return;
  }
  const auto* q = std::get_if<wire::IsRunning>(&a.message.body);
  const auto* rv = std::get_if<wire::Revoked>(&a.message.body);
  wire::Body answer;
  if (rv != nullptr) {
    wire::RevokedAck ack;
    ack.name_id = rv->name_id;
    ack.epoch = rv->epoch;
    ack.running = revoked_ ? revoked_(*rv) : false;
    ++stats_.revocations_pushed;
    answer = ack;
  } else if (q == nullptr) {
    ++stats_.is_running_rejected;
    wire::Error e;
    e.code = wire::ErrorCode::unsupported;
    e.message = "a supervisor answers only is_running and revoked";
    answer = e;
  } else {
    wire::RunningAnswer r;
    r.name_id = q->name_id;
    r.sandbox = q->sandbox;
    r.epoch = q->epoch;
    r.running = is_running_ ? is_running_(*q) : false;
    ++stats_.is_running_answered;
    answer = r;
  }
  if (sender_.seal(a.message.header.request_id, answer, out)) {
    receiver_.remember_answer(a.key, out.view(), from);
    loop_.send_to(client_->socket(), std::as_bytes(out.view()), &from);
  }
}

std::string describe_answer(const wire::Body& body) {
  if (const auto* g = std::get_if<wire::Grant>(&body))
    return "granted at epoch " + std::to_string(g->epoch) + " (" +
           std::string(leasehold::to_string(g->state)) + ", ttl " + std::to_string(g->ttl_ms) + " ms)";
  if (const auto* d = std::get_if<wire::Deny>(&body)) {
    std::string s = "refused: " + std::string(to_string(d->refusal));
    if (!d->holder.is_nil()) s += ", holder " + d->holder.str();
    s += ", epoch " + std::to_string(d->epoch) + ", state " + std::string(leasehold::to_string(d->state));
    return s;
  }
  if (const auto* e = std::get_if<wire::Error>(&body))
    return "lockd error " + std::string(wire::to_string(e->code)) + ": " + e->message;
  if (const auto* o = std::get_if<wire::Ok>(&body)) return "ok at epoch " + std::to_string(o->epoch);
  return std::string("answer ") + std::string(wire::to_string(wire::type_of(body)));
}

}  // namespace leasehold
