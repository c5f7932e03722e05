// Replay window, response cache and the receiver/sender policy (wire/replay.hpp).
#include "leasehold/lease/assert.hpp"
#include "leasehold/wire/replay.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

namespace leasehold::wire {

// ---- ReplayWindow (RFC 4303 §3.4.3) ------------------------------------------------------------

DecodeError ReplayWindow::check(std::uint64_t seq) const noexcept {
  if (seq == 0) return DecodeError::stale_seq;
  if (seq >= kSeqLimit) return DecodeError::seq_out_of_range;  // so highest_ + 1 never overflows
  if (seq > highest_) return DecodeError::none;
  const std::uint64_t behind = highest_ - seq;
  if (behind >= kReplayWindowSeqs) return DecodeError::stale_seq;
  return (bitmap_ >> behind) & 1u ? DecodeError::replayed : DecodeError::none;
}

void ReplayWindow::record(std::uint64_t seq) noexcept {
  // Recording a seq already seen (or below the window) means a caller skipped check(): the
  // replay it let through is the one this window exists to stop.
  LEASEHOLD_ASSERT_SLOW(check(seq) == DecodeError::none || check(seq) == DecodeError::seq_out_of_range);  // (ablation)
  if (seq > highest_) {
    const std::uint64_t shift = seq - highest_;
    bitmap_ = shift >= kReplayWindowSeqs ? 0 : bitmap_ << shift;
    bitmap_ |= 1u;
    highest_ = seq;
  } else {
    bitmap_ |= std::uint64_t{1} << (highest_ - seq);
  }
}

void ReplayWindow::raise_floor(std::uint64_t seq) noexcept {
  if (seq <= highest_ || seq >= kSeqLimit) return;
  highest_ = seq;
  bitmap_ = ~std::uint64_t{0};
}

std::uint64_t seq_seed() noexcept {
  // Test hook: a seed as if the wall clock had been stepped (tests of restarts after a step).
  if (const char* forced = std::getenv("LEASEHOLD_TEST_SEQ_SEED"); forced != nullptr && *forced != '\0') {
    const std::uint64_t v = std::strtoull(forced, nullptr, 10);
    if (v != 0 && v < kSeqLimit) return v;
  }
  const std::uint64_t ns = realtime_ns();
  return ns == 0 || ns >= kSeqLimit ? 1 : ns;  // kSeqLimit ns is the year 2262
}

std::uint64_t realtime_ns() noexcept {
  timespec ts{};
  if (::clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

bool seq_resync_ablated() noexcept {
  const char* a = std::getenv("LEASEHOLD_ABLATE");
  return a != nullptr && std::strstr(a, "no-seq-resync") != nullptr;
}

// ---- Sender ------------------------------------------------------------------------------------

Sender::Sender(WorkerId self, std::uint64_t first_seq, const WireKey& key)
    : self_(self), next_seq_(first_seq == 0 ? 1 : first_seq), key_id_(key.key_id), auth_(key) {}

EncodeResult Sender::seal_into(const Authenticator& auth, std::uint16_t key_id, std::uint64_t request_id,
                               const Body& body, std::span<std::uint8_t> out, std::uint16_t flags) noexcept {
  if (next_seq_ >= kSeqLimit) return EncodeResult{0, EncodeError::seq_exhausted};  // lockd would refuse it
  Header h;
  h.flags = flags;
  h.sender = self_;
  h.seq = next_seq_;
  h.request_id = request_id;
  h.key_id = key_id;
  const EncodeResult r = encode(h, body, &auth, out);
  if (r) ++next_seq_;  // a seq is used up only by a datagram that exists
  return r;
}

EncodeResult Sender::seal_heartbeat(std::uint64_t request_id, std::uint32_t ttl_cap_ms,
                                    std::span<const HeartbeatEntry> entries, Datagram& out) noexcept {
  out.size = 0;
  if (next_seq_ >= kSeqLimit) return EncodeResult{0, EncodeError::seq_exhausted};
  Header h;
  h.sender = self_;
  h.seq = next_seq_;
  h.request_id = request_id;
  h.key_id = key_id_;
  const EncodeResult r = encode_heartbeat(h, ttl_cap_ms, entries, &auth_, out.buffer());
  if (r) ++next_seq_;
  out.size = static_cast<std::uint16_t>(r.bytes);
  return r;
}

EncodeResult Sender::seal(std::uint64_t request_id, const Body& body, std::span<std::uint8_t> out,
                          std::uint16_t flags) noexcept {
  return seal_into(auth_, key_id_, request_id, body, out, flags);
}

EncodeResult Sender::seal_with(const Authenticator& auth, std::uint16_t key_id, std::uint64_t request_id,
                               const Body& body, Datagram& out, std::uint16_t flags) noexcept {
  const EncodeResult r = seal_into(auth, key_id, request_id, body, out.buffer(), flags);
  out.size = static_cast<std::uint16_t>(r.bytes);
  return r;
}

void Sender::rekey(const WireKey& key) {
  auth_ = Authenticator(key);
  key_id_ = key.key_id;
}

bool Sender::restamp(std::span<std::uint8_t> datagram) noexcept { return restamp(datagram, auth_, key_id_); }

bool Sender::restamp(std::span<std::uint8_t> datagram, const Authenticator& auth, std::uint16_t key_id) noexcept {
  if (next_seq_ >= kSeqLimit) return false;
  if (datagram.size() < kDatagramBytesMin) return false;
  datagram[kHeaderBytes - 2] = static_cast<std::uint8_t>(key_id & 0xFF);  // key_id, little-endian
  datagram[kHeaderBytes - 1] = static_cast<std::uint8_t>(key_id >> 8);
  if (!wire::restamp(datagram, next_seq_, auth)) return false;
  ++next_seq_;
  return true;
}

EncodeResult Sender::seal(std::uint64_t request_id, const Body& body, Datagram& out, std::uint16_t flags) noexcept {
  const EncodeResult r = seal(request_id, body, out.buffer(), flags);
  out.size = static_cast<std::uint16_t>(r.bytes);
  return r;
}

// ---- Receiver ----------------------------------------------------------------------------------

std::string_view to_string(Verdict v) noexcept {
  switch (v) {
    case Verdict::deliver: return "deliver";
    case Verdict::resend: return "resend";
    case Verdict::answer_error: return "answer_error";
    case Verdict::drop: return "drop";
  }
  return "unknown";
}

Error error_answer(const Admission& a) {
  Error e;
  e.code = error_code_of(a.reason);
  e.message = a.detail.substr(0, kErrorTextBytesMax);
  e.seq_floor = a.seq_floor;
  return e;
}

namespace {

struct CacheKey {
  WorkerId sender;
  std::uint64_t request_id = 0;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};
struct CacheKeyHash {
  std::size_t operator()(const CacheKey& k) const noexcept {
    return std::hash<WorkerId>{}(k.sender) ^ static_cast<std::size_t>(k.request_id * 0xC2B2AE3D27D4EB4FULL);
  }
};

// FNV-1a 64 over the type byte and the payload: tells a retry from a different request that
// reuses the request id. Not a security boundary (the datagram is already authenticated). Never
// kNoDigest.
std::uint64_t request_digest(std::span<const std::uint8_t> datagram, const Header& h) noexcept {
  std::uint64_t x = 0xcbf29ce484222325ULL;
  auto mix = [&x](std::uint8_t b) {
    x ^= b;
    x *= 0x100000001b3ULL;
  };
  mix(static_cast<std::uint8_t>(h.type));
  const std::size_t end = std::min<std::size_t>(datagram.size() - kTagBytes, kHeaderBytes + h.payload_len);
  for (std::size_t i = kHeaderBytes; i < end; ++i) mix(datagram[i]);
  return x == kNoDigest ? 1 : x;
}

// The key admit() hands out: with the digest only for a type whose answers may be cached or
// deferred. A heartbeat's payload (up to 29 entries) is the bulk of what lockd reads, and its
// digest would never be compared with anything.
RequestKey request_key(std::span<const std::uint8_t> datagram, const Header& h) noexcept {
  return RequestKey{h.sender, h.request_id,
                    answer_may_be_cached(h.type) ? request_digest(datagram, h) : kNoDigest};
}

// The digest of the request admitted, computed now if request_key() left it out (a heartbeat
// that reuses the request id of a cached or deferred request: told apart from it like any other).
std::uint64_t digest_of(const RequestKey& key, std::span<const std::uint8_t> datagram, const Header& h) noexcept {
  return key.digest != kNoDigest ? key.digest : request_digest(datagram, h);
}

// Byte-wise: both come from the kernel (recvmsg) the same way. (leasehold_wire does not link the
// socket library, whose operator== this equals for such addresses.)
bool same_address(const SocketAddress& a, const SocketAddress& b) noexcept {
  return a.length == b.length && std::memcmp(&a.storage, &b.storage, a.length) == 0;
}

}  // namespace

struct Receiver::State {
  std::unique_ptr<Keyring> keys;
  Limits limits;
  DecodeStats stats;

  // Replay windows, least recently heard sender at the back. Admin senders have their own
  // windows: an admin key cannot move a worker's window by claiming its id.
  struct WindowKey {
    WorkerId sender;
    bool admin = false;
    friend bool operator==(const WindowKey&, const WindowKey&) = default;
  };
  struct WindowKeyHash {
    std::size_t operator()(const WindowKey& k) const noexcept {
      return std::hash<WorkerId>{}(k.sender) ^ static_cast<std::size_t>(k.admin);
    }
  };
  struct SenderWindow {
    WindowKey key;
    ReplayWindow window;
    std::int64_t last_error_ns = INT64_MIN;  ///< last replay/stale error answered
    SocketAddress last_from;                 ///< where the last datagram the window took came from
    std::int64_t last_taken_ns = INT64_MIN;  ///< when
    std::int64_t last_foreign_error_ns = INT64_MIN;  ///< last stale_seq answered to another address
    void take(std::uint64_t seq, const SocketAddress* from, std::int64_t now_ns) noexcept {
      window.record(seq);
      if (from != nullptr) last_from = *from;
      last_taken_ns = now_ns;
    }
  };
  std::list<SenderWindow> lru;
  std::unordered_map<WindowKey, std::list<SenderWindow>::iterator, WindowKeyHash> windows;

  // Response cache: a ring of slots (FIFO eviction) indexed by (sender, request_id).
  struct Slot {
    RequestKey key;
    SocketAddress to;  ///< where the answer went: resends go only there
    std::int64_t last_resend_ns = 0;
    std::uint32_t resends = 0;
    std::uint16_t size = 0;
    std::array<std::uint8_t, kDatagramBytesMax> bytes{};
  };
  std::vector<Slot> slots;  // grows to limits.cached_answers_max
  std::size_t next_slot = 0;
  std::unordered_map<CacheKey, std::size_t, CacheKeyHash> cache;

  // Requests delivered whose answer is deferred (see defer()): digest and expiry per request.
  struct InFlight {
    std::uint64_t digest = 0;
    std::int64_t expires_ns = 0;
  };
  std::unordered_map<CacheKey, InFlight, CacheKeyHash> in_flight;

  void expire_in_flight(std::int64_t now_ns) {
    std::erase_if(in_flight, [now_ns](const auto& e) { return e.second.expires_ns <= now_ns; });
  }

  State(std::unique_ptr<Keyring> k, Limits l) : keys(std::move(k)), limits(l) {
    if (!keys) throw std::invalid_argument("Receiver: no keyring");
    if (limits.senders_max == 0) throw std::invalid_argument("Receiver: senders_max must be at least 1");
    if (limits.in_flight_expiry_ns <= 0)
      throw std::invalid_argument("Receiver: in_flight_expiry_ns must be positive");
    windows.reserve(std::min<std::size_t>(limits.senders_max, 1024));
  }

  SenderWindow& window_of(const WindowKey& key) {
    if (auto it = windows.find(key); it != windows.end()) {
      lru.splice(lru.begin(), lru, it->second);  // most recently heard to the front
      return *it->second;
    }
    if (windows.size() >= limits.senders_max) {  // evict the least recently heard
      windows.erase(lru.back().key);
      lru.pop_back();
    }
    lru.push_front(SenderWindow{key, ReplayWindow{}, INT64_MIN, SocketAddress{}, INT64_MIN, INT64_MIN});
    windows.emplace(key, lru.begin());
    return lru.front();
  }
};

Receiver::Receiver(const WireKey& key) : Receiver(key, Limits{}) {}
Receiver::Receiver(const WireKey& key, Limits limits)
    : Receiver(std::make_unique<SingleKeyring>(key), limits) {}
Receiver::Receiver(std::unique_ptr<Keyring> keys, Limits limits)
    : state_(std::make_unique<State>(std::move(keys), limits)) {}
Receiver::~Receiver() = default;

Admission Receiver::admit(std::span<const std::uint8_t> datagram, const SocketAddress* from,
                          std::int64_t now_ns) {
  State& s = *state_;
  Admission a;
  // The key first: which one depends on who the datagram claims to be and its key id.
  KeyMatch match;
  if (const std::optional<KeyRef> ref = key_ref_of(datagram); ref && datagram.size() <= kDatagramBytesMax) {
    match = s.keys->find(ref->sender, ref->key_id);
    if (match.auth == nullptr) {
      a.verdict = Verdict::drop;
      a.reason = DecodeError::unknown_key;
      a.detail = "no key with id " + std::to_string(ref->key_id) + " for sender " + ref->sender.str();
      s.stats.count(a.reason);
      return a;
    }
  }
  const DecodeError header_error = decode_header(datagram, match.auth, a.message.header);
  const Header& h = a.message.header;
  a.authority = match.authority;
  a.key_id = h.key_id;
  a.auth = match.auth;
  if (header_error != DecodeError::none) {
    a.reason = header_error;
    if (is_authenticated_reason(header_error)) {
      // Authentic: the sender deserves an answer. decode() gives the text.
      a.verdict = Verdict::answer_error;
      a.detail = decode(datagram, nullptr).detail;
      a.key = request_key(datagram, h);
    } else {
      a.verdict = Verdict::drop;
      a.detail = std::string(to_string(header_error));
      a.authority = Authority::none;
      a.auth = nullptr;
    }
    s.stats.count(header_error);
    return a;
  }
  a.key = request_key(datagram, h);

  const bool admin_window = match.authority == Authority::admin || match.authority == Authority::root;
  State::SenderWindow& sw = s.window_of(State::WindowKey{h.sender, admin_window});
  ReplayWindow& window = sw.window;
  DecodeError seq_error = window.check(h.seq);
  if (s.limits.ablate_seq_limit && seq_error == DecodeError::seq_out_of_range)
    seq_error = h.seq > window.highest() ? DecodeError::none : DecodeError::replayed;
  // One datagram may not move the window far ahead of this receiver's clock (replay.hpp):
  // checked before the cache, so no path records such a seq.
  if (seq_error == DecodeError::none && h.seq > window.highest() && !s.limits.ablate_seq_jump) {
    const std::uint64_t now_real = realtime_ns();
    if (now_real != 0 && h.seq > now_real && h.seq - now_real > kSeqAheadMaxNs) seq_error = DecodeError::seq_jump;
  }

  // A retry (new seq) or a duplicate (replayed seq) of an answered request: the same bytes again,
  // only to where they went first, only while the seq is inside the window, at a bounded rate.
  if (auto it = s.cache.find(CacheKey{h.sender, h.request_id}); it != s.cache.end() &&
                                                             seq_error != DecodeError::stale_seq &&
                                                             seq_error != DecodeError::seq_out_of_range &&
                                                             seq_error != DecodeError::seq_jump) {
    State::Slot& slot = s.slots[it->second];
    if (slot.key.digest == digest_of(a.key, datagram, h)) {
      if (seq_error == DecodeError::none) sw.take(h.seq, from, now_ns);
      a.verdict = Verdict::drop;
      const bool bounded = !s.limits.ablate_reflection_bounds;
      if (bounded && from != nullptr && slot.to.is_set() && !same_address(slot.to, *from)) {
        a.detail = "a retry of request id " + std::to_string(h.request_id) + " from another address";
        ++s.stats.resends_refused_source;
        return a;
      }
      if (bounded && (slot.resends >= kResendsPerAnswerMax ||
                      (slot.resends != 0 && now_ns - slot.last_resend_ns < kResendIntervalNs))) {
        a.detail = "request id " + std::to_string(h.request_id) + "'s answer was resent too often";
        ++s.stats.resends_refused_rate;
        return a;
      }
      ++slot.resends;
      slot.last_resend_ns = now_ns;
      a.verdict = Verdict::resend;
      a.cached_answer = std::span<const std::uint8_t>(slot.bytes.data(), slot.size);
      ++s.stats.resent;
      return a;
    }
    if (seq_error == DecodeError::none) {
      sw.take(h.seq, from, now_ns);
      a.verdict = Verdict::answer_error;
      a.reason = DecodeError::request_id_reused;
      a.detail = "request id " + std::to_string(h.request_id) + " was already used for a different " +
                 std::string(to_string(h.type)) + " request; use a new id for a new request";
      s.stats.count(a.reason);
      return a;
    }
  }

  // A retry (new seq) or a duplicate (replayed seq) of a request whose answer is still pending:
  // that answer will be sent and cached, so this copy is dropped. Rejecting it as replayed, or
  // executing it again, would race the real answer.
  if (auto it = s.in_flight.find(CacheKey{h.sender, h.request_id}); it != s.in_flight.end()) {
    if (it->second.expires_ns <= now_ns) {
      s.in_flight.erase(it);
    } else if (it->second.digest == digest_of(a.key, datagram, h)) {
      if (seq_error == DecodeError::none) sw.take(h.seq, from, now_ns);
      a.verdict = Verdict::drop;
      a.reason = DecodeError::none;
      a.detail = "retry of request id " + std::to_string(h.request_id) + " while its answer is pending";
      ++s.stats.in_flight_retries;
      return a;
    }
  }

  if (seq_error != DecodeError::none) {
    a.reason = seq_error;
    a.seq_floor = window.highest() + 1;  // highest < kSeqLimit: no overflow
    switch (seq_error) {
      case DecodeError::replayed:
        a.detail = "seq " + std::to_string(h.seq) + " was already received from this sender";
        break;
      case DecodeError::seq_out_of_range:
        a.detail = "seq " + std::to_string(h.seq) + " is at or above 2^63, which no sender makes; refused";
        break;
      case DecodeError::seq_jump:
        a.detail = "seq " + std::to_string(h.seq) + " is more than " + std::to_string(kSeqAheadMaxNs / 1'000'000'000) +
                   " s of nanoseconds above this receiver's wall clock (a sender's seq is seeded from its clock): "
                   "refused; check the sender's clock";
        break;
      default:
        a.detail = "seq " + std::to_string(h.seq) + " is below this sender's replay window (highest seq " +
                   std::to_string(window.highest()) + ", window " + std::to_string(kReplayWindowSeqs) +
                   "); continue from seq_floor";
        break;
    }
    s.stats.count(seq_error);
    // Never executed. Answered (so a restarted sender learns seq_floor) at a bounded rate per
    // sender, and only to where the sender's last datagram came from: a captured datagram
    // replayed, from anywhere, is not reflected. A sender restarted on another port (its wall
    // clock stepped back) is answered stale_seq there only once its old address has been silent
    // for kForeignErrorSilenceNs, and at most once per kForeignErrorIntervalNs.
    const bool bounded = !s.limits.ablate_reflection_bounds;
    if (bounded && from != nullptr && sw.last_from.is_set() && !same_address(sw.last_from, *from)) {
      const bool restarted = seq_error == DecodeError::stale_seq && now_ns - sw.last_taken_ns >= kForeignErrorSilenceNs &&
                             (sw.last_foreign_error_ns == INT64_MIN ||
                              now_ns - sw.last_foreign_error_ns >= kForeignErrorIntervalNs);
      if (!restarted) {
        a.verdict = Verdict::drop;
        ++s.stats.error_answers_refused_source;
        return a;
      }
      sw.last_foreign_error_ns = now_ns;
    }
    if (bounded && sw.last_error_ns != INT64_MIN &&
        now_ns - sw.last_error_ns < kErrorAnswerIntervalNs) {
      a.verdict = Verdict::drop;
      ++s.stats.error_answers_suppressed;
      return a;
    }
    sw.last_error_ns = now_ns;
    a.verdict = Verdict::answer_error;
    return a;
  }
  sw.take(h.seq, from, now_ns);

  DecodeResult d = decode_payload(h, datagram);
  a.reason = d.error;
  s.stats.count(d.error);
  if (!d) {
    a.verdict = Verdict::answer_error;
    a.detail = std::move(d.detail);
    return a;
  }
  a.verdict = Verdict::deliver;
  a.message.body = std::move(d.body);
  return a;
}

void Receiver::remember_answer(const RequestKey& request, std::span<const std::uint8_t> answer,
                               const SocketAddress& to) {
  State& s = *state_;
  // A key without a digest (a heartbeat's): a retry could not be told from another request
  // under the same id. Never cached; the retry is executed again (heartbeats are idempotent).
  // Nor does it end the in-flight guard of a request that shares its id.
  if (request.digest == kNoDigest) return;
  s.in_flight.erase(CacheKey{request.sender, request.request_id});
  if (s.limits.cached_answers_max == 0 || answer.size() > kDatagramBytesMax) return;
  const CacheKey ck{request.sender, request.request_id};
  std::size_t index;
  if (auto it = s.cache.find(ck); it != s.cache.end()) {
    index = it->second;  // a new answer for the same request replaces the old one in place
  } else {
    if (s.slots.size() < s.limits.cached_answers_max) {
      s.slots.emplace_back();
      index = s.slots.size() - 1;
    } else {
      index = s.next_slot;
      s.next_slot = (s.next_slot + 1) % s.limits.cached_answers_max;
      const RequestKey& old = s.slots[index].key;
      s.cache.erase(CacheKey{old.sender, old.request_id});
    }
    s.cache.emplace(ck, index);
  }
  State::Slot& slot = s.slots[index];
  slot.key = request;
  slot.to = to;
  slot.last_resend_ns = 0;
  slot.resends = 0;
  slot.size = static_cast<std::uint16_t>(answer.size());
  std::memcpy(slot.bytes.data(), answer.data(), answer.size());
}

bool Receiver::defer(const RequestKey& request, std::int64_t now_ns) {
  State& s = *state_;
  if (request.digest == kNoDigest) return false;  // as remember_answer(): such a key is not tracked
  const CacheKey ck{request.sender, request.request_id};
  if (s.in_flight.size() >= s.limits.in_flight_max && s.in_flight.count(ck) == 0) {
    s.expire_in_flight(now_ns);  // O(in_flight_max), only when the set is full
    if (s.in_flight.size() >= s.limits.in_flight_max) return false;
  }
  s.in_flight[ck] = State::InFlight{request.digest, now_ns + s.limits.in_flight_expiry_ns};
  return true;
}

void Receiver::abandon(const RequestKey& request) noexcept {
  state_->in_flight.erase(CacheKey{request.sender, request.request_id});
}

const DecodeStats& Receiver::stats() const noexcept { return state_->stats; }
std::size_t Receiver::senders() const noexcept { return state_->windows.size(); }

std::uint64_t Receiver::highest_seq(const WorkerId& sender) const noexcept {
  const auto it = state_->windows.find(State::WindowKey{sender, false});
  return it == state_->windows.end() ? 0 : it->second->window.highest();
}

void Receiver::raise_floor(const WorkerId& sender, std::uint64_t seq) {
  state_->window_of(State::WindowKey{sender, false}).window.raise_floor(seq);
}
std::size_t Receiver::cached_answers() const noexcept { return state_->cache.size(); }
std::size_t Receiver::in_flight() const noexcept { return state_->in_flight.size(); }
Keyring& Receiver::keyring() noexcept { return *state_->keys; }

}  // namespace leasehold::wire
