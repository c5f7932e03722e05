// libFuzzer target for the wire decoder and the receiver policy (wire/protocol.hpp, wire/replay.hpp).
//
// Properties checked on every input, besides "no crash, no out-of-bounds read, no UB":
// 1. decode() without authentication is total and, when it accepts, the encoding is canonical:
//    re-encoding the decoded message reproduces the input byte for byte (up to the tag).
// 2. decode() with authentication rejects every input whose tag does not match.
// 3. The same bytes, signed with the fuzz key, go through Receiver::admit() (authenticated path:
//    replay window, response cache, payload decoder) and every verdict is consistent.
// 4. decode_key_rejected() (the unauthenticated notice) is total and canonical: what it accepts
//    is exactly what encode_key_rejected() writes for the decoded notice, and no notice is a
//    datagram decode() accepts.
#include "fuzz/wire_fuzz_key.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace leasehold::wire;

namespace {

[[noreturn]] void property_failed() { std::abort(); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const WireKey key = fuzzing::fuzz_key();
  static Authenticator auth(key);
  // Small limits so eviction of senders and cached answers is exercised too.
  static Receiver receiver(key, Receiver::Limits{8, 8});

  const std::span<const std::uint8_t> input(data, size);

  // 1. Unauthenticated decode and canonical re-encoding.
  const DecodeResult plain = decode(input, nullptr);
  if (plain) {
    std::uint8_t again[kDatagramBytesMax];
    const EncodeResult e = encode(plain.header, plain.body, nullptr, again);
    if (!e || e.bytes != size || std::memcmp(again, data, size - kTagBytes) != 0) property_failed();
  } else if (plain.detail.empty()) {
    property_failed();  // every rejection says why
  }

  // 4. The key-rejected notice.
  if (const auto notice = decode_key_rejected(input)) {
    const auto again = encode_key_rejected(*notice);
    if (size != again.size() || std::memcmp(again.data(), data, size) != 0 || plain) property_failed();
  }

  // 2. Authenticated decode of the raw input.
  const DecodeResult authed = decode(input, &auth);
  if (authed && !auth.verify(input)) property_failed();

  // 3. The receiver, on a correctly signed copy.
  if (size >= kTagBytes && size <= kDatagramBytesMax + 64) {
    std::vector<std::uint8_t> signed_copy(data, data + size);
    // The key id the receiver's keyring knows (header bytes 42..43), so the copy reaches the
    // authenticated path; inputs with other ids are covered by (1) and (2).
    if (size >= kHeaderBytes) {
      signed_copy[42] = static_cast<std::uint8_t>(key.key_id);
      signed_copy[43] = static_cast<std::uint8_t>(key.key_id >> 8);
    }
    auth.sign(signed_copy);
    const Admission a = receiver.admit(signed_copy, 0);
    switch (a.verdict) {
      case Verdict::deliver:
        if (a.reason != DecodeError::none) property_failed();
        receiver.remember_answer(a.key, std::span<const std::uint8_t>(signed_copy).first(size / 2));
        break;
      case Verdict::resend:
        if (a.cached_answer.size() > kDatagramBytesMax) property_failed();
        break;
      case Verdict::answer_error: {
        if (!is_authenticated_reason(a.reason)) property_failed();
        const Error err = error_answer(a);
        Header h;
        h.seq = 1;
        h.request_id = a.message.header.request_id;
        std::uint8_t out[kDatagramBytesMax];
        if (!encode(h, err, &auth, out)) property_failed();  // an Error answer always fits
        break;
      }
      case Verdict::drop:
        // Dropped authentic datagrams: only seq refusals (replayed, below the window, at or
        // above 2^63, too far above the receiver's clock) whose error answer is rate-bounded.
        if (is_authenticated_reason(a.reason) && a.reason != DecodeError::replayed &&
            a.reason != DecodeError::stale_seq && a.reason != DecodeError::seq_out_of_range &&
            a.reason != DecodeError::seq_jump)
          property_failed();
        break;
    }
  }
  return 0;
}
