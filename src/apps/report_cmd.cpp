#include "report_cmd.h"

#include <cstdio>
#include <filesystem>

#include "crosstrain/obs/report.h"
#include "crosstrain/obs/trace_file.h"

namespace crosstrain::apps {

int report_command(const std::string& run_dir, const std::string& out) {
  const obs::RunData run = obs::load_run(run_dir);
  const std::string path = out.empty() ? (std::filesystem::path(run_dir) / "report.html").string() : out;
  obs::write_report(run, path);
  std::printf("%sreport: %s\n", obs::report_summary_text(run).c_str(), path.c_str());
  return 0;
}

std::string report_page(const std::string& run_dir) {
  return obs::report_html(obs::load_run(run_dir), obs::chart_js_source());
}

int trace_merge_command(const std::string& run_dir) {
  const obs::MergeSummary merged = obs::merge_traces(run_dir);
  std::printf("merged %d ranks, %lld events, %.3f s of time: %s\n", merged.ranks,
              static_cast<long long>(merged.events), (merged.end_us - merged.begin_us) / 1e6, merged.path.c_str());
  for (int rank : merged.ranks_without_clock)
    std::printf("warning: rank %d's trace has no crosstrain_clock event; its events stay on its own clock\n", rank);
  std::printf("open it in https://ui.perfetto.dev or chrome://tracing\n");
  return 0;
}

}  // namespace crosstrain::apps
