// leasehold/harness: choosing the private subnet of one run's veth pairs (pure; unit-tested).
//
// Each run links its two worker namespaces to lockd with two /30s inside one /24 of
// 10.213.0.0/16 (kDemoSubnetPrefix.N.0/24, N in 0..kDemoSubnetCount-1). The /24 must not be used
// by anything on this machine - another run of the demo, a VPN, a container bridge - or the
// workers' datagrams go to the wrong link. So the run reads what is in use (the text of
// `ip -o -4 addr show` and `ip -4 route show table all`) and takes the first free /24 at or
// after a start point (its pid, so concurrent runs tend to spread out). Reading and creating
// are not atomic: the caller holds a machine-wide lock around both (harness/network.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::harness {

/// The /16 the demo's subnets come from, as text ("10.213").
inline constexpr std::string_view kDemoSubnetPrefix = "10.213";
/// /24s the demo may use: third octets 0..kDemoSubnetCount-1.
inline constexpr unsigned kDemoSubnetCount = 250;
/// Routes and addresses broader than this prefix length are ignored: a /30 of ours is more
/// specific than a /16 or a default route, so those cannot take its traffic.
inline constexpr unsigned kDemoSubnetBroadestConflict = 17;

/// An IPv4 range [first, first + size) found in `ip` output.
struct Ipv4Range {
  std::uint32_t first = 0;
  std::uint64_t size = 1;
};

/// Every IPv4 address or prefix ("a.b.c.d" or "a.b.c.d/len") in `text`, as ranges.
/// Malformed tokens are skipped.
inline std::vector<Ipv4Range> ipv4_ranges_in(std::string_view text) {
  std::vector<Ipv4Range> out;
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t i = 0;
  while (i < text.size()) {
    if (!is_digit(text[i]) || (i > 0 && (is_digit(text[i - 1]) || text[i - 1] == '.'))) {
      ++i;
      continue;
    }
    std::uint32_t addr = 0;
    std::size_t j = i;
    bool ok = true;
    for (int octet = 0; octet < 4 && ok; ++octet) {
      if (octet > 0) {
        if (j >= text.size() || text[j] != '.') {
          ok = false;
          break;
        }
        ++j;
      }
      unsigned v = 0;
      std::size_t digits = 0;
      while (j < text.size() && is_digit(text[j]) && digits < 4) {
        v = v * 10 + static_cast<unsigned>(text[j++] - '0');
        ++digits;
      }
      ok = digits > 0 && digits <= 3 && v <= 255;
      addr = (addr << 8) | v;
    }
    if (!ok || (j < text.size() && (is_digit(text[j]) || text[j] == '.'))) {
      i = j > i ? j : i + 1;
      continue;
    }
    unsigned len = 32;
    if (j + 1 < text.size() && text[j] == '/' && is_digit(text[j + 1])) {
      unsigned l = 0;
      std::size_t k = j + 1;
      while (k < text.size() && is_digit(text[k]) && l <= 32) l = l * 10 + static_cast<unsigned>(text[k++] - '0');
      if (l <= 32) len = l;
      j = k;
    }
    const std::uint64_t size = std::uint64_t{1} << (32 - len);
    const std::uint32_t mask = len == 0 ? 0u : ~std::uint32_t{0} << (32 - len);
    out.push_back({addr & mask, size});
    i = j;
  }
  return out;
}

/// The third octet of the first /24 of kDemoSubnetPrefix, at or after `start` (mod
/// kDemoSubnetCount), that no range in `in_use` (the text of `ip` listings) overlaps; ranges
/// broader than /kDemoSubnetBroadestConflict are ignored. nullopt when all are taken.
inline std::optional<unsigned> pick_demo_subnet(std::string_view in_use, unsigned start) {
  const std::vector<Ipv4Range> used = ipv4_ranges_in(in_use);
  const std::uint32_t base = (10u << 24) | (213u << 16);
  for (unsigned k = 0; k < kDemoSubnetCount; ++k) {
    const unsigned octet = (start + k) % kDemoSubnetCount;
    const std::uint64_t lo = base | (octet << 8), hi = lo + 256;
    bool free = true;
    for (const Ipv4Range& r : used) {
      if (r.size > (std::uint64_t{1} << (32 - kDemoSubnetBroadestConflict))) continue;
      if (r.first < hi && lo < r.first + r.size) {
        free = false;
        break;
      }
    }
    if (free) return octet;
  }
  return std::nullopt;
}

}  // namespace leasehold::harness
