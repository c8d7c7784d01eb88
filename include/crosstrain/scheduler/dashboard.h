// The scheduler's dashboard page (served at "/" by service.h): clusters, links, the queue and placements, and the
// selected job's events and live metrics (figures, loss and tokens/s charts, a link to its run report), read from
// the JSON API in the browser. Open it at /#job=ID to select a job.
#pragma once

namespace crosstrain::scheduler {

const char* dashboard_html();

}  // namespace crosstrain::scheduler
