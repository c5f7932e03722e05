// leasehold-handover-writer: the sandbox of leasehold-handover-bench (perf/handover/README.md).
//
// Started by a supervisor as a named sandbox, it does one fenced write the moment it starts, as
// `leasehold agent` writes (tools/cmd_agent.cpp): its epoch and slot from the environment the
// supervisor sets, the grant's signed token from its own token channel, the shm check
// (check_deadline: epoch, valid-until, supervisor liveness) before the write, then
// FencedStore::write with the token {name, epoch, sandbox} to a store that verifies tokens with
// lockd's public key. Then it writes one line to --result (a temporary file renamed into place,
// so a reader never sees half of it):
//
//   epoch=E verdict=V start_ns=T0 valid_ns=T1 accepted_ns=T2 audit_id=N reason="..."
//
// times on CLOCK_MONOTONIC (one clock for every process of the host; the sandbox has no time
// namespace): T0 when main() began, T1 when the shm check first passed, T2 when write() returned.
// It then waits for SIGTERM (a release) and exits 0; at the latest after --max-seconds (SIGALRM).
// Exit 3 when the write was not accepted, 2 for a bad argument or environment, 1 when the store,
// the table or the result file cannot be used.
#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/wire/token.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace leasehold;

std::int64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

volatile sig_atomic_t g_terminated = 0;
extern "C" void on_sigterm(int) { g_terminated = 1; }

/// Longest the shm check may take to pass after the start (the slot is published before the
/// sandbox may exec, so this is a bound, not a wait that happens).
constexpr std::int64_t kValidWaitNs = 5'000'000'000;

struct Args {
  std::string db, name, public_key, result;
  unsigned max_seconds = 120;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "leasehold-handover-writer: %s\n"
               "usage: leasehold-handover-writer --db STORE --name NAME --public-key PEM --result FILE "
               "[--max-seconds N]\n",
               why);
  return 2;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t start_ns = mono_ns();
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage(("missing the value of " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--db") a.db = value;
    else if (flag == "--name") a.name = value;
    else if (flag == "--public-key") a.public_key = value;
    else if (flag == "--result") a.result = value;
    else if (flag == "--max-seconds") a.max_seconds = static_cast<unsigned>(std::strtoul(value.c_str(), nullptr, 10));
    else return usage(("unknown flag " + flag).c_str());
  }
  if (a.db.empty() || a.name.empty() || a.public_key.empty() || a.result.empty() || a.max_seconds == 0)
    return usage("--db, --name, --public-key and --result are required (--max-seconds > 0)");

  // A release sends SIGTERM; as the init of its pid namespace it would ignore it without a
  // handler. Blocked until the wait below, so it is not lost between a check and the wait.
  struct sigaction term{};
  term.sa_handler = on_sigterm;
  sigemptyset(&term.sa_mask);
  ::sigaction(SIGTERM, &term, nullptr);
  sigset_t block, unblocked;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &block, &unblocked);
  ::alarm(a.max_seconds);  // SIGALRM ends it: it never lingers

  const char* shm_env = env("LEASEHOLD_SHM");
  const char* slot_env = env("LEASEHOLD_SLOT");
  const char* sandbox_env = env("LEASEHOLD_SANDBOX");
  const char* epoch_env = env("LEASEHOLD_EPOCH");
  if (shm_env == nullptr || slot_env == nullptr || sandbox_env == nullptr || epoch_env == nullptr) {
    std::fprintf(stderr, "leasehold-handover-writer: LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_SANDBOX and "
                         "LEASEHOLD_EPOCH must be set (a named sandbox of a supervisor)\n");
    return 2;
  }
  const auto sandbox = SandboxId::parse(sandbox_env);
  const auto slot = static_cast<std::uint32_t>(std::strtoul(slot_env, nullptr, 10));
  const Epoch epoch = std::strtoull(epoch_env, nullptr, 10);
  if (!sandbox || epoch == 0) {
    std::fprintf(stderr, "leasehold-handover-writer: malformed LEASEHOLD_SANDBOX or LEASEHOLD_EPOCH\n");
    return 2;
  }

  std::unique_ptr<shm::TableReader> table;
  try {
    shm::OpenOptions oo;
    oo.wait_ns = 2'000'000'000;
    table = std::make_unique<shm::TableReader>(shm::TableReader::open(shm_env, oo));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold-handover-writer: shm table: %s\n", e.what());
    return 1;
  }
  resource::StoreOptions so;
  so.durable = false;        // synchronous=NORMAL in WAL mode, as `leasehold agent` by default
  so.checkpoint_pages = 0;   // the bench checkpoints between rounds: no write pauses for it
  so.verifier = std::make_shared<token::TokenVerifier>();
  if (const Status why = so.verifier->add_public_key_file(a.public_key); !why.ok()) {
    std::fprintf(stderr, "leasehold-handover-writer: %s\n", why.message().c_str());
    return 1;
  }
  auto opened = resource::FencedStore::open(a.db, so);
  if (!opened) {
    std::fprintf(stderr, "leasehold-handover-writer: %s\n", opened.message().c_str());
    return 1;
  }
  const auto store = std::move(opened).value();
  auto own = shm::own_token({}, epoch);
  if (!own.ok()) std::fprintf(stderr, "leasehold-handover-writer: no signed token for epoch %llu: %s\n",
                              static_cast<unsigned long long>(epoch), own.message().c_str());
  const std::vector<std::uint8_t> signed_token = own.ok() ? std::move(own).value() : std::vector<std::uint8_t>{};

  // The check before the side effect. It passes at once when the supervisor published the
  // slot before letting this process exec; the loop is for a publication still on its way.
  std::int64_t valid_ns = 0;
  while (valid_ns == 0 && mono_ns() - start_ns < kValidWaitNs) {
    if (table->check_deadline(slot, epoch)) {
      valid_ns = mono_ns();
      break;
    }
    const timespec pause{0, 50'000};
    ::nanosleep(&pause, nullptr);
  }
  resource::WriteResult r;
  r.verdict = resource::Verdict::error;
  r.reason = "the shm check did not pass within 5 s";
  if (valid_ns != 0)
    r = store->write({a.name, epoch, *sandbox, signed_token}, "handover writer pid=" + std::to_string(::getpid()));
  const std::int64_t accepted_ns = mono_ns();

  std::string reason = r.reason;
  for (char& c : reason)
    if (c == '"' || c == '\n') c = '\'';
  const std::string tmp = a.result + ".tmp";
  if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "epoch=%llu verdict=%s start_ns=%lld valid_ns=%lld accepted_ns=%lld audit_id=%lld reason=\"%s\"\n",
                 static_cast<unsigned long long>(epoch), std::string(resource::to_string(r.verdict)).c_str(),
                 static_cast<long long>(start_ns), static_cast<long long>(valid_ns),
                 static_cast<long long>(accepted_ns), static_cast<long long>(r.audit_id), reason.c_str());
    const bool written = std::fclose(f) == 0;
    if (!written || std::rename(tmp.c_str(), a.result.c_str()) != 0) {
      std::fprintf(stderr, "leasehold-handover-writer: cannot write %s: %s\n", a.result.c_str(), std::strerror(errno));
      return 1;
    }
  } else {
    std::fprintf(stderr, "leasehold-handover-writer: cannot create %s: %s\n", tmp.c_str(), std::strerror(errno));
    return 1;
  }
  if (!r.accepted()) {
    std::fprintf(stderr, "leasehold-handover-writer: epoch %llu: write %s: %s\n", static_cast<unsigned long long>(epoch),
                 std::string(resource::to_string(r.verdict)).c_str(), r.reason.c_str());
    return 3;
  }
  while (g_terminated == 0) ::sigsuspend(&unblocked);
  return 0;
}
