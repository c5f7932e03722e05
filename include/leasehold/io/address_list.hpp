// leasehold/io: a list of service addresses as an operator writes it, "A,B,C".
//
// A replicated lockd is several processes, one of which leads at a time; its clients (the
// supervisor's --lockd, the CLI's --lockd and $LEASEHOLD_LOCKD) are given all of them and follow
// the leader (Error{not_leader}, wire/protocol.hpp). Each entry is HOST:PORT, [IPV6]:PORT, or a
// host name with a port, resolved once at start-up (getaddrinfo, UDP). A single entry is the
// one-address form every earlier release accepted (plus host names).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/wire/address.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

/// At most this many entries in one list: a cluster is a handful of lockd processes, and every
/// entry may cost a name lookup at start-up.
inline constexpr std::size_t kAddressListMax = 16;

/// One entry as written: `host` without brackets, `port` numeric.
struct AddressEntry {
  std::string text;  ///< the entry, spaces around it removed
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const AddressEntry&, const AddressEntry&) = default;
};

/// The entries of "A,B,C", syntax only (no name lookup): each is HOST:PORT or [IPV6]:PORT with a
/// numeric port 0..65535; spaces around an entry are ignored; an entry written twice is kept
/// once (the first). Errors (invalid_argument, naming the entry and its position): an empty list
/// or entry, a missing or bad port, an unbracketed IPv6 address, more than kAddressListMax
/// entries.
Result<std::vector<AddressEntry>> split_address_list(std::string_view text);

/// split_address_list, then every entry resolved: a numeric address as it is, a host name with
/// getaddrinfo (UDP) to its first IPv4 address, else its first IPv6 one. Addresses that come
/// out the same (e.g. "localhost:7400,127.0.0.1:7400") are kept once, the first. Errors, each
/// naming the entry: invalid_argument (syntax as above, port 0, IPv4 and IPv6 mixed: one UDP
/// socket talks to them all), not_found (a name that does not resolve, with the resolver's
/// reason).
Result<std::vector<SocketAddress>> resolve_address_list(std::string_view text);

/// "A, B, C": each address's SocketAddress::str().
std::string address_list_text(std::span<const SocketAddress> list);

}  // namespace leasehold
