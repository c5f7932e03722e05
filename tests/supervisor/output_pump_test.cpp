// OutputPump (supervisor/output_pump.hpp): a sandbox's output pipe copied into its log file up
// to a cap, the rest read and discarded, both descriptors closed at the pipe's end of file.
#include "leasehold/supervisor/output_pump.hpp"

#include "leasehold/harness/process.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace leasehold {
namespace {

namespace fs = std::filesystem;

using harness::slurp;

struct Stream {
  int write_end = -1;
  fs::path log;
};

Stream open_stream(OutputPump& pump, const fs::path& log, std::uint64_t cap) {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  pump.add(p[0], fd, cap);
  return {p[1], log};
}

void write_n(int fd, char c, std::size_t n) {
  const std::string chunk(4096, c);
  while (n > 0) {
    const std::size_t k = std::min(n, chunk.size());
    ASSERT_EQ(::write(fd, chunk.data(), k), static_cast<ssize_t>(k));
    n -= k;
  }
}

TEST(OutputPump, CopiesUpToTheCapAndDiscardsTheRestOfEachStream) {
  char tmpl[] = "/tmp/leasehold-pump-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  std::uint64_t discarded = 0;
  {
    OutputPump pump;
    const Status started = pump.start();
    ASSERT_TRUE(started.ok()) << started.message();
    Stream small = open_stream(pump, dir / "small.log", 1000);
    Stream big = open_stream(pump, dir / "big.log", 1000);
    // Two writers at once, one under its cap and one far over it (more than a pipe holds, so
    // the writer would stall if the pump stopped reading at the cap).
    std::thread a([&] { write_n(small.write_end, 'a', 999); });
    std::thread b([&] { write_n(big.write_end, 'b', 1 << 20); });
    a.join();
    b.join();
    ::close(small.write_end);
    ::close(big.write_end);
    for (int i = 0; i < 500 && pump.discarded_bytes() < (1u << 20) - 1000; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    discarded = pump.discarded_bytes();
  }
  EXPECT_EQ(discarded, (1u << 20) - 1000);
  EXPECT_EQ(slurp(dir / "small.log"), std::string(999, 'a'));
  const std::string big = slurp(dir / "big.log");
  ASSERT_GE(big.size(), 1000u);
  EXPECT_EQ(big.substr(0, 1000), std::string(1000, 'b'));
  EXPECT_NE(big.find("the rest is discarded"), std::string::npos) << big.substr(1000);
  EXPECT_LT(big.size(), 1200u);
  fs::remove_all(dir);
}

TEST(OutputPump, StoppingDrainsWhatIsAlreadyInThePipe) {
  char tmpl[] = "/tmp/leasehold-pump-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  int keep_open = -1;
  {
    OutputPump pump;
    const Status started = pump.start();
    ASSERT_TRUE(started.ok()) << started.message();
    Stream s = open_stream(pump, dir / "s.log", 1 << 20);
    write_n(s.write_end, 'z', 5000);
    keep_open = s.write_end;  // the writer never closes: the destructor must not hang
  }
  EXPECT_EQ(slurp(dir / "s.log"), std::string(5000, 'z'));
  ::close(keep_open);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace leasehold
