#include "parts.h"

#include <numeric>

#include "crosstrain/recsys/ps_embedding.h"

namespace crosstrain::train {

std::unique_ptr<recsys::EmbeddingBackend> make_ps_embeddings(const Config& c, const std::vector<recsys::TableDef>& tables,
                                                             const recsys::SparseOptimizerConfig& opt,
                                                             const recsys::TableStorage& storage,
                                                             comm::Communicator& world) {
  std::vector<int> everyone(world.size());
  std::iota(everyone.begin(), everyone.end(), 0);
  // The server's point-to-point traffic gets a group of its own, apart from the collectives of the dense part.
  auto group = world.split(everyone);
  // A cached row serves for as many steps as a worker may run ahead of the slowest (sync.staleness).
  const int64_t max_age = c.sync.staleness;
  return std::make_unique<recsys::PsEmbeddings>(std::move(group), tables, opt, storage, c.run.seed, c.comm.timeout(),
                                                c.dlrm.cache_rows, max_age, c.dlrm.pooling == recsys::Pooling::Mean);
}

}  // namespace crosstrain::train
