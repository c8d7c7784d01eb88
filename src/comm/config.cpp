#include "crosstrain/comm/config.h"

#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/core/error.h"

namespace crosstrain::comm {

void validate(const CommConfig& config) {
  if (config.algo != "builtin" && config.algo != "auto") {
    try {
      algo::parse_algorithm(config.algo);
    } catch (const UsageError&) {
      throw UsageError("comm.algo = \"" + config.algo + "\" is not an algorithm; use builtin, ring, tree, hd, " +
                       "hierarchical or auto");
    }
  }
  if (!config.topology.empty()) load_topology(config.topology);  // names the file and the key that is wrong
  if (config.compression != "none") make_codec(config.compression);  // names the spec and the valid forms
  if (config.encrypt != "auto" && config.encrypt != "wan" && config.encrypt != "all" && config.encrypt != "off")
    throw UsageError("comm.encrypt = \"" + config.encrypt + "\" is not one of auto, wan, all, off");
  if (config.identity.empty() != config.peer_keys.empty())
    throw UsageError("comm.identity and comm.peer_keys go together: this cluster's key file, and the keys.json of "
                     "the clusters it accepts (crosstrain keys create writes both)");
}

}  // namespace crosstrain::comm
