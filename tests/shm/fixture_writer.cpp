// shm_fixture_writer: a stand-in supervisor for the script tests (install/pkg-config, dump).
// Usage: shm_fixture_writer LOCATION READY_FILE [SECONDS] [LIVENESS_MS]
// Creates a table, claims and publishes slot 0 (epoch 42, name "fixture-name") and slot 1
// (revoked), records some stats, heartbeats every 10 ms, writes "slot epoch" to READY_FILE,
// and exits after SECONDS (default 10) or on SIGTERM (then closes and removes the table).
#include "leasehold/shm/table.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_term(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  using namespace leasehold;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s LOCATION READY_FILE [SECONDS] [LIVENESS_MS]\n", argv[0]);
    return 2;
  }
  const double seconds = argc > 3 ? std::atof(argv[3]) : 10.0;
  const long liveness_ms = argc > 4 ? std::atol(argv[4]) : 200;
  std::signal(SIGTERM, on_term);
  try {
    shm::TableOptions o;
    o.location = argv[1];
    o.slot_count = 16;
    o.liveness_timeout_ns = static_cast<std::uint64_t>(liveness_ms) * 1'000'000ULL;
    auto w = shm::TableWriter::create(o);
    const std::uint64_t now = boottime_ns();
    const auto a = w.claim(SandboxId{0x0f8fad5bd9cb469fULL, 0xa16570867728950eULL}, now);
    const auto b = w.claim(SandboxId{0x1111111111111111ULL, 0x2222222222222222ULL}, now);
    if (!a.ok() || !b.ok()) return 3;
    const std::string name = "fixture-name";
    w.publish(a->slot, name_id_of(name), name, 42, now + 600'000'000'000ULL);
    w.publish(b->slot, name_id_of("other"), "other", 7, now + 600'000'000'000ULL);
    w.revoke(b->slot);
    w.record_rt_lateness_ns(1500);
    w.record_rt_lateness_ns(40'000);
    w.record_heartbeat_rtt_ns(250'000);
    w.record_kill(3'000'000);
    w.record_heartbeat_failure();
    if (FILE* f = std::fopen(argv[2], "w")) {
      std::fprintf(f, "%u 42\n", a->slot);
      std::fclose(f);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!g_stop.load() && std::chrono::steady_clock::now() < end) {
      w.heartbeat(boottime_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    w.close(boottime_ns());
    w.remove();
    return 0;
  } catch (const shm::TableError& e) {
    std::fprintf(stderr, "shm_fixture_writer: %s\n", e.what());
    return 4;
  }
}
