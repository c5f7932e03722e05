// leasehold/harness: the pause-probe's files on disk (include/leasehold/harness/pause_output.hpp).
#include "leasehold/harness/pause_output.hpp"

#include "leasehold/harness/process.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace leasehold::harness {

namespace {

namespace fs = std::filesystem;

/// The PNG through gnuplot: its path, or "" when gnuplot wrote nothing (no empty PNG is left).
Result<std::string> gnuplot_png(const pause::SweepReport& rep, const std::string& gnuplot, const std::string& out,
                                const std::string& csv_path, const std::function<void(const std::string&)>& warn) {
  const std::string plot_path = out + "/pause-probe.png";
  const std::string script = out + "/pause-probe.gp";
  // The script names its files relative to `out`, where gnuplot runs (`cd` before the script),
  // so the directory can be moved or shared and the script still runs there.
  std::error_code ec;
  const fs::path dir = fs::absolute(out, ec);
  fs::path csv = fs::absolute(csv_path, ec).lexically_relative(dir);
  if (csv.empty()) csv = fs::path(csv_path).filename();
  if (const Status w = write_file(script, pause::gnuplot_script(rep, csv.string(), "pause-probe.png")); !w.ok())
    return w;
  Process gp;
  Spawn spec;
  spec.argv = {gnuplot, "-e", "cd " + pause::detail::gp_quote(dir.string()), fs::absolute(script, ec).string()};
  spec.stdout_path = out + "/gnuplot.log";
  spec.stderr_path = spec.stdout_path;
  spec.label = "gnuplot";
  if (gp.start(spec).ok()) {
    gp.wait(kGnuplotTimeout);
    gp.terminate(milliseconds(100));
  }
  struct stat st {};
  if (::stat(plot_path.c_str(), &st) == 0 && st.st_size != 0) return plot_path;
  // No point to draw (every trial an error), or gnuplot failed.
  ::unlink(plot_path.c_str());
  warn("warning: gnuplot did not write " + plot_path + " (see " + out + "/gnuplot.log); writing an SVG instead\n");
  return std::string();
}

}  // namespace

Result<std::string> write_plot(const pause::SweepReport& rep, const std::string& out, const std::string& csv_path,
                               const std::string& mode, const std::function<void(const std::string&)>& warn) {
  const std::string gnuplot = mode == "svg" ? "" : find_program("gnuplot");
  if (!gnuplot.empty()) {
    auto png = gnuplot_png(rep, gnuplot, out, csv_path, warn);
    if (!png || !png->empty()) return png;
  } else if (mode == "png") {
    warn("warning: gnuplot is not installed; writing an SVG instead of a PNG\n");
  }
  const std::string svg = out + "/pause-probe.svg";
  if (const Status w = write_file(svg, pause::svg_plot(rep)); !w.ok()) return w;
  return svg;
}

Result<SweepFiles> write_sweep(const pause::SweepReport& rep, const SweepOutput& where, bool interrupted,
                               const std::function<void(const std::string&)>& warn) {
  SweepFiles f;
  f.csv = !where.csv_path.empty() ? where.csv_path : where.out + "/pause-probe.csv";
  f.json = where.out + "/pause-probe.json";
  if (const Status w = write_file(f.csv, pause::to_csv(rep)); !w.ok()) return w;
  auto plot = write_plot(rep, where.out, f.csv, where.plot_mode, warn);
  if (!plot) return plot.status();
  f.plot = *plot;
  f.summary = pause::to_json(rep);
  f.summary["files"] = {{"csv", f.csv}, {"plot", f.plot}, {"json", f.json}, {"sandbox_logs", where.log_dir}};
  f.summary["interrupted"] = interrupted;
  if (const Status w = write_file(f.json, f.summary.dump(2) + "\n"); !w.ok()) return w;
  return f;
}

}  // namespace leasehold::harness
