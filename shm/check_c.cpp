// libleasehold-check: the C ABI (include/leasehold/check.h) over shm::TableReader.
#include "leasehold/check.h"

#include "leasehold/lease/code_table.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/shm/table.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

struct leasehold_table {
  leasehold::shm::TableReader reader;
};

struct leasehold_tokens {
  leasehold::shm::TokenChannelReader reader;
};

struct leasehold_verifier {
  leasehold::token::TokenVerifier verifier;
};

namespace {

using leasehold::shm::SlotState;
using leasehold::shm::TableErrc;

/// The C constant of each slot state (check.h LEASEHOLD_SLOT_*); snapshots report states through
/// this table only.
constexpr leasehold::CodeTable<SlotState, std::uint32_t, 4> kSlotStateCodes{{{
    {SlotState::free, LEASEHOLD_SLOT_FREE},
    {SlotState::claimed, LEASEHOLD_SLOT_CLAIMED},
    {SlotState::published, LEASEHOLD_SLOT_PUBLISHED},
    {SlotState::cooling, LEASEHOLD_SLOT_COOLING}}}};
static_assert(kSlotStateCodes.covers(leasehold::shm::kSlotStates));
static_assert(!kSlotStateCodes.decode(std::uint32_t{LEASEHOLD_SLOT_UNKNOWN}), "UNKNOWN names no state");

int code_of(TableErrc e) noexcept {
  switch (e) {
    case TableErrc::ok: return LEASEHOLD_OK;
    case TableErrc::missing: return LEASEHOLD_E_MISSING;
    case TableErrc::truncated: return LEASEHOLD_E_TRUNCATED;
    case TableErrc::bad_magic: return LEASEHOLD_E_BAD_MAGIC;
    case TableErrc::newer_major:
    case TableErrc::older_major: return LEASEHOLD_E_VERSION;
    case TableErrc::bad_geometry: return LEASEHOLD_E_GEOMETRY;
    case TableErrc::not_ready: return LEASEHOLD_E_NOT_READY;
    case TableErrc::bad_slot: return LEASEHOLD_E_BAD_SLOT;
    case TableErrc::bad_argument: return LEASEHOLD_E_ARG;
    case TableErrc::busy: return LEASEHOLD_E_BUSY;
    default: return LEASEHOLD_E_IO;
  }
}

void put_error(char* err, size_t len, const char* msg) noexcept {
  if (err != nullptr && len > 0) std::snprintf(err, len, "%s", msg);
}

void put_uuid(std::uint8_t out[16], std::uint64_t hi, std::uint64_t lo) noexcept {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<std::uint8_t>(hi >> (56 - 8 * i));
    out[8 + i] = static_cast<std::uint8_t>(lo >> (56 - 8 * i));
  }
}

// The open functions' shared error handling: `make` builds the object or throws TableError.
template <typename T, typename Make>
int open_object(T** out, const char* fn, bool from_env, char* err, size_t err_len, Make make) noexcept {
  if (out == nullptr) {
    put_error(err, err_len, (std::string(fn) + ": out is NULL").c_str());
    return LEASEHOLD_E_ARG;
  }
  *out = nullptr;
  try {
    *out = make();
    put_error(err, err_len, "");
    return LEASEHOLD_OK;
  } catch (const leasehold::shm::TableError& e) {
    put_error(err, err_len, e.what());
    if (from_env && e.code() == TableErrc::bad_argument) return LEASEHOLD_E_MISSING;
    return code_of(e.code());
  } catch (const std::bad_alloc&) {
    put_error(err, err_len, (std::string(fn) + ": out of memory").c_str());
    return LEASEHOLD_E_IO;
  } catch (const std::exception& e) {
    put_error(err, err_len, e.what());
    return LEASEHOLD_E_IO;
  }
}

}  // namespace

extern "C" {

int leasehold_open(const char* location, uint32_t wait_ms, leasehold_table** out, char* err,
                   size_t err_len) {
  return open_object(out, "leasehold_open", location == nullptr, err, err_len, [&] {
    const std::string loc =
        location != nullptr ? std::string(location) : leasehold::shm::location_from_env();
    leasehold::shm::OpenOptions o;
    o.wait_ns = static_cast<std::uint64_t>(wait_ms) * 1'000'000ULL;
    return new leasehold_table{leasehold::shm::TableReader::open(loc, o)};
  });
}

void leasehold_close(leasehold_table* table) { delete table; }

#define LEASEHOLD_CHECK_STR2(x) #x
#define LEASEHOLD_CHECK_STR(x) LEASEHOLD_CHECK_STR2(x)
const char* leasehold_check_version(void) {
  return LEASEHOLD_CHECK_STR(LEASEHOLD_CHECK_ABI_VERSION) "." LEASEHOLD_CHECK_STR(
      LEASEHOLD_CHECK_VERSION_MINOR) "." LEASEHOLD_CHECK_STR(LEASEHOLD_CHECK_VERSION_PATCH);
}

const leasehold_slot* leasehold_slot_at(const leasehold_table* table, uint32_t index) {
  if (table == nullptr) return nullptr;
  return reinterpret_cast<const leasehold_slot*>(table->reader.slot(index));
}

uint32_t leasehold_slot_count(const leasehold_table* table) {
  return table == nullptr ? 0 : table->reader.slot_count();
}

leasehold_lease leasehold_lease_at(const leasehold_table* table, uint32_t index, uint64_t epoch) {
  static const uint64_t never_valid = LEASEHOLD_REVOKED_BIT;  // no epoch in range equals it
  if (table == nullptr || table->reader.slot(index) == nullptr || static_cast<int64_t>(epoch) <= 0)
    return leasehold_lease{&never_valid, 1};
  // Layout 1.x: the check word is the slot's first 8 bytes (static_assert in shm/layout.hpp).
  return leasehold_lease{reinterpret_cast<const uint64_t*>(table->reader.slot(index)), epoch};
}

int leasehold_check_slot(const leasehold_table* table, uint32_t index, uint64_t epoch) {
  return table != nullptr && table->reader.check(index, epoch) ? 1 : 0;
}

int leasehold_check_deadline(const leasehold_table* table, uint32_t index, uint64_t epoch) {
  return table != nullptr && table->reader.check_deadline(index, epoch) ? 1 : 0;
}

int leasehold_writer_alive(const leasehold_table* table, uint64_t* age_ns) {
  if (table == nullptr) {
    if (age_ns != nullptr) *age_ns = UINT64_MAX;
    return 0;
  }
  const auto l = table->reader.writer_liveness();
  if (age_ns != nullptr) *age_ns = l.age_ns;
  return l.alive ? 1 : 0;
}

int leasehold_snapshot(const leasehold_table* table, uint32_t index, leasehold_slot_info* out) {
  if (table == nullptr || out == nullptr) return LEASEHOLD_E_ARG;
  leasehold::shm::SlotSnapshot s;
  const TableErrc e = table->reader.snapshot(index, s);
  if (e != TableErrc::ok) return code_of(e);
  std::memset(out, 0, sizeof *out);
  out->index = s.index;
  out->generation = s.generation;
  out->state = kSlotStateCodes.encode(s.state, LEASEHOLD_SLOT_UNKNOWN);
  out->revoked = s.revoked ? 1 : 0;
  out->epoch = s.epoch;
  put_uuid(out->sandbox_id, s.sandbox.hi, s.sandbox.lo);
  put_uuid(out->name_id, s.name.hi, s.name.lo);
  out->valid_until_ns = s.valid_until_ns;
  out->name_bytes = s.name_bytes;
  std::memcpy(out->name_prefix, s.name_prefix, sizeof s.name_prefix);
  return LEASEHOLD_OK;
}

int64_t leasehold_find_sandbox(const leasehold_table* table, const char* sandbox_uuid) {
  if (table == nullptr || sandbox_uuid == nullptr) return LEASEHOLD_E_ARG;
  const auto id = leasehold::SandboxId::parse(sandbox_uuid);
  if (!id || id->is_nil()) return LEASEHOLD_E_ARG;
  const auto s = table->reader.find(*id);
  return s ? static_cast<int64_t>(s->index) : LEASEHOLD_E_NOT_FOUND;
}

int leasehold_tokens_open(const char* location, leasehold_tokens** out, char* err, size_t err_len) {
  return open_object(out, "leasehold_tokens_open", location == nullptr, err, err_len, [&] {
    const char* env = location != nullptr ? location : std::getenv(leasehold::shm::kTokenChannelEnv);
    if (env == nullptr || *env == '\0')
      throw leasehold::shm::TableError(TableErrc::bad_argument,
                                       "no token channel: LEASEHOLD_TOKENS is not set (the supervisor sets it in "
                                       "every sandbox it starts)");
    return new leasehold_tokens{leasehold::shm::TokenChannelReader::open(env)};
  });
}

void leasehold_tokens_close(leasehold_tokens* tokens) { delete tokens; }

int leasehold_token(const leasehold_tokens* tokens, uint64_t epoch, uint8_t* buf, size_t buf_len) {
  if (tokens == nullptr || buf == nullptr) return LEASEHOLD_E_ARG;
  leasehold::shm::TokenSnapshot ts;
  const TableErrc e = tokens->reader.read(ts);
  if (e != TableErrc::ok) return code_of(e);
  if (ts.length == 0 || ts.epoch != epoch) return LEASEHOLD_E_NOT_FOUND;
  if (buf_len < ts.length) return LEASEHOLD_E_ARG;
  std::memcpy(buf, ts.bytes.data(), ts.length);
  return static_cast<int>(ts.length);
}

leasehold_verifier* leasehold_verifier_new(void) { return new (std::nothrow) leasehold_verifier; }

void leasehold_verifier_free(leasehold_verifier* verifier) { delete verifier; }

int leasehold_verifier_add_key_file(leasehold_verifier* verifier, const char* path, char* err, size_t err_len) {
  if (verifier == nullptr || path == nullptr) {
    put_error(err, err_len, "leasehold_verifier_add_key_file: verifier or path is NULL");
    return LEASEHOLD_E_ARG;
  }
  try {
    const leasehold::Status why = verifier->verifier.add_public_key_file(path);
    if (why.ok()) return LEASEHOLD_OK;
    put_error(err, err_len, why.message().c_str());
    return why.code() == leasehold::Errc::corrupt || why.code() == leasehold::Errc::invalid_argument || why.code() == leasehold::Errc::exists
               ? LEASEHOLD_E_ARG
               : LEASEHOLD_E_IO;
  } catch (const std::exception& e) {
    put_error(err, err_len, e.what());
    return LEASEHOLD_E_IO;
  }
}

int leasehold_verifier_add_key(leasehold_verifier* verifier, const uint8_t* public_key, size_t len) {
  if (verifier == nullptr || public_key == nullptr) return LEASEHOLD_E_ARG;
  try {
    return verifier->verifier.add_public_key({public_key, len}).ok() ? LEASEHOLD_OK : LEASEHOLD_E_ARG;
  } catch (...) {
    return LEASEHOLD_E_ARG;
  }
}

int leasehold_verify(leasehold_verifier* verifier, const uint8_t* token, size_t token_len, const char* name,
                     uint64_t epoch, const char* holder_uuid, char* err, size_t err_len) {
  using leasehold::token::Reject;
  if (verifier == nullptr || name == nullptr || holder_uuid == nullptr || (token == nullptr && token_len != 0)) {
    put_error(err, err_len, "leasehold_verify: verifier, name or holder is NULL");
    return LEASEHOLD_E_ARG;
  }
  try {
    if (const leasehold::Status why = leasehold::validate_name(name); !why.ok()) {
      put_error(err, err_len, ("leasehold_verify: " + why.message()).c_str());
      return LEASEHOLD_E_ARG;
    }
    const auto holder = leasehold::SandboxId::parse(holder_uuid);
    if (!holder || holder->is_nil()) {
      put_error(err, err_len, "leasehold_verify: malformed holder (expected a sandbox UUID)");
      return LEASEHOLD_E_ARG;
    }
    const leasehold::token::Verdict v =
        verifier->verifier.verify({token, token_len}, leasehold::name_id_of(name), epoch, *holder);
    if (v.ok()) return LEASEHOLD_OK;
    put_error(err, err_len, v.detail.c_str());
    switch (v.reject) {
      case Reject::unsigned_token: return LEASEHOLD_E_TOKEN_UNSIGNED;
      case Reject::malformed: return LEASEHOLD_E_TOKEN_MALFORMED;
      case Reject::unknown_key: return LEASEHOLD_E_TOKEN_UNKNOWN_KEY;
      case Reject::bad_signature: return LEASEHOLD_E_TOKEN_BAD_SIGNATURE;
      case Reject::wrong_name: return LEASEHOLD_E_TOKEN_WRONG_NAME;
      case Reject::wrong_epoch: return LEASEHOLD_E_TOKEN_WRONG_EPOCH;
      case Reject::wrong_holder: return LEASEHOLD_E_TOKEN_WRONG_HOLDER;
      case Reject::none: break;
    }
    return LEASEHOLD_E_TOKEN_MALFORMED;
  } catch (const std::exception& e) {
    put_error(err, err_len, e.what());
    return LEASEHOLD_E_IO;
  }
}

const char* leasehold_strerror(int code) {
  switch (code) {
    case LEASEHOLD_OK: return "ok";
    case LEASEHOLD_E_MISSING: return "table missing";
    case LEASEHOLD_E_TRUNCATED: return "table truncated";
    case LEASEHOLD_E_BAD_MAGIC: return "not a leasehold table (wrong magic)";
    case LEASEHOLD_E_VERSION: return "incompatible table layout version";
    case LEASEHOLD_E_GEOMETRY: return "inconsistent table header";
    case LEASEHOLD_E_NOT_READY: return "table not ready";
    case LEASEHOLD_E_BAD_SLOT: return "slot index out of range";
    case LEASEHOLD_E_NOT_FOUND: return "no slot for that sandbox";
    case LEASEHOLD_E_IO: return "operating system error";
    case LEASEHOLD_E_ARG: return "malformed argument";
    case LEASEHOLD_E_BUSY: return "slot busy, retry";
    case LEASEHOLD_E_TOKEN_UNSIGNED: return "token unsigned";
    case LEASEHOLD_E_TOKEN_MALFORMED: return "token malformed";
    case LEASEHOLD_E_TOKEN_UNKNOWN_KEY: return "token signed with an unknown key id";
    case LEASEHOLD_E_TOKEN_BAD_SIGNATURE: return "token signature does not verify (forged)";
    case LEASEHOLD_E_TOKEN_WRONG_NAME: return "token of another name";
    case LEASEHOLD_E_TOKEN_WRONG_EPOCH: return "token of another epoch";
    case LEASEHOLD_E_TOKEN_WRONG_HOLDER: return "token of another holder";
    default: return "unknown leasehold error";
  }
}

}  // extern "C"

static_assert(sizeof(leasehold_slot_info) == 80);
static_assert(LEASEHOLD_REVOKED_BIT == leasehold::shm::kRevokedBit);
static_assert(LEASEHOLD_LAYOUT_MAJOR == leasehold::shm::kLayoutMajor);
static_assert(LEASEHOLD_TOKEN_BYTES == leasehold::token::kTokenBytes);
