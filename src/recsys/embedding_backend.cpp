#include "crosstrain/recsys/embedding_backend.h"

#include <ATen/ATen.h>

namespace crosstrain::recsys {

UniqueIds dedup(const at::Tensor& ids) {
  auto [unique, inverse, unused] = at::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  return {unique, inverse};
}

at::Tensor pool_bags(const at::Tensor& rows, const at::Tensor& inverse, const at::Tensor& offsets, bool mean) {
  return std::get<0>(at::embedding_bag(rows, inverse, offsets, /*scale_grad_by_freq=*/false, mean ? 1 : 0,
                                       /*sparse=*/false, /*per_sample_weights=*/{}, /*include_last_offset=*/true));
}

}  // namespace crosstrain::recsys
