#pragma once

#include <string>
#include <vector>

namespace crosstrain::apps {

// `crosstrain demo`: a short tour of the collectives on nproc local ranks.
int demo_comm(int nproc, const std::vector<std::string>& relaunch_args);

}  // namespace crosstrain::apps
