// `leasehold`: the operator and runtime CLI (DESIGN.md "Programs").
#include "tools/cmd_common.hpp"
#include "tools/command.hpp"
#include "tools/version.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::cli {
std::vector<Registrar>& registry() {
  static std::vector<Registrar> r;
  return r;
}

namespace {

/// Edit distance (insert, delete, substitute, swap of neighbours) of two short words.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// The subcommand closest to `word` (at most 2 edits, or a command it begins), or "".
std::string closest_command(const CLI::App& app, std::string_view word) {
  std::string best;
  std::size_t best_d = 3;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    const std::string& name = sub->get_name();
    std::size_t dist = edit_distance(word, name);
    if (word.size() >= 2 && name.rfind(word, 0) == 0) dist = std::min<std::size_t>(dist, 1);
    if (dist < best_d) {
      best_d = dist;
      best = name;
    }
  }
  return best;
}

}  // namespace
}  // namespace leasehold::cli

int main(int argc, char** argv) {
  using namespace leasehold::cli;
  CLI::App app{"leasehold: named, fenced leases for sandboxes", "leasehold"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "Print the version and exit");
  app.footer(
      "Commands: `leasehold help COMMAND` or `leasehold COMMAND --help` describes one.\n"
      "Exit codes (every command): 0 ok; 1 check failed / answer is no; 2 usage or malformed argument;\n"
      "3 refused (by lockd or the supervisor: held, stale epoch, table full, busy, forbidden, permission\n"
      "denied on the control socket, a key lockd rejected ...); 4 not found (unknown name, sandbox,\n"
      "slot or command); 5 lockd unreachable (no answer, or nothing listens at its address); 6 shm table missing, corrupt or its writer dead or gone\n"
      "(`dump` and `check` alike); 7 no supervisor answering on the control socket; 70 internal error.\n"
      "With --json a failure is also printed on stdout as {\"error\", \"exit_code\", \"message\", ...}.\n"
      "Environment: LEASEHOLD_LOCKD, LEASEHOLD_KEY_FILE, LEASEHOLD_SUPERVISOR (defaults for\n"
      "--lockd, --key-file, --supervisor); LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_EPOCH (check);\n"
      "NO_COLOR or TERM=dumb: `top` and `dump --watch` never clear the screen.");
  int exit_code = kOk;
  for (auto& reg : registry()) reg(app, &exit_code);
  set_json_errors(wants_json(argc, argv));
  // The first word names the command: `help [COMMAND]`, or one that does not exist (CLI11 would
  // only say that a subcommand is required).
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string word = argv[1];
    if (word == "help") {
      const CLI::App* about = &app;
      if (argc >= 3) {
        try {
          about = app.get_subcommand(argv[2]);
        } catch (const CLI::OptionNotFound&) {
          const std::string near = closest_command(app, argv[2]);
          return report("help", {kUsage, "unknown command \"" + std::string(argv[2]) + "\"" +
                                                (near.empty() ? std::string() : "; did you mean \"" + near + "\"?") +
                                                " (`leasehold help` lists the commands)"});
        }
      }
      std::fputs(about->help().c_str(), stdout);
      return kOk;
    }
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      known = known || sub->check_name(word);
    if (!known) {
      const std::string near = closest_command(app, word);
      return report("", {kUsage, "unknown command \"" + word + "\"" +
                                     (near.empty() ? std::string() : "; did you mean \"" + near + "\"?") +
                                     " (`leasehold help` lists the commands)"});
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const int rc = app.exit(e);
    if (json_errors()) std::printf("%s\n", error_json({kUsage, e.what()}).dump().c_str());
    return rc == 0 ? kOk : kUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold: internal error: %s\n", e.what());
    if (json_errors()) std::printf("%s\n", error_json({kInternal, std::string("internal error: ") + e.what()}).dump().c_str());
    return kInternal;
  }
  return exit_code;
}
