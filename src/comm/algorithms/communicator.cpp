#include "crosstrain/comm/algorithms/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <functional>

#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/comm/backends/mpi.h"
#include "../forwarding_communicator.h"
#include "../serial_worker.h"

namespace crosstrain::comm {
namespace {

using algo::Algorithm;

// Tags of the objects: above the algorithms' default range, a range of kTagsPerCall per algorithm.
constexpr int kTagBase = algo::kDefaultTag + 4096;

// What our algorithms take: dense CPU buffers of float, double or an integer type. Half and bfloat16 stay with the
// back end, which sums them in float (our algorithms would round at every hop); bool and complex too.
bool takes(const at::Tensor& t) {
  const auto d = t.scalar_type();
  return t.defined() && t.is_contiguous() && t.device().is_cpu() && d != at::kBool && d != at::kHalf &&
         d != at::kBFloat16 && !at::isComplexType(d);
}

// The links of `file` over the hosts of this group (each host's cluster from the file when it lists the host).
Topology with_links_from(Topology detected, const std::string& file) {
  if (file.empty()) return detected;
  const Topology f = load_topology(file);
  detected.host = f.host;
  detected.cluster = f.cluster;
  detected.wan = f.wan;
  for (auto& h : detected.hosts)
    for (const auto& g : f.hosts)
      if (g.name == h.name) h.cluster = g.cluster;
  return detected;
}

std::string describe_hosts(const Topology& t) {
  std::string s;
  for (const auto& h : t.hosts) s += (s.empty() ? "" : ", ") + h.name + "=" + std::to_string(h.ranks);
  return s;
}

class AlgorithmCommunicator : public ForwardingCommunicator {
 public:
  AlgorithmCommunicator(std::unique_ptr<Communicator> inner, CommConfig config, Topology topology)
      : ForwardingCommunicator(std::move(inner), config.algo), config_(std::move(config)),
        topology_(std::move(topology)) {
    // Same-host float sums and averages: the shared-memory path beats every point-to-point algorithm here.
    shm_ = inner_->backend().find("+shm") != std::string::npos;
    fixed_ = config_.algo == "auto" ? Algorithm::Builtin : algo::parse_algorithm(config_.algo);
    // Hierarchical groups are consecutive ranks: each host's ranks must be, in equal numbers. They are split now,
    // collectively, not later inside one call.
    const int per_host = topology_.consecutive_ranks_per_host();
    if (fixed_ == Algorithm::Hierarchical && per_host == 0)
      throw UsageError("comm.algo = \"hierarchical\" needs the same number of ranks on every host, each host's "
                       "ranks consecutive (as crosstrain run and mpirun --map-by slot place them); hosts: " +
                       describe_hosts(topology_) + ". Use ring, tree, hd or auto");
    hierarchical_ = per_host > 0 && topology_.hosts.size() > 1;
    if (fixed_ == Algorithm::Hierarchical || (fixed_ == Algorithm::Builtin && hierarchical_))
      hierarchy_ = algo::make_hierarchy(*inner_, per_host);
  }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    const bool shm = shm_ && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) &&
                     (op == ReduceOp::Sum || op == ReduceOp::Avg);
    if (!takes(t) || (fixed_ == Algorithm::Builtin && shm)) return inner_->all_reduce(t, op);
    return start(std::string("allreduce(") + to_string(op) + ")", Collective::AllReduce, t.nbytes(),
                 [t, op](algo::CollectiveAlgorithm& a) mutable { a.all_reduce(t, op); });
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    if (!takes(in) || !takes(out)) return inner_->reduce_scatter(in, out, op);
    return start(std::string("reducescatter(") + to_string(op) + ")", Collective::ReduceScatter, in.nbytes(),
                 [in, out, op](algo::CollectiveAlgorithm& a) mutable { a.reduce_scatter(in, out, op); });
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    if (!takes(in) || !takes(out)) return inner_->all_gather(in, out);
    return start("allgather", Collective::AllGather, out.nbytes(),
                 [in, out](algo::CollectiveAlgorithm& a) mutable { a.all_gather(in, out); });
  }
  WorkPtr broadcast(at::Tensor& t, int root) override {
    if (!takes(t)) return inner_->broadcast(t, root);
    return start("broadcast", Collective::Broadcast, t.nbytes(),
                 [t, root](algo::CollectiveAlgorithm& a) mutable { a.broadcast(t, root); });
  }

  // Everything else goes to the wrapped communicator (ForwardingCommunicator).

  // The algorithm a call of `op` on `bytes` uses.
  Algorithm choose(Collective op, double bytes) const {
    return fixed_ != Algorithm::Builtin ? fixed_ : choose_algorithm(op, bytes, topology_, hierarchical_);
  }

 protected:
  std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> sub) override {
    return with_algorithms(std::move(sub), config_);
  }

 private:
  WorkPtr start(const std::string& name, Collective op, int64_t bytes,
                std::function<void(algo::CollectiveAlgorithm&)> call) {
    auto work = std::make_shared<DeferredWork>(timeout(), context(name));
    const Algorithm a = choose(op, static_cast<double>(bytes));
    // Always on the worker, never inline: a collective may wait for peers that first wait for this rank's
    // later sends, and the caller must get its Work back at once.
    worker_.submit(work, [this, a, call = std::move(call)] { call(object(a)); });
    return work;
  }

  // One object per algorithm, made on first use (by the job running: one at a time). Their scratch grows to the
  // largest buffer seen and is reused.
  algo::CollectiveAlgorithm& object(Algorithm a) {
    auto& slot = objects_[static_cast<size_t>(a)];
    if (!slot) {
      algo::AlgorithmOptions o;
      o.tag = kTagBase + static_cast<int>(a) * algo::kTagsPerCall;
      if (a == Algorithm::Hierarchical) slot = std::make_unique<algo::HierarchicalAlgorithm>(*inner_, hierarchy_, o);
      else slot = algo::make_algorithm(a, *inner_, o);
    }
    return *slot;
  }

  CommConfig config_;
  Topology topology_;
  Algorithm fixed_;            // Builtin: auto
  bool hierarchical_ = false;  // auto may choose hierarchical (several hosts, equal and consecutive ranks)
  bool shm_ = false;           // the wrapped communicator has the shared-memory all-reduce
  algo::Hierarchy hierarchy_;
  std::array<std::unique_ptr<algo::CollectiveAlgorithm>, 5> objects_;
  SerialWorker worker_;  // last: destroyed (and drained) first
};

}  // namespace

std::unique_ptr<Communicator> with_algorithms(std::unique_ptr<Communicator> inner, const CommConfig& config) {
  if (!inner || config.algo == "builtin" || inner->size() < 2) return inner;
  if (inner->backend().rfind("mpi", 0) == 0 && !mpi_thread_multiple())
    throw UsageError("comm.algo = \"" + config.algo + "\" needs an MPI library with MPI_THREAD_MULTIPLE (our " +
                     "algorithms send from a worker thread); use comm.algo = \"builtin\" with this MPI");
  const Topology detected = detect_local_topology(*inner, /*calibrate=*/false);
  // Every rank must choose the same algorithm for each call: check that all read the same topology. A rank that
  // cannot read the file says why; the others name it.
  Topology topology = detected;
  std::string error;
  try {
    validate(config);
    topology = with_links_from(detected, config.topology);
  } catch (const UsageError& e) {
    error = e.what();
  }
  const int64_t digest =
      error.empty() ? static_cast<int64_t>(std::hash<std::string>{}(to_toml(topology)) & 0x7fffffffffffffffLL) : -1;
  at::Tensor all = at::empty({inner->size()}, at::kLong);
  inner->all_gather(at::full({1}, digest, at::kLong), all)->wait();
  for (int q = 0; q < inner->size(); ++q) {
    const int64_t theirs = all[q].item<int64_t>();
    if (theirs == -1 && !error.empty()) throw UsageError(error);
    if (theirs == -1)
      throw UsageError("rank " + std::to_string(q) + " could not read comm.topology '" + config.topology +
                       "' (its own error names the cause)");
    if (theirs != digest)
      throw UsageError("comm.topology '" + config.topology + "' reads differently on rank " + std::to_string(q) +
                       " than on rank " + std::to_string(inner->rank()) + ": give every host the same file");
  }
  return std::make_unique<AlgorithmCommunicator>(std::move(inner), config, std::move(topology));
}

}  // namespace crosstrain::comm
