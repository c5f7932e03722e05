// leasehold/supervisor: RtThreadPort, the production RtPort (ports.hpp).
//
// The rt thread (rt_thread.hpp) plus what the io thread shares with it: the per-slot deadline
// it re-reads when an armed deadline comes due (lazy re-arm; one atomic per slot), the bounded
// queue of its kill records (pushed on the rt thread, popped on the io thread after the loop's
// wake-up), and the largest wake-up lateness since the io thread last looked. The shm table is
// the rt thread's too: it revokes a slot before the kill, beats the writer heartbeat and records
// kill latencies there.
#pragma once

#include "leasehold/io/loop.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/supervisor/rt_thread.hpp"

#include <boost/lockfree/spsc_queue.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace leasehold {

class RtThreadPort final : public RtPort {
 public:
  /// Starts the rt thread with `config` (its slot count is the table's). `table` and `loop`
  /// outlive the port; `loop` is woken (EventLoop::wake) after each kill record is queued.
  /// The port, or RtThread::start's Status when the thread cannot start.
  static Result<std::unique_ptr<RtThreadPort>> start(const RtConfig& config, shm::TableWriter& table, EventLoop& loop,
                                                     RtStartStatus& status);
  RtThreadPort(const RtThreadPort&) = delete;
  RtThreadPort& operator=(const RtThreadPort&) = delete;
  ~RtThreadPort() override;  ///< stops the thread

  RtSubmitted arm(std::uint32_t slot, std::uint64_t valid_until_ns, const KillTarget& target) override;
  void set_deadline(std::uint32_t slot, std::uint64_t valid_until_ns) override;
  RtSubmitted disarm(std::uint32_t slot) override;
  RtSubmitted kill_now(std::uint32_t slot) override;
  bool applied(std::uint64_t seq) const override;
  void stop() override;

  /// The next kill record the rt thread reported; false when none is queued (io thread only).
  bool pop_kill(RtKillEvent& event);
  /// The largest wake-up lateness (ns) since the last call; resets it.
  std::uint64_t take_lateness_max_ns();
  RtCounters counters() const;
  /// Kill records lost to a full queue (the kill itself happened).
  std::uint64_t kill_events_dropped() const;

 private:
  RtThreadPort(std::uint32_t slots, shm::TableWriter& table, EventLoop& loop);
  shm::TableWriter& table_;
  EventLoop& loop_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> deadlines_;  // per slot, read by the rt thread
  boost::lockfree::spsc_queue<RtKillEvent> kill_events_;
  std::atomic<std::uint64_t> kill_events_dropped_{0};
  // rt thread: one relaxed compare-exchange loop per wake-up, no syscall.
  std::atomic<std::uint64_t> lateness_max_ns_{0};
  std::unique_ptr<RtThread> rt_;
};

}  // namespace leasehold
