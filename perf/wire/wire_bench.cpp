// Wire codec benchmark (issue "io_uring transport and the wire protocol", Performance): encode +
// decode of a 64-entry heartbeat batch — ceil(64 / kHeartbeatEntriesMax) = 3 datagrams, each
// encoded straight from its chunk of the entries (heartbeat_chunk(), encode_heartbeat()), as a
// supervisor sends it — with the HMAC-SHA256 tag (sign + verify) and without it, next to a memcpy
// of the same datagram bytes measured in the same run; and the encode of the same chunks as
// Heartbeat values (encode() of a Body, what a sender built before). At the end it prints ns per
// batch and each variant's ratio to the memcpy.
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "perf/common/ratio_report.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace leasehold;
using namespace leasehold::wire;

constexpr std::size_t kBatchEntries = 64;

struct Batch {
  std::vector<HeartbeatEntry> entries;
  std::vector<Datagram> datagrams;  // the encoded batch (signed)
  std::size_t bytes = 0;            // total datagram bytes
};

const WireKey& key() {
  static const WireKey k{std::vector<std::uint8_t>(kKeyBytesMin, 0x6B)};
  return k;
}

const Batch& batch() {
  static const Batch b = [] {
    Batch x;
    for (std::uint64_t i = 0; i < kBatchEntries; ++i)
      x.entries.push_back(HeartbeatEntry{NameId{0x1000 + i, 0x77 * i}, SandboxId{0x2000 + i, 0x99 * i}, 100 + i});
    Authenticator auth(key());
    std::uint64_t seq = 1;
    for (std::size_t i = 0; i < heartbeat_chunks(x.entries.size()); ++i) {
      Header h;
      h.sender = WorkerId{1, 2};
      h.seq = seq;
      h.request_id = seq++;
      Datagram& d = x.datagrams.emplace_back();
      d.size = static_cast<std::uint16_t>(encode_heartbeat(h, 3000, heartbeat_chunk(x.entries, i), &auth, d.buffer()).bytes);
      x.bytes += d.size;
    }
    return x;
  }();
  return b;
}

void BM_Memcpy(benchmark::State& state) {
  const Batch& b = batch();
  std::vector<Datagram> out(b.datagrams.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < b.datagrams.size(); ++i) {
      std::memcpy(out[i].bytes.data(), b.datagrams[i].bytes.data(), b.datagrams[i].size);
      benchmark::DoNotOptimize(out[i].bytes.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(b.bytes));
}

// encode every chunk of the batch, then decode every datagram (verifying the tag if auth).
void encode_decode(benchmark::State& state, Authenticator* auth) {
  const Batch& b = batch();
  std::vector<Datagram> out(heartbeat_chunks(b.entries.size()));
  Header h;
  h.sender = WorkerId{1, 2};
  std::uint64_t seq = 1;
  std::size_t entries = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      h.seq = seq;
      h.request_id = seq++;
      const EncodeResult r = encode_heartbeat(h, 3000, heartbeat_chunk(b.entries, i), auth, out[i].buffer());
      out[i].size = static_cast<std::uint16_t>(r.bytes);
    }
    entries = 0;
    for (const Datagram& d : out) {
      const DecodeResult r = decode(d.view(), auth);
      if (!r) state.SkipWithError(r.detail.c_str());
      entries += std::get<Heartbeat>(r.body).entries.size();
      benchmark::DoNotOptimize(r.body);
    }
  }
  if (entries != kBatchEntries) state.SkipWithError("lost heartbeat entries");
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(b.bytes));
}

void BM_EncodeDecode_Hmac(benchmark::State& state) {
  Authenticator auth(key());
  encode_decode(state, &auth);
}

void BM_EncodeDecode_NoHmac(benchmark::State& state) { encode_decode(state, nullptr); }

// The halves, without the tag: where the codec's time goes.
void BM_Encode_NoHmac(benchmark::State& state) {
  const Batch& b = batch();
  std::vector<Datagram> out(heartbeat_chunks(b.entries.size()));
  Header h;
  h.sender = WorkerId{1, 2};
  h.seq = 1;
  for (auto _ : state) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i].size = static_cast<std::uint16_t>(
          encode_heartbeat(h, 3000, heartbeat_chunk(b.entries, i), nullptr, out[i].buffer()).bytes);
      benchmark::DoNotOptimize(out[i].bytes.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}

// The same chunks as Heartbeat values, built from the entries and encoded through a Body.
void BM_EncodeBody_NoHmac(benchmark::State& state) {
  const Batch& b = batch();
  std::vector<Datagram> out(heartbeat_chunks(b.entries.size()));
  Header h;
  h.sender = WorkerId{1, 2};
  h.seq = 1;
  for (auto _ : state) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      Heartbeat hb;
      hb.ttl_cap_ms = 3000;
      const auto chunk = heartbeat_chunk(b.entries, i);
      hb.entries.assign(chunk.begin(), chunk.end());
      out[i].size = static_cast<std::uint16_t>(encode(h, hb, nullptr, out[i].buffer()).bytes);
      benchmark::DoNotOptimize(out[i].bytes.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Decode_NoHmac(benchmark::State& state) {
  const Batch& b = batch();
  for (auto _ : state) {
    for (const Datagram& d : b.datagrams) {
      const DecodeResult r = decode(d.view(), nullptr);
      benchmark::DoNotOptimize(r.body);
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// Only the authentication: sign + verify of the batch's datagrams.
void BM_SignVerify(benchmark::State& state) {
  Authenticator auth(key());
  std::vector<Datagram> d = batch().datagrams;
  for (auto _ : state) {
    for (Datagram& x : d) {
      auth.sign(std::span<std::uint8_t>(x.bytes.data(), x.size));
      if (!auth.verify(x.view())) state.SkipWithError("tag mismatch");
    }
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Memcpy)->MinTime(0.5);
BENCHMARK(BM_EncodeDecode_Hmac)->MinTime(0.5);
BENCHMARK(BM_EncodeDecode_NoHmac)->MinTime(0.5);
BENCHMARK(BM_Encode_NoHmac)->MinTime(0.5);
BENCHMARK(BM_EncodeBody_NoHmac)->MinTime(0.5);
BENCHMARK(BM_Decode_NoHmac)->MinTime(0.5);
BENCHMARK(BM_SignVerify)->MinTime(0.5);

// At the end: ns per 64-entry batch and the ratio to memcpy of the same bytes, for every
// benchmark that ran next to BM_Memcpy (perf/common/ratio_report.hpp).
std::string summary(const leasehold::perf::RunResults& r) {
  const Batch& b = batch();
  leasehold::perf::RatioTable t(std::to_string(kBatchEntries) + "-entry heartbeat = " + std::to_string(b.datagrams.size()) +
                                    " datagrams, " + std::to_string(b.bytes) + " bytes; ns per batch and ratio to memcpy:",
                                "benchmark", {{"ns", 1, ""}, {"ratio", 1, "x"}});
  const auto base = r.ns_per_item("BM_Memcpy");
  for (const char* name : {"BM_Memcpy", "BM_EncodeDecode_NoHmac", "BM_EncodeDecode_Hmac", "BM_Encode_NoHmac",
                           "BM_EncodeBody_NoHmac", "BM_Decode_NoHmac", "BM_SignVerify"}) {
    const auto v = r.ns_per_item(name);
    t.row(name + 3, {v, leasehold::perf::ratio(v, base)});
  }
  return leasehold::perf::join_tables({t});
}

}  // namespace

int main(int argc, char** argv) { return leasehold::perf::run_with_ratios(argc, argv, summary); }
