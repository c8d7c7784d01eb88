// `crosstrain report RUN_DIR` (the HTML run report and a terminal summary) and `crosstrain trace merge RUN_DIR`
// (the ranks' traces on one clock): docs/observability.md.
#pragma once

#include <string>

namespace crosstrain::apps {

// Writes the report to `out` (default RUN_DIR/report.html), prints the summary and the report's path.
int report_command(const std::string& run_dir, const std::string& out);
// The report of a run folder as one HTML page (Chart.js inlined): the scheduler serves it for each recipe job
// (ServiceOptions::report_html; the scheduler layer cannot reach obs).
std::string report_page(const std::string& run_dir);
// Writes RUN_DIR/traces/merged.json and prints its path, the ranks and the events.
int trace_merge_command(const std::string& run_dir);

}  // namespace crosstrain::apps
