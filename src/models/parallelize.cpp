#include "crosstrain/models/parallelize.h"

#include "crosstrain/core/error.h"

namespace crosstrain::models {

parallel::ParallelDims gpt_dims(const GPTConfig& model, const parallel::ParallelConfig& config,
                                int64_t train_micro_batches, int world) {
  parallel::ParallelDims dims = parallel::ParallelDims::resolve(config, train_micro_batches, world, model.n_layer);
  check_parallel_plan(model, dims.tp(), dims.sequence_parallel, dims.virtual_stages());
  // A tied head reads the embedding's weight: both must live on one stage, and ZeRO-3 would have released the
  // embedding's gathered weight before the head runs.
  if (model.is_llama() && model.tie_embeddings && (dims.virtual_stages() > 1 || dims.zero >= 3))
    throw UsageError("model.tie_embeddings needs one pipeline stage and ZeRO below 3 (the head reads the embedding's "
                     "weight); set model.tie_embeddings = false for this layout");
  if (dims.bounds.empty()) dims.bounds = partition_gpt(model, dims.virtual_stages());
  return dims;
}

std::vector<torch::Tensor> ParallelGPT::parameters() const {
  std::vector<torch::Tensor> all;
  for (const auto& chunk : chunks_)
    for (const auto& p : chunk->parameters()) all.push_back(p);
  return all;
}

bool ParallelGPT::is_replicated(const std::string& name) const { return chunks_[0]->is_replicated(name); }

std::vector<std::vector<std::string>> ParallelGPT::unit_names() const {
  std::vector<std::vector<std::string>> units;
  for (const auto& chunk : chunks_)
    for (const auto& names : chunk->unit_names()) units.push_back(names);
  return units;
}

void ParallelGPT::train(bool on) {
  for (auto& chunk : chunks_) chunk->train(on);
}

std::unique_ptr<ParallelGPT> parallelize(const GPTConfig& model, uint64_t seed, const parallel::ParallelDims& dims,
                                         const parallel::Mesh& mesh, int64_t local_batch, at::ScalarType compute_dtype) {
  using parallel::Axis;
  std::unique_ptr<ParallelGPT> m(new ParallelGPT());
  // The unsplit shapes from the plan: no rank builds the full model (the stages draw their own shards).
  const ParallelPlan plan(model);
  for (const auto& p : plan.parameters()) m->global_shapes_[p.name] = p.shape;
  TensorParallelContext tp{mesh.group(Axis::TP), mesh.index(Axis::TP), dims.tp(), dims.sequence_parallel};
  const int pp = dims.pp(), stage = mesh.index(Axis::PP), virtual_stages = dims.virtual_stages();
  if (pp > 1 && parallel::splits_backward(dims.schedule_spec().kind)) {
    // Zero-bubble: the linear layers keep what their weight gradients need for the schedule's weight actions.
    m->weight_grads_ = std::make_unique<parallel::WeightGradStore>();
    tp.weight_grads = m->weight_grads_.get();
  }
  for (int64_t k = 0; k < dims.chunks; ++k) {
    const int vs = static_cast<int>(k * pp + stage);
    StageSpec spec{dims.bounds[vs], dims.bounds[vs + 1], vs == 0, vs == virtual_stages - 1};
    m->chunks_.emplace_back(model, spec, tp, seed);
    for (const auto& [name, t] : m->chunks_.back()->named_shards()) m->shards_[name] = t;
    for (auto& p : m->chunks_.back()->partial_gradient_parameters()) m->partial_.push_back(p);
  }
  const auto M = static_cast<size_t>(dims.microbatches);
  m->inputs.resize(M);
  m->targets.resize(M);
  m->loss_weights.assign(M, 1.0);
  if (pp == 1) return m;
  ParallelGPT* self = m.get();
  parallel::PipelineModel runner;
  runner.forward = [self, M](int chunk, int mb, const at::Tensor& input) {
    return self->chunks_[chunk]->pipeline_forward(input, self->inputs[mb], self->targets[mb],
                                                  self->loss_weights[mb] / static_cast<double>(M));
  };
  runner.parameters = [self](int chunk) { return self->chunks_[chunk]->parameters(); };
  const int64_t seq = dims.sequence_parallel ? model.block_size / dims.tp() : model.block_size;
  runner.activation_shape = {local_batch, seq, model.n_embd};
  runner.activation_dtype = compute_dtype;
  runner.weight_grads = m->weight_grads_.get();
  m->pipeline_ = std::make_unique<parallel::PipelineRuntime>(dims.schedule_spec(), mesh.group(Axis::PP), stage, runner);
  return m;
}

}  // namespace crosstrain::models
