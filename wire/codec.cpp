// The wire codec (wire/protocol.hpp): header and payload encoding, and the total decoder.
//
// Encoding sizes the payload first (payload_bytes), so the writer never checks bounds per field.
// Decoding goes through a Reader that checks every read against the payload end and reports the
// first problem with the field name and offset.
#include "leasehold/wire/protocol.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/le_bytes.hpp"
#include "leasehold/lease/assert.hpp"

#include <cstring>
#include <string>

namespace leasehold::wire {
namespace {

/// Written for an enumerator no table row names (only a value cast from junk): the decoder
/// refuses it (bad_value), so a corrupt value never travels as a valid state.
constexpr std::uint8_t kBadCode = 0xFF;
constexpr std::size_t kIdBytes = 16;

// Header field offsets (see the layout table in protocol.hpp).
constexpr std::size_t kOffMagic = 0;
constexpr std::size_t kOffVersion = 4;
constexpr std::size_t kOffType = 5;
constexpr std::size_t kOffFlags = 6;
constexpr std::size_t kOffSender = 8;
constexpr std::size_t kOffSeq = 24;
constexpr std::size_t kOffRequestId = 32;
constexpr std::size_t kOffPayloadLen = 40;
constexpr std::size_t kOffKeyId = 42;
static_assert(kOffKeyId + 2 == kHeaderBytes);
static_assert(kPayloadBytesMax == 1324);
static_assert(2 + kHeartbeatEntriesMax * kHeartbeatAckEntryBytes <= kPayloadBytesMax);
static_assert(2 + (kHeartbeatEntriesMax + 1) * kHeartbeatAckEntryBytes > kPayloadBytesMax);
// A full WorkerHeartbeat and the WorkerAck listing all of its names fit one datagram each.
static_assert(16 + 2 + kWorkerBeatEntriesMax * kHeartbeatEntryBytes <= kPayloadBytesMax);
static_assert(4 + 2 + kWorkerBeatEntriesMax * kHeartbeatAckEntryBytes <= kPayloadBytesMax);

// Little-endian loads and stores: wire/le_bytes.hpp.
std::uint16_t load_u16(const std::uint8_t* p) noexcept { return load_le<std::uint16_t>(p); }
std::uint32_t load_u32(const std::uint8_t* p) noexcept { return load_le<std::uint32_t>(p); }
std::uint64_t load_u64(const std::uint8_t* p) noexcept { return load_le<std::uint64_t>(p); }
void store_u16(std::uint8_t* p, std::uint16_t v) noexcept { store_le(p, v); }
void store_u32(std::uint8_t* p, std::uint32_t v) noexcept { store_le(p, v); }
void store_u64(std::uint8_t* p, std::uint64_t v) noexcept { store_le(p, v); }

// ---- writing -----------------------------------------------------------------------------------

struct Writer {
  std::uint8_t* p;
  void u8(std::uint8_t v) noexcept { *p++ = v; }
  void u16(std::uint16_t v) noexcept { store_u16(p, v); p += 2; }
  void u32(std::uint32_t v) noexcept { store_u32(p, v); p += 4; }
  void u64(std::uint64_t v) noexcept { store_u64(p, v); p += 8; }
  template <class Tag>
  void id(const Id<Tag>& v) noexcept { store_id(p, v); p += kIdBytes; }
  void boolean(bool v) noexcept { u8(v ? 1 : 0); }
  void text8(std::string_view s) noexcept {
    u8(static_cast<std::uint8_t>(s.size()));
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  void text16(std::string_view s) noexcept {
    u16(static_cast<std::uint16_t>(s.size()));
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
};

// Per-type payload size (no validation) ...
std::size_t size_of(const Acquire& m) noexcept { return 2 * kIdBytes + 4 + 1 + 1 + m.name.size(); }
std::size_t size_of(const Wait& m) noexcept { return 2 * kIdBytes + 4 + 1 + m.name.size(); }
std::size_t size_of(const Queued&) noexcept { return 3 * kIdBytes + 4 + 4 + 8 + 1 + 4; }
std::size_t size_of(const Commit&) noexcept { return 3 * kIdBytes + 8; }
std::size_t size_of(const Heartbeat& m) noexcept { return 4 + 2 + m.entries.size() * kHeartbeatEntryBytes; }
std::size_t size_of(const Release&) noexcept { return 2 * kIdBytes + 8; }
std::size_t size_of(const TransferBegin&) noexcept { return 4 * kIdBytes + 8; }
std::size_t size_of(const TransferComplete&) noexcept { return kIdBytes + 8; }
std::size_t size_of(const TransferAccept&) noexcept { return 3 * kIdBytes; }
std::size_t size_of(const Revoke&) noexcept { return kIdBytes + 8 + 1; }
std::size_t size_of(const Revoked&) noexcept { return kIdBytes + 8 + 8; }
std::size_t size_of(const RevokedAck&) noexcept { return kIdBytes + 8 + 1; }
std::size_t size_of(const KillConfirmed&) noexcept { return 2 * kIdBytes + 8; }
std::size_t size_of(const Reassign&) noexcept { return 3 * kIdBytes; }
std::size_t size_of(const WorkerHeartbeat& m) noexcept { return kIdBytes + 2 + m.held.size() * kHeartbeatEntryBytes; }
std::size_t size_of(const IsRunning&) noexcept { return 2 * kIdBytes + 8; }
std::size_t size_of(const List& m) noexcept { return 8 + 2 + (m.waiters ? 1 : 0); }
std::size_t size_of(const Show& m) noexcept {
  return 1 + (m.name.empty() ? kIdBytes : 1 + m.name.size()) + (m.waiters_from ? 4 : 0);
}
std::size_t size_of(const Stats& m) noexcept { return m.first ? 2 : 0; }
std::size_t size_of(const Grant& m) noexcept { return 3 * kIdBytes + 8 + 1 + 4 + 1 + m.token.size(); }
std::size_t size_of(const Deny&) noexcept { return 3 * kIdBytes + 1 + 8 + 1; }
std::size_t size_of(const HeartbeatAck& m) noexcept { return 2 + m.entries.size() * kHeartbeatAckEntryBytes; }
std::size_t size_of(const Ok&) noexcept { return kIdBytes + 8; }
std::size_t size_of(const TransferState&) noexcept { return 3 * kIdBytes + 8 + 8 + 1; }
std::size_t size_of(const WorkerAck& m) noexcept { return 4 + 2 + m.not_held.size() * kHeartbeatAckEntryBytes; }
std::size_t size_of(const RunningAnswer&) noexcept { return 2 * kIdBytes + 8 + 1; }
std::size_t size_of(const NameRecord& r) noexcept {
  return 1 + r.name.size() + 4 * kIdBytes + 1 + 8 + 4 + 1 + 8 + 4 + 1;
}
std::size_t size_of(const ListPage& m) noexcept {
  std::size_t n = 8 + 2;
  for (const auto& r : m.entries) n += size_of(r) + (m.with_waiters ? 4 : 0);
  return n + (m.with_waiters ? 1 : 0);
}
constexpr std::size_t kWaiterRecordBytes = 2 * kIdBytes + 4;
std::size_t size_of(const NameInfo& m) noexcept {
  return size_of(m.record) + (m.with_waiters ? 4 + 4 + 2 + m.waiters.size() * kWaiterRecordBytes : 0);
}
std::size_t size_of(const StatsAnswer& m) noexcept {
  std::size_t n = 2;
  for (const auto& c : m.counters) n += 1 + c.key.size() + 8;
  return n;
}
std::size_t size_of(const Error& m) noexcept { return 2 + 8 + 2 + m.message.size(); }

// ... validation before writing (what the decoder would reject) ...
EncodeError check_name(std::string_view name) {
  return validate_name(name).ok() ? EncodeError::none : EncodeError::invalid_name;
}
template <class M>
EncodeError check(const M&) { return EncodeError::none; }
EncodeError check(const Acquire& m) { return check_name(m.name); }
EncodeError check(const Wait& m) { return check_name(m.name); }
EncodeError check(const Show& m) { return m.name.empty() ? EncodeError::none : check_name(m.name); }
EncodeError check(const NameRecord& r) { return check_name(r.name); }
// Waiter counts and lists are only on the wire in the sections asked for: without one they must
// be empty, or the decoded message would differ from the one encoded.
EncodeError check(const NameInfo& m) {
  if (!m.with_waiters && (m.record.waiters != 0 || m.waiters_from != 0 || !m.waiters.empty()))
    return EncodeError::bad_count;
  if (m.waiters.size() > UINT16_MAX) return EncodeError::bad_count;
  return check(m.record);
}
EncodeError check(const ListPage& m) {
  if (m.entries.size() > kListEntriesMax) return EncodeError::bad_count;
  for (const auto& r : m.entries) {
    if (!m.with_waiters && r.waiters != 0) return EncodeError::bad_count;
    if (auto e = check(r); e != EncodeError::none) return e;
  }
  return EncodeError::none;
}
EncodeError check(const StatsAnswer& m) {
  if (m.counters.size() > kCountersMax) return EncodeError::bad_count;
  for (const auto& c : m.counters)
    if (c.key.empty() || c.key.size() > kCounterKeyBytesMax) return EncodeError::bad_text;
  return EncodeError::none;
}
EncodeError check(const Error& m) {
  return m.message.size() > kErrorTextBytesMax ? EncodeError::bad_text : EncodeError::none;
}

// ... and the writers.
void put(Writer& w, const Acquire& m) {
  w.id(m.sandbox); w.id(m.worker); w.u32(m.ttl_ms); w.boolean(m.two_phase); w.text8(m.name);
}
void put(Writer& w, const Wait& m) { w.id(m.sandbox); w.id(m.worker); w.u32(m.ttl_ms); w.text8(m.name); }
void put(Writer& w, const Queued& m) {
  w.id(m.name_id); w.u32(m.position); w.u32(m.waiters); w.id(m.holder); w.id(m.worker); w.u64(m.epoch);
  w.u8(kLockPhaseCodes.encode(m.state, kBadCode)); w.u32(m.ttl_ms);
}
void put(Writer& w, const Commit& m) { w.id(m.name_id); w.id(m.sandbox); w.u64(m.epoch); w.id(m.worker); }
template <class Entries>
void put_entries(Writer& w, const Entries& entries) {
  w.u16(static_cast<std::uint16_t>(entries.size()));
  for (const HeartbeatEntry& e : entries) { w.id(e.name_id); w.id(e.sandbox); w.u64(e.epoch); }
}
template <class Entries>
void put_ack_entries(Writer& w, const Entries& entries) {
  w.u16(static_cast<std::uint16_t>(entries.size()));
  for (const HeartbeatAckEntry& e : entries) {
    w.id(e.name_id); w.u8(kRefreshStatusCodes.encode(e.status, kBadCode)); w.id(e.holder); w.u64(e.epoch);
    w.u32(e.ttl_left_ms);
  }
}
void put(Writer& w, const Heartbeat& m) {
  w.u32(m.ttl_cap_ms);
  put_entries(w, m.entries);
}
void put(Writer& w, const Release& m) { w.id(m.name_id); w.id(m.sandbox); w.u64(m.epoch); }
void put(Writer& w, const TransferBegin& m) {
  w.id(m.name_id); w.id(m.from); w.u64(m.epoch); w.id(m.to); w.id(m.to_worker);
}
void put(Writer& w, const TransferComplete& m) { w.id(m.name_id); w.u64(m.new_epoch); }
void put(Writer& w, const TransferAccept& m) { w.id(m.name_id); w.id(m.to); w.id(m.worker); }
void put(Writer& w, const Revoke& m) { w.id(m.name_id); w.u64(m.expected_epoch); w.boolean(m.force); }
void put(Writer& w, const Revoked& m) { w.id(m.name_id); w.u64(m.epoch); w.u64(m.new_epoch); }
void put(Writer& w, const RevokedAck& m) { w.id(m.name_id); w.u64(m.epoch); w.boolean(m.running); }
void put(Writer& w, const KillConfirmed& m) { w.id(m.name_id); w.id(m.sandbox); w.u64(m.epoch); }
void put(Writer& w, const Reassign& m) { w.id(m.name_id); w.id(m.to); w.id(m.worker); }
void put(Writer& w, const WorkerHeartbeat& m) {
  w.id(m.worker);
  put_entries(w, m.held);
}
void put(Writer& w, const IsRunning& m) { w.id(m.name_id); w.id(m.sandbox); w.u64(m.epoch); }
void put(Writer& w, const List& m) {
  w.u64(m.cursor); w.u16(m.limit);
  if (m.waiters) w.u8(1);
}
void put(Writer& w, const Show& m) {
  if (m.name.empty()) { w.u8(0); w.id(m.name_id); }
  else { w.u8(1); w.text8(m.name); }
  if (m.waiters_from) w.u32(*m.waiters_from);
}
void put(Writer& w, const Stats& m) {
  if (m.first) w.u16(*m.first);
}
void put(Writer& w, const Grant& m) {
  w.id(m.name_id); w.u64(m.epoch); w.id(m.holder); w.id(m.worker);
  w.u8(kLockPhaseCodes.encode(m.state, kBadCode)); w.u32(m.ttl_ms);
  w.u8(static_cast<std::uint8_t>(m.token.size()));
  if (!m.token.empty()) std::memcpy(w.p, m.token.data(), m.token.size());
  w.p += m.token.size();
}
void put(Writer& w, const Deny& m) {
  w.id(m.name_id); w.u8(kRefusalCodes.encode(m.refusal, kBadCode)); w.id(m.holder); w.id(m.worker);
  w.u64(m.epoch); w.u8(kLockPhaseCodes.encode(m.state, kBadCode));
}
void put(Writer& w, const HeartbeatAck& m) { put_ack_entries(w, m.entries); }
void put(Writer& w, const Ok& m) { w.id(m.name_id); w.u64(m.epoch); }
void put(Writer& w, const TransferState& m) {
  w.id(m.name_id); w.id(m.from); w.id(m.to); w.u64(m.old_epoch); w.u64(m.new_epoch);
  w.u8(kLockPhaseCodes.encode(m.state, kBadCode));
}
void put(Writer& w, const WorkerAck& m) {
  w.u32(m.liveness_ttl_ms);
  put_ack_entries(w, m.not_held);
}
void put(Writer& w, const RunningAnswer& m) { w.id(m.name_id); w.id(m.sandbox); w.u64(m.epoch); w.boolean(m.running); }
void put(Writer& w, const NameRecord& r) {
  w.text8(r.name); w.id(r.name_id); w.u8(kLockPhaseCodes.encode(r.state, kBadCode)); w.id(r.holder);
  w.id(r.worker); w.u64(r.epoch); w.u32(r.ttl_left_ms); w.id(r.reserved_for);
  w.boolean(r.revoke_pending); w.u64(r.revoked_epoch); w.u32(r.reservation_left_ms);
  w.u8(static_cast<std::uint8_t>(r.revoke_ended));
}
void put(Writer& w, const ListPage& m) {
  w.u64(m.next_cursor);
  w.u16(static_cast<std::uint16_t>(m.entries.size()));
  for (const auto& r : m.entries) put(w, r);
  if (!m.with_waiters) return;
  w.u8(1);  // the section is there even for an empty page
  for (const auto& r : m.entries) w.u32(r.waiters);
}
void put(Writer& w, const NameInfo& m) {
  put(w, m.record);
  if (!m.with_waiters) return;
  w.u32(m.record.waiters); w.u32(m.waiters_from);
  w.u16(static_cast<std::uint16_t>(m.waiters.size()));
  for (const auto& x : m.waiters) { w.id(x.sandbox); w.id(x.worker); w.u32(x.ttl_left_ms); }
}
void put(Writer& w, const StatsAnswer& m) {
  w.u16(static_cast<std::uint16_t>(m.counters.size()));
  for (const auto& c : m.counters) { w.text8(c.key); w.u64(c.value); }
}
void put(Writer& w, const Error& m) {
  w.u16(static_cast<std::uint16_t>(m.code)); w.u64(m.seq_floor); w.text16(m.message);
}

// ---- reading -----------------------------------------------------------------------------------

// Reads fields from the payload; every read is bounds-checked. On the first failure it records
// the reason and a text naming the field and offset; later reads fail at once.
class Reader {
 public:
  Reader(const std::uint8_t* begin, std::size_t n) : begin_(begin), p_(begin), end_(begin + n) {}

  bool ok() const noexcept { return error_ == DecodeError::none; }
  DecodeError error() const noexcept { return error_; }
  std::string& detail() noexcept { return detail_; }
  std::size_t offset() const noexcept { return static_cast<std::size_t>(p_ - begin_); }
  std::size_t left() const noexcept { return static_cast<std::size_t>(end_ - p_); }

  bool fail(DecodeError e, std::string text) {
    if (ok()) { error_ = e; detail_ = std::move(text); }
    return false;
  }
  bool need(std::size_t n, const char* field) {
    if (!ok()) return false;
    if (left() >= n) return true;
    return fail(DecodeError::short_payload, std::string("payload ends inside ") + field + " at payload offset " +
                                                std::to_string(offset()) + " (needs " + std::to_string(n) +
                                                " bytes, " + std::to_string(left()) + " left)");
  }
  bool u8(std::uint8_t& v, const char* f) { if (!need(1, f)) return false; v = *p_++; return true; }
  bool u16(std::uint16_t& v, const char* f) { if (!need(2, f)) return false; v = load_u16(p_); p_ += 2; return true; }
  bool u32(std::uint32_t& v, const char* f) { if (!need(4, f)) return false; v = load_u32(p_); p_ += 4; return true; }
  bool u64(std::uint64_t& v, const char* f) { if (!need(8, f)) return false; v = load_u64(p_); p_ += 8; return true; }
  template <class Tag>
  bool id(Id<Tag>& v, const char* f) {
    if (!need(kIdBytes, f)) return false;
    v = load_id<Tag>(p_); p_ += kIdBytes;
    return true;
  }
  bool boolean(bool& v, const char* f) {
    std::uint8_t b = 0;
    if (!u8(b, f)) return false;
    if (b > 1) return bad_value(f, b);
    v = b == 1;
    return true;
  }
  bool bytes(std::uint8_t* out, std::size_t n, const char* f) {
    if (!need(n, f)) return false;
    std::memcpy(out, p_, n);
    p_ += n;
    return true;
  }
  bool bad_value(const char* f, unsigned v) {
    return fail(DecodeError::bad_value, std::string("field ") + f + " has value " + std::to_string(v) +
                                            ", out of range, at payload offset " + std::to_string(offset() - 1));
  }
  bool text(std::string& s, std::size_t len, std::size_t max, const char* f) {
    if (len > max)
      return fail(DecodeError::bad_text, std::string("field ") + f + " is " + std::to_string(len) +
                                             " bytes; the limit is " + std::to_string(max));
    if (!need(len, f)) return false;
    s.assign(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    return true;
  }
  bool text8(std::string& s, std::size_t max, const char* f) {
    std::uint8_t n = 0;
    return u8(n, f) && text(s, n, max, f);
  }
  bool text16(std::string& s, std::size_t max, const char* f) {
    std::uint16_t n = 0;
    return u16(n, f) && text(s, n, max, f);
  }
  bool name(std::string& s, const char* f) {
    if (!text8(s, kNameBytesMax, f)) return false;
    if (const Status why = validate_name(s); !why.ok())
      return fail(DecodeError::invalid_name, std::string("field ") + f + ": " + why.message());
    return true;
  }
  bool count(std::uint16_t& n, std::size_t max, std::size_t min_entry_bytes, const char* f) {
    if (!u16(n, f)) return false;
    if (n > max)
      return fail(DecodeError::bad_count, std::string("field ") + f + " is " + std::to_string(n) +
                                              "; the limit is " + std::to_string(max));
    if (static_cast<std::size_t>(n) * min_entry_bytes > left())
      return fail(DecodeError::bad_count, std::string("field ") + f + " is " + std::to_string(n) +
                                              " but only " + std::to_string(left()) + " payload bytes follow");
    return true;
  }
  bool lock_state(LockPhase& s, const char* f) {
    std::uint8_t b = 0;
    if (!u8(b, f)) return false;
    const auto p = kLockPhaseCodes.decode(b);
    if (!p) return bad_value(f, b);
    s = *p;
    return true;
  }
  bool refusal(Refusal& r, const char* f) {
    std::uint8_t b = 0;
    if (!u8(b, f)) return false;
    const auto v = kRefusalCodes.decode(b);
    if (!v) return bad_value(f, b);
    r = *v;
    return true;
  }
  bool status(RefreshStatus& s, const char* f) {
    std::uint8_t b = 0;
    if (!u8(b, f)) return false;
    const auto v = kRefreshStatusCodes.decode(b);
    if (!v) return bad_value(f, b);
    s = *v;
    return true;
  }
  bool revoke_end(RevokeEnd& e, const char* f) {
    std::uint8_t b = 0;
    if (!u8(b, f)) return false;
    if (b > static_cast<std::uint8_t>(RevokeEnd::lease_expired)) return bad_value(f, b);
    e = static_cast<RevokeEnd>(b);
    return true;
  }

 private:
  const std::uint8_t* begin_;
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  DecodeError error_ = DecodeError::none;
  std::string detail_;
};

bool get(Reader& r, Acquire& m) {
  return r.id(m.sandbox, "acquire.sandbox") && r.id(m.worker, "acquire.worker") &&
         r.u32(m.ttl_ms, "acquire.ttl_ms") && r.boolean(m.two_phase, "acquire.two_phase") &&
         r.name(m.name, "acquire.name");
}
bool get(Reader& r, Wait& m) {
  return r.id(m.sandbox, "wait.sandbox") && r.id(m.worker, "wait.worker") && r.u32(m.ttl_ms, "wait.ttl_ms") &&
         r.name(m.name, "wait.name");
}
bool get(Reader& r, Commit& m) {
  return r.id(m.name_id, "commit.name_id") && r.id(m.sandbox, "commit.sandbox") &&
         r.u64(m.epoch, "commit.epoch") && r.id(m.worker, "commit.worker");
}
// Entry lists shared by Heartbeat / WorkerHeartbeat and HeartbeatAck / WorkerAck. Field names
// are spelled out per message (no allocation on the heartbeat path).
struct EntryFields {
  const char* count;
  const char* name_id;
  const char* sandbox;  ///< HeartbeatEntry: sandbox; HeartbeatAckEntry: status
  const char* epoch;
  const char* holder = nullptr;
  const char* ttl_left_ms = nullptr;
};
constexpr EntryFields kHeartbeatFields{"heartbeat.count", "heartbeat.name_id", "heartbeat.sandbox", "heartbeat.epoch"};
constexpr EntryFields kWorkerBeatFields{"worker_heartbeat.count", "worker_heartbeat.name_id",
                                        "worker_heartbeat.sandbox", "worker_heartbeat.epoch"};
constexpr EntryFields kHeartbeatAckFields{"heartbeat_ack.count", "heartbeat_ack.name_id", "heartbeat_ack.status",
                                          "heartbeat_ack.epoch", "heartbeat_ack.holder", "heartbeat_ack.ttl_left_ms"};
constexpr EntryFields kWorkerAckFields{"worker_ack.count", "worker_ack.name_id", "worker_ack.status",
                                       "worker_ack.epoch", "worker_ack.holder", "worker_ack.ttl_left_ms"};
template <class Entries>
bool get_entries(Reader& r, Entries& entries, const EntryFields& f) {
  std::uint16_t n = 0;
  if (!r.count(n, entries.capacity(), kHeartbeatEntryBytes, f.count)) return false;
  entries.resize(n);
  for (HeartbeatEntry& e : entries)
    if (!(r.id(e.name_id, f.name_id) && r.id(e.sandbox, f.sandbox) && r.u64(e.epoch, f.epoch))) return false;
  return true;
}
template <class Entries>
bool get_ack_entries(Reader& r, Entries& entries, const EntryFields& f) {
  std::uint16_t n = 0;
  if (!r.count(n, entries.capacity(), kHeartbeatAckEntryBytes, f.count)) return false;
  entries.resize(n);
  for (HeartbeatAckEntry& e : entries)
    if (!(r.id(e.name_id, f.name_id) && r.status(e.status, f.sandbox) && r.id(e.holder, f.holder) &&
          r.u64(e.epoch, f.epoch) && r.u32(e.ttl_left_ms, f.ttl_left_ms)))
      return false;
  return true;
}
bool get(Reader& r, Heartbeat& m) {
  return r.u32(m.ttl_cap_ms, "heartbeat.ttl_cap_ms") && get_entries(r, m.entries, kHeartbeatFields);
}
bool get(Reader& r, Release& m) {
  return r.id(m.name_id, "release.name_id") && r.id(m.sandbox, "release.sandbox") &&
         r.u64(m.epoch, "release.epoch");
}
bool get(Reader& r, TransferBegin& m) {
  return r.id(m.name_id, "transfer_begin.name_id") && r.id(m.from, "transfer_begin.from") &&
         r.u64(m.epoch, "transfer_begin.epoch") && r.id(m.to, "transfer_begin.to") &&
         r.id(m.to_worker, "transfer_begin.to_worker");
}
bool get(Reader& r, TransferComplete& m) {
  return r.id(m.name_id, "transfer_complete.name_id") && r.u64(m.new_epoch, "transfer_complete.new_epoch");
}
bool get(Reader& r, TransferAccept& m) {
  return r.id(m.name_id, "transfer_accept.name_id") && r.id(m.to, "transfer_accept.to") &&
         r.id(m.worker, "transfer_accept.worker");
}
bool get(Reader& r, Revoke& m) {
  return r.id(m.name_id, "revoke.name_id") && r.u64(m.expected_epoch, "revoke.expected_epoch") &&
         r.boolean(m.force, "revoke.force");
}
bool get(Reader& r, Revoked& m) {
  return r.id(m.name_id, "revoked.name_id") && r.u64(m.epoch, "revoked.epoch") &&
         r.u64(m.new_epoch, "revoked.new_epoch");
}
bool get(Reader& r, RevokedAck& m) {
  return r.id(m.name_id, "revoked_ack.name_id") && r.u64(m.epoch, "revoked_ack.epoch") &&
         r.boolean(m.running, "revoked_ack.running");
}
bool get(Reader& r, KillConfirmed& m) {
  return r.id(m.name_id, "kill_confirmed.name_id") && r.id(m.sandbox, "kill_confirmed.sandbox") &&
         r.u64(m.epoch, "kill_confirmed.epoch");
}
bool get(Reader& r, Reassign& m) {
  return r.id(m.name_id, "reassign.name_id") && r.id(m.to, "reassign.to") && r.id(m.worker, "reassign.worker");
}
bool get(Reader& r, WorkerHeartbeat& m) {
  return r.id(m.worker, "worker_heartbeat.worker") && get_entries(r, m.held, kWorkerBeatFields);
}
bool get(Reader& r, IsRunning& m) {
  return r.id(m.name_id, "is_running.name_id") && r.id(m.sandbox, "is_running.sandbox") &&
         r.u64(m.epoch, "is_running.epoch");
}
bool get(Reader& r, List& m) {
  if (!(r.u64(m.cursor, "list.cursor") && r.u16(m.limit, "list.limit"))) return false;
  if (r.left() == 0) return true;  // as every version sends it
  std::uint8_t waiters = 0;
  if (!r.u8(waiters, "list.waiters")) return false;
  if (waiters != 1) return r.bad_value("list.waiters", waiters);  // sent only when wanted
  m.waiters = true;
  return true;
}
bool get(Reader& r, Show& m) {
  std::uint8_t by = 0;
  if (!r.u8(by, "show.by")) return false;
  if (by == 0) {
    if (!r.id(m.name_id, "show.name_id")) return false;
  } else if (by == 1) {
    if (!r.name(m.name, "show.name")) return false;
  } else {
    return r.bad_value("show.by", by);
  }
  if (r.left() == 0) return true;  // as every version sends it
  std::uint32_t from = 0;
  if (!r.u32(from, "show.waiters_from")) return false;
  m.waiters_from = from;
  return true;
}
bool get(Reader& r, Stats& m) {
  if (r.left() == 0) return true;  // the unpaged request, as every version sends it
  std::uint16_t first = 0;
  if (!r.u16(first, "stats.first")) return false;
  m.first = first;
  return true;
}
bool get(Reader& r, Grant& m) {
  if (!(r.id(m.name_id, "grant.name_id") && r.u64(m.epoch, "grant.epoch") && r.id(m.holder, "grant.holder") &&
        r.id(m.worker, "grant.worker") && r.lock_state(m.state, "grant.state") && r.u32(m.ttl_ms, "grant.ttl_ms")))
    return false;
  std::uint8_t n = 0;
  if (!r.u8(n, "grant.token_len")) return false;
  if (n != 0 && n != token::kTokenBytes) return r.bad_value("grant.token_len", n);
  m.token.resize(n);
  return n == 0 || r.bytes(m.token.data(), n, "grant.token");
}
bool get(Reader& r, Deny& m) {
  return r.id(m.name_id, "deny.name_id") && r.refusal(m.refusal, "deny.refusal") && r.id(m.holder, "deny.holder") &&
         r.id(m.worker, "deny.worker") && r.u64(m.epoch, "deny.epoch") && r.lock_state(m.state, "deny.state");
}
bool get(Reader& r, Queued& m) {
  return r.id(m.name_id, "queued.name_id") && r.u32(m.position, "queued.position") &&
         r.u32(m.waiters, "queued.waiters") && r.id(m.holder, "queued.holder") && r.id(m.worker, "queued.worker") &&
         r.u64(m.epoch, "queued.epoch") && r.lock_state(m.state, "queued.state") && r.u32(m.ttl_ms, "queued.ttl_ms");
}
bool get(Reader& r, HeartbeatAck& m) { return get_ack_entries(r, m.entries, kHeartbeatAckFields); }
bool get(Reader& r, Ok& m) { return r.id(m.name_id, "ok.name_id") && r.u64(m.epoch, "ok.epoch"); }
bool get(Reader& r, TransferState& m) {
  return r.id(m.name_id, "transfer_state.name_id") && r.id(m.from, "transfer_state.from") &&
         r.id(m.to, "transfer_state.to") && r.u64(m.old_epoch, "transfer_state.old_epoch") &&
         r.u64(m.new_epoch, "transfer_state.new_epoch") && r.lock_state(m.state, "transfer_state.state");
}
bool get(Reader& r, WorkerAck& m) {
  return r.u32(m.liveness_ttl_ms, "worker_ack.liveness_ttl_ms") && get_ack_entries(r, m.not_held, kWorkerAckFields);
}
bool get(Reader& r, RunningAnswer& m) {
  return r.id(m.name_id, "running_answer.name_id") && r.id(m.sandbox, "running_answer.sandbox") &&
         r.u64(m.epoch, "running_answer.epoch") && r.boolean(m.running, "running_answer.running");
}
bool get(Reader& r, NameRecord& m) {
  return r.name(m.name, "record.name") && r.id(m.name_id, "record.name_id") && r.lock_state(m.state, "record.state") &&
         r.id(m.holder, "record.holder") && r.id(m.worker, "record.worker") && r.u64(m.epoch, "record.epoch") &&
         r.u32(m.ttl_left_ms, "record.ttl_left_ms") && r.id(m.reserved_for, "record.reserved_for") &&
         r.boolean(m.revoke_pending, "record.revoke_pending") && r.u64(m.revoked_epoch, "record.revoked_epoch") &&
         r.u32(m.reservation_left_ms, "record.reservation_left_ms") && r.revoke_end(m.revoke_ended, "record.revoke_ended");
}
constexpr std::size_t kNameRecordBytesMin = 1 + 1 + 4 * kIdBytes + 1 + 8 + 4 + 1 + 8 + 4 + 1;
bool get(Reader& r, ListPage& m) {
  std::uint16_t n = 0;
  if (!(r.u64(m.next_cursor, "list_page.next_cursor") &&
        r.count(n, kListEntriesMax, kNameRecordBytesMin, "list_page.count")))
    return false;
  m.entries.resize(n);
  for (auto& e : m.entries)
    if (!get(r, e)) return false;
  if (r.left() == 0) return true;  // no waiter counts asked for
  std::uint8_t section = 0;
  if (!r.u8(section, "list_page.waiters")) return false;
  if (section != 1) return r.bad_value("list_page.waiters", section);
  m.with_waiters = true;
  for (auto& e : m.entries)
    if (!r.u32(e.waiters, "list_page.waiters")) return false;
  return true;
}
bool get(Reader& r, NameInfo& m) {
  if (!get(r, m.record)) return false;
  if (r.left() == 0) return true;  // no waiters asked for
  m.with_waiters = true;
  std::uint16_t n = 0;
  if (!(r.u32(m.record.waiters, "name_info.waiters") && r.u32(m.waiters_from, "name_info.waiters_from") &&
        r.count(n, UINT16_MAX, kWaiterRecordBytes, "name_info.waiter_count")))
    return false;
  m.waiters.resize(n);
  for (auto& x : m.waiters)
    if (!(r.id(x.sandbox, "name_info.waiter_sandbox") && r.id(x.worker, "name_info.waiter_worker") &&
          r.u32(x.ttl_left_ms, "name_info.waiter_ttl_left_ms")))
      return false;
  return true;
}
bool get(Reader& r, StatsAnswer& m) {
  std::uint16_t n = 0;
  if (!r.count(n, kCountersMax, 1 + 1 + 8, "stats_answer.count")) return false;
  m.counters.resize(n);
  for (auto& c : m.counters) {
    if (!(r.text8(c.key, kCounterKeyBytesMax, "stats_answer.key") && r.u64(c.value, "stats_answer.value")))
      return false;
    if (c.key.empty()) return r.fail(DecodeError::bad_text, "field stats_answer.key is empty");
  }
  return true;
}
bool get(Reader& r, Error& m) {
  std::uint16_t code = 0;
  if (!r.u16(code, "error.code")) return false;
  m.code = static_cast<ErrorCode>(code);  // unknown codes are kept as their number
  return r.u64(m.seq_floor, "error.seq_floor") && r.text16(m.message, kErrorTextBytesMax, "error.message");
}

template <class M>
constexpr MessageType type_for();
#define LEASEHOLD_WIRE_TYPE(M, T) \
  template <>                     \
  constexpr MessageType type_for<M>() { return MessageType::T; }
LEASEHOLD_WIRE_TYPE(Acquire, acquire)
LEASEHOLD_WIRE_TYPE(Commit, commit)
LEASEHOLD_WIRE_TYPE(Heartbeat, heartbeat)
LEASEHOLD_WIRE_TYPE(Release, release)
LEASEHOLD_WIRE_TYPE(TransferBegin, transfer_begin)
LEASEHOLD_WIRE_TYPE(TransferComplete, transfer_complete)
LEASEHOLD_WIRE_TYPE(TransferAccept, transfer_accept)
LEASEHOLD_WIRE_TYPE(Revoke, revoke)
LEASEHOLD_WIRE_TYPE(Reassign, reassign)
LEASEHOLD_WIRE_TYPE(WorkerHeartbeat, worker_heartbeat)
LEASEHOLD_WIRE_TYPE(IsRunning, is_running)
LEASEHOLD_WIRE_TYPE(List, list)
LEASEHOLD_WIRE_TYPE(Show, show)
LEASEHOLD_WIRE_TYPE(Stats, stats)
LEASEHOLD_WIRE_TYPE(Grant, grant)
LEASEHOLD_WIRE_TYPE(Deny, deny)
LEASEHOLD_WIRE_TYPE(HeartbeatAck, heartbeat_ack)
LEASEHOLD_WIRE_TYPE(Ok, ok)
LEASEHOLD_WIRE_TYPE(TransferState, transfer_state)
LEASEHOLD_WIRE_TYPE(WorkerAck, worker_ack)
LEASEHOLD_WIRE_TYPE(RunningAnswer, running_answer)
LEASEHOLD_WIRE_TYPE(ListPage, list_page)
LEASEHOLD_WIRE_TYPE(NameInfo, name_info)
LEASEHOLD_WIRE_TYPE(StatsAnswer, stats_answer)
LEASEHOLD_WIRE_TYPE(Error, error)
LEASEHOLD_WIRE_TYPE(Revoked, revoked)
LEASEHOLD_WIRE_TYPE(KillConfirmed, kill_confirmed)
LEASEHOLD_WIRE_TYPE(RevokedAck, revoked_ack)
LEASEHOLD_WIRE_TYPE(Wait, wait)
LEASEHOLD_WIRE_TYPE(Queued, queued)
#undef LEASEHOLD_WIRE_TYPE

// Emplaces the alternative for `type` and parses it; false if the type is unknown.
template <std::size_t I = 0>
bool get_by_type(MessageType type, Reader& r, Body& body, bool& known) {
  if constexpr (I == std::variant_size_v<Body>) {
    known = false;
    return false;
  } else {
    using M = std::variant_alternative_t<I, Body>;
    if (type_for<M>() == type) {
      known = true;
      return get(r, body.template emplace<I>());
    }
    return get_by_type<I + 1>(type, r, body, known);
  }
}

template <std::size_t I = 0>
constexpr bool known_type(std::uint8_t t) {
  if constexpr (I == std::variant_size_v<Body>) {
    return false;
  } else {
    return static_cast<std::uint8_t>(type_for<std::variant_alternative_t<I, Body>>()) == t ||
           known_type<I + 1>(t);
  }
}

std::string hex8(unsigned v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s.push_back(kDigits[(v >> shift) & 0xF]);
  return s;
}

}  // namespace

// ---- names -------------------------------------------------------------------------------------

std::string_view to_string(MessageType t) noexcept {
  switch (t) {
    case MessageType::acquire: return "acquire";
    case MessageType::commit: return "commit";
    case MessageType::heartbeat: return "heartbeat";
    case MessageType::release: return "release";
    case MessageType::transfer_begin: return "transfer_begin";
    case MessageType::transfer_complete: return "transfer_complete";
    case MessageType::transfer_accept: return "transfer_accept";
    case MessageType::revoke: return "revoke";
    case MessageType::reassign: return "reassign";
    case MessageType::worker_heartbeat: return "worker_heartbeat";
    case MessageType::is_running: return "is_running";
    case MessageType::list: return "list";
    case MessageType::show: return "show";
    case MessageType::stats: return "stats";
    case MessageType::revoked: return "revoked";
    case MessageType::kill_confirmed: return "kill_confirmed";
    case MessageType::wait: return "wait";
    case MessageType::grant: return "grant";
    case MessageType::deny: return "deny";
    case MessageType::heartbeat_ack: return "heartbeat_ack";
    case MessageType::ok: return "ok";
    case MessageType::transfer_state: return "transfer_state";
    case MessageType::worker_ack: return "worker_ack";
    case MessageType::running_answer: return "running_answer";
    case MessageType::list_page: return "list_page";
    case MessageType::name_info: return "name_info";
    case MessageType::stats_answer: return "stats_answer";
    case MessageType::revoked_ack: return "revoked_ack";
    case MessageType::queued: return "queued";
    case MessageType::error: return "error";
  }
  return "unknown";
}

std::string_view to_string(RevokeEnd e) noexcept {
  switch (e) {
    case RevokeEnd::none: return "none";
    case RevokeEnd::kill_confirmed: return "kill_confirmed";
    case RevokeEnd::lease_expired: return "lease_expired";
  }
  return "unknown";
}

std::string_view to_string(DecodeError e) noexcept {
  switch (e) {
    case DecodeError::none: return "none";
    case DecodeError::truncated: return "truncated";
    case DecodeError::oversized: return "oversized";
    case DecodeError::bad_magic: return "bad_magic";
    case DecodeError::bad_tag: return "bad_tag";
    case DecodeError::unknown_version: return "unknown_version";
    case DecodeError::unknown_type: return "unknown_type";
    case DecodeError::bad_flags: return "bad_flags";
    case DecodeError::length_mismatch: return "length_mismatch";
    case DecodeError::short_payload: return "short_payload";
    case DecodeError::trailing_bytes: return "trailing_bytes";
    case DecodeError::bad_count: return "bad_count";
    case DecodeError::bad_value: return "bad_value";
    case DecodeError::invalid_name: return "invalid_name";
    case DecodeError::bad_text: return "bad_text";
    case DecodeError::replayed: return "replayed";
    case DecodeError::stale_seq: return "stale_seq";
    case DecodeError::request_id_reused: return "request_id_reused";
    case DecodeError::unknown_key: return "unknown_key";
    case DecodeError::seq_out_of_range: return "seq_out_of_range";
    case DecodeError::seq_jump: return "seq_jump";
  }
  return "unknown";
}

std::string_view to_string(ErrorCode c) noexcept {
  const auto v = static_cast<std::uint16_t>(c);
  if (v > 0 && v < kDecodeErrorCount) return to_string(static_cast<DecodeError>(v));
  switch (c) {
    case ErrorCode::none: return "none";
    case ErrorCode::internal: return "internal";
    case ErrorCode::overloaded: return "overloaded";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::not_leader: return "not_leader";
  }
  return "unknown";
}

std::string_view to_string(EncodeError e) noexcept {
  switch (e) {
    case EncodeError::none: return "none";
    case EncodeError::buffer_too_small: return "buffer_too_small";
    case EncodeError::too_large: return "too_large";
    case EncodeError::bad_count: return "bad_count";
    case EncodeError::invalid_name: return "invalid_name";
    case EncodeError::bad_text: return "bad_text";
    case EncodeError::bad_flags: return "bad_flags";
    case EncodeError::seq_exhausted: return "seq_exhausted";
  }
  return "unknown";
}

MessageType type_of(const Body& body) noexcept {
  return std::visit([](const auto& m) { return type_for<std::decay_t<decltype(m)>>(); }, body);
}

// ---- encode ------------------------------------------------------------------------------------

std::size_t payload_bytes(const Body& body) noexcept {
  return std::visit([](const auto& m) { return size_of(m); }, body);
}

namespace {
// decode(encode(header, body)) == (header, body), the header's encoder-set fields aside.
[[maybe_unused]] bool decodes_back(const Header& header, const Body& body,
                                   std::span<const std::uint8_t> datagram) noexcept {
  const DecodeResult d = decode(datagram, nullptr);
  if (!d) return false;
  Header expect = header;
  expect.version = kVersion;
  expect.type = d.header.type;
  expect.payload_len = d.header.payload_len;
  return d.header == expect && d.header.type == type_of(body) && d.body == body;
}
}  // namespace

namespace {
// The header of a datagram of `type` with `payload` bytes of payload: the part of encode() every
// message shares.
void put_header(std::uint8_t* p, MessageType type, const Header& header, std::size_t payload) noexcept {
  store_u32(p + kOffMagic, kMagic);
  p[kOffVersion] = kVersion;
  p[kOffType] = static_cast<std::uint8_t>(type);
  store_u16(p + kOffFlags, header.flags);
  store_id(p + kOffSender, header.sender);
  store_u64(p + kOffSeq, header.seq);
  store_u64(p + kOffRequestId, header.request_id);
  store_u16(p + kOffPayloadLen, static_cast<std::uint16_t>(payload));
  store_u16(p + kOffKeyId, header.key_id);
}

// encode_heartbeat() wrote `datagram`: encode() of the Heartbeat its entries make writes the same.
[[maybe_unused]] bool encodes_as_heartbeat(const Header& header, std::uint32_t ttl_cap_ms,
                                           std::span<const HeartbeatEntry> entries, const Authenticator* auth,
                                           std::span<const std::uint8_t> datagram) noexcept {
  Heartbeat hb;
  hb.ttl_cap_ms = ttl_cap_ms;
  hb.entries.assign(entries.begin(), entries.end());
  Datagram d;
  const EncodeResult r = encode(header, hb, auth, d.buffer());
  return r.bytes == datagram.size() && std::memcmp(d.bytes.data(), datagram.data(), datagram.size()) == 0;
}

// The tag over the first `total` bytes (zero without auth).
void put_tag(std::span<std::uint8_t> out, std::size_t total, const Authenticator* auth) noexcept {
  if (auth != nullptr) {
    auth->sign(out.first(total));
  } else {
    std::memset(out.data() + total - kTagBytes, 0, kTagBytes);
  }
}
}  // namespace

EncodeResult encode(const Header& header, const Body& body, const Authenticator* auth,
                    std::span<std::uint8_t> out) noexcept {
  if ((header.flags & ~kFlagsKnown) != 0) return {0, EncodeError::bad_flags};
  const EncodeError invalid = std::visit([](const auto& m) { return check(m); }, body);
  if (invalid != EncodeError::none) return {0, invalid};
  const std::size_t payload = payload_bytes(body);
  if (payload > kPayloadBytesMax) return {0, EncodeError::too_large};
  const std::size_t total = kHeaderBytes + payload + kTagBytes;
  if (out.size() < total) return {0, EncodeError::buffer_too_small};

  std::uint8_t* p = out.data();
  put_header(p, type_of(body), header, payload);
  Writer w{p + kHeaderBytes};
  std::visit([&w](const auto& m) { put(w, m); }, body);
  LEASEHOLD_ASSERT_SLOW(w.p == p + kHeaderBytes + payload);  // size_of and put agree
  put_tag(out, total, auth);
  // The codec round trip, in debug and simulator builds: what the decoder reads back from these
  // bytes is exactly what was encoded (an encoder and decoder that disagree on a field corrupt it
  // silently: both sides "work").
  LEASEHOLD_ASSERT_SLOW(decodes_back(header, body, out.first(total)));
  return {total, EncodeError::none};
}

EncodeResult encode_heartbeat(const Header& header, std::uint32_t ttl_cap_ms, std::span<const HeartbeatEntry> entries,
                              const Authenticator* auth, std::span<std::uint8_t> out) noexcept {
  if ((header.flags & ~kFlagsKnown) != 0) return {0, EncodeError::bad_flags};
  if (entries.size() > kHeartbeatEntriesMax) return {0, EncodeError::too_large};
  const std::size_t payload = 4 + 2 + entries.size() * kHeartbeatEntryBytes;  // size_of(Heartbeat)
  const std::size_t total = kHeaderBytes + payload + kTagBytes;
  if (out.size() < total) return {0, EncodeError::buffer_too_small};
  std::uint8_t* p = out.data();
  put_header(p, MessageType::heartbeat, header, payload);
  Writer w{p + kHeaderBytes};
  w.u32(ttl_cap_ms);  // put(Writer&, const Heartbeat&), from the span
  put_entries(w, entries);
  LEASEHOLD_ASSERT_SLOW(w.p == p + kHeaderBytes + payload);
  put_tag(out, total, auth);
  // The same bytes as encode() of the Heartbeat these entries make (debug and simulator builds).
  LEASEHOLD_ASSERT_SLOW(encodes_as_heartbeat(header, ttl_cap_ms, entries, auth, out.first(total)));
  return {total, EncodeError::none};
}

bool restamp(std::span<std::uint8_t> datagram, std::uint64_t seq, const Authenticator& auth) noexcept {
  if (datagram.size() < kDatagramBytesMin || load_u32(datagram.data() + kOffMagic) != kMagic) return false;
  store_u64(datagram.data() + kOffSeq, seq);
  auth.sign(datagram);
  return true;
}

std::vector<Heartbeat> split_heartbeat(std::span<const HeartbeatEntry> entries, std::uint32_t ttl_cap_ms) {
  std::vector<Heartbeat> out;
  out.reserve(heartbeat_chunks(entries.size()));
  for (std::size_t i = 0; i < heartbeat_chunks(entries.size()); ++i) {
    Heartbeat& hb = out.emplace_back();
    hb.ttl_cap_ms = ttl_cap_ms;
    const std::span<const HeartbeatEntry> chunk = heartbeat_chunk(entries, i);
    hb.entries.assign(chunk.begin(), chunk.end());
  }
  return out;
}

// ---- decode ------------------------------------------------------------------------------------

bool is_answer_to(std::span<const std::uint8_t> datagram, const Authenticator& auth, const WorkerId& self) noexcept {
  Header h;
  return decode_header(datagram, &auth, h) == DecodeError::none && !is_request(h.type) && h.sender != self;
}

DecodeError decode_header(std::span<const std::uint8_t> datagram, const Authenticator* auth,
                          Header& out) noexcept {
  if (datagram.size() < kDatagramBytesMin) return DecodeError::truncated;
  if (datagram.size() > kDatagramBytesMax) return DecodeError::oversized;
  const std::uint8_t* p = datagram.data();
  if (load_u32(p + kOffMagic) != kMagic) return DecodeError::bad_magic;
  if (auth != nullptr && !auth->verify(datagram)) return DecodeError::bad_tag;
  // Authentic (or not checked) from here: fill the header so an Error answer can be addressed.
  out.version = p[kOffVersion];
  out.type = static_cast<MessageType>(p[kOffType]);
  out.flags = load_u16(p + kOffFlags);
  out.sender = load_id<WorkerTag>(p + kOffSender);
  out.seq = load_u64(p + kOffSeq);
  out.request_id = load_u64(p + kOffRequestId);
  out.payload_len = load_u16(p + kOffPayloadLen);
  out.key_id = load_u16(p + kOffKeyId);
  if (out.version != kVersion) return DecodeError::unknown_version;
  if (!known_type(p[kOffType])) return DecodeError::unknown_type;
  if ((out.flags & ~kFlagsKnown) != 0) return DecodeError::bad_flags;
  if (kHeaderBytes + out.payload_len + kTagBytes != datagram.size()) return DecodeError::length_mismatch;
  return DecodeError::none;
}

std::optional<std::uint64_t> request_id_of(std::span<const std::byte> datagram) noexcept {
  if (datagram.size() < kDatagramBytesMin) return std::nullopt;
  const auto* p = reinterpret_cast<const std::uint8_t*>(datagram.data());
  if (load_u32(p + kOffMagic) != kMagic) return std::nullopt;
  return load_u64(p + kOffRequestId);
}

std::optional<KeyRef> key_ref_of(std::span<const std::uint8_t> datagram) noexcept {
  if (datagram.size() < kDatagramBytesMin) return std::nullopt;
  const std::uint8_t* p = datagram.data();
  if (load_u32(p + kOffMagic) != kMagic) return std::nullopt;
  KeyRef k;
  k.sender = load_id<WorkerTag>(p + kOffSender);
  k.key_id = load_u16(p + kOffKeyId);
  return k;
}

std::string_view to_string(KeyRejectReason r) noexcept {
  switch (r) {
    case KeyRejectReason::unknown_key: return "unknown_key";
    case KeyRejectReason::bad_mac: return "bad_mac";
  }
  return "unknown";
}

std::array<std::uint8_t, kKeyRejectedBytes> encode_key_rejected(const KeyRejected& n) noexcept {
  std::array<std::uint8_t, kKeyRejectedBytes> out{};
  std::uint8_t* p = out.data();
  store_u32(p + kOffMagic, kMagic);
  p[kOffVersion] = kVersion;
  p[kOffType] = kKeyRejectedType;
  store_u64(p + kOffRequestId, n.request_id);
  store_u16(p + kOffPayloadLen, 3);
  store_u16(p + kHeaderBytes, n.key_id);
  p[kHeaderBytes + 2] = static_cast<std::uint8_t>(n.reason);
  return out;
}

std::optional<KeyRejected> decode_key_rejected(std::span<const std::uint8_t> datagram) noexcept {
  if (datagram.size() != kKeyRejectedBytes) return std::nullopt;
  const std::uint8_t* p = datagram.data();
  if (load_u32(p + kOffMagic) != kMagic || p[kOffVersion] != kVersion || p[kOffType] != kKeyRejectedType ||
      load_u16(p + kOffFlags) != 0 || load_u64(p + kOffSeq) != 0 || load_u16(p + kOffPayloadLen) != 3 ||
      load_u16(p + kOffKeyId) != 0)
    return std::nullopt;
  for (std::size_t i = kOffSender; i < kOffSeq; ++i)
    if (p[i] != 0) return std::nullopt;
  const std::uint8_t reason = p[kHeaderBytes + 2];
  if (reason != static_cast<std::uint8_t>(KeyRejectReason::unknown_key) &&
      reason != static_cast<std::uint8_t>(KeyRejectReason::bad_mac))
    return std::nullopt;
  return KeyRejected{load_u64(p + kOffRequestId), load_u16(p + kHeaderBytes), static_cast<KeyRejectReason>(reason)};
}

DecodeResult decode_payload(const Header& header, std::span<const std::uint8_t> datagram) {
  DecodeResult res;
  res.header = header;
  if (datagram.size() != kHeaderBytes + header.payload_len + kTagBytes) {
    res.error = DecodeError::length_mismatch;
    res.detail = "datagram is " + std::to_string(datagram.size()) + " bytes but payload_len " +
                 std::to_string(header.payload_len) + " needs " +
                 std::to_string(kHeaderBytes + header.payload_len + kTagBytes);
    return res;
  }
  Reader r(datagram.data() + kHeaderBytes, header.payload_len);
  bool known = true;
  get_by_type(header.type, r, res.body, known);
  if (!known) {
    res.error = DecodeError::unknown_type;
    res.detail = "message type " + hex8(static_cast<unsigned>(header.type)) + " is not known in version " +
                 std::to_string(kVersion);
    return res;
  }
  if (!r.ok()) {
    res.error = r.error();
    res.detail = std::string(to_string(header.type)) + ": " + std::move(r.detail());
    return res;
  }
  if (r.left() != 0) {
    res.error = DecodeError::trailing_bytes;
    res.detail = std::string(to_string(header.type)) + ": " + std::to_string(r.left()) +
                 " bytes after the last field (payload_len " + std::to_string(header.payload_len) + ")";
    return res;
  }
  return res;
}

DecodeResult decode(std::span<const std::uint8_t> datagram, const Authenticator* auth) {
  Header header;
  const DecodeError e = decode_header(datagram, auth, header);
  if (e == DecodeError::none) return decode_payload(header, datagram);
  DecodeResult res;
  res.error = e;
  res.header = header;
  switch (e) {
    case DecodeError::truncated:
      res.detail = "datagram is " + std::to_string(datagram.size()) + " bytes; the minimum is " +
                   std::to_string(kDatagramBytesMin) + " (header + tag)";
      break;
    case DecodeError::oversized:
      res.detail = "datagram is " + std::to_string(datagram.size()) + " bytes; the limit is " +
                   std::to_string(kDatagramBytesMax);
      break;
    case DecodeError::bad_magic:
      res.detail = "magic is " + hex8(load_u32(datagram.data())) + ", expected " + hex8(kMagic);
      break;
    case DecodeError::bad_tag:
      res.detail = "HMAC-SHA256 tag does not match (wrong key, or the datagram was altered)";
      break;
    case DecodeError::unknown_version:
      res.detail = "protocol version " + std::to_string(header.version) + " is not supported; this side speaks " +
                   std::to_string(kVersion);
      break;
    case DecodeError::unknown_type:
      res.detail = "message type " + hex8(static_cast<unsigned>(header.type)) + " is not known in version " +
                   std::to_string(kVersion);
      break;
    case DecodeError::bad_flags:
      res.detail = "flags " + hex8(header.flags) + " has unknown bits (known: " + hex8(kFlagsKnown) +
                   ")";
      break;
    case DecodeError::length_mismatch:
      res.detail = "datagram is " + std::to_string(datagram.size()) + " bytes but payload_len " +
                   std::to_string(header.payload_len) + " needs " +
                   std::to_string(kHeaderBytes + header.payload_len + kTagBytes);
      break;
    default:
      res.detail = std::string(to_string(e));
      break;
  }
  return res;
}

}  // namespace leasehold::wire
