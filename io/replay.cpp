// Replay window, response cache and the receiver/sender policy (io/replay.hpp).
#include "io/replay.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

namespace leasehold::wire {

// ---- ReplayWindow (RFC 4303 §3.4.3) ------------------------------------------------------------

DecodeError ReplayWindow::check(std::uint64_t seq) const noexcept {
  if (seq == 0) return DecodeError::stale_seq;
  if (seq > highest_) return DecodeError::none;
  const std::uint64_t behind = highest_ - seq;
  if (behind >= kReplayWindowSeqs) return DecodeError::stale_seq;
  return (bitmap_ >> behind) & 1u ? DecodeError::replayed : DecodeError::none;
}

void ReplayWindow::record(std::uint64_t seq) noexcept {
  assert(check(seq) == DecodeError::none);
  if (seq > highest_) {
    const std::uint64_t shift = seq - highest_;
    bitmap_ = shift >= kReplayWindowSeqs ? 0 : bitmap_ << shift;
    bitmap_ |= 1u;
    highest_ = seq;
  } else {
    bitmap_ |= std::uint64_t{1} << (highest_ - seq);
  }
}

std::uint64_t seq_seed() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  const auto ns = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
  return ns == 0 ? 1 : ns;
}

// ---- Sender ------------------------------------------------------------------------------------

Sender::Sender(WorkerId self, std::uint64_t first_seq, const WireKey& key)
    : self_(self), next_seq_(first_seq == 0 ? 1 : first_seq), auth_(key) {}

EncodeResult Sender::seal(std::uint64_t request_id, const Body& body, std::span<std::uint8_t> out,
                          std::uint16_t flags) noexcept {
  Header h;
  h.flags = flags;
  h.sender = self_;
  h.seq = next_seq_;
  h.request_id = request_id;
  const EncodeResult r = encode(h, body, &auth_, out);
  if (r) ++next_seq_;  // a seq is used up only by a datagram that exists
  return r;
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
// reuses the request id. Not a security boundary (the datagram is already authenticated).
std::uint64_t request_digest(std::span<const std::uint8_t> datagram, const Header& h) noexcept {
  std::uint64_t x = 0xcbf29ce484222325ULL;
  auto mix = [&x](std::uint8_t b) {
    x ^= b;
    x *= 0x100000001b3ULL;
  };
  mix(static_cast<std::uint8_t>(h.type));
  const std::size_t end = std::min<std::size_t>(datagram.size() - kTagBytes, kHeaderBytes + h.payload_len);
  for (std::size_t i = kHeaderBytes; i < end; ++i) mix(datagram[i]);
  return x;
}

}  // namespace

struct Receiver::State {
  Authenticator auth;
  Limits limits;
  DecodeStats stats;

  // Replay windows, least recently heard sender at the back.
  struct SenderWindow {
    WorkerId sender;
    ReplayWindow window;
  };
  std::list<SenderWindow> lru;
  std::unordered_map<WorkerId, std::list<SenderWindow>::iterator> windows;

  // Response cache: a ring of slots (FIFO eviction) indexed by (sender, request_id).
  struct Slot {
    RequestKey key;
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

  State(const WireKey& key, Limits l) : auth(key), limits(l) {
    if (limits.senders_max == 0) throw std::invalid_argument("Receiver: senders_max must be at least 1");
    if (limits.in_flight_expiry_ns <= 0)
      throw std::invalid_argument("Receiver: in_flight_expiry_ns must be positive");
    windows.reserve(std::min<std::size_t>(limits.senders_max, 1024));
  }

  ReplayWindow& window_of(const WorkerId& sender) {
    if (auto it = windows.find(sender); it != windows.end()) {
      lru.splice(lru.begin(), lru, it->second);  // most recently heard to the front
      return it->second->window;
    }
    if (windows.size() >= limits.senders_max) {  // evict the least recently heard
      windows.erase(lru.back().sender);
      lru.pop_back();
    }
    lru.push_front(SenderWindow{sender, ReplayWindow{}});
    windows.emplace(sender, lru.begin());
    return lru.front().window;
  }
};

Receiver::Receiver(const WireKey& key) : Receiver(key, Limits{}) {}
Receiver::Receiver(const WireKey& key, Limits limits) : state_(std::make_unique<State>(key, limits)) {}
Receiver::~Receiver() = default;

Admission Receiver::admit(std::span<const std::uint8_t> datagram, std::int64_t now_ns) {
  State& s = *state_;
  Admission a;
  const DecodeError header_error = decode_header(datagram, &s.auth, a.message.header);
  const Header& h = a.message.header;
  if (header_error != DecodeError::none) {
    a.reason = header_error;
    if (is_authenticated_reason(header_error)) {
      // Authentic: the sender deserves an answer. decode() gives the text.
      a.verdict = Verdict::answer_error;
      a.detail = decode(datagram, nullptr).detail;
      a.key = RequestKey{h.sender, h.request_id, request_digest(datagram, h)};
    } else {
      a.verdict = Verdict::drop;
      a.detail = std::string(to_string(header_error));
    }
    s.stats.count(header_error);
    return a;
  }
  a.key = RequestKey{h.sender, h.request_id, request_digest(datagram, h)};

  ReplayWindow& window = s.window_of(h.sender);
  const DecodeError seq_error = window.check(h.seq);

  // A retry (new seq) or a duplicate (replayed seq) of an answered request: the same bytes again.
  if (auto it = s.cache.find(CacheKey{h.sender, h.request_id}); it != s.cache.end()) {
    const State::Slot& slot = s.slots[it->second];
    if (slot.key.digest == a.key.digest) {
      if (seq_error == DecodeError::none) window.record(h.seq);
      a.verdict = Verdict::resend;
      a.cached_answer = std::span<const std::uint8_t>(slot.bytes.data(), slot.size);
      ++s.stats.resent;
      return a;
    }
    if (seq_error == DecodeError::none) {
      window.record(h.seq);
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
    } else if (it->second.digest == a.key.digest) {
      if (seq_error == DecodeError::none) window.record(h.seq);
      a.verdict = Verdict::drop;
      a.reason = DecodeError::none;
      a.detail = "retry of request id " + std::to_string(h.request_id) + " while its answer is pending";
      ++s.stats.in_flight_retries;
      return a;
    }
  }

  if (seq_error != DecodeError::none) {
    a.verdict = Verdict::answer_error;
    a.reason = seq_error;
    a.detail = seq_error == DecodeError::replayed
                   ? "seq " + std::to_string(h.seq) + " was already received from this sender"
                   : "seq " + std::to_string(h.seq) + " is below this sender's replay window (highest seq " +
                         std::to_string(window.highest()) + ", window " + std::to_string(kReplayWindowSeqs) +
                         "); a sender's seq must grow, also across restarts";
    s.stats.count(seq_error);
    return a;
  }
  window.record(h.seq);

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

void Receiver::remember_answer(const RequestKey& request, std::span<const std::uint8_t> answer) {
  State& s = *state_;
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
  slot.size = static_cast<std::uint16_t>(answer.size());
  std::memcpy(slot.bytes.data(), answer.data(), answer.size());
}

bool Receiver::defer(const RequestKey& request, std::int64_t now_ns) {
  State& s = *state_;
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
std::size_t Receiver::cached_answers() const noexcept { return state_->cache.size(); }
std::size_t Receiver::in_flight() const noexcept { return state_->in_flight.size(); }
const Authenticator& Receiver::authenticator() const noexcept { return state_->auth; }

}  // namespace leasehold::wire
