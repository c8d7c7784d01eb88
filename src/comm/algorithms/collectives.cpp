// The registry of our collective algorithms: their names (parse_algorithm, to_string) and make_algorithm, which
// builds the object for an Algorithm. The algorithms themselves have a file each beside this one (ring.cpp,
// tree.cpp, halving_doubling.cpp, hierarchical.cpp, builtin.cpp; the shared base in collective_algorithm.cpp and
// all_to_all.cpp); the cost model (src/comm/cost_model.cpp) chooses among them for `auto`.
#include "crosstrain/comm/algorithms/collectives.h"

#include <memory>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {

// --- names -----------------------------------------------------------------------------------------------------

Algorithm parse_algorithm(const std::string& name) {
  if (name == "builtin") return Algorithm::Builtin;
  if (name == "ring") return Algorithm::Ring;
  if (name == "tree") return Algorithm::Tree;
  if (name == "hd" || name == "halving-doubling") return Algorithm::HalvingDoubling;
  if (name == "hierarchical") return Algorithm::Hierarchical;
  throw UsageError("unknown algorithm '" + name + "'; use builtin, ring, tree, hd or hierarchical");
}

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Builtin: return "builtin";
    case Algorithm::Ring: return "ring";
    case Algorithm::Tree: return "tree";
    case Algorithm::HalvingDoubling: return "hd";
    case Algorithm::Hierarchical: return "hierarchical";
  }
  return "?";
}

// --- factory -----------------------------------------------------------------------------------------------------

std::unique_ptr<CollectiveAlgorithm> make_algorithm(Algorithm a, Communicator& comm, const AlgorithmOptions& options) {
  switch (a) {
    case Algorithm::Builtin: return std::make_unique<BuiltinAlgorithm>(comm, options);
    case Algorithm::Ring: return std::make_unique<RingAlgorithm>(comm, options);
    case Algorithm::Tree: return std::make_unique<TreeAlgorithm>(comm, options);
    case Algorithm::HalvingDoubling: return std::make_unique<HalvingDoublingAlgorithm>(comm, options);
    case Algorithm::Hierarchical: return std::make_unique<HierarchicalAlgorithm>(comm, options);
  }
  throw UsageError("unknown algorithm");
}

}  // namespace crosstrain::comm::algo
