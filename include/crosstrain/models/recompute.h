// Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022 for "selective"): a region of the model
// keeps only its input during forward and runs its forward again in backward, trading compute for the
// activations it would have saved.
//
//   train.recompute = "none"       every activation saved (fastest)
//                   = "selective"  the attention core (q, k, v -> attention output: the scores, the softmax and,
//                                  with the fused kernel, its q/k/v copies and statistics) recomputed: cheap to
//                                  redo, large to keep at long contexts
//                   = "full"       each transformer block recomputed from its input: one more forward per step
//
// The recomputed forward is the same computation on the same values, and the random state is restored for it,
// so losses and gradients are bit-identical to "none". Parameter gradients leave the recomputed region through
// the outer graph (not a nested backward into .grad), so gradient hooks of reducers and ZeRO fire as usual.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace crosstrain::models {

enum class Recompute { None, Selective, Full };

// "none", "selective", "full"; throws UsageError listing them.
Recompute parse_recompute(const std::string& name);
const char* to_string(Recompute r);

// fn(x), keeping only x (and references to `parameters`, the tensors fn reads besides x that need gradients).
// Without gradient mode it is just fn(x).
at::Tensor recomputed(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                      const std::vector<at::Tensor>& parameters);

}  // namespace crosstrain::models
