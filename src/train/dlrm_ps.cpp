#include "dlrm_parts.h"

#include "crosstrain/core/error.h"

namespace crosstrain::train {

std::unique_ptr<recsys::EmbeddingBackend> make_ps_embeddings(const Config&, const std::vector<recsys::TableDef>&,
                                                             const recsys::SparseOptimizerConfig&,
                                                             const recsys::TableStorage&, comm::Communicator&) {
  throw UsageError("dlrm.mode = \"ps\" is being built");
}

}  // namespace crosstrain::train
