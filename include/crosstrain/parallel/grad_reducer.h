// Gradient synchronisation for data parallelism, behind one interface: the trainer zeroes, runs backward
// (with or without sync) and reads averaged gradients; how they got there (bucketed all-reduce, later ZeRO
// reduce-scatter, compression, local SGD) is the reducer's business.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <utility>
#include <cstdint>
#include <memory>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/parallel/grad_hooks.h"

namespace crosstrain::parallel {

struct ReducerStats {
  double comm_time_s = 0;          // wall time with at least one all-reduce in flight, last synced step
  double exposed_comm_time_s = 0;  // of which backward had finished and the step waited
  int64_t bytes = 0;               // gradient bytes all-reduced per synced step
  int buckets = 0;
  int started_during_backward = 0;  // buckets whose all-reduce began before backward finished (overlap)
  int64_t bytes_sent = 0;            // by this rank in the last synced step (busbw accounting)
  int64_t bytes_uncompressed = 0;    // what a plain float all-reduce of the same gradients sends
};

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // Whether the next backward passes communicate; false while accumulating micro-batches.
  virtual void set_sync(bool sync) = 0;
  // Zeroes every gradient in place (gradients may be views into communication buffers).
  virtual void zero_grad() = 0;
  // Blocks until the synchronised gradients are in place. A syncing backward already ends with it;
  // calling it again is free.
  virtual void finish() = 0;
  // Starts and waits for every bucket now: for callers whose backward passes all ran without sync
  // (a pipeline interleaves micro-batches, so no single backward is the last one).
  virtual void synchronize() = 0;
  virtual ReducerStats stats() const = 0;
  // L2 norm of all gradients, and scaling them in place (for clipping), without per-tensor calls.
  virtual double gradient_norm() const = 0;
  virtual void scale_gradients(double factor) = 0;
  // Scalars averaged over the ranks together with the gradients (no extra collective): set them before the
  // syncing backward, read them after it. Used for the step's loss.
  virtual void set_side_value(int index, double value) = 0;
  virtual double side_value(int index) const = 0;
};

// Wall time during which at least one of the intervals [launched, completed) was running, for intervals given
// in launch order (a back end runs them one after another): the reducers' comm_time_s. Pure.
double busy_seconds(const std::vector<std::pair<std::chrono::steady_clock::time_point,
                                                std::chrono::steady_clock::time_point>>& intervals);

struct BucketConfig {
  int64_t bucket_bytes = 1 << 20;  // all-reduce granularity; small enough to start during backward
  // comm.compression: none, bf16, fp16, int8, int4, topk:F, powersgd:R. Compressed buckets are exchanged at
  // the end of backward (with error feedback), not overlapped with it.
  std::string compression = "none";
};

// DDP-style reducer. Gradients live in flat per-bucket buffers (each parameter's .grad is a view), so
// accumulation and averaging happen in place with no copies. Low-precision (bf16) gradients are reduced in
// fp32: each bucket is widened once into an fp32 buffer when its all-reduce starts, averaged there, and the
// result stays fp32 (reduced_gradient()); the norm, clipping and the side values work on it. The parameters'
// own .grad then keeps this rank's local sum. Buckets hold parameters in reverse
// registration order (the order backward produces them); a bucket's all-reduce starts from a gradient
// hook as soon as its last gradient is accumulated, while backward continues. Buckets are always started
// in the same order on every rank, so a parameter that gets no gradient (its bucket is started at the end
// of backward with zeros) never hangs or reorders the collectives.
class BucketedAllReduce : public GradReducer {
 public:
  // `comm` may be null or of size 1: then nothing is communicated.
  BucketedAllReduce(std::vector<at::Tensor> parameters, comm::Communicator* comm, BucketConfig config = {});
  ~BucketedAllReduce() override;
  BucketedAllReduce(const BucketedAllReduce&) = delete;
  BucketedAllReduce& operator=(const BucketedAllReduce&) = delete;

  void set_sync(bool sync) override { sync_ = sync; }
  void zero_grad() override;
  void finish() override;
  void synchronize() override;
  ReducerStats stats() const override { return stats_; }
  double gradient_norm() const override;
  void scale_gradients(double factor) override;
  void set_side_value(int index, double value) override;
  double side_value(int index) const override;
  static constexpr int kSideValues = 4;
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // The averaged gradient of `parameter` (one of those given, requiring a gradient) after a syncing backward or
  // synchronize(): a view of the fp32 buffer it was reduced in (for fp32 parameters, its .grad itself).
  at::Tensor reduced_gradient(const at::Tensor& parameter) const;
  // Bytes of the local gradient buffers that are not also the reduction buffers (bf16 gradients: 2 per element).
  int64_t local_gradient_bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Bucket {
    at::Tensor flat;                   // gradients, then (last bucket only) the side values
    at::Tensor grads;                  // the gradient part of flat
    at::Tensor wide;                   // what is reduced: flat itself when fp32, else an fp32 copy of it
    at::Tensor wide_grads;             // the gradient part of wide
    std::vector<at::Tensor> wide_views;  // per parameter, into wide
    std::vector<size_t> params;  // indices into parameters_
    std::vector<at::Tensor> views;
    int pending = 0;
    comm::WorkPtr work;
    Clock::time_point launched, completed;
    bool done = false;
  };

  bool on_gradient_ready(size_t param);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void reset_pass();
  void attach_views();

  std::vector<at::Tensor> parameters_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<Bucket> buckets_;
  comm::Communicator* comm_;
  std::unique_ptr<comm::Codec> codec_;  // null: plain all-reduce
  comm::ErrorFeedback feedback_;
  bool sync_ = true;
  size_t next_launch_ = 0;
  Clock::time_point backward_done_;
  ReducerStats stats_;
  // Last, so it is destroyed first: disarmed before anything its callbacks use goes.
  std::unique_ptr<GradientHooks> hooks_;
};

}  // namespace crosstrain::parallel
