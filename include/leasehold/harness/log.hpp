// leasehold/harness: reading the structured log lines of lockd and the supervisor
// (`ts_boot_ns=... event=grant name=orders epoch=3`): whitespace-separated words, those with an
// `=` as key=value fields; a word without `=` is ignored.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::harness {

/// One log line's key=value fields (the value: everything after the word's first `=`).
using LogFields = std::map<std::string, std::string>;

/// The key=value fields of one line.
LogFields parse_log_line(std::string_view line);

/// The lines of `text` whose `event` field equals `event`, in order, as fields.
std::vector<LogFields> log_events(std::string_view text, std::string_view event);

}  // namespace leasehold::harness
