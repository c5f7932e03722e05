// leasehold/io: address lists, "A,B,C" (see address_list.hpp).
#include "leasehold/io/address_list.hpp"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace leasehold {
namespace {

constexpr const char* kExpected = "expected HOST:PORT such as 127.0.0.1:7400, [::1]:7400 or lockd-1.example:7400";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "\"a:1\"", and " (entry 2 of 3)" when the list has more than one.
std::string which(std::string_view entry, std::size_t index, std::size_t count) {
  std::string s = "\"" + std::string(entry) + "\"";
  if (count > 1) s += " (entry " + std::to_string(index + 1) + " of " + std::to_string(count) + ")";
  return s;
}

Result<AddressEntry> parse_entry(std::string_view text, std::size_t index, std::size_t count) {
  const auto bad = [&](const std::string& why) { return Status::invalid(which(text, index, count) + ": " + why); };
  if (text.empty()) return bad("an empty entry; " + std::string(kExpected));
  AddressEntry e;
  e.text = std::string(text);
  std::string_view port_text;
  if (text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("no ']' after the IPv6 address; " + std::string(kExpected));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no :PORT after the address; " + std::string(kExpected));
    e.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    if (e.host.empty()) return bad("an empty address between [ and ]");
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad(kExpected);
    e.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (e.host.empty()) return bad("no host before :PORT; " + std::string(kExpected));
    if (e.host.find(':') != std::string::npos)
      return bad("an IPv6 address needs brackets, as in [" + e.host + "]:" + std::string(port_text));
  }
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535)
    return bad("the port \"" + std::string(port_text) + "\" is not a number 0..65535");
  e.port = static_cast<std::uint16_t>(port);
  return e;
}

const char* family_text(int family) { return family == AF_INET6 ? "IPv6" : "IPv4"; }

}  // namespace

Result<std::vector<AddressEntry>> split_address_list(std::string_view text) {
  std::vector<std::string_view> parts;
  if (trim(text).empty()) return Status::invalid("no address given; " + std::string(kExpected));
  for (std::string_view rest = text;;) {
    const std::size_t comma = rest.find(',');
    parts.push_back(trim(rest.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (parts.size() > kAddressListMax)
    return Status::invalid(std::to_string(parts.size()) + " addresses in \"" + std::string(text) + "\": at most " +
                           std::to_string(kAddressListMax));
  std::vector<AddressEntry> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    Result<AddressEntry> e = parse_entry(parts[i], i, parts.size());
    if (!e) return e.status();
    if (std::find(out.begin(), out.end(), *e) == out.end()) out.push_back(std::move(e).value());
  }
  return out;
}

Result<std::vector<SocketAddress>> resolve_address_list(std::string_view text) {
  Result<std::vector<AddressEntry>> entries = split_address_list(text);
  if (!entries) return entries.status();
  const std::size_t count = entries->size();
  std::vector<SocketAddress> out;
  std::string first_text;  // the entry that set the family
  for (std::size_t i = 0; i < count; ++i) {
    const AddressEntry& e = (*entries)[i];
    const std::string name = which(e.text, i, count);
    if (e.port == 0) return Status::invalid(name + ": port 0 is no service's port");
    std::optional<SocketAddress> addr = SocketAddress::parse(e.text);
    if (!addr && e.text.front() == '[') return Status::invalid(name + ": \"" + e.host + "\" is not an IPv6 address");
    if (!addr) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_DGRAM;
      hints.ai_protocol = IPPROTO_UDP;
      hints.ai_flags = AI_NUMERICSERV;
      addrinfo* found = nullptr;
      const std::string port = std::to_string(e.port);
      const int rc = ::getaddrinfo(e.host.c_str(), port.c_str(), &hints, &found);
      if (rc != 0) {
        const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
        return Status{Errc::not_found, name + ": cannot resolve host \"" + e.host + "\": " + why};
      }
      const addrinfo* pick = nullptr;
      for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
          pick = a;
          break;
        }
        if (a->ai_family == AF_INET6 && pick == nullptr) pick = a;
      }
      if (pick != nullptr) addr = SocketAddress::from(pick->ai_addr, pick->ai_addrlen);
      ::freeaddrinfo(found);
      if (!addr) return Status{Errc::not_found, name + ": host \"" + e.host + "\" has no IPv4 or IPv6 address"};
    }
    if (!out.empty() && addr->family() != out.front().family())
      return Status::invalid(name + " is " + family_text(addr->family()) + " (" + addr->str() + ") but " + first_text +
                             " is " + family_text(out.front().family()) + ": give addresses of one family");
    if (out.empty()) first_text = "\"" + e.text + "\"";
    if (std::find(out.begin(), out.end(), *addr) == out.end()) out.push_back(*addr);
  }
  return out;
}

std::string address_list_text(std::span<const SocketAddress> list) {
  std::string s;
  for (const SocketAddress& a : list) s += (s.empty() ? "" : ", ") + a.str();
  return s;
}

}  // namespace leasehold
