// The communication settings of a process: the [comm] section of a training config maps onto this struct key
// for key (train/config.h), and init_world, with_algorithms and validate take it as it is, so no caller copies
// the settings into a struct of its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

struct CommConfig {
  std::string backend = "gloo";      // gloo, or mpi (a job started by mpirun)
  double timeout_s = 30;             // every wait, the rendezvous and group creation
  bool shared_memory = true;         // same-host float all-reduces through shared memory (comm/backends/shm.h)
  // Gradients between data-parallel replicas: none, bf16, fp16, int8, int4, topk:F, powersgd:R
  // (comm/compression/codecs.h). The gradient reducer applies it; it is here because it is part of [comm].
  std::string compression = "none";
  // Collectives through our algorithms (comm/algorithms/communicator.h): builtin (the back end's own), ring, tree,
  // hd, hierarchical, auto.
  std::string algo = "builtin";
  std::string topology;              // for algo = auto: a topology TOML whose links the cost model uses
  // Seal the data plane (comm/secure/encryption.h): wan (groups that cross clusters), all, off, or auto (wan when
  // the job has a secret, else off).
  std::string encrypt = "auto";
  // Cluster identities for sealed groups (comm/secure/encryption.h): this cluster's key file (NAME.key of
  // `crosstrain keys create`, mode 0600) and the public keys of the clusters it trusts (keys.json).
  std::string identity;
  std::string peer_keys;

  // Seconds are what a person writes in a config; waits take milliseconds. Rounded, not truncated: 0.3 s is
  // 300 ms even where 0.3 * 1000 falls just below 300.
  Millis timeout() const { return Millis(std::llround(timeout_s * 1000)); }
};

// The [comm] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(CommConfig& c, Key&& key) {
  key("backend", c.backend, "gloo, or mpi (a job started by mpirun)");
  key("timeout_s", c.timeout_s,
      "seconds any wait for a peer (collective, rendezvous, group creation) may take before the run fails");
  key("shared_memory", c.shared_memory, "same-host float all-reduces through shared memory");
  key("compression", c.compression, "data-parallel gradients: none, bf16, fp16, int8, int4, topk:F or powersgd:R");
  key("algo", c.algo, "collective algorithm: builtin (the back end's), ring, tree, hd, hierarchical or auto");
  key("topology", c.topology, "algo = auto: a topology TOML whose links the cost model uses");
  key("encrypt", c.encrypt,
      "authenticate and encrypt messages: wan (groups that cross clusters), all, off; auto: wan when the job has a "
      "secret or an identity");
  key("identity", c.identity, "this cluster's key file (NAME.key of crosstrain keys create): signs its group keys");
  key("peer_keys", c.peer_keys, "keys.json of the clusters whose signed group keys are accepted (with identity)");
}

// Checks algo, topology and compression (throws UsageError naming the bad value and the choices) without
// communicating. The back end is checked by init_world, which knows how the process was started.
void validate(const CommConfig& config);

}  // namespace crosstrain::comm
