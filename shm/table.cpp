// leasehold/shm: table creation, mapping, writer and reader (see table.hpp for the protocol).
#include "leasehold/shm/table.hpp"

#include "leasehold/lease/assert.hpp"

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace leasehold::shm {

namespace bip = boost::interprocess;

std::string_view to_string(TableErrc e) noexcept {
  switch (e) {
    case TableErrc::ok: return "ok";
    case TableErrc::missing: return "missing";
    case TableErrc::truncated: return "truncated";
    case TableErrc::bad_magic: return "bad_magic";
    case TableErrc::newer_major: return "newer_major";
    case TableErrc::older_major: return "older_major";
    case TableErrc::bad_geometry: return "bad_geometry";
    case TableErrc::not_ready: return "not_ready";
    case TableErrc::writer_alive: return "writer_alive";
    case TableErrc::exists: return "exists";
    case TableErrc::table_full: return "table_full";
    case TableErrc::bad_slot: return "bad_slot";
    case TableErrc::wrong_state: return "wrong_state";
    case TableErrc::revoked: return "revoked";
    case TableErrc::bad_epoch: return "bad_epoch";
    case TableErrc::bad_argument: return "bad_argument";
    case TableErrc::io_error: return "io_error";
    case TableErrc::busy: return "busy";
    case TableErrc::untrusted: return "untrusted";
  }
  return "unknown";
}

std::string_view to_string(SlotState s) noexcept {
  switch (s) {
    case SlotState::free: return "free";
    case SlotState::claimed: return "claimed";
    case SlotState::published: return "published";
    case SlotState::cooling: return "cooling";
  }
  return "corrupt";
}

std::string_view to_string(OpenStage s) noexcept {
  switch (s) {
    case OpenStage::awaiting_file: return "awaiting file";
    case OpenStage::awaiting_size: return "awaiting size";
    case OpenStage::awaiting_ready: return "awaiting ready flag";
    case OpenStage::ready: return "ready";
  }
  return "unknown";
}

TableError::TableError(TableErrc code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

namespace {

[[noreturn]] void fail(TableErrc code, const std::string& message) {
  throw TableError(code, message);
}

std::string quote(const Location& loc) { return "shm table '" + loc.text + "'"; }

TableErrc table_errc_of_errno(int err) {
  return err == ENOENT ? TableErrc::missing : TableErrc::io_error;
}

int errno_of(const bip::interprocess_exception& e) {
  const int native = e.get_native_error();
  return native != 0 ? native : EIO;
}

std::string ms_text(std::uint64_t ns) { return std::to_string(ns / 1'000'000) + " ms"; }

}  // namespace

Location parse_location(std::string_view text) {
  Location loc;
  loc.text = std::string(text);
  if (text.empty()) fail(TableErrc::bad_argument, "shm table location is empty");
  if (text.find('\0') != std::string_view::npos)
    fail(TableErrc::bad_argument, "shm table location contains a NUL byte");
  if (text.size() > 4096) fail(TableErrc::bad_argument, "shm table location exceeds 4096 bytes");
  if (text.find_first_not_of("0123456789") == std::string_view::npos) {
    if (text.size() > 9) fail(TableErrc::bad_argument, "shm table descriptor '" + loc.text + "' is out of range");
    loc.is_fd = true;
    loc.fd = std::atoi(loc.text.c_str());
    loc.name = "fd " + loc.text;
    return loc;
  }
  if (text.substr(0, kMemfdPrefix.size()) == kMemfdPrefix) {
    const std::string_view name = text.substr(kMemfdPrefix.size());
    if (name.empty()) fail(TableErrc::bad_argument, "shm table location '" + loc.text + "' names no memfd");
    if (name.size() > 249 || name.find('/') != std::string_view::npos)
      fail(TableErrc::bad_argument,
           "memfd name in '" + loc.text + "' must be at most 249 bytes without '/'");
    loc.is_memfd = true;
    loc.name = std::string(name);
    return loc;
  }
  if (text.front() == '/' && text.find('/', 1) != std::string_view::npos) {
    if (text.back() == '/')
      fail(TableErrc::bad_argument, "shm table path '" + loc.text + "' names a directory");
    loc.is_path = true;
    loc.name = loc.text;
    return loc;
  }
  std::string_view name = text.front() == '/' ? text.substr(1) : text;
  if (name.empty()) fail(TableErrc::bad_argument, "shm table name '/' is empty");
  if (name.find('/') != std::string_view::npos)
    fail(TableErrc::bad_argument,
         "shm table name '" + loc.text + "' contains '/': use an absolute path for a file");
  if (name.size() > 255) fail(TableErrc::bad_argument, "shm table name exceeds 255 bytes");
  loc.name = std::string(name);
  return loc;
}

std::string location_from_env() {
  const char* v = std::getenv(kLocationEnv);
  if (v == nullptr || *v == '\0')
    fail(TableErrc::bad_argument, std::string(kLocationEnv) + " is not set: no shm table location");
  return v;
}

std::size_t histogram_bucket(std::uint64_t v) noexcept {
  return static_cast<std::size_t>(std::bit_width(v));
}

void histogram_record(Histogram& h, std::uint64_t v) noexcept {
  h.count.fetch_add(1, std::memory_order_relaxed);
  h.sum.fetch_add(v, std::memory_order_relaxed);
  h.buckets[histogram_bucket(v)].fetch_add(1, std::memory_order_relaxed);
  if (v > h.max.load(std::memory_order_relaxed)) h.max.store(v, std::memory_order_relaxed);
}

// ---- validation ---------------------------------------------------------------------------

namespace {

// Validates a mapped table of `bytes` bytes; on failure returns the code and sets `why`.
// Reads `ready` with acquire first. Used by open() and by create() to judge an old table.
TableErrc validate_table(const void* base, std::uint64_t bytes, std::string& why) noexcept {
  try {
    if (bytes < sizeof(Header)) {
      why = "file is " + std::to_string(bytes) + " bytes, smaller than the " +
            std::to_string(sizeof(Header)) + "-byte header";
      return TableErrc::truncated;
    }
    const auto* h = static_cast<const Header*>(base);
    const std::uint32_t ready = h->ready.load(std::memory_order_acquire);
    if (ready == 0) {
      if (h->magic != 0 && h->magic != kMagic) {
        why = "wrong magic (not a leasehold table)";
        return TableErrc::bad_magic;
      }
      why = "the writer has not set the ready flag yet";
      return TableErrc::not_ready;
    }
    if (h->magic != kMagic) {
      why = "wrong magic (not a leasehold table)";
      return TableErrc::bad_magic;
    }
    if (ready != kReady) {
      why = "ready flag has unknown value " + std::to_string(ready);
      return TableErrc::bad_geometry;
    }
    if (h->layout_major > kLayoutMajor) {
      why = "layout " + std::to_string(h->layout_major) + "." + std::to_string(h->layout_minor) +
            " is newer than this reader's " + std::to_string(kLayoutMajor) + ".x: upgrade leasehold";
      return TableErrc::newer_major;
    }
    if (h->layout_major < kLayoutMajor) {
      why = "layout " + std::to_string(h->layout_major) + "." + std::to_string(h->layout_minor) +
            " is older than this reader's " + std::to_string(kLayoutMajor) + ".x";
      return TableErrc::older_major;
    }
    if (h->slot_bytes != kSlotBytes || h->slots_offset != kSlotsOffset ||
        h->stats_offset != kStatsOffset || h->liveness_offset != kLivenessOffset) {
      why = "inconsistent geometry (slot_bytes " + std::to_string(h->slot_bytes) +
            ", slots_offset " + std::to_string(h->slots_offset) + ")";
      return TableErrc::bad_geometry;
    }
    if (h->clock_id != CLOCK_BOOTTIME) {
      why = "clock id " + std::to_string(h->clock_id) + " is not CLOCK_BOOTTIME";
      return TableErrc::bad_geometry;
    }
    if (h->slot_count == 0 || h->slot_count > kSlotCountMax) {
      why = "slot count " + std::to_string(h->slot_count) + " outside 1.." +
            std::to_string(kSlotCountMax);
      return TableErrc::bad_geometry;
    }
    const std::uint64_t need = table_bytes(h->slot_count);
    if (h->total_bytes != need) {
      why = "total_bytes " + std::to_string(h->total_bytes) + " does not match slot count " +
            std::to_string(h->slot_count) + " (" + std::to_string(need) + " bytes)";
      return TableErrc::bad_geometry;
    }
    if (bytes < need) {
      why = "slot count " + std::to_string(h->slot_count) + " needs " + std::to_string(need) +
            " bytes but the file has " + std::to_string(bytes);
      return TableErrc::truncated;
    }
    if (h->liveness_timeout_ns == 0) {
      why = "liveness timeout is 0";
      return TableErrc::bad_geometry;
    }
    return TableErrc::ok;
  } catch (...) {
    why = "out of memory while describing the table";
    return TableErrc::io_error;
  }
}

// Maps an existing table read-only; errno-style failure in `err` (ENOENT: missing).
// `not_regular` names the kind of a location that is not a regular file (a directory, FIFO,
// socket or device): nothing is mapped then, and err is EINVAL.
struct RawMap {
  bip::mapped_region region;
  std::uint64_t bytes = 0;
  int err = 0;
  const char* not_regular = nullptr;
};

const char* file_kind(mode_t mode) noexcept {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// After a stat (err: its errno, or 0): true for a regular file; false with m.err set
// (EINVAL and m.not_regular naming the kind for anything else than a regular file) otherwise.
bool regular_file(int err, const struct stat& st, RawMap& m) {
  if (err != 0) {
    m.err = err;
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    m.err = EINVAL;
    m.not_regular = file_kind(st.st_mode);
    return false;
  }
  return true;
}

// Looks at the location through a non-blocking descriptor before Boost opens it: opening a
// FIFO for reading without O_NONBLOCK blocks until a writer appears, which would hang a
// runtime in leasehold_open (whatever its wait_ms) and the supervisor in create(). /dev/shm
// is world-writable, so anyone can put a FIFO or a directory under a table's shm name.
bool inspect(const Location& loc, RawMap& m) {
  const int fd = loc.is_path
                     ? ::open(loc.name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
                     : ::shm_open(loc.name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) {
    m.err = errno;
    return false;
  }
  struct stat st{};
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  ::close(fd);
  return regular_file(rc == 0 ? 0 : err, st, m);
}

// After a stat (err: its errno, or 0): a regular file of at least a header, with m.bytes set;
// false (m.err or m.not_regular set, or too small to map) otherwise.
bool sized_regular(int err, const struct stat& st, RawMap& m) {
  if (!regular_file(err, st, m)) return false;
  m.bytes = static_cast<std::uint64_t>(st.st_size);
  return m.bytes >= sizeof(Header);
}

// Boost maps any object with a mapping handle: here an inherited descriptor.
struct FdMapping {
  int fd;
  bip::mapping_handle_t get_mapping_handle() const noexcept {
    return bip::ipcdetail::mapping_handle_from_file_handle(fd);
  }
};

RawMap map_readonly(const Location& loc) {
  RawMap m;
  if (loc.is_fd) {
    struct stat st{};
    const int rc = ::fstat(loc.fd, &st);
    if (!sized_regular(rc == 0 ? 0 : (errno == EBADF ? ENOENT : errno), st, m)) return m;
    try {
      m.region = bip::mapped_region(FdMapping{loc.fd}, bip::read_only, 0, m.bytes);
    } catch (const bip::interprocess_exception& e) {
      m.err = errno_of(e);
    }
    return m;
  }
  if (!inspect(loc, m)) return m;
  try {
    if (loc.is_path) {
      struct stat st{};
      const int rc = ::stat(loc.name.c_str(), &st);
      if (!sized_regular(rc == 0 ? 0 : errno, st, m)) return m;
      bip::file_mapping fm(loc.name.c_str(), bip::read_only);
      m.region = bip::mapped_region(fm, bip::read_only, 0, m.bytes);
    } else {
      bip::shared_memory_object shm(bip::open_only, loc.name.c_str(), bip::read_only);
      bip::offset_t size = 0;
      if (!shm.get_size(size)) {
        m.err = EIO;
        return m;
      }
      m.bytes = static_cast<std::uint64_t>(size);
      if (m.bytes < sizeof(Header)) return m;
      m.region = bip::mapped_region(shm, bip::read_only, 0, m.bytes);
    }
  } catch (const bip::interprocess_exception& e) {
    m.err = errno_of(e);
  }
  return m;
}

// Why a location holds something create() must not delete, or empty when it may replace it.
// Replaced: our own tables (our magic; dead, closed, corrupt or of another layout), a table
// whose creator died before writing the header (magic 0, ready 0), and an empty file (its
// creator died before sizing it). Kept: anything else, since it is not ours to delete.
// Age of the writer heartbeat `hb_ns` at the reader's clock read `now_ns`, UINT64_MAX for "no
// valid heartbeat". A reader reads its clock, then loads the heartbeat: a writer that beat in
// between stored a time after `now_ns`. That writer is alive now, so a heartbeat ahead of the
// reader's clock has age 0 — unless it is more than `liveness_timeout_ns` ahead, which no beat
// of this boot's writer can be (it is from another boot, or corrupt): not valid.
std::uint64_t heartbeat_age_ns(std::uint64_t hb_ns, std::uint64_t now_ns,
                               std::uint64_t liveness_timeout_ns) noexcept {
  if (hb_ns == 0) return UINT64_MAX;  // closed / never beat
  if (hb_ns <= now_ns) return now_ns - hb_ns;
  return hb_ns - now_ns <= liveness_timeout_ns ? 0 : UINT64_MAX;
}

std::string foreign_content(const RawMap& old, TableErrc verdict, const std::string& why) {
  if (old.not_regular != nullptr) return std::string("is ") + old.not_regular;
  if (verdict == TableErrc::bad_magic) return "holds a file that is not a leasehold table (" + why + ")";
  if (verdict == TableErrc::truncated && old.bytes > 0 && old.bytes < sizeof(Header))
    return "holds a " + std::to_string(old.bytes) +
           "-byte file, smaller than a table header, which no writer leaves behind";
  return {};
}

Liveness liveness_of(const Header& h, const WriterLiveness& l, std::uint64_t now_ns) noexcept {
  Liveness out;
  const std::uint64_t hb = l.heartbeat_ns.load(std::memory_order_acquire);
  out.closed = h.closed_ns.load(std::memory_order_acquire) != 0;
  const std::uint64_t timeout_ns = clamp_liveness_timeout_ns(h.liveness_timeout_ns);
  out.age_ns = heartbeat_age_ns(hb, now_ns, timeout_ns);
  if (out.age_ns == UINT64_MAX) return out;
  out.alive = !out.closed && out.age_ns <= timeout_ns;
  return out;
}

void unlink_location(const Location& loc) noexcept {
  if (loc.is_memfd || loc.is_fd) return;  // nothing named to unlink
  if (loc.is_path) {
    ::unlink(loc.name.c_str());
  } else {
    bip::shared_memory_object::remove(loc.name.c_str());
  }
}

}  // namespace

// ---- writer -------------------------------------------------------------------------------

namespace {

// A memfd table: created, owned (mode, group) and sized, then mapped read-write by the writer.
// The seals come after the header is written (seal_memfd): F_SEAL_FUTURE_WRITE leaves the
// writer's mapping writable and refuses every later writable mapping and write(2).
void create_memfd(const Location& loc, const TableOptions& o, std::uint64_t bytes, int& fd_out,
                  bip::mapped_region& region) {
  const int fd = ::memfd_create(loc.name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail(TableErrc::io_error, quote(loc) + ": memfd_create: " + std::strerror(errno));
  fd_out = fd;  // owned by the writer from here on (closed by its destructor)
  int err = 0;
  // Read bits only: nobody (its owner included, until it chmods) reopens it for writing through
  // /proc/<pid>/fd; the seals refuse the writes of one who does.
  if (::fchmod(fd, o.mode & 0444) != 0) err = errno;
  if (err == 0 && o.group >= 0 && ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(o.group)) != 0)
    err = errno;
  if (err == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
  if (err != 0) fail(TableErrc::io_error, quote(loc) + ": cannot size/own the memfd: " + std::strerror(err));
  region = bip::mapped_region(FdMapping{fd}, bip::read_write, 0, bytes);
}

void seal_memfd(const Location& loc, int fd) {
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0 || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) != 0)
    fail(TableErrc::io_error, quote(loc) + ": cannot seal the memfd (F_SEAL_SHRINK | F_SEAL_GROW | "
                                           "F_SEAL_FUTURE_WRITE needs Linux 5.1): " + std::strerror(errno));
  if ((::fcntl(fd, F_GET_SEALS) & (kSeals | F_SEAL_SEAL)) != (kSeals | F_SEAL_SEAL))
    fail(TableErrc::io_error, quote(loc) + ": the memfd does not report its seals");
}

}  // namespace

OwnedFd& OwnedFd::operator=(OwnedFd&& o) noexcept {
  if (this != &o) {
    if (fd >= 0) ::close(fd);
    fd = o.fd;
    o.fd = -1;
  }
  return *this;
}
OwnedFd::~OwnedFd() {
  if (fd >= 0) ::close(fd);
}

Result<int> TableWriter::reopen_read_only() const {
  const std::string file = location_.is_memfd ? "/proc/self/fd/" + std::to_string(memfd_.fd)
                                              : (location_.is_path ? location_.name : "/dev/shm/" + location_.name);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::from_errno(errno, quote(location_) + ": cannot open " + file + " read-only");
  return fd;
}

std::string TableWriter::reader_location() const {
  if (location_.is_memfd) return "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(memfd_.fd);
  return location_.text;
}

Result<int> TableWriter::seals() const {
  if (memfd_.fd < 0) return 0;
  const int s = ::fcntl(memfd_.fd, F_GET_SEALS);
  if (s < 0) return Status::from_errno(errno, quote(location_) + ": F_GET_SEALS");
  return s;
}

TableWriter TableWriter::create(const TableOptions& o) {
  const Location loc = parse_location(o.location);
  if (o.slot_count == 0 || o.slot_count > kSlotCountMax)
    fail(TableErrc::bad_argument, quote(loc) + ": slot count " + std::to_string(o.slot_count) +
                                      " outside 1.." + std::to_string(kSlotCountMax));
  if (o.liveness_timeout_ns == 0 || o.liveness_timeout_ns > kLivenessTimeoutMaxNs)
    fail(TableErrc::bad_argument, quote(loc) + ": liveness timeout " + ms_text(o.liveness_timeout_ns) +
                                      " outside (0, " + ms_text(kLivenessTimeoutMaxNs) + "]");
  if (loc.is_fd) fail(TableErrc::bad_argument, quote(loc) + ": a writer creates a path, a shm name or memfd:NAME");
  if (o.mode > 0777) fail(TableErrc::bad_argument, quote(loc) + ": file mode above 0777");

  // A table already there: refuse if its writer is alive, else replace it (new incarnation).
  std::uint64_t incarnation = 1;
  if (!loc.is_memfd) {  // a memfd is new by construction: nothing to inspect or replace
    RawMap old = map_readonly(loc);
    if (old.err == 0 || old.not_regular != nullptr) {
      std::string why;
      const TableErrc v = old.not_regular != nullptr
                              ? TableErrc::bad_magic
                              : validate_table(old.region.get_address(), old.bytes, why);
      const std::string foreign = foreign_content(old, v, why);
      if (!foreign.empty())
        fail(TableErrc::bad_magic, quote(loc) + ": the location " + foreign +
                                       "; refusing to replace it (remove it or choose another location)");
      if (v == TableErrc::ok) {
        const auto* h = static_cast<const Header*>(old.region.get_address());
        const auto* l = reinterpret_cast<const WriterLiveness*>(
            static_cast<const char*>(old.region.get_address()) + kLivenessOffset);
        const Liveness live = liveness_of(*h, *l, static_cast<std::uint64_t>(boottime_ns()));
        if (live.alive)
          fail(TableErrc::writer_alive,
               quote(loc) + ": writer pid " + std::to_string(h->writer_pid) +
                   " is alive (heartbeat " + ms_text(live.age_ns) + " ago, liveness timeout " +
                   ms_text(h->liveness_timeout_ns) + "); refusing to replace its table");
        incarnation = h->incarnation + 1;
      }
      unlink_location(loc);
    } else if (old.err != ENOENT) {
      fail(table_errc_of_errno(old.err),
           quote(loc) + ": cannot inspect the existing table: " + std::strerror(old.err));
    }
  }

  const std::uint64_t bytes = table_bytes(o.slot_count);
  TableWriter w;
  w.location_ = loc;
  try {
    bip::permissions perm(o.mode);
    if (loc.is_memfd) {
      create_memfd(loc, o, bytes, w.memfd_.fd, w.region_);
    } else if (loc.is_path) {
      const int fd = ::open(loc.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, o.mode);
      if (fd < 0) {
        const int err = errno;
        fail(err == EEXIST ? TableErrc::exists : TableErrc::io_error,
             quote(loc) + ": cannot create: " + std::strerror(err));
      }
      int err = 0;
      if (::fchmod(fd, o.mode) != 0) err = errno;
      if (err == 0 && o.group >= 0 && ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(o.group)) != 0) err = errno;
      if (err == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
      ::close(fd);
      if (err != 0) {
        ::unlink(loc.name.c_str());
        fail(TableErrc::io_error, quote(loc) + ": cannot size/own the file: " + std::strerror(err));
      }
      bip::file_mapping fm(loc.name.c_str(), bip::read_write);
      w.region_ = bip::mapped_region(fm, bip::read_write, 0, bytes);
    } else {
      bip::shared_memory_object shm(bip::create_only, loc.name.c_str(), bip::read_write, perm);
      shm.truncate(static_cast<bip::offset_t>(bytes));
      if (o.group >= 0 && ::fchown(shm.get_mapping_handle().handle, static_cast<uid_t>(-1),
                                   static_cast<gid_t>(o.group)) != 0) {
        const int err = errno;
        bip::shared_memory_object::remove(loc.name.c_str());
        fail(TableErrc::io_error, quote(loc) + ": cannot chown to group " +
                                      std::to_string(o.group) + ": " + std::strerror(err));
      }
      w.region_ = bip::mapped_region(shm, bip::read_write, 0, bytes);
    }
  } catch (const bip::interprocess_exception& e) {
    const int err = errno_of(e);
    fail(err == EEXIST ? TableErrc::exists : TableErrc::io_error,
         quote(loc) + ": cannot create: " + e.what());
  }

  // The new mapping is zero-filled: every slot is free, every check word 0.
  auto* base = static_cast<char*>(w.region_.get_address());
  auto* h = reinterpret_cast<Header*>(base);
  const std::uint64_t now = static_cast<std::uint64_t>(boottime_ns());
  h->magic = kMagic;
  h->layout_major = kLayoutMajor;
  h->layout_minor = kLayoutMinor;
  h->slots_offset = kSlotsOffset;
  h->slot_count = o.slot_count;
  h->slot_bytes = kSlotBytes;
  h->total_bytes = bytes;
  h->writer_pid = static_cast<std::int32_t>(::getpid());
  h->clock_id = CLOCK_BOOTTIME;
  h->writer_start_ns = now;
  h->incarnation = incarnation;
  h->liveness_timeout_ns = o.liveness_timeout_ns;
  h->slot_cooldown_ns = o.slot_cooldown_ns;
  h->stats_offset = kStatsOffset;
  h->liveness_offset = kLivenessOffset;
  reinterpret_cast<WriterLiveness*>(base + kLivenessOffset)
      ->heartbeat_ns.store(now, std::memory_order_release);
  h->ready.store(kReady, std::memory_order_release);  // LAST: publishes everything above
  if (loc.is_memfd && o.seal) seal_memfd(loc, w.memfd_.fd);

  w.slot_count_ = o.slot_count;
  w.cooldown_ns_ = o.slot_cooldown_ns;
  w.free_ring_.resize(o.slot_count);
  w.freed_at_ns_.assign(o.slot_count, 0);
  for (std::uint32_t i = 0; i < o.slot_count; ++i) w.free_ring_[i] = i;
  w.free_len_ = o.slot_count;
  return w;
}

TableWriter::TableWriter(TableWriter&&) noexcept = default;
TableWriter& TableWriter::operator=(TableWriter&&) noexcept = default;
TableWriter::~TableWriter() = default;

const Header& TableWriter::header() const noexcept {
  return *static_cast<const Header*>(region_.get_address());
}

Slot* TableWriter::slot_ptr(std::uint32_t i) const noexcept {
  if (i >= slot_count_) return nullptr;
  return reinterpret_cast<Slot*>(static_cast<char*>(region_.get_address()) + kSlotsOffset) + i;
}


Stats& TableWriter::stats() const noexcept {
  return *reinterpret_cast<Stats*>(static_cast<char*>(region_.get_address()) + kStatsOffset);
}

namespace {

// Seqlock write section (io thread only): odd while the descriptive fields change.
// Fence-free form: every field store inside the section is a release store, so the odd
// `seq` is visible before any new field value; readers load the fields with acquire, so the
// closing `seq` load cannot move above them (on x86 both are plain moves).
struct SeqWrite {
  explicit SeqWrite(Slot& s) noexcept : slot(s), seq(s.seq.load(std::memory_order_relaxed)) {
    slot.seq.store(seq + 1, std::memory_order_relaxed);
  }
  ~SeqWrite() { slot.seq.store(seq + 2, std::memory_order_release); }
  SeqWrite(const SeqWrite&) = delete;
  SeqWrite& operator=(const SeqWrite&) = delete;
  Slot& slot;
  std::uint32_t seq;
};

std::uint64_t pack_info(SlotState st, std::string_view name) noexcept {
  std::uint64_t v = static_cast<std::uint64_t>(st);
  v |= static_cast<std::uint64_t>(name.size() & 0xFF) << 8;
  for (std::size_t i = 0; i < kNamePrefixBytes && i < name.size(); ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(name[i])) << (16 + 8 * i);
  return v;
}

SlotState state_of(std::uint64_t info) noexcept { return static_cast<SlotState>(info & 0xFF); }

/// Writes a token record under its seqlock (the SeqWrite pattern): `token` empty clears
/// it. Bytes beyond the token are zero.
void store_token(TokenRecord& r, Epoch epoch, std::span<const std::uint8_t> token) noexcept {
  const std::uint32_t seq = r.seq.load(std::memory_order_relaxed);
  r.seq.store(seq + 1, std::memory_order_relaxed);
  r.epoch.store(token.empty() ? 0 : epoch, std::memory_order_release);
  r.length.store(static_cast<std::uint32_t>(token.size()), std::memory_order_release);
  for (std::size_t w = 0; w < kTokenRecordWords; ++w) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < 8 && w * 8 + b < token.size(); ++b)
      v |= static_cast<std::uint64_t>(token[w * 8 + b]) << (8 * b);
    r.words[w].store(v, std::memory_order_release);
  }
  r.seq.store(seq + 2, std::memory_order_release);
}

}  // namespace

Result<ClaimedSlot> TableWriter::claim(SandboxId sandbox, std::uint64_t now_ns) {
  if (sandbox.is_nil()) return Status::invalid(quote(location_) + ": claim needs a sandbox id (got nil)");
  if (free_len_ == 0) {
    stats().counters.claims_refused_full.fetch_add(1, std::memory_order_relaxed);
    return Status{Errc::busy, quote(location_) + " is full: all " + std::to_string(slot_count_) + " slots are in use"};
  }
  const std::uint32_t i = free_ring_[free_head_];
  const std::uint64_t freed = freed_at_ns_[i];
  // A clock that reads earlier than the free time counts as "still cooling" (fail safe).
  if (freed != 0 && (now_ns < freed || now_ns - freed < cooldown_ns_)) {
    stats().counters.claims_refused_full.fetch_add(1, std::memory_order_relaxed);
    return Status{Errc::busy, quote(location_) + " is full: " + std::to_string(free_len_) +
                                  " free slots are still cooling down; the next is usable in " +
                                  ms_text(now_ns < freed ? cooldown_ns_ : cooldown_ns_ - (now_ns - freed))};
  }
  ClaimedSlot r;
  free_head_ = (free_head_ + 1) % slot_count_;
  --free_len_;
  Slot& s = *slot_ptr(i);
  {
    SeqWrite w(s);
    const std::uint32_t gen = s.generation.load(std::memory_order_acquire) + 1;
    s.generation.store(gen, std::memory_order_release);
    s.check_word.store(0, std::memory_order_release);
    s.valid_until_ns.store(0, std::memory_order_release);
    s.sandbox_hi.store(sandbox.hi, std::memory_order_release);
    s.sandbox_lo.store(sandbox.lo, std::memory_order_release);
    s.name_hi.store(0, std::memory_order_release);
    s.name_lo.store(0, std::memory_order_release);
    s.info.store(pack_info(SlotState::claimed, {}), std::memory_order_release);
    r.generation = gen;
  }
  r.slot = i;
  return r;
}

TableErrc TableWriter::publish(std::uint32_t slot, NameId name, std::string_view name_text,
                               Epoch epoch, std::uint64_t valid_until_ns) noexcept {
  Slot* s = slot_ptr(slot);
  if (s == nullptr) return TableErrc::bad_slot;
  if (!epoch_in_range(epoch)) return TableErrc::bad_epoch;
  if (name_text.size() > kNameBytesMax) return TableErrc::bad_argument;
  const SlotState st = state_of(s->info.load(std::memory_order_relaxed));
  if (st != SlotState::claimed && st != SlotState::published) return TableErrc::wrong_state;
  SeqWrite w(*s);
  std::uint64_t cur = s->check_word.load(std::memory_order_relaxed);
  if (cur & kRevokedBit) return TableErrc::revoked;
  // Epoch monotone at publish (the grant end asserts it in LeaseTable): a slot's published
  // epoch only grows until the slot is freed; a lower one would re-validate a fenced token.
  LEASEHOLD_ASSERT(cur == 0 || epoch >= cur);
  if (cur == epoch) {  // same epoch again: only the deadline and the descriptive fields move
    // valid_until never decreasing for an epoch, as in extend().
    LEASEHOLD_ASSERT(valid_until_ns >= s->valid_until_ns.load(std::memory_order_relaxed));
    s->valid_until_ns.store(valid_until_ns, std::memory_order_release);
  } else {
    // Leave the old epoch first, so no reader pairs the new deadline with it.
    if (cur != 0 && !s->check_word.compare_exchange_strong(cur, 0, std::memory_order_release,
                                                           std::memory_order_relaxed))
      return TableErrc::revoked;  // only the rt thread's revoke changes it under us
    s->valid_until_ns.store(valid_until_ns, std::memory_order_release);
  }
  s->name_hi.store(name.hi, std::memory_order_release);
  s->name_lo.store(name.lo, std::memory_order_release);
  s->info.store(pack_info(SlotState::published, name_text), std::memory_order_release);
  if (cur != epoch) {
    std::uint64_t expect = 0;
    if (!s->check_word.compare_exchange_strong(expect, epoch, std::memory_order_release,
                                               std::memory_order_relaxed))
      return TableErrc::revoked;
  }
  stats().counters.publishes.fetch_add(1, std::memory_order_relaxed);
  return TableErrc::ok;
}

TableErrc TableWriter::extend(std::uint32_t slot, std::uint64_t valid_until_ns) noexcept {
  Slot* s = slot_ptr(slot);
  if (s == nullptr) return TableErrc::bad_slot;
  if (state_of(s->info.load(std::memory_order_relaxed)) != SlotState::published)
    return TableErrc::wrong_state;
  if (s->check_word.load(std::memory_order_relaxed) & kRevokedBit) return TableErrc::revoked;
  // valid_until never decreasing for an epoch (the heartbeat end drops a stale answer before it
  // gets here): an extend that moves the deadline back was applied out of order, and the one it
  // overtook may have been the later lease.
  LEASEHOLD_ASSERT(valid_until_ns >= s->valid_until_ns.load(std::memory_order_relaxed));
  s->valid_until_ns.store(valid_until_ns, std::memory_order_release);
  return TableErrc::ok;
}

TableErrc TableWriter::free(std::uint32_t slot, std::uint64_t now_ns) noexcept {
  Slot* s = slot_ptr(slot);
  if (s == nullptr) return TableErrc::bad_slot;
  const SlotState st = state_of(s->info.load(std::memory_order_relaxed));
  if (st != SlotState::claimed && st != SlotState::published) return TableErrc::wrong_state;
  {
    SeqWrite w(*s);
    s->check_word.store(0, std::memory_order_release);  // clears a revoke too: nobody holds it
    s->valid_until_ns.store(0, std::memory_order_release);
    s->info.store(pack_info(SlotState::cooling, {}), std::memory_order_release);
  }
  if (st == SlotState::claimed) {
    // Never published: no reader was ever told an epoch for this slot, so there is nothing to
    // confuse and no cooldown to wait out (a refused create must not use up the table). It goes
    // to the head of the free ring, ready at once.
    freed_at_ns_[slot] = 0;
    free_head_ = (free_head_ + slot_count_ - 1) % slot_count_;
    free_ring_[free_head_] = slot;
    ++free_len_;
    return TableErrc::ok;
  }
  freed_at_ns_[slot] = now_ns == 0 ? 1 : now_ns;
  free_ring_[(free_head_ + free_len_) % slot_count_] = slot;
  ++free_len_;
  return TableErrc::ok;
}

SandboxId TableWriter::owner(std::uint32_t slot) const noexcept {
  const Slot* s = slot_ptr(slot);
  if (s == nullptr) return {};
  const SlotState st = state_of(s->info.load(std::memory_order_relaxed));
  if (st != SlotState::claimed && st != SlotState::published) return {};
  return SandboxId{s->sandbox_hi.load(std::memory_order_relaxed), s->sandbox_lo.load(std::memory_order_relaxed)};
}

bool TableWriter::revoke(std::uint32_t slot) noexcept {
  Slot* s = slot_ptr(slot);
  if (s == nullptr) return false;
  s->check_word.fetch_or(kRevokedBit, std::memory_order_release);
  stats().counters.revokes.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void TableWriter::heartbeat(std::uint64_t now_ns) noexcept {
  auto* l = reinterpret_cast<WriterLiveness*>(static_cast<char*>(region_.get_address()) +
                                              kLivenessOffset);
  l->heartbeat_ns.store(now_ns == 0 ? 1 : now_ns, std::memory_order_release);
  l->heartbeats.fetch_add(1, std::memory_order_relaxed);
}

void TableWriter::close(std::uint64_t now_ns) noexcept {
  auto* base = static_cast<char*>(region_.get_address());
  reinterpret_cast<Header*>(base)->closed_ns.store(now_ns == 0 ? 1 : now_ns,
                                                   std::memory_order_release);
  reinterpret_cast<WriterLiveness*>(base + kLivenessOffset)
      ->heartbeat_ns.store(0, std::memory_order_release);
}

void TableWriter::remove() noexcept { unlink_location(location_); }

void TableWriter::record_rt_lateness_ns(std::uint64_t ns) noexcept {
  histogram_record(stats().rt_lateness_ns, ns);
}
void TableWriter::record_heartbeat_rtt_ns(std::uint64_t ns) noexcept {
  histogram_record(stats().heartbeat_rtt_ns, ns);
}
void TableWriter::record_heartbeat_failure() noexcept {
  stats().counters.heartbeat_failures.fetch_add(1, std::memory_order_relaxed);
}
void TableWriter::record_kill(std::uint64_t kill_latency_ns) noexcept {
  stats().counters.kills.fetch_add(1, std::memory_order_relaxed);
  histogram_record(stats().kill_latency_ns, kill_latency_ns);
}

// ---- reader -------------------------------------------------------------------------------

TableReader TableReader::open(std::string_view location, const OpenOptions& o) {
  const Location loc = parse_location(location);
  if (loc.is_memfd)
    fail(TableErrc::bad_argument, quote(loc) + ": a memfd table is opened by its descriptor or by "
                                               "/proc/<writer pid>/fd/<N>, not by its name");
  if (!loc.is_fd) {
    // Only a table its writer alone can change is worth checking a lease against.
    const std::string file = loc.is_path ? loc.name : "/dev/shm/" + loc.name;
    struct stat st{};
    if (::stat(file.c_str(), &st) == 0) {
      const uid_t trusted = o.trusted_uid == static_cast<std::uint32_t>(-1) ? ::geteuid() : o.trusted_uid;
      if (st.st_uid != 0 && st.st_uid != trusted)
        fail(TableErrc::untrusted, quote(loc) + ": owned by uid " + std::to_string(st.st_uid) +
                                       ", neither root nor uid " + std::to_string(trusted) + ": refusing to trust it");
      if ((st.st_mode & 022) != 0)
        fail(TableErrc::untrusted, quote(loc) + ": group or others may write it (mode " +
                                       std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                                       std::to_string(st.st_mode & 7) + "): refusing to trust it");
    }
  }
  const std::uint64_t start = static_cast<std::uint64_t>(boottime_ns());
  OpenStage stage = OpenStage::awaiting_file;
  for (std::uint64_t attempt = 0;; ++attempt) {
    RawMap m = map_readonly(loc);
    TableErrc code = TableErrc::ok;
    std::string why;
    if (m.err != 0) {
      stage = OpenStage::awaiting_file;
      code = table_errc_of_errno(m.err);
      if (m.not_regular != nullptr) {
        code = TableErrc::bad_magic;  // structural: fails at once, no waiting
        stage = OpenStage::ready;
        why = std::string("is ") + m.not_regular + ", not a table file";
      } else {
        why = m.err == ENOENT ? "does not exist" : std::string("cannot map: ") + std::strerror(m.err);
      }
    } else {
      code = validate_table(m.region.get_address(), m.bytes, why);
      if (code == TableErrc::truncated && m.bytes < sizeof(Header)) stage = OpenStage::awaiting_size;
      else if (code == TableErrc::not_ready) stage = OpenStage::awaiting_ready;
      else stage = OpenStage::ready;
    }
    if (code == TableErrc::ok) {
      TableReader r;
      r.location_ = loc;
      r.region_ = std::move(m.region);
      const auto* base = static_cast<const char*>(r.region_.get_address());
      r.header_ = reinterpret_cast<const Header*>(base);
      r.liveness_ = reinterpret_cast<const WriterLiveness*>(base + kLivenessOffset);
      r.stats_ = reinterpret_cast<const Stats*>(base + kStatsOffset);
      r.slots_ = reinterpret_cast<const Slot*>(base + kSlotsOffset);
      r.slot_count_ = r.header_->slot_count;
      r.liveness_timeout_ns_ = clamp_liveness_timeout_ns(r.header_->liveness_timeout_ns);
      return r;
    }
    // Transient stages retry until wait_ns; structural errors fail at once.
    const bool transient = stage != OpenStage::ready && code != TableErrc::io_error;
    const std::uint64_t waited = static_cast<std::uint64_t>(boottime_ns()) - start;
    if (!transient || waited >= o.wait_ns) {
      std::string msg = quote(loc) + ": " + why;
      if (transient && o.wait_ns > 0)
        msg += " (still " + std::string(to_string(stage)) + " after " + ms_text(waited) + ")";
      fail(code, msg);
    }
    const std::uint64_t nap = o.poll_ns == 0 ? 1'000'000 : o.poll_ns;
    std::this_thread::sleep_for(std::chrono::nanoseconds(nap));
  }
}

TableReader::TableReader(TableReader&&) noexcept = default;
TableReader& TableReader::operator=(TableReader&&) noexcept = default;
TableReader::~TableReader() = default;

namespace {
// The word a bad LeaseCheck points at: it holds kRevokedBit, which no epoch in range equals;
// the LeaseCheck's epoch is then 1, so the compare always fails.
const std::atomic<std::uint64_t> kNeverValidWord{kRevokedBit};
}  // namespace

LeaseCheck TableReader::lease(std::uint32_t index, Epoch epoch) const noexcept {
  if (index >= slot_count_ || !epoch_in_range(epoch)) return LeaseCheck{&kNeverValidWord, 1};
  return LeaseCheck{&slots_[index].check_word, epoch};
}

bool TableReader::check_deadline(std::uint32_t index, Epoch epoch) const noexcept {
  return check_deadline_at(index, epoch, static_cast<std::uint64_t>(boottime_ns()));
}

bool TableReader::check_deadline_at(std::uint32_t index, Epoch epoch,
                                    std::uint64_t now_ns) const noexcept {
  if (index >= slot_count_ || !epoch_in_range(epoch)) return false;
  const Slot& s = slots_[index];
  if (s.check_word.load(std::memory_order_acquire) != epoch) return false;
  const std::uint64_t until = s.valid_until_ns.load(std::memory_order_acquire);
  const std::uint64_t hb = liveness_->heartbeat_ns.load(std::memory_order_acquire);
  // Re-read after valid_until (acquire above orders it): the deadline belongs to `epoch`.
  if (s.check_word.load(std::memory_order_acquire) != epoch) return false;
  const std::uint64_t age_ns = heartbeat_age_ns(hb, now_ns, liveness_timeout_ns_);
  return now_ns < until && age_ns != UINT64_MAX && age_ns <= liveness_timeout_ns_;
}

TableErrc TableReader::snapshot(std::uint32_t index, SlotSnapshot& out) const noexcept {
  if (index >= slot_count_) return TableErrc::bad_slot;
  const Slot& s = slots_[index];
  for (std::uint32_t attempt = 0; attempt < kSnapshotRetriesMax; ++attempt) {
    const std::uint32_t s1 = s.seq.load(std::memory_order_acquire);
    if (s1 & 1u) continue;
    const std::uint32_t gen = s.generation.load(std::memory_order_acquire);
    const std::uint64_t word = s.check_word.load(std::memory_order_acquire);
    const std::uint64_t until = s.valid_until_ns.load(std::memory_order_acquire);
    const std::uint64_t shi = s.sandbox_hi.load(std::memory_order_acquire);
    const std::uint64_t slo = s.sandbox_lo.load(std::memory_order_acquire);
    const std::uint64_t nhi = s.name_hi.load(std::memory_order_acquire);
    const std::uint64_t nlo = s.name_lo.load(std::memory_order_acquire);
    const std::uint64_t info = s.info.load(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != s1) continue;
    out = SlotSnapshot{};
    out.index = index;
    out.generation = gen;
    out.state = state_of(info);
    out.revoked = (word & kRevokedBit) != 0;
    out.epoch = word & ~kRevokedBit;
    out.sandbox = SandboxId{shi, slo};
    out.name = NameId{nhi, nlo};
    out.name_bytes = static_cast<std::uint8_t>((info >> 8) & 0xFF);
    for (std::size_t i = 0; i < kNamePrefixBytes && i < out.name_bytes; ++i) {
      const char c = static_cast<char>((info >> (16 + 8 * i)) & 0xFF);
      out.name_prefix[i] = (c >= 0x20 && c < 0x7F) ? c : '?';  // printable only
    }
    out.valid_until_ns = until;
    return TableErrc::ok;
  }
  return TableErrc::busy;
}

std::optional<SlotSnapshot> TableReader::find(SandboxId sandbox) const noexcept {
  if (sandbox.is_nil()) return std::nullopt;
  SlotSnapshot snap;
  for (std::uint32_t i = 0; i < slot_count_; ++i) {
    // Cheap pre-filter on the sandbox words; the snapshot then confirms consistently.
    if (slots_[i].sandbox_lo.load(std::memory_order_relaxed) != sandbox.lo) continue;
    if (snapshot(i, snap) != TableErrc::ok) continue;
    if (snap.sandbox == sandbox &&
        (snap.state == SlotState::claimed || snap.state == SlotState::published))
      return snap;
  }
  return std::nullopt;
}

Liveness TableReader::writer_liveness(std::uint64_t now_ns) const noexcept {
  return liveness_of(*header_, *liveness_, now_ns);
}

bool TableReader::replaced() const {
  RawMap m = map_readonly(location_);
  if (m.err != 0) return true;
  std::string why;
  if (validate_table(m.region.get_address(), m.bytes, why) != TableErrc::ok) return true;
  const auto* h = static_cast<const Header*>(m.region.get_address());
  return h->incarnation != header_->incarnation || h->writer_start_ns != header_->writer_start_ns;
}

// ---- a sandbox's token channel ---------------------------------------------------------

namespace {

// A token record's consistent copy (the snapshot() pattern: seq, fields, seq again).
TableErrc read_token(const TokenRecord& r, TokenSnapshot& out) noexcept {
  for (std::uint32_t attempt = 0; attempt < kSnapshotRetriesMax; ++attempt) {
    const std::uint32_t s1 = r.seq.load(std::memory_order_acquire);
    if (s1 & 1u) continue;
    const std::uint64_t epoch = r.epoch.load(std::memory_order_acquire);
    const std::uint32_t length = r.length.load(std::memory_order_acquire);
    std::uint64_t words[kTokenRecordWords];
    for (std::size_t w = 0; w < kTokenRecordWords; ++w) words[w] = r.words[w].load(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) != s1) continue;
    out = TokenSnapshot{};
    if (length > out.bytes.size()) return TableErrc::bad_geometry;  // a writer never stores that
    out.epoch = epoch;
    out.length = length;
    for (std::size_t i = 0; i < length; ++i) out.bytes[i] = static_cast<std::uint8_t>(words[i / 8] >> (8 * (i % 8)));
    return TableErrc::ok;
  }
  return TableErrc::busy;
}

TokenRecord& channel_record(const bip::mapped_region& region) noexcept {
  return *reinterpret_cast<TokenRecord*>(static_cast<char*>(region.get_address()) + kTokenChannelRecordOffset);
}

}  // namespace

TokenChannel TokenChannel::create(std::string_view name) {
  const Location loc = parse_location(std::string(kMemfdPrefix) + std::string(name));
  TableOptions o;
  o.mode = 0400;  // its owner alone may reopen it through /proc, and only for reading
  TokenChannel c;
  create_memfd(loc, o, kTokenChannelBytes, c.memfd_.fd, c.region_);
  auto* h = static_cast<TokenChannelHeader*>(c.region_.get_address());
  h->magic = kTokenChannelMagic;
  h->major = kTokenChannelMajor;
  h->minor = kTokenChannelMinor;
  h->record_bytes = kTokenRecordBytes;
  h->record_offset = kTokenChannelRecordOffset;
  h->ready.store(kReady, std::memory_order_release);  // LAST
  seal_memfd(loc, c.memfd_.fd);
  return c;
}

TokenChannel::TokenChannel(TokenChannel&&) noexcept = default;
TokenChannel& TokenChannel::operator=(TokenChannel&&) noexcept = default;
TokenChannel::~TokenChannel() = default;

TableErrc TokenChannel::publish(Epoch epoch, std::span<const std::uint8_t> token) noexcept {
  if (token.size() > kTokenRecordWords * 8 || (!token.empty() && !epoch_in_range(epoch))) return TableErrc::bad_argument;
  store_token(channel_record(region_), epoch, token);
  return TableErrc::ok;
}

Result<int> TokenChannel::reopen_read_only() const {
  const std::string file = "/proc/self/fd/" + std::to_string(memfd_.fd);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::from_errno(errno, "token channel: cannot open " + file + " read-only");
  return fd;
}

Result<int> TokenChannel::seals() const {
  const int s = ::fcntl(memfd_.fd, F_GET_SEALS);
  if (s < 0) return Status::from_errno(errno, "token channel: F_GET_SEALS of descriptor " + std::to_string(memfd_.fd));
  return s;
}

TokenChannelReader TokenChannelReader::open(std::string_view location) {
  const std::string what = "token channel '" + std::string(location) + "'";
  if (location.empty() || location.size() > 9 || location.find_first_not_of("0123456789") != std::string_view::npos)
    fail(TableErrc::bad_argument, what + ": expected the number of an inherited descriptor (LEASEHOLD_TOKENS)");
  Location loc;
  loc.text = std::string(location);
  loc.is_fd = true;
  loc.fd = std::stoi(loc.text);
  RawMap m = map_readonly(loc);
  if (m.err == ENOENT) fail(TableErrc::missing, what + ": no such descriptor (is this a sandbox of a supervisor?)");
  if (m.not_regular != nullptr) fail(TableErrc::bad_argument, what + " is " + m.not_regular);
  if (m.err != 0) fail(table_errc_of_errno(m.err), what + ": " + std::strerror(m.err));
  if (m.bytes < kTokenChannelBytes)
    fail(TableErrc::truncated, what + " is " + std::to_string(m.bytes) + " bytes, smaller than " +
                                   std::to_string(kTokenChannelBytes));
  const auto* h = static_cast<const TokenChannelHeader*>(m.region.get_address());
  const std::uint32_t ready = h->ready.load(std::memory_order_acquire);
  if (h->magic != kTokenChannelMagic) fail(TableErrc::bad_magic, what + ": wrong magic (not a leasehold token channel)");
  if (ready != kReady) fail(TableErrc::not_ready, what + ": the writer has not set the ready flag");
  if (h->major != kTokenChannelMajor)
    fail(h->major > kTokenChannelMajor ? TableErrc::newer_major : TableErrc::older_major,
         what + ": layout " + std::to_string(h->major) + "." + std::to_string(h->minor) + " is not this reader's " +
             std::to_string(kTokenChannelMajor) + ".x");
  if (h->record_bytes != kTokenRecordBytes || h->record_offset != kTokenChannelRecordOffset)
    fail(TableErrc::bad_geometry, what + ": inconsistent geometry (record_bytes " + std::to_string(h->record_bytes) +
                                      ", record_offset " + std::to_string(h->record_offset) + ")");
  TokenChannelReader r;
  r.region_ = std::move(m.region);
  r.record_ = &channel_record(r.region_);
  return r;
}

TokenChannelReader::TokenChannelReader(TokenChannelReader&&) noexcept = default;
TokenChannelReader& TokenChannelReader::operator=(TokenChannelReader&&) noexcept = default;
TokenChannelReader::~TokenChannelReader() = default;

TableErrc TokenChannelReader::read(TokenSnapshot& out) const noexcept { return read_token(*record_, out); }

Errc errc_of(TableErrc e) noexcept {
  switch (e) {
    case TableErrc::ok: return Errc::ok;
    case TableErrc::missing: return Errc::not_found;
    case TableErrc::bad_slot:
    case TableErrc::bad_epoch:
    case TableErrc::bad_argument: return Errc::invalid_argument;
    case TableErrc::truncated:
    case TableErrc::bad_magic:
    case TableErrc::bad_geometry: return Errc::corrupt;
    case TableErrc::newer_major:
    case TableErrc::older_major: return Errc::unsupported;
    case TableErrc::untrusted: return Errc::permission_denied;
    case TableErrc::writer_alive:
    case TableErrc::exists: return Errc::exists;
    case TableErrc::not_ready:
    case TableErrc::busy:
    case TableErrc::table_full: return Errc::busy;
    case TableErrc::wrong_state:
    case TableErrc::revoked: return Errc::refused;
    case TableErrc::io_error: return Errc::io_error;
  }
  return Errc::io_error;
}

Result<std::vector<std::uint8_t>> own_token(std::string_view location, Epoch epoch) {
  std::string loc(location);
  if (loc.empty()) {
    const char* env = std::getenv(kTokenChannelEnv);
    loc = env != nullptr ? env : "";
  }
  if (loc.empty()) return Status{Errc::not_found, "no token channel (LEASEHOLD_TOKENS is not set)"};
  try {
    TokenSnapshot ts;
    const TableErrc e = TokenChannelReader::open(loc).read(ts);
    if (e != TableErrc::ok) return Status{errc_of(e), "token channel unreadable: " + std::string(to_string(e))};
    if (ts.length == 0 || ts.epoch != epoch)
      return Status{Errc::not_found, "no signed token of this sandbox's for epoch " + std::to_string(epoch)};
    auto v = ts.view();
    return std::vector<std::uint8_t>(v.begin(), v.end());
  } catch (const TableError& e) {
    return Status{errc_of(e.code()), e.what()};
  } catch (const std::exception& e) {
    return Status{Errc::io_error, e.what()};
  }
}

}  // namespace leasehold::shm
