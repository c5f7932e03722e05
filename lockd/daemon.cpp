#include "leasehold/lockd/daemon.hpp"

#include "leasehold/io/log_writer.hpp"

#include "leasehold/wire/replay.hpp"

#include <openssl/rand.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace leasehold::lockd {

WorkerId random_instance_id() {
  WorkerId id;
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) throw std::runtime_error("cannot draw a random lockd instance id");
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | b[i];
    id.lo = (id.lo << 8) | b[8 + i];
  }
  if (id.is_nil()) id.lo = 1;
  return id;
}

LockdDaemon::LockdDaemon(const LockdConfig& cfg, const std::vector<wire::WireKey>& keys, EventLoop& loop)
    : loop_(loop) {
  StoreOptions store_options;
  store_options.private_files = !cfg.ablate_store_mode;
  store_options.busy_timeout_ms = cfg.ablate_store_busy_timeout ? 0 : kStoreOpenBusyTimeoutMsDefault;
  auto store = std::make_unique<NameStore>(cfg.store_path, store_options);  // throws StoreError
  RestoredTable restored;
  restored.incarnation = store->open_count();
  const std::int64_t now = loop.clock().now_ns();
  for (const std::string& fixed : store->modes_fixed())
    log_ += "ts_boot_ns=" + std::to_string(now) + " event=store_mode_fixed file=" + fixed + "\n";
  restored.stored = store->load();
  store_ = std::make_unique<StoreThread>(std::move(store), [&loop] { loop.wake(); });

  const auto addr = SocketAddress::parse(cfg.listen);
  if (!addr) throw std::runtime_error("--listen \"" + cfg.listen + "\" is not a numeric ADDR:PORT");
  const int fd = open_udp_socket(*addr);
  if (fd < 0)
    throw std::runtime_error("cannot bind UDP " + cfg.listen + ": " + std::strerror(-fd));
  // Deep socket buffers: bursts of heartbeats from many workers arrive at once.
  set_socket_buffers(fd, 8 << 20, 8 << 20);
  local_ = leasehold::local_address(fd).value_or(*addr);
  socket_ = loop.add_udp_socket(UniqueFd(fd), [this](const Datagram& d) {
    // One clock reading per turn: every datagram of a turn is served at the same now_ns.
    service_->on_datagram(std::span(reinterpret_cast<const std::uint8_t*>(d.payload.data()), d.payload.size()),
                          d.source_address(), loop_.turn_now_ns());
  });
  if (!socket_.valid()) throw std::runtime_error("cannot register the UDP socket with the io loop");
  net_ = std::make_unique<UdpDatagramPort>(loop, socket_, local_);
  try {
    service_ = std::make_unique<LockService>(cfg, keys, restored, *net_, *store_, now,
                                             ServiceSeeds{random_instance_id(), wire::seq_seed(), {}});
  } catch (...) {
    loop.close_socket(socket_);
    throw;
  }
  loop.set_wake_handler([] {});  // the wake only ends run_once; after_iteration does the work
  write_log();
}

LockdDaemon::~LockdDaemon() {
  if (socket_.valid()) loop_.close_socket(socket_);
  // Let the store thread finish what it was handed, then log what became durable.
  store_->drain();
  if (service_ != nullptr) {
    service_->tick(loop_.clock().now_ns());
    write_log();
  }
  service_.reset();
  store_.reset();
}

bool LockdDaemon::after_iteration() {
  const std::int64_t now = loop_.turn_now_ns();
  const std::int64_t next = service_->tick(now);
  wait_ns_ = std::clamp<std::int64_t>(next - now, 0, kTickNs);
  write_log();
  return !service_->failed();
}

bool LockdDaemon::drain_for_shutdown() {
  service_->begin_drain();
  for (;;) {
    service_->tick(loop_.clock().now_ns());
    write_log();
    if (service_->failed()) return false;
    if (service_->drained()) return true;
    store_->drain();
  }
}

void LockdDaemon::write_log() {
  service_->take_log(log_);
  if (log_.empty()) return;
  // Bounded and non-blocking (io/log_writer.hpp): a full stderr drops lines, never answers.
  stderr_log().write(log_);
  log_.clear();
  service_->set_log_lines_dropped(stderr_log().dropped());
}

}  // namespace leasehold::lockd
