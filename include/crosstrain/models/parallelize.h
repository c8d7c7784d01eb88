// The GPT under a parallel layout: the model-specific step between the resolved dimensions (parallel_dims.h) and
// the training loop, as torchtitan's `parallelize` functions are. It checks the model against the layout, builds
// this rank's stages (its pipeline chunks, tensor-parallel shards of them), each drawing only its own shards of
// the seeded model, and the pipeline runner that drives them. The trainer and `crosstrain bench pipeline` both
// start here.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/parallel/parallel_dims.h"
#include "crosstrain/parallel/pipeline.h"

namespace crosstrain::models {

// The layout for a GPT: ParallelDims::resolve, then the model's own limits (heads, width, vocabulary and
// sequence divisible by tp; blocks enough for the virtual stages) and, unless given, stage bounds balanced by cost.
parallel::ParallelDims gpt_dims(const GPTConfig& model, const parallel::ParallelConfig& config,
                                int64_t train_micro_batches, int world);

// This rank's part of the model. Not copyable: the pipeline's callbacks point into it.
class ParallelGPT {
 public:
  ParallelGPT(const ParallelGPT&) = delete;
  ParallelGPT& operator=(const ParallelGPT&) = delete;

  // The micro-batches of the step being run, [local batch, block size] tokens each; the caller fills them.
  std::vector<torch::Tensor> inputs, targets;
  // Each micro-batch's loss (its mean over counted targets) is multiplied by its weight: 1 unless targets are
  // masked (data/loss_mask.h), where the weights make every layout's loss the mean over the global batch.
  std::vector<double> loss_weights;

  std::vector<GPTStage>& chunks() { return chunks_; }
  // Every parameter this rank holds, by plain name ("h.3.attn.c_attn.weight"), and the model's unsplit shapes.
  const std::map<std::string, torch::Tensor>& shards() const { return shards_; }
  const std::map<std::string, std::vector<int64_t>>& global_shapes() const { return global_shapes_; }
  std::vector<torch::Tensor> parameters() const;
  // Replicated over the tensor-parallel group: a gradient norm counts it on tp rank 0 only.
  bool is_replicated(const std::string& name) const;
  // Sequence parallelism: replicated parameters whose gradients must be summed over the tensor-parallel group.
  const std::vector<torch::Tensor>& partial_gradient_parameters() const { return partial_; }
  // Parameter names grouped the way ZeRO gathers them (embedding, each block, head), over every chunk.
  std::vector<std::vector<std::string>> unit_names() const;
  // Null with one pipeline stage: then loss(m) runs micro-batch m through the single stage.
  parallel::PipelineRuntime* pipeline() { return pipeline_.get(); }
  torch::Tensor loss(int64_t m) { return chunks_[0]->loss(inputs[m], targets[m]) * loss_weights[m]; }
  void train(bool on);
  // train.recompute for every block of every chunk.
  void set_recompute(Recompute r) {
    for (auto& chunk : chunks_) chunk->set_recompute(r);
  }

 private:
  friend std::unique_ptr<ParallelGPT> parallelize(const GPTConfig&, uint64_t, const parallel::ParallelDims&,
                                                  const parallel::Mesh&, int64_t, at::ScalarType);
  ParallelGPT() = default;
  std::vector<GPTStage> chunks_;
  std::map<std::string, torch::Tensor> shards_;
  std::map<std::string, std::vector<int64_t>> global_shapes_;
  std::vector<torch::Tensor> partial_;
  std::unique_ptr<parallel::WeightGradStore> weight_grads_;  // zero-bubble schedules only
  std::unique_ptr<parallel::PipelineRuntime> pipeline_;
};

// Builds this rank's stages, holding its shards of the model of `seed` (every layout starts from the same model,
// and no rank materialises more than its shards plus one full parameter), and with
// pp > 1 the pipeline runtime over the mesh's pipeline group. `local_batch`: sequences per micro-batch;
// `compute_dtype`: of the activations the stages pass (bf16 with mixed precision).
std::unique_ptr<ParallelGPT> parallelize(const GPTConfig& model, uint64_t seed, const parallel::ParallelDims& dims,
                                         const parallel::Mesh& mesh, int64_t local_batch,
                                         at::ScalarType compute_dtype = at::kFloat);

}  // namespace crosstrain::models
