// leasehold/harness: the pause-probe's files on disk - the CSV, the JSON summary and the plot, a
// PNG drawn by gnuplot from the CSV where gnuplot is installed, else the self-drawn SVG of
// pause/report.hpp. Errors come back as a Result whose message names the file that could not be
// written (DESIGN.md "Errors"); a gnuplot that fails is not an error (the SVG is written instead,
// with a warning).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/pause/report.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace leasehold::harness {

/// How long gnuplot may take to draw the PNG.
inline constexpr std::chrono::milliseconds kGnuplotTimeout{30'000};

/// Writes the plot of `rep` into directory `out`. `mode` "svg": OUT/pause-probe.svg; "auto" or
/// "png": OUT/pause-probe.png through gnuplot (its script OUT/pause-probe.gp reads `csv_path`,
/// its output OUT/gnuplot.log), and the SVG when gnuplot is missing or writes nothing (`warn`
/// says so; "png" warns also when gnuplot is not installed). The path of the plot written;
/// errors: write_file's, naming the script or the SVG.
Result<std::string> write_plot(const pause::SweepReport& rep, const std::string& out, const std::string& csv_path,
                               const std::string& mode, const std::function<void(const std::string&)>& warn);

/// Where write_sweep() puts a sweep's files.
struct SweepOutput {
  std::string out;        ///< the output directory (it exists)
  std::string csv_path;   ///< the CSV; "": OUT/pause-probe.csv
  std::string plot_mode;  ///< write_plot()'s `mode`: "auto", "png" or "svg"
  std::string log_dir;    ///< the sandboxes' logs, named in the summary
};

/// The files write_sweep() wrote, and the summary it wrote into `json`.
struct SweepFiles {
  std::string csv, plot, json;
  nlohmann::json summary;  ///< pause::to_json(rep) with "files" and "interrupted"
};

/// Writes the CSV of `rep`, its plot (write_plot(); `warn` as there) and OUT/pause-probe.json: the
/// summary, pause::to_json(rep) with "files" ({csv, plot, json, sandbox_logs}) and
/// "interrupted" (the sweep ended early). Errors: write_file's or write_plot's, naming the file;
/// the files before it are written.
Result<SweepFiles> write_sweep(const pause::SweepReport& rep, const SweepOutput& where, bool interrupted,
                               const std::function<void(const std::string&)>& warn);

}  // namespace leasehold::harness
