// The scheduler's dashboard page (served at "/" by service.h): clusters, links, the queue and placements, and a
// job's events, read from the JSON API in the browser.
#pragma once

namespace crosstrain::scheduler {

const char* dashboard_html();

}  // namespace crosstrain::scheduler
