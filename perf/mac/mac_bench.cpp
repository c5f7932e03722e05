// Tag cost per datagram (issue "Performance", lockd's refresh path): lockd verifies one tag per
// heartbeat and signs one per answer. For a 29-entry heartbeat (kHeartbeatEntriesMax) and its
// 29-entry HeartbeatAck, each measured as one tag over the datagram less its tag:
//   EvpMacReinit   HMAC-SHA256 through EVP_MAC, re-initialised with a NULL key per datagram
//                  (what wire/auth.cpp did; kept here as the baseline)
//   Sha256Midstate HMAC-SHA256 from the inner and outer SHA-256 states of the key, computed once:
//                  per datagram a copy of each, the data, two finals (low-level SHA256_*)
//   EvpMdCopy      the same from pre-keyed EVP_MD_CTX states copied with EVP_MD_CTX_copy_ex
//   Authenticator  wire::Authenticator::mac(), whatever the library does now
//   Blake2bMac     keyed BLAKE2b-256 (EVP_MAC "BLAKE2BMAC"), re-initialised per datagram
//   Blake2sMac     keyed BLAKE2s-256 (EVP_MAC "BLAKE2SMAC"), re-initialised per datagram
// BLAKE2 tags differ from HMAC-SHA256 ones: using one would be a wire-protocol break. The
// HMAC variants must give the same tag as EvpMacReinit; the run fails if one does not. At the
// end: ns per datagram and the ratio to EvpMacReinit.
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "perf/common/ratio_report.hpp"

// The low-level SHA-256 calls are deprecated in OpenSSL 3, not removed; wire/auth.cpp uses them
// the same way.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>

#include <benchmark/benchmark.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace leasehold;
using namespace leasehold::wire;
using Tag = std::array<std::uint8_t, kTagBytes>;

const WireKey& key() {
  static const WireKey k{std::vector<std::uint8_t>(kKeyBytesMin, 0x6B)};
  return k;
}

// The signed part of a 29-entry heartbeat (arg 0) and of its answer (arg 1).
std::vector<std::uint8_t> message(int which) {
  Header h;
  h.sender = WorkerId{1, 2};
  h.seq = 1000;
  h.request_id = 7;
  Datagram d;
  EncodeResult r;
  if (which == 0) {
    Heartbeat hb;
    for (std::uint64_t i = 0; i < kHeartbeatEntriesMax; ++i)
      hb.entries.push_back(HeartbeatEntry{NameId{0x1000 + i, 0x77 * i}, SandboxId{0x2000 + i, 0x99 * i}, 100 + i});
    r = encode(h, hb, nullptr, d.buffer());
  } else {
    HeartbeatAck ack;
    for (std::uint64_t i = 0; i < kHeartbeatEntriesMax; ++i)
      ack.entries.push_back(HeartbeatAckEntry{NameId{0x1000 + i, 0x77 * i}, RefreshStatus::refreshed, SandboxId{},
                                              100 + i, 30'000});
    r = encode(h, ack, nullptr, d.buffer());
  }
  if (!r) throw std::runtime_error("cannot encode the sample datagram");
  return std::vector<std::uint8_t>(d.bytes.begin(), d.bytes.begin() + static_cast<std::ptrdiff_t>(r.bytes - kTagBytes));
}

// ---- the constructions ----------------------------------------------------------------------

class EvpMac {
 public:
  EvpMac(const char* name, const char* digest, std::size_t out_bytes) {
    mac_ = EVP_MAC_fetch(nullptr, name, nullptr);
    if (mac_ == nullptr) throw std::runtime_error(std::string("no ") + name);
    ctx_ = EVP_MAC_CTX_new(mac_);
    std::vector<OSSL_PARAM> params;
    if (digest != nullptr)
      params.push_back(OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, const_cast<char*>(digest), 0));
    params.push_back(OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &out_bytes));
    if (digest != nullptr) params.pop_back();  // HMAC's size is the digest's
    params.push_back(OSSL_PARAM_construct_end());
    if (EVP_MAC_init(ctx_, key().bytes.data(), key().bytes.size(), params.data()) != 1)
      throw std::runtime_error(std::string(name) + " init failed");
  }
  ~EvpMac() {
    EVP_MAC_CTX_free(ctx_);
    EVP_MAC_free(mac_);
  }
  Tag tag(std::span<const std::uint8_t> data) const {
    Tag t{};
    std::size_t len = 0;
    EVP_MAC_init(ctx_, nullptr, 0, nullptr);
    EVP_MAC_update(ctx_, data.data(), data.size());
    EVP_MAC_final(ctx_, t.data(), &len, t.size());
    return t;
  }

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* ctx_ = nullptr;
};

// HMAC (RFC 2104) with the key's two padded blocks hashed once.
class Sha256Midstate {
 public:
  Sha256Midstate() {
    std::array<std::uint8_t, SHA256_CBLOCK> ipad{}, opad{};
    const auto& k = key().bytes;  // <= 64 bytes (kKeyBytesMax): used as is
    std::memcpy(ipad.data(), k.data(), k.size());
    std::memcpy(opad.data(), k.data(), k.size());
    for (auto& b : ipad) b ^= 0x36;
    for (auto& b : opad) b ^= 0x5c;
    SHA256_Init(&inner_);
    SHA256_Update(&inner_, ipad.data(), ipad.size());
    SHA256_Init(&outer_);
    SHA256_Update(&outer_, opad.data(), opad.size());
  }
  Tag tag(std::span<const std::uint8_t> data) const {
    Tag t{};
    SHA256_CTX c = inner_;
    SHA256_Update(&c, data.data(), data.size());
    SHA256_Final(t.data(), &c);
    c = outer_;
    SHA256_Update(&c, t.data(), t.size());
    SHA256_Final(t.data(), &c);
    return t;
  }

 private:
  SHA256_CTX inner_{}, outer_{};
};

class EvpMdCopy {
 public:
  EvpMdCopy() {
    std::array<std::uint8_t, 64> ipad{}, opad{};
    const auto& k = key().bytes;
    std::memcpy(ipad.data(), k.data(), k.size());
    std::memcpy(opad.data(), k.data(), k.size());
    for (auto& b : ipad) b ^= 0x36;
    for (auto& b : opad) b ^= 0x5c;
    md_ = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    inner_ = EVP_MD_CTX_new();
    outer_ = EVP_MD_CTX_new();
    work_ = EVP_MD_CTX_new();
    EVP_DigestInit_ex2(inner_, md_, nullptr);
    EVP_DigestUpdate(inner_, ipad.data(), ipad.size());
    EVP_DigestInit_ex2(outer_, md_, nullptr);
    EVP_DigestUpdate(outer_, opad.data(), opad.size());
  }
  ~EvpMdCopy() {
    EVP_MD_CTX_free(inner_);
    EVP_MD_CTX_free(outer_);
    EVP_MD_CTX_free(work_);
    EVP_MD_free(md_);
  }
  Tag tag(std::span<const std::uint8_t> data) const {
    Tag t{};
    unsigned len = 0;
    EVP_MD_CTX_copy_ex(work_, inner_);
    EVP_DigestUpdate(work_, data.data(), data.size());
    EVP_DigestFinal_ex(work_, t.data(), &len);
    EVP_MD_CTX_copy_ex(work_, outer_);
    EVP_DigestUpdate(work_, t.data(), t.size());
    EVP_DigestFinal_ex(work_, t.data(), &len);
    return t;
  }

 private:
  EVP_MD* md_ = nullptr;
  EVP_MD_CTX* inner_ = nullptr;
  EVP_MD_CTX* outer_ = nullptr;
  EVP_MD_CTX* work_ = nullptr;
};

struct LibraryAuthenticator {
  Authenticator auth{key()};
  Tag tag(std::span<const std::uint8_t> data) const { return auth.mac(data); }
};

template <class Mac>
void run(benchmark::State& state, const Mac& mac, bool hmac) {
  const std::vector<std::uint8_t> m = message(static_cast<int>(state.range(0)));
  if (hmac) {
    static const EvpMac reference("HMAC", "SHA256", kTagBytes);
    if (mac.tag(m) != reference.tag(m)) {
      state.SkipWithError("tag differs from HMAC-SHA256 through EVP_MAC");
      return;
    }
  }
  for (auto _ : state) {
    Tag t = mac.tag(m);
    benchmark::DoNotOptimize(t);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(m.size()));
  state.SetLabel(std::to_string(m.size()) + " bytes");
}

void BM_EvpMacReinit(benchmark::State& s) { run(s, EvpMac("HMAC", "SHA256", kTagBytes), true); }
void BM_Sha256Midstate(benchmark::State& s) { run(s, Sha256Midstate(), true); }
void BM_EvpMdCopy(benchmark::State& s) { run(s, EvpMdCopy(), true); }
void BM_Authenticator(benchmark::State& s) { run(s, LibraryAuthenticator(), true); }
void BM_Blake2bMac(benchmark::State& s) { run(s, EvpMac("BLAKE2BMAC", nullptr, kTagBytes), false); }
void BM_Blake2sMac(benchmark::State& s) { run(s, EvpMac("BLAKE2SMAC", nullptr, kTagBytes), false); }

BENCHMARK(BM_EvpMacReinit)->Arg(0)->Arg(1)->MinTime(0.3);
BENCHMARK(BM_Sha256Midstate)->Arg(0)->Arg(1)->MinTime(0.3);
BENCHMARK(BM_EvpMdCopy)->Arg(0)->Arg(1)->MinTime(0.3);
BENCHMARK(BM_Authenticator)->Arg(0)->Arg(1)->MinTime(0.3);
BENCHMARK(BM_Blake2bMac)->Arg(0)->Arg(1)->MinTime(0.3);
BENCHMARK(BM_Blake2sMac)->Arg(0)->Arg(1)->MinTime(0.3);

std::string summary(const leasehold::perf::RunResults& r) {
  std::vector<leasehold::perf::RatioTable> tables;
  const char* names[] = {"BM_EvpMacReinit", "BM_Sha256Midstate", "BM_EvpMdCopy",
                         "BM_Authenticator", "BM_Blake2bMac", "BM_Blake2sMac"};
  for (int which = 0; which < 2; ++which) {
    const std::string arg = "/" + std::to_string(which);
    leasehold::perf::RatioTable t(std::string(which == 0 ? "29-entry heartbeat (" : "its 29-entry answer (") +
                                      std::to_string(message(which).size()) +
                                      " bytes tagged): ns per tag and ratio to EvpMacReinit:",
                                  "construction", {{"ns", 0, ""}, {"ratio", 2, "x"}});
    const auto base = r.ns_per_item(std::string("BM_EvpMacReinit") + arg);
    for (const char* name : names) {
      const auto v = r.ns_per_item(name + arg);
      t.row(name + 3, {v, leasehold::perf::ratio(v, base)});
    }
    tables.push_back(t);
  }
  return leasehold::perf::join_tables(tables);
}

}  // namespace

int main(int argc, char** argv) { return leasehold::perf::run_with_ratios(argc, argv, summary); }
