// The fixed HMAC key of the wire fuzzer and its seed corpus (so seeds authenticate). Never a
// deployment key.
#pragma once

#include "leasehold/wire/auth.hpp"

namespace leasehold::wire::fuzzing {

inline WireKey fuzz_key() {
  WireKey key;
  for (std::size_t i = 0; i < kKeyBytesMin; ++i) key.bytes.push_back(static_cast<std::uint8_t>(0xF0 ^ i));
  return key;
}

}  // namespace leasehold::wire::fuzzing
