#include "elastic_supervisor.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <iostream>

namespace crosstrain::apps {

ElasticSupervisor::ElasticSupervisor(const ElasticLaunch& options, int world_size, int ranks_per_node,
                                     std::shared_ptr<comm::Rendezvous> store)
    : options_(options) {
  if (!store) return;
  elastic::CoordinatorOptions c;
  c.world_size = world_size;
  c.min_start_ranks = options.min_nnodes * ranks_per_node;
  c.exclude = [this](const std::vector<std::pair<int, int>>& processes, const std::string&) {
    std::lock_guard<std::mutex> lock(mu_);
    excluded_.insert(excluded_.end(), processes.begin(), processes.end());
  };
  c.log = [](const std::string& line) { std::cerr << "crosstrain elastic: " + line + "\n" << std::flush; };
  coordinator_ = std::make_unique<elastic::Coordinator>(store->store(), std::move(c));
}

ElasticSupervisor::~ElasticSupervisor() = default;

bool ElasticSupervisor::on_failure(int rank, pid_t pid, const std::string& how) {
  if (coordinator_) coordinator_->rank_exited(rank);
  if (restarts_ >= options_.max_restarts) {
    std::cerr << "crosstrain run: rank " << rank << " (pid " << pid << ") failed with " << how
              << "; no restarts left (--max-restarts " << options_.max_restarts
              << "), the job goes on without it\n" << std::flush;
    return false;
  }
  ++restarts_;
  std::cerr << "crosstrain run: rank " << rank << " (pid " << pid << ") failed with " << how << "; restarting it ("
            << restarts_ << " of " << options_.max_restarts << " restarts)\n" << std::flush;
  return true;
}

std::vector<std::pair<int, int>> ElasticSupervisor::take_exclusions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int, int>> out;
  out.swap(excluded_);
  return out;
}

}  // namespace crosstrain::apps
