// DLRM runs with ranks as threads, for the parity and parameter-server tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "scratch.h"

namespace crosstrain::testing {

// A small DLRM (4 tables, dim 8, 3 ids per feature) at a constant learning rate (a run cut short follows the same
// schedule as a whole one), no evaluation until the end; run.dir is a fresh temporary directory per tag.
inline train::Config dlrm_test_config(const std::string& tag) {
  train::Config c;
  c.model.arch = models::ModelArch::Dlrm;
  c.run.dir = scratch_path("dlrm-" + tag).string();
  c.run.seed = 11;
  c.dlrm.tables = "3000,700,64,40";
  c.dlrm.embedding_dim = 8;
  c.dlrm.multi_hot = 3;  // pooled bags with repeats: dedup and sum pooling both matter
  c.dlrm.bottom_mlp = "16";
  c.dlrm.top_mlp = "16";
  c.dlrm.sparse_lr = 0.05;
  c.train.steps = 20;
  c.train.global_batch = 64;
  c.train.lr = 0.01;
  c.train.min_lr = 0.01;
  c.train.warmup_steps = 0;
  c.train.weight_decay = 0;
  c.train.eval_every = 0;
  c.train.eval_batches = 1;
  c.comm.timeout_s = 60;
  return c;
}

// Rank 0's result of `c` on `world` threads, with every whole table and the dense parameters at the end.
inline train::DlrmResult train_dlrm(int world, const train::Config& c, bool resume = false) {
  if (!resume) std::filesystem::remove_all(c.run.dir);
  train::DlrmResult out;
  std::mutex m;
  comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
    train::DlrmTrainer trainer(c, comm);
    train::DlrmOptions o;
    o.quiet = true;
    o.resume = resume;
    o.gather_tables = true;
    auto r = trainer.run(o);
    std::lock_guard<std::mutex> lock(m);
    if (comm.rank() == 0) out = std::move(r);
  });
  return out;
}

}  // namespace crosstrain::testing
