// Signed fencing tokens (wire/token.hpp): what a grant pays to sign its token, and what a resource
// pays per write to verify one, uncached (first write of an epoch) and cached (every later write),
// each next to its baseline in the same run: the grant answer encoded and tagged without a token,
// and the plain epoch compare a resource made before tokens were signed.
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/token.hpp"
#include "perf/common/ratio_report.hpp"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

namespace {

using namespace leasehold;

const token::TokenSigner& signer() {
  static const std::unique_ptr<token::TokenSigner> s = [] {
    auto k = token::TokenSigner::generate();
    if (!k) std::abort();
    return std::move(k).value();
  }();
  return *s;
}

const wire::Authenticator& auth() {
  static const wire::Authenticator a(wire::WireKey(std::vector<std::uint8_t>(32, 7)));
  return a;
}

token::GrantToken token_of(Epoch e) {
  token::GrantToken t;
  t.name = name_id_of("bench/name");
  t.epoch = e;
  t.holder = SandboxId{0x51, 1};
  t.worker = WorkerId{0x77, 1};
  t.issued_at_ns = 1'700'000'000'000'000'000;
  return t;
}

wire::Grant grant_of(Epoch e) {
  const token::GrantToken t = token_of(e);
  wire::Grant g;
  g.name_id = t.name;
  g.epoch = e;
  g.holder = t.holder;
  g.worker = t.worker;
  g.ttl_ms = 10'000;
  return g;
}

// The grant answer as lockd sends it without a token: Grant encoded and HMAC-tagged.
void BM_GrantAnswer_Unsigned(benchmark::State& state) {
  wire::Datagram d;
  wire::Header h;
  h.seq = 1;
  h.request_id = 1;
  Epoch e = 1;
  for (auto _ : state) {
    const auto r = wire::encode(h, grant_of(++e), &auth(), d.buffer());
    benchmark::DoNotOptimize(r.bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

// The same with the token signed and carried (what every grant does now).
void BM_GrantAnswer_Signed(benchmark::State& state) {
  wire::Datagram d;
  wire::Header h;
  h.seq = 1;
  h.request_id = 1;
  Epoch e = 1;
  for (auto _ : state) {
    wire::Grant g = grant_of(++e);
    token::GrantToken t = token_of(e);
    if (!signer().sign(t)) state.SkipWithError("sign failed");
    const token::TokenBytes b = token::encode(t);
    g.token.assign(b.begin(), b.end());
    const auto r = wire::encode(h, g, &auth(), d.buffer());
    benchmark::DoNotOptimize(r.bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

// Signing alone.
void BM_Sign(benchmark::State& state) {
  Epoch e = 1;
  for (auto _ : state) {
    token::GrantToken t = token_of(++e);
    benchmark::DoNotOptimize(signer().sign(t));
  }
  state.SetItemsProcessed(state.iterations());
}

// A resource's first write of an epoch: a signature check. The cache holds a newer epoch of the
// name, so every iteration misses and checks the signature.
void BM_Verify_Uncached(benchmark::State& state) {
  token::TokenVerifier v;
  if (!v.add_public_key(signer().public_key()).ok()) state.SkipWithError("key refused");
  token::GrantToken newer = token_of(100);
  token::GrantToken t = token_of(99);
  signer().sign(newer);
  signer().sign(t);
  const auto nb = token::encode(newer);
  const auto b = token::encode(t);
  v.verify(nb, newer.name, newer.epoch, newer.holder);
  for (auto _ : state) {
    const token::Verdict r = v.verify(b, t.name, t.epoch, t.holder);
    if (!r.ok() || r.cached) state.SkipWithError("expected an uncached accept");
    benchmark::DoNotOptimize(r.reject);
  }
  state.SetItemsProcessed(state.iterations());
}

// Every later write of the epoch: the cache answers (decode, field compare, byte compare).
void BM_Verify_Cached(benchmark::State& state) {
  token::TokenVerifier v;
  if (!v.add_public_key(signer().public_key()).ok()) state.SkipWithError("key refused");
  token::GrantToken t = token_of(7);
  signer().sign(t);
  const auto b = token::encode(t);
  v.verify(b, t.name, t.epoch, t.holder);
  for (auto _ : state) {
    const token::Verdict r = v.verify(b, t.name, t.epoch, t.holder);
    if (!r.cached) state.SkipWithError("expected a cache hit");
    benchmark::DoNotOptimize(r.reject);
  }
  state.SetItemsProcessed(state.iterations());
}

// The check a resource made before signed tokens: epoch >= highest seen.
void BM_EpochCompare(benchmark::State& state) {
  Epoch highest = 7;
  Epoch e = 7;
  for (auto _ : state) {
    benchmark::DoNotOptimize(e);
    benchmark::DoNotOptimize(highest);
    bool ok = e >= highest;
    benchmark::DoNotOptimize(ok);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_GrantAnswer_Unsigned)->MinTime(0.5);
BENCHMARK(BM_GrantAnswer_Signed)->MinTime(0.5);
BENCHMARK(BM_Sign)->MinTime(0.5);
BENCHMARK(BM_Verify_Uncached)->MinTime(0.5);
BENCHMARK(BM_Verify_Cached)->MinTime(0.5);
BENCHMARK(BM_EpochCompare)->MinTime(0.5);

std::string summary(const leasehold::perf::RunResults& r) {
  leasehold::perf::RatioTable grant("per grant answer: ns and ratio to the answer without a token:", "benchmark",
                                    {{"ns", 1, ""}, {"ratio", 2, "x"}});
  const auto unsigned_ns = r.ns_per_item("BM_GrantAnswer_Unsigned");
  for (const char* name : {"BM_GrantAnswer_Unsigned", "BM_GrantAnswer_Signed", "BM_Sign"}) {
    const auto v = r.ns_per_item(name);
    grant.row(name + 3, {v, leasehold::perf::ratio(v, unsigned_ns)});
  }
  leasehold::perf::RatioTable check("per write at the resource: ns and ratio to the plain epoch compare:", "benchmark",
                                    {{"ns", 1, ""}, {"ratio", 0, "x"}});
  const auto compare_ns = r.ns_per_item("BM_EpochCompare");
  for (const char* name : {"BM_EpochCompare", "BM_Verify_Cached", "BM_Verify_Uncached"}) {
    const auto v = r.ns_per_item(name);
    check.row(name + 3, {v, leasehold::perf::ratio(v, compare_ns)});
  }
  return leasehold::perf::join_tables({grant, check});
}

}  // namespace

int main(int argc, char** argv) { return leasehold::perf::run_with_ratios(argc, argv, summary); }
