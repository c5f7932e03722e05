// `leasehold check`: a sandbox runtime's view of its own lease in the shm epoch table
// (DESIGN.md "The shared-memory epoch table"). Reads LEASEHOLD_SHM, LEASEHOLD_SLOT and
// LEASEHOLD_EPOCH (what the supervisor puts in every sandbox's env) unless flags say otherwise.
// The grant's signed token comes from the sandbox's own token channel (LEASEHOLD_TOKENS), never
// from the table: a sandbox reads its own grants' tokens only.
// Exit 0: valid (check_deadline passes); 1: not valid (the reason is printed); 6: no usable
// table, or its writer (the supervisor) is dead or closed it - as `dump` exits for the same
// table; 2: missing or malformed slot/epoch.
#include "tools/cmd_common.hpp"

#include "leasehold/wire/token.hpp"
#include "leasehold/shm/table.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace leasehold::cli {
namespace {

struct CheckArgs {
  std::string shm;
  std::string slot;
  std::string epoch;
  std::string sandbox;
  std::string tokens;
  std::uint64_t wait_ms = 0;
  bool json = false;
};

std::optional<std::uint64_t> parse_u64(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::string env(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr ? std::string(v) : std::string();
}

const Command kCheck([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<CheckArgs>();
  auto* sub = app.add_subcommand(
      "check", "Check a sandbox's own lease in the shm table (epoch, deadline, writer liveness); "
               "exit 0 if valid, 1 if not, 6 if the table is unusable or its supervisor is dead or gone "
               "(as `dump`)");
  sub->add_option("--shm", a->shm, "table location (env LEASEHOLD_SHM)");
  sub->add_option("--slot", a->slot, "slot index (env LEASEHOLD_SLOT)");
  sub->add_option("--epoch", a->epoch, "the epoch the sandbox was granted (env LEASEHOLD_EPOCH)");
  sub->add_option("--sandbox", a->sandbox, "find the slot by sandbox id instead of --slot");
  sub->add_option("--tokens", a->tokens, "the sandbox's own token channel, an inherited descriptor (env LEASEHOLD_TOKENS)");
  sub->add_option("--wait-ms", a->wait_ms, "wait this long for the table to appear");
  sub->add_flag("--json", a->json, "print a JSON object");
  sub->callback([a, exit_code] {
    auto fail = [&](int code, const std::string& m) { *exit_code = report("check", {code, m}); };
    const std::string loc = !a->shm.empty() ? a->shm : env("LEASEHOLD_SHM");
    if (loc.empty()) return fail(kUsage, "no table: pass --shm or set LEASEHOLD_SHM (the supervisor sets it in every sandbox)");
    shm::OpenOptions oo;
    oo.wait_ns = a->wait_ms * 1'000'000;
    std::optional<shm::TableReader> reader;
    try {
      reader.emplace(shm::TableReader::open(loc, oo));
    } catch (const std::exception& e) {
      return fail(kTableError, e.what());
    }
    std::uint32_t slot = 0;
    if (!a->sandbox.empty()) {
      Failure f;
      const auto sb = parse_sandbox(a->sandbox, f);
      if (!sb) return fail(f.code, f.message);
      const auto found = reader->find(*sb);
      if (!found) return fail(kNotFound, "no slot for sandbox " + sb->str() + " in " + loc);
      slot = found->index;
    } else {
      const std::string text = !a->slot.empty() ? a->slot : env("LEASEHOLD_SLOT");
      if (text.empty()) return fail(kUsage, "no slot: pass --slot or --sandbox, or set LEASEHOLD_SLOT");
      const auto v = parse_u64(text);
      if (!v) return fail(kUsage, "malformed slot \"" + text + "\": expected a slot index");
      if (*v >= reader->slot_count())
        return fail(kNotFound, "slot " + text + " is out of range: the table has " +
                                   std::to_string(reader->slot_count()) + " slots");
      slot = static_cast<std::uint32_t>(*v);
    }
    const std::string etext = !a->epoch.empty() ? a->epoch : env("LEASEHOLD_EPOCH");
    if (etext.empty()) return fail(kUsage, "no epoch: pass --epoch or set LEASEHOLD_EPOCH");
    const auto epoch = parse_u64(etext);
    if (!epoch || *epoch == 0) return fail(kUsage, "malformed epoch \"" + etext + "\": expected a positive integer");

    const std::uint64_t now = static_cast<std::uint64_t>(boottime_ns());
    const bool valid = reader->check_deadline_at(slot, *epoch, now);
    shm::SlotSnapshot snap;
    const shm::TableErrc se = reader->snapshot(slot, snap);
    const shm::Liveness live = reader->writer_liveness(now);
    std::string reason;
    if (!valid) {
      if (se != shm::TableErrc::ok) reason = "slot unreadable: " + std::string(shm::to_string(se));
      else if (live.closed) reason = "the supervisor closed the table";
      else if (!live.alive) reason = "the supervisor's heartbeat is stale (writer dead?)";
      else if (snap.revoked) reason = "the lease was revoked (kill-switch or lost lease)";
      else if (snap.state == shm::SlotState::cooling || snap.state == shm::SlotState::free)
        reason = "the slot's sandbox is gone (slot " + std::string(shm::to_string(snap.state)) +
                 "): killed by the kill-switch, released, or exited";
      else if (snap.epoch == 0) reason = "no lease is published in the slot (its sandbox has no name)";
      else if (snap.epoch != *epoch) reason = "the slot holds epoch " + std::to_string(snap.epoch) + ", not " + etext;
      else if (snap.valid_until_ns <= now) reason = "valid_until passed " + duration_text(static_cast<std::int64_t>(now - snap.valid_until_ns)) + " ago";
      else reason = "the slot is " + std::string(shm::to_string(snap.state));
    }
    const std::int64_t left_ns = static_cast<std::int64_t>(snap.valid_until_ns) - static_cast<std::int64_t>(now);
    // This sandbox's signed token of the grant at this epoch, from its own token channel (it
    // hands it to a resource with its writes; the resource verifies it with lockd's public key).
    // Only when it is the slot's: the holder it names is the slot's sandbox.
    const auto own_result = shm::own_token(a->tokens, *epoch);
    std::string token_why = own_result.message();
    const std::vector<std::uint8_t> own = own_result.ok() ? *own_result : std::vector<std::uint8_t>{};
    std::optional<token::GrantToken> tok;
    if (!own.empty()) {
      if (Result<token::GrantToken> decoded = token::decode(own); decoded.ok())
        tok = std::move(decoded).value();
      else
        token_why = "this sandbox's token for epoch " + etext + ": " + decoded.message();
    }
    if (tok && tok->holder != snap.sandbox) {
      tok.reset();
      token_why = "this sandbox's token for epoch " + etext + " is not the slot's (slot " + std::to_string(slot) +
                  " holds sandbox " + snap.sandbox.str() + ")";
    }
    const std::string token_hex = tok ? token::to_hex(own) : std::string();
    if (a->json) {
      nlohmann::json j = {{"valid", valid}, {"slot", slot}, {"epoch", *epoch},
                          {"slot_epoch", snap.epoch}, {"slot_state", std::string(shm::to_string(snap.state))},
                          {"revoked", snap.revoked}, {"sandbox", snap.sandbox.str()},
                          {"writer_alive", live.alive}};
      // null when the slot holds no deadline (freed, or never published)
      j["ttl_left_ms"] = snap.valid_until_ns == 0 ? nlohmann::json(nullptr) : nlohmann::json(left_ns / 1'000'000);
      if (!valid) j["reason"] = reason;
      // null: no signed token for this epoch (lockd signs none, or the slot holds another grant)
      j["token"] = token_hex.empty() ? nlohmann::json(nullptr) : nlohmann::json(token_hex);
      j["token_key_id"] = tok ? nlohmann::json(token::key_id_text(tok->key_id)) : nlohmann::json(nullptr);
      std::printf("%s\n", j.dump().c_str());
    } else if (valid) {
      std::printf("valid: slot %u epoch %s, sandbox %s, valid for %s more\n", slot, etext.c_str(),
                  snap.sandbox.str().c_str(), duration_text(left_ns).c_str());
      if (tok)
        std::printf("token: %s (signed by lockd key %s; name %s, worker %s)\n", token_hex.c_str(),
                    token::key_id_text(tok->key_id).c_str(), tok->name.str().c_str(), tok->worker.str().c_str());
      else
        std::printf("token: none (%s)\n", token_why.c_str());
    } else {
      std::printf("NOT valid: slot %u epoch %s: %s\n", slot, etext.c_str(), reason.c_str());
    }
    // A dead or closed writer makes the table unusable for every slot: kTableError, as `dump`.
    *exit_code = valid ? kOk : (!live.alive || live.closed) ? kTableError : kFailure;
  });
});

}  // namespace
}  // namespace leasehold::cli
