#include "leasehold/lease/types.hpp"

#include <boost/uuid/name_generator_sha1.hpp>
#include <boost/uuid/string_generator.hpp>
#include <boost/uuid/uuid.hpp>
#include <boost/uuid/uuid_io.hpp>

#include <cstdio>

namespace leasehold {
namespace {

boost::uuids::uuid to_uuid(std::uint64_t hi, std::uint64_t lo) {
  boost::uuids::uuid u{};
  for (int i = 0; i < 8; ++i) {
    u.data[i] = static_cast<std::uint8_t>(hi >> (56 - 8 * i));
    u.data[8 + i] = static_cast<std::uint8_t>(lo >> (56 - 8 * i));
  }
  return u;
}

void from_uuid(const boost::uuids::uuid& u, std::uint64_t& hi, std::uint64_t& lo) {
  hi = lo = 0;
  for (int i = 0; i < 8; ++i) {
    hi = (hi << 8) | u.data[i];
    lo = (lo << 8) | u.data[8 + i];
  }
}

bool is_name_byte(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '/' || c == '-';
}

// leasehold's UUIDv5 namespace (RFC 4122 §4.3): a fixed random UUID.
constexpr boost::uuids::uuid kNameNamespace{{0x6c, 0x65, 0x61, 0x73, 0x65, 0x68, 0x4f, 0x6c, 0x84,
                                             0x64, 0x2d, 0x6e, 0x61, 0x6d, 0x65, 0x73}};

}  // namespace

template <class Tag>
std::string Id<Tag>::str() const {
  return boost::uuids::to_string(to_uuid(hi, lo));
}

template <class Tag>
std::optional<Id<Tag>> Id<Tag>::parse(std::string_view text) noexcept {
  // boost's string_generator accepts braces and throws on junk; we accept exactly 32 hex
  // digits, optionally in the 8-4-4-4-12 dashed form.
  const bool dashed = text.size() == 36;
  if (!(dashed || text.size() == 32)) return std::nullopt;
  if (dashed && (text[8] != '-' || text[13] != '-' || text[18] != '-' || text[23] != '-'))
    return std::nullopt;
  std::string hex;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (dashed && (i == 8 || i == 13 || i == 18 || i == 23)) continue;
    const char c = text[i];
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!ok) return std::nullopt;
    hex.push_back(c);
  }
  try {
    boost::uuids::uuid u = boost::uuids::string_generator()(hex);
    Id id;
    from_uuid(u, id.hi, id.lo);
    return id;
  } catch (...) {
    return std::nullopt;
  }
}

template struct Id<NameTag>;
template struct Id<SandboxTag>;
template struct Id<WorkerTag>;

Status validate_name(std::string_view name) {
  if (name.empty()) return Status::invalid("name is empty (a name is 1..128 bytes of A-Z a-z 0-9 . _ : / -)");
  if (name.size() > kNameBytesMax)
    return Status::invalid("name is " + std::to_string(name.size()) + " bytes; the limit is " +
                           std::to_string(kNameBytesMax));
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (!is_name_byte(c)) {
      char buf[160];
      if (c >= 0x20 && c < 0x7f)
        std::snprintf(buf, sizeof buf,
                      "name has '%c' (0x%02x) at byte %zu; allowed: A-Z a-z 0-9 . _ : / -", c, c, i);
      else
        std::snprintf(buf, sizeof buf,
                      "name has byte 0x%02x at byte %zu; allowed: A-Z a-z 0-9 . _ : / -", c, i);
      return Status::invalid(buf);
    }
  }
  return {};
}

Status validate_new_name(std::string_view name) {
  if (Status why = validate_name(name); !why.ok()) return why;
  if (name.front() == '-')
    return Status::invalid("name begins with '-': it would read as an option, and \"-\" means none in listings; "
                           "begin it with A-Z a-z 0-9 . _ : or /");
  return {};
}

NameId name_id_of(std::string_view name) {
  boost::uuids::name_generator_sha1 gen(kNameNamespace);
  const boost::uuids::uuid u = gen(name.data(), name.size());
  NameId id;
  from_uuid(u, id.hi, id.lo);
  return id;
}

std::string_view to_string(LockPhase p) noexcept {
  switch (p) {
    case LockPhase::free: return "free";
    case LockPhase::acquiring: return "acquiring";
    case LockPhase::held: return "held";
    case LockPhase::transferring: return "transferring";
  }
  return "unknown_phase";
}

std::string_view to_string(RefreshStatus s) noexcept {
  switch (s) {
    case RefreshStatus::refreshed: return "refreshed";
    case RefreshStatus::lost: return "lost";
    case RefreshStatus::unknown: return "unknown";
    case RefreshStatus::queued: return "queued";
  }
  return "unknown_status";
}

}  // namespace leasehold
