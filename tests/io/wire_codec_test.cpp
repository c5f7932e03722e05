// The wire codec: round trips of every message type, the header layout, and every rejection
// reason of the decoder (DESIGN.md "The wire protocol").
#include "leasehold/lease/assert.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "tests/io/wire_samples.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace leasehold::wire {
namespace {

using Bytes = std::vector<std::uint8_t>;

WireKey test_key(std::uint8_t fill = 0x5A) { return WireKey{Bytes(kKeyBytesMin, fill)}; }

Header header(std::uint64_t seq = 7, std::uint64_t request_id = 99) {
  Header h;
  h.sender = samples::wid(500);
  h.seq = seq;
  h.request_id = request_id;
  return h;
}

Bytes encode_bytes(const Body& body, Authenticator* auth, const Header& h = header()) {
  Bytes out(kDatagramBytesMax);
  const EncodeResult r = encode(h, body, auth, out);
  EXPECT_EQ(r.error, EncodeError::none) << to_string(r.error);
  out.resize(r.bytes);
  return out;
}

void put_u16(Bytes& d, std::size_t at, std::uint16_t v) {
  d[at] = static_cast<std::uint8_t>(v);
  d[at + 1] = static_cast<std::uint8_t>(v >> 8);
}

// Rewrites payload and payload_len of a datagram and signs it again: an authentic datagram with
// exactly the payload the test wants.
Bytes with_payload(const Bytes& d, const Bytes& payload, Authenticator& auth) {
  // Sized once and filled with std::copy: g++ 12 at -O2 reports a false -Warray-bounds on
  // vector::insert into a vector built from an iterator range.
  Bytes out(kHeaderBytes + payload.size() + kTagBytes, 0);
  std::copy(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes), out.begin());
  put_u16(out, 40, static_cast<std::uint16_t>(payload.size()));
  std::copy(payload.begin(), payload.end(), out.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes));
  auth.sign(out);
  return out;
}

Bytes payload_of(const Bytes& d) {
  return Bytes(d.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes), d.end() - static_cast<std::ptrdiff_t>(kTagBytes));
}

class WireCodec : public ::testing::Test {
 protected:
  Authenticator auth{test_key()};
};

TEST_F(WireCodec, EveryMessageTypeRoundTripsWithAuthentication) {
  std::set<MessageType> seen;
  for (const Body& body : samples::every_type()) {
    const Header h = header(1234567, 0xFEEDull);
    const Bytes d = encode_bytes(body, &auth, h);
    ASSERT_LE(d.size(), kDatagramBytesMax);
    EXPECT_EQ(d.size(), kHeaderBytes + payload_bytes(body) + kTagBytes);
    const DecodeResult r = decode(d, &auth);
    ASSERT_EQ(r.error, DecodeError::none) << to_string(type_of(body)) << ": " << r.detail;
    EXPECT_EQ(r.header.type, type_of(body));
    EXPECT_EQ(r.header.sender, h.sender);
    EXPECT_EQ(r.header.seq, 1234567u);
    EXPECT_EQ(r.header.request_id, 0xFEEDu);
    EXPECT_EQ(r.header.payload_len, payload_bytes(body));
    EXPECT_TRUE(r.body == body) << to_string(type_of(body));
    seen.insert(type_of(body));
  }
  // Every MessageType the enum names is covered by the samples.
  std::size_t known = 0;
  for (unsigned t = 0; t < 256; ++t)
    if (to_string(static_cast<MessageType>(t)) != "unknown") ++known;
  EXPECT_EQ(seen.size(), known);
  EXPECT_EQ(known, std::variant_size_v<Body>);
}

// Stats: an empty payload (every version's request) has no `first`; a u16 payload is a page
// request; one byte, or three, is refused.
TEST_F(WireCodec, StatsTakesAnOptionalFirstIndex) {
  const Bytes plain = encode_bytes(Stats{}, &auth, header(1, 2));
  EXPECT_EQ(payload_of(plain).size(), 0u);
  const DecodeResult p = decode(plain, &auth);
  ASSERT_TRUE(p) << p.detail;
  EXPECT_FALSE(std::get<Stats>(p.body).first);
  Stats paged;
  paged.first = 0x1234;
  const Bytes d = encode_bytes(paged, &auth, header(3, 4));
  EXPECT_EQ(payload_of(d), (Bytes{0x34, 0x12}));
  const DecodeResult r = decode(d, &auth);
  ASSERT_TRUE(r) << r.detail;
  EXPECT_EQ(std::get<Stats>(r.body).first, std::optional<std::uint16_t>(0x1234));
  EXPECT_EQ(decode(with_payload(d, Bytes{0x01}, auth), &auth).error, DecodeError::short_payload);
  EXPECT_EQ(decode(with_payload(d, Bytes{1, 2, 3}, auth), &auth).error, DecodeError::trailing_bytes);
}

// The key-rejected notice: 47 bytes at documented offsets, no tag; the decoder takes exactly
// what the encoder writes and refuses any other byte; decode() refuses it (too short).
TEST_F(WireCodec, KeyRejectedNoticeLayoutAndStrictDecoding) {
  const KeyRejected n{0x0102030405060708ULL, 0x8001, KeyRejectReason::unknown_key};
  const auto b = encode_key_rejected(n);
  ASSERT_EQ(b.size(), 47u);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 4), (Bytes{'L', 'H', 'W', '1'}));
  EXPECT_EQ(b[4], kVersion);
  EXPECT_EQ(b[5], 0xFE);
  EXPECT_EQ(b[32], 0x08);
  EXPECT_EQ(b[39], 0x01);
  EXPECT_EQ(b[40], 3);
  EXPECT_EQ(b[44], 0x01);
  EXPECT_EQ(b[45], 0x80);
  EXPECT_EQ(b[46], 1);
  EXPECT_EQ(decode_key_rejected(b), n);
  EXPECT_EQ(request_id_of(std::as_bytes(std::span(b))), std::nullopt);  // never matched as an answer
  EXPECT_EQ(decode(b, nullptr).error, DecodeError::truncated);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i >= 32 && i < 40) continue;  // the request id: any value
    if (i == 44 || i == 45) continue;  // the key id: any value
    auto bad = b;
    bad[i] ^= 0x40;
    EXPECT_EQ(decode_key_rejected(bad), std::nullopt) << "byte " << i;
  }
  auto reason = b;
  reason[46] = 3;
  EXPECT_EQ(decode_key_rejected(reason), std::nullopt);
  Bytes longer(b.begin(), b.end());
  longer.push_back(0);
  EXPECT_EQ(decode_key_rejected(longer), std::nullopt);
}

TEST_F(WireCodec, HeaderLayoutIsLittleEndianAtDocumentedOffsets) {
  Header h;
  h.sender = WorkerId{0x0102030405060708ULL, 0x1112131415161718ULL};
  h.seq = 0x2122232425262728ULL;
  h.request_id = 0x3132333435363738ULL;
  h.flags = kFlagRetry;
  const Bytes d = encode_bytes(Revoke{NameId{0xA1, 0xB2}}, &auth, h);
  ASSERT_EQ(d.size(), kHeaderBytes + 25 + kTagBytes);  // name_id, expected_epoch, force
  EXPECT_EQ((Bytes{d.begin(), d.begin() + 4}), (Bytes{'L', 'H', 'W', '1'}));
  EXPECT_EQ(d[4], kVersion);
  EXPECT_EQ(d[5], static_cast<std::uint8_t>(MessageType::revoke));
  EXPECT_EQ(d[6], 1);
  EXPECT_EQ(d[7], 0);
  EXPECT_EQ(d[8], 0x08);   // sender.hi, least significant byte first
  EXPECT_EQ(d[15], 0x01);
  EXPECT_EQ(d[16], 0x18);  // sender.lo
  EXPECT_EQ(d[24], 0x28);  // seq
  EXPECT_EQ(d[31], 0x21);
  EXPECT_EQ(d[32], 0x38);  // request_id
  EXPECT_EQ(d[40], 25);    // payload_len
  EXPECT_EQ(d[41], 0);
  EXPECT_EQ(d[42], 0);     // reserved
  EXPECT_EQ(d[44], 0xA1);  // payload: name_id.hi
  // The tag is HMAC-SHA256 over everything before it.
  const auto tag = auth.mac(std::span<const std::uint8_t>(d).first(d.size() - kTagBytes));
  EXPECT_TRUE(std::equal(tag.begin(), tag.end(), d.end() - static_cast<std::ptrdiff_t>(kTagBytes)));
}

TEST_F(WireCodec, TruncatedDatagramsAreRejected) {
  const Bytes d = encode_bytes(Release{samples::nid(1), samples::sid(1), 3}, &auth);
  for (std::size_t n = 0; n < kDatagramBytesMin; ++n) {
    const DecodeResult r = decode(std::span<const std::uint8_t>(d).first(n), &auth);
    EXPECT_EQ(r.error, DecodeError::truncated) << n;
  }
  // Cut inside the payload but authentic and length-consistent: the payload parser notices.
  Bytes payload = payload_of(d);
  payload.resize(payload.size() - 3);
  const DecodeResult r = decode(with_payload(d, payload, auth), &auth);
  EXPECT_EQ(r.error, DecodeError::short_payload);
  EXPECT_NE(r.detail.find("release.epoch"), std::string::npos) << r.detail;
  // Cut without re-signing: the tag no longer matches.
  EXPECT_EQ(decode(std::span<const std::uint8_t>(d).first(d.size() - 1), &auth).error, DecodeError::bad_tag);
}

TEST_F(WireCodec, OversizedDatagramIsRejected) {
  Bytes d = encode_bytes(Stats{}, &auth);
  d.resize(kDatagramBytesMax + 1);
  const DecodeResult r = decode(d, &auth);
  EXPECT_EQ(r.error, DecodeError::oversized);
  EXPECT_NE(r.detail.find("1401"), std::string::npos) << r.detail;
}

TEST_F(WireCodec, PayloadLengthMismatchIsRejected) {
  for (int delta : {-1, +1, +1000}) {
    Bytes d = encode_bytes(Revoke{samples::nid(1)}, &auth);
    put_u16(d, 40, static_cast<std::uint16_t>(25 + delta));
    auth.sign(d);
    const DecodeResult r = decode(d, &auth);
    EXPECT_EQ(r.error, DecodeError::length_mismatch) << delta;
    EXPECT_EQ(r.header.request_id, 99u);  // authentic: the header is there to address an Error answer
  }
}

TEST_F(WireCodec, WrongHmacIsRejected) {
  const Bytes d = encode_bytes(Acquire{"a", samples::sid(1), {}, 0, false}, &auth);
  Authenticator other{test_key(0x5B)};
  EXPECT_EQ(decode(d, &other).error, DecodeError::bad_tag);
  for (std::size_t at : {std::size_t{5}, kHeaderBytes, d.size() - 1}) {
    Bytes bad = d;
    bad[at] ^= 0x01;
    EXPECT_EQ(decode(bad, &auth).error, DecodeError::bad_tag) << at;
  }
  EXPECT_EQ(decode(d, &auth).error, DecodeError::none);
  // Unsigned datagrams (auth == nullptr at encode) do not authenticate.
  EXPECT_EQ(decode(encode_bytes(Stats{}, nullptr), &auth).error, DecodeError::bad_tag);
}

TEST_F(WireCodec, BadMagicUnknownVersionUnknownTypeAndFlagsAreRejected) {
  Bytes d = encode_bytes(Stats{}, &auth);
  Bytes magic = d;
  magic[0] = 'X';
  auth.sign(magic);
  EXPECT_EQ(decode(magic, &auth).error, DecodeError::bad_magic);

  Bytes version = d;
  version[4] = kVersion + 1;
  auth.sign(version);
  DecodeResult r = decode(version, &auth);
  EXPECT_EQ(r.error, DecodeError::unknown_version);
  EXPECT_TRUE(is_authenticated_reason(r.error));
  EXPECT_EQ(r.header.sender, samples::wid(500));
  EXPECT_NE(r.detail.find("version " + std::to_string(kVersion + 1)), std::string::npos) << r.detail;

  for (std::uint8_t t : {0x00, 0x1F, 0x42, 0x80, 0x8F, 0xFE}) {
    Bytes type = d;
    type[5] = t;
    auth.sign(type);
    EXPECT_EQ(decode(type, &auth).error, DecodeError::unknown_type) << int(t);
  }

  Bytes flags = d;
  flags[6] = 0x02;
  auth.sign(flags);
  EXPECT_EQ(decode(flags, &auth).error, DecodeError::bad_flags);
  // Bytes 42..43 are the key id (version 2): decoded into the header, checked by the Keyring.
  Bytes key_id = d;
  key_id[42] = 7;
  auth.sign(key_id);
  const DecodeResult k = decode(key_id, &auth);
  EXPECT_EQ(k.error, DecodeError::none);
  EXPECT_EQ(k.header.key_id, 7u);
}

TEST_F(WireCodec, TrailingBytesAreRejected) {
  const Bytes d = encode_bytes(Ok{samples::nid(1), 5}, &auth);
  Bytes payload = payload_of(d);
  payload.push_back(0);
  const DecodeResult r = decode(with_payload(d, payload, auth), &auth);
  EXPECT_EQ(r.error, DecodeError::trailing_bytes);
  EXPECT_NE(r.detail.find("1 bytes after"), std::string::npos) << r.detail;
}

TEST_F(WireCodec, BadCountsAreRejected) {
  Heartbeat hb;
  hb.entries.push_back(HeartbeatEntry{samples::nid(1), samples::sid(1), 1});
  const Bytes d = encode_bytes(hb, &auth);
  Bytes payload = payload_of(d);
  payload[4] = static_cast<std::uint8_t>(kHeartbeatEntriesMax + 1);  // count above the limit
  EXPECT_EQ(decode(with_payload(d, payload, auth), &auth).error, DecodeError::bad_count);
  payload[4] = 2;  // within the limit, but only one entry follows
  const DecodeResult r = decode(with_payload(d, payload, auth), &auth);
  EXPECT_EQ(r.error, DecodeError::bad_count);
  EXPECT_NE(r.detail.find("heartbeat.count"), std::string::npos) << r.detail;
}

TEST_F(WireCodec, InvalidNamesAreRejectedAtDecodeAndEncode) {
  const Bytes d = encode_bytes(Acquire{"ab", samples::sid(1), {}, 0, false}, &auth);
  Bytes payload = payload_of(d);
  payload[payload.size() - 1] = ' ';  // "a " breaks [A-Za-z0-9._:/-]
  const DecodeResult r = decode(with_payload(d, payload, auth), &auth);
  EXPECT_EQ(r.error, DecodeError::invalid_name);
  EXPECT_NE(r.detail.find("acquire.name"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find(validate_name("a ").message()), std::string::npos) << r.detail;

  payload.resize(payload.size() - 3);
  payload.push_back(0);  // empty name (length byte 0)
  EXPECT_EQ(decode(with_payload(d, payload, auth), &auth).error, DecodeError::invalid_name);

  Bytes out(kDatagramBytesMax);
  EXPECT_EQ(encode(header(), Acquire{"no spaces", samples::sid(1), {}, 0, false}, &auth, out).error,
            EncodeError::invalid_name);
  EXPECT_EQ(encode(header(), Acquire{std::string(kNameBytesMax + 1, 'a'), samples::sid(1), {}, 0, false}, &auth, out)
                .error,
            EncodeError::invalid_name);
  EXPECT_EQ(encode(header(), Show{"x y", {}, std::nullopt}, &auth, out).error, EncodeError::invalid_name);
}

TEST_F(WireCodec, OutOfRangeEnumsAndBooleansAreRejected) {
  const Bytes grant = encode_bytes(Grant{samples::nid(1), 2, samples::sid(1), samples::wid(1), LockPhase::held, 9, {}}, &auth);
  Bytes payload = payload_of(grant);
  payload[16 + 8 + 16 + 16] = 4;  // state
  EXPECT_EQ(decode(with_payload(grant, payload, auth), &auth).error, DecodeError::bad_value);

  const Bytes deny = encode_bytes(Deny{samples::nid(1), Refusal::held, {}, {}, 3, LockPhase::held}, &auth);
  payload = payload_of(deny);
  payload[16] = 200;  // refusal
  const DecodeResult r = decode(with_payload(deny, payload, auth), &auth);
  EXPECT_EQ(r.error, DecodeError::bad_value);
  EXPECT_NE(r.detail.find("deny.refusal"), std::string::npos) << r.detail;

  const Bytes running = encode_bytes(RunningAnswer{samples::nid(1), samples::sid(1), 3, true}, &auth);
  payload = payload_of(running);
  payload.back() = 2;  // boolean
  EXPECT_EQ(decode(with_payload(running, payload, auth), &auth).error, DecodeError::bad_value);
}

// Every refusal travels as its own byte - the enumerator's value, as earlier builds sent it - and
// decodes back to itself; every other byte is refused as bad_value naming the field, never read
// as some refusal.
TEST_F(WireCodec, EveryRefusalRoundTripsAndOtherBytesAreRefused) {
  constexpr std::size_t kRefusalAt = 16;  // after name_id
  std::set<unsigned> codes;
  for (const Refusal refusal : kRefusals) {
    const Deny deny{samples::nid(1), refusal, samples::sid(2), samples::wid(3), 4, LockPhase::held};
    const Bytes d = encode_bytes(deny, &auth);
    const std::uint8_t code = payload_of(d).at(kRefusalAt);
    EXPECT_EQ(code, static_cast<std::uint8_t>(refusal)) << to_string(refusal);
    codes.insert(code);
    const DecodeResult r = decode(d, &auth);
    ASSERT_EQ(r.error, DecodeError::none) << to_string(refusal) << ": " << r.detail;
    EXPECT_EQ(std::get<Deny>(r.body), deny) << to_string(refusal);
  }
  EXPECT_EQ(codes.size(), kRefusals.size());
  EXPECT_EQ(kRefusalCodes.encode(Refusal::held), 3);
  EXPECT_EQ(kRefusalCodes.encode(Refusal::lock_delay), 7);
  EXPECT_EQ(kRefusalCodes.encode(Refusal::forbidden), 22);

  const Bytes d = encode_bytes(Deny{samples::nid(1), Refusal::held, {}, {}, 3, LockPhase::held}, &auth);
  std::size_t refused = 0;
  for (unsigned b = 0; b <= 0xFF; ++b) {
    if (codes.count(b) != 0) continue;
    Bytes payload = payload_of(d);
    payload.at(kRefusalAt) = static_cast<std::uint8_t>(b);
    const DecodeResult r = decode(with_payload(d, payload, auth), &auth);
    EXPECT_EQ(r.error, DecodeError::bad_value) << b;
    EXPECT_NE(r.detail.find("deny.refusal"), std::string::npos) << r.detail;
    ++refused;
  }
  EXPECT_EQ(refused, 256 - kRefusals.size());
}

// A Grant's token is absent (length 0) or exactly one token long; any other length is refused,
// and a datagram cut inside the token is short.
TEST_F(WireCodec, GrantTokenLengthIsChecked) {
  Grant g{samples::nid(1), 2, samples::sid(1), samples::wid(1), LockPhase::held, 9, {}};
  g.token.resize(token::kTokenBytes, 0xAB);
  const Bytes grant = encode_bytes(g, &auth);
  const DecodeResult ok = decode(grant, &auth);
  ASSERT_EQ(ok.error, DecodeError::none) << ok.detail;
  EXPECT_EQ(std::get<Grant>(ok.body), g);
  constexpr std::size_t kTokenLenAt = 16 + 8 + 16 + 16 + 1 + 4;
  Bytes payload = payload_of(grant);
  ASSERT_EQ(payload[kTokenLenAt], token::kTokenBytes);
  payload[kTokenLenAt] = token::kTokenBytes - 1;
  payload.pop_back();
  const DecodeResult bad = decode(with_payload(grant, payload, auth), &auth);
  EXPECT_EQ(bad.error, DecodeError::bad_value);
  EXPECT_NE(bad.detail.find("grant.token_len"), std::string::npos) << bad.detail;
  payload = payload_of(grant);
  payload.resize(payload.size() - 10);
  EXPECT_EQ(decode(with_payload(grant, payload, auth), &auth).error, DecodeError::short_payload);
}

TEST_F(WireCodec, OverlongTextIsRejected) {
  Bytes out(kDatagramBytesMax);
  EXPECT_EQ(encode(header(), Error{ErrorCode::internal, std::string(kErrorTextBytesMax + 1, 'x')}, &auth, out).error,
            EncodeError::bad_text);
  const Bytes d = encode_bytes(Error{ErrorCode::internal, "x"}, &auth);
  Bytes payload = payload_of(d);
  put_u16(payload, 2 + 8, static_cast<std::uint16_t>(kErrorTextBytesMax + 1));  // after code, seq_floor
  payload.resize(2 + 8 + 2 + kErrorTextBytesMax + 1, 'x');
  EXPECT_EQ(decode(with_payload(d, payload, auth), &auth).error, DecodeError::bad_text);
}

TEST_F(WireCodec, EncoderRefusesWhatDoesNotFitOneDatagram) {
  ListPage page;
  for (std::uint64_t i = 0; i < 30; ++i) page.entries.push_back(samples::record(i));
  EXPECT_GT(payload_bytes(page), kPayloadBytesMax);
  Bytes out(kDatagramBytesMax);
  EXPECT_EQ(encode(header(), page, &auth, out).error, EncodeError::too_large);
  // lockd fills a page while it fits.
  ListPage fitted;
  for (const auto& rec : page.entries) {
    fitted.entries.push_back(rec);
    if (payload_bytes(fitted) > kPayloadBytesMax) {
      fitted.entries.pop_back();
      break;
    }
  }
  const EncodeResult r = encode(header(), fitted, &auth, out);
  ASSERT_TRUE(r);
  EXPECT_LE(r.bytes, kDatagramBytesMax);
  EXPECT_GT(fitted.entries.size(), 5u);

  // A buffer too small, and unknown flags.
  Bytes small(kDatagramBytesMin);
  EXPECT_EQ(encode(header(), Revoke{}, &auth, small).error, EncodeError::buffer_too_small);
  Header h = header();
  h.flags = 0x8000;
  EXPECT_EQ(encode(h, Revoke{}, &auth, out).error, EncodeError::bad_flags);
}

TEST_F(WireCodec, FullHeartbeatAndItsAckFitOneDatagram) {
  Heartbeat hb;
  HeartbeatAck ack;
  WorkerHeartbeat beat{samples::wid(1), {}};
  WorkerAck wack{9000, {}};
  for (std::uint64_t i = 0; i < kHeartbeatEntriesMax; ++i) {
    hb.entries.push_back(HeartbeatEntry{samples::nid(i), samples::sid(i), i});
    ack.entries.push_back(HeartbeatAckEntry{samples::nid(i), RefreshStatus::lost, samples::sid(i), i, 0});
  }
  for (std::uint64_t i = 0; i < kWorkerBeatEntriesMax; ++i) {
    beat.held.push_back(HeartbeatEntry{samples::nid(i), samples::sid(i), i});
    wack.not_held.push_back(HeartbeatAckEntry{samples::nid(i), RefreshStatus::lost, samples::sid(i), i, 0});
  }
  for (const Body& b : {Body{hb}, Body{ack}, Body{beat}, Body{wack}}) {
    const Bytes d = encode_bytes(b, &auth);
    EXPECT_LE(d.size(), kDatagramBytesMax);
    const DecodeResult r = decode(d, &auth);
    ASSERT_TRUE(r) << r.detail;
    EXPECT_TRUE(r.body == b);
  }
}

// A batch of any size goes out chunk by chunk, each encoded straight from its entries into one
// reused datagram buffer: every entry exactly once, in order, and the bytes of each datagram
// are those of encode() of the Heartbeat its chunk makes (split_heartbeat()'s).
TEST_F(WireCodec, LargeHeartbeatBatchSplitsAcrossDatagrams) {
  std::vector<HeartbeatEntry> batch;
  for (std::uint64_t i = 0; i < 1000; ++i) batch.push_back(HeartbeatEntry{samples::nid(i), samples::sid(i), 10 + i});
  const std::size_t chunks = heartbeat_chunks(batch.size());
  EXPECT_EQ(chunks, (1000 + kHeartbeatEntriesMax - 1) / kHeartbeatEntriesMax);
  const std::vector<Heartbeat> parts = split_heartbeat(batch, 2500);
  ASSERT_EQ(parts.size(), chunks);
  std::vector<HeartbeatEntry> received;
  Datagram d;
  for (std::size_t i = 0; i < chunks; ++i) {
    const Header h = header(i + 1, i + 1);
    const EncodeResult r = encode_heartbeat(h, 2500, heartbeat_chunk(batch, i), &auth, d.buffer());
    ASSERT_TRUE(r) << to_string(r.error);
    d.size = static_cast<std::uint16_t>(r.bytes);
    EXPECT_EQ(Bytes(d.view().begin(), d.view().end()), encode_bytes(parts[i], &auth, h));
    const DecodeResult dr = decode(d.view(), &auth);
    ASSERT_TRUE(dr) << dr.detail;
    const auto& hb = std::get<Heartbeat>(dr.body);
    EXPECT_EQ(hb.ttl_cap_ms, 2500u);
    received.insert(received.end(), hb.entries.begin(), hb.entries.end());
  }
  EXPECT_EQ(received, batch);  // every entry exactly once, in order
  EXPECT_TRUE(heartbeat_chunk(batch, chunks).empty());
  EXPECT_EQ(heartbeat_chunks(0), 0u);
  EXPECT_TRUE(split_heartbeat({}, 1).empty());
  // An empty heartbeat encodes (and decodes) like the empty Heartbeat; more than one datagram's
  // worth of entries is refused.
  ASSERT_TRUE(encode_heartbeat(header(), 0, {}, &auth, d.buffer()));
  EXPECT_EQ(encode_heartbeat(header(), 0, batch, &auth, d.buffer()).error, EncodeError::too_large);
  EXPECT_EQ(encode_heartbeat(header(), 0, heartbeat_chunk(batch, 0), &auth, std::span<std::uint8_t>(d.buffer()).first(100)).error,
            EncodeError::buffer_too_small);
}

TEST_F(WireCodec, DecodeWithoutAuthenticatorSkipsOnlyTheTag) {
  Bytes d = encode_bytes(Commit{samples::nid(1), samples::sid(1), 4, samples::wid(1)}, nullptr);
  EXPECT_TRUE(decode(d, nullptr));
  d[5] = 0x77;
  EXPECT_EQ(decode(d, nullptr).error, DecodeError::unknown_type);
}

// request_id_of matches an answer to its request from the magic and the id field alone: also an
// answer of another version or an unknown type (an Error from a newer peer), never a datagram
// that is too short or not ours.
TEST(WireRequestId, ReadsTheIdOfAnyDatagramWithOurMagic) {
  auto id_of = [](const Bytes& d) { return request_id_of(std::as_bytes(std::span<const std::uint8_t>(d))); };
  Bytes d = encode_bytes(Error{ErrorCode::overloaded, "busy"}, nullptr, header(7, 0x0123456789ABCDEFull));
  ASSERT_EQ(id_of(d), std::optional<std::uint64_t>(0x0123456789ABCDEFull));
  Bytes other_version = d;
  other_version[4] = static_cast<std::uint8_t>(kVersion + 1);
  Header h;
  EXPECT_EQ(decode_header(other_version, nullptr, h), DecodeError::unknown_version);
  EXPECT_EQ(id_of(other_version), std::optional<std::uint64_t>(0x0123456789ABCDEFull));
  Bytes unknown_type = d;
  unknown_type[5] = 0xFF;
  EXPECT_EQ(id_of(unknown_type), std::optional<std::uint64_t>(0x0123456789ABCDEFull));
  Bytes bad_magic = d;
  bad_magic[0] ^= 0xFF;
  EXPECT_EQ(id_of(bad_magic), std::nullopt);
  const Bytes short_datagram(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(kDatagramBytesMin - 1));
  EXPECT_EQ(id_of(short_datagram), std::nullopt);
  EXPECT_EQ(id_of(Bytes{}), std::nullopt);
}

TEST(WireNames, ReasonsAndTypesHaveStableDistinctText) {
  std::set<std::string_view> texts;
  for (std::size_t e = 0; e < kDecodeErrorCount; ++e) texts.insert(to_string(static_cast<DecodeError>(e)));
  EXPECT_EQ(texts.size(), kDecodeErrorCount);
  EXPECT_EQ(texts.count("unknown"), 0u);
  EXPECT_EQ(to_string(DecodeError::length_mismatch), "length_mismatch");
  EXPECT_EQ(to_string(error_code_of(DecodeError::replayed)), "replayed");
  EXPECT_EQ(to_string(ErrorCode::overloaded), "overloaded");
  EXPECT_EQ(to_string(ErrorCode::not_leader), "not_leader");
  EXPECT_EQ(to_string(MessageType::heartbeat_ack), "heartbeat_ack");
  EXPECT_TRUE(is_request(MessageType::is_running));
  EXPECT_FALSE(is_request(MessageType::error));
}

// The codec round trip (decode(encode(x)) == x) is asserted inside encode() in debug builds
// and wherever enable_slow_asserts() was called (the simulator). Fed a body that the encoder writes and the decoder cannot read back (a lock
// phase outside kLockPhaseCodes: the encoder writes the table's "bad" byte), encode aborts
// instead of sending a datagram that lockd would refuse or, worse, read as something else.
TEST(WireCodecDeathTest, AnEncodingThatDoesNotDecodeBackAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if !LEASEHOLD_SLOW_ASSERTS
  enable_slow_asserts();  // as the simulator does: the check runs in a build compiled without it
#endif
  const Grant bad{samples::nid(1), 2, samples::sid(1), samples::wid(1), static_cast<LockPhase>(0x7f), 9, {}};
  Bytes out(kDatagramBytesMax);
  EXPECT_DEATH(encode(header(), bad, nullptr, out), "LEASEHOLD_ASSERT\\(decodes_back\\(.*\\) failed");
  const Grant good{samples::nid(1), 2, samples::sid(1), samples::wid(1), LockPhase::held, 9, {}};
  EXPECT_TRUE(encode(header(), good, nullptr, out));
}

}  // namespace
}  // namespace leasehold::wire
