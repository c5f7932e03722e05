// A sandbox for the supervisor's process tests: it does what a runtime must do before every side
// effect — check its lease in the shm table with check_deadline — every 200 µs, and appends a
// line to the file named by argv[1] whenever the answer changes:
//   start t=<ns> slot=<n> epoch=<e>
//   t=<ns> valid=<0|1> valid_until=<ns>
// (CLOCK_BOOTTIME, the clock of every deadline.) It runs until it is killed.
#include "leasehold/shm/table.hpp"

#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  using namespace leasehold::shm;
  if (argc < 2) {
    std::fprintf(stderr, "usage: lease_probe LOGFILE\n");
    return 2;
  }
  std::FILE* log = std::fopen(argv[1], "a");
  if (log == nullptr) return 3;
  const char* slot_env = std::getenv("LEASEHOLD_SLOT");
  const char* epoch_env = std::getenv("LEASEHOLD_EPOCH");
  if (slot_env == nullptr || epoch_env == nullptr) {
    std::fprintf(log, "error no LEASEHOLD_SLOT/LEASEHOLD_EPOCH\n");
    return 4;
  }
  const auto slot = static_cast<std::uint32_t>(std::strtoul(slot_env, nullptr, 10));
  const std::uint64_t epoch = std::strtoull(epoch_env, nullptr, 10);
  try {
    TableReader table = TableReader::open(location_from_env(), OpenOptions{1'000'000'000, 1'000'000});
    std::fprintf(log, "start t=%" PRIu64 " slot=%u epoch=%" PRIu64 "\n",
                 static_cast<std::uint64_t>(leasehold::boottime_ns()), slot, epoch);
    std::fflush(log);
    int last = -1;
    std::uint64_t previous = 0;  // the time of the sample before: the last one that saw `last`
    for (;;) {
      const auto now = static_cast<std::uint64_t>(leasehold::boottime_ns());
      const int valid = table.check_deadline_at(slot, epoch, now) ? 1 : 0;
      if (valid != last) {
        SlotSnapshot snap;
        const std::uint64_t vu = table.snapshot(slot, snap) == TableErrc::ok ? snap.valid_until_ns : 0;
        std::fprintf(log, "t=%" PRIu64 " valid=%d valid_until=%" PRIu64 " previous_t=%" PRIu64 "\n", now, valid, vu,
                     previous);
        std::fflush(log);
        last = valid;
      }
      previous = now;
      ::usleep(200);
    }
  } catch (const TableError& e) {
    std::fprintf(log, "error %s\n", e.what());
    return 5;
  }
}
