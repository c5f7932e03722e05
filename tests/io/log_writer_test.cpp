// The bounded, non-blocking log path (io/log_writer.hpp): a writer whose fd nobody drains keeps
// taking lines without blocking, drops whole lines once its queue is full and counts them.
#include "leasehold/io/log_writer.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <string>

namespace leasehold {
namespace {

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      r = p[0];
      w = p[1];
      ::fcntl(w, F_SETPIPE_SZ, 4096);  // the smallest pipe: full after a page
    }
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  std::string drain() const {
    std::string out;
    char buf[4096];
    for (;;) {
      pollfd p{r, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) break;
      const ssize_t n = ::read(r, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
};

TEST(LogWriter, AnUnreadFdNeitherBlocksTheCallerNorLosesWholeLinesSilently) {
  Pipe p;
  ASSERT_GE(p.w, 0);
  // Fill the pipe first, so the writer thread blocks in its first write(2).
  const int flags = ::fcntl(p.w, F_GETFL);
  ::fcntl(p.w, F_SETFL, flags | O_NONBLOCK);
  std::size_t prefill = 0;
  while (::write(p.w, "x", 1) == 1) ++prefill;
  ::fcntl(p.w, F_SETFL, flags);
  ASSERT_GT(prefill, 0u);
  LogWriter log(p.w, 2048);
  const std::string line = std::string(99, 'x') + "\n";  // 100 bytes
  // A full pipe and 2 KiB of queue (twice: one batch in write(2)) take at most 40 lines; 1000
  // writes must return anyway.
  std::size_t taken = 0;
  for (int i = 0; i < 1000; ++i) taken += log.write(line) ? 1 : 0;
  EXPECT_LT(taken, 1000u);
  EXPECT_EQ(log.dropped(), 1000u - taken);
  EXPECT_GT(taken, 0u);
  // Nobody reads: a flush times out rather than hanging.
  EXPECT_FALSE(log.flush(std::chrono::milliseconds(50)));
  // Once a reader drains, every line that was taken arrives whole.
  const std::string got = p.drain();
  EXPECT_EQ(got.size(), prefill + taken * line.size());
  EXPECT_EQ(got.find_first_not_of("x\n"), std::string::npos);
  EXPECT_TRUE(log.flush(std::chrono::milliseconds(5000)));
}

TEST(LogWriter, KeepsOrderAndCountsEveryLineOfADroppedWrite) {
  Pipe p;
  ASSERT_GE(p.w, 0);
  {
    LogWriter log(p.w, 64);
    EXPECT_TRUE(log.write("a\n"));
    EXPECT_TRUE(log.write("b\n"));
    EXPECT_FALSE(log.write(std::string(30, 'y') + "\n" + std::string(40, 'z') + "\n"));  // > 64 bytes
    EXPECT_EQ(log.dropped(), 2u);
    EXPECT_TRUE(log.flush(std::chrono::milliseconds(5000)));
  }
  EXPECT_EQ(p.drain(), "a\nb\n");
}

}  // namespace
}  // namespace leasehold
