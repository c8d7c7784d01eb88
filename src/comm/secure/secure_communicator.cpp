// The sealed communicator behind comm.encrypt (secure/encryption.h): key exchange at construction, sealed
// point-to-point, and every collective as our own algorithms over the sealed point-to-point.
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/secure/channel_crypto.h"
#include "crosstrain/comm/secure/encryption.h"
#include "crosstrain/core/names.h"
#include "../forwarding_communicator.h"
#include "../serial_worker.h"

namespace crosstrain::comm {
namespace {

using secure::Cipher;
using secure::kMacBytes;

// Tags of the wrapper's own messages (encryption.h).
constexpr int kTagBase = kSealedTagBase;
static_assert(kSealedTagBase == algo::kDefaultTag + 8192, "above the algorithm communicator's tags");
constexpr int kRingTag = kTagBase;                          // ring: tag, tag + 1
constexpr int kTreeTag = kTagBase + algo::kTagsPerCall;     // tree
constexpr int kGatherTag = kTagBase + 2 * algo::kTagsPerCall;
constexpr int kScatterTag = kGatherTag + 1;
constexpr int kConfirmTag = kGatherTag + 2;
// Below this many bytes the tree's fewer, latency-bound rounds beat the ring's 2(n-1) steps.
constexpr int64_t kTreeBelowBytes = 64 << 10;

// The collective a worker thread is running, for the errors of the messages it sends and receives.
thread_local const std::string* t_running = nullptr;

// One connection: a sealer per direction and the sequence number of each tag in each direction. The locks keep the
// order of numbers equal to the order of posting (messages of one pair and tag are delivered in posting order).
struct Channel {
  Channel(Cipher c, const secure::ChannelKeys& k) : out(c, k.send), in(c, k.recv) {}
  secure::Sealer out, in;
  std::mutex send_mutex, recv_mutex;
  std::unordered_map<int, uint64_t> sent, received;
};

at::Tensor flat_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

// Buffers of sealed messages, reused by size: a ring all-reduce seals and opens pieces of the same sizes at every
// call, and fresh buffers of a MiB cost their page faults again at every call (about 5,000 per 64 MiB all-reduce
// of 2 ranks). At most kMaxIdleBytes wait here.
class BoxPool {
 public:
  at::Tensor take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = idle_.find(bytes);
      if (it != idle_.end() && !it->second.empty()) {
        at::Tensor box = std::move(it->second.back());
        it->second.pop_back();
        idle_bytes_ -= bytes;
        return box;
      }
    }
    return at::empty({bytes}, at::kByte);
  }
  // Only buffers no transfer uses any more.
  void give(at::Tensor box) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!box.defined() || idle_bytes_ + box.numel() > kMaxIdleBytes) return;
    idle_bytes_ += box.numel();
    idle_[box.numel()].push_back(std::move(box));
  }

 private:
  static constexpr int64_t kMaxIdleBytes = int64_t{256} << 20;
  std::mutex mutex_;
  std::unordered_map<int64_t, std::vector<at::Tensor>> idle_;
  int64_t idle_bytes_ = 0;
};

class SealedSendWork : public Work {
 public:
  SealedSendWork(Millis timeout, WorkPtr inner, at::Tensor box, std::shared_ptr<BoxPool> pool)
      : Work(timeout), inner_(std::move(inner)), box_(std::move(box)), pool_(std::move(pool)) {}
  ~SealedSendWork() override {
    if (inner_->is_completed()) pool_->give(std::move(box_));  // else the back end may still read it
  }
  void wait(Millis timeout) override { inner_->wait(timeout); }
  bool is_completed() override { return inner_->is_completed(); }
  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    return inner_->wait_unless(timeout, give_up);
  }

 private:
  WorkPtr inner_;
  at::Tensor box_;  // the sealed bytes, alive until the back end is done with them
  std::shared_ptr<BoxPool> pool_;
};

// A receive: the sealed bytes land in `box`; the first wait() after they arrived opens them into the caller's
// tensor, or fails naming the peer when they do not open.
class OpenWork : public Work {
 public:
  struct Opening {
    const Channel* channel;
    int tag;
    uint64_t sequence;
    int from, to;
    CommContext context;
  };
  OpenWork(Millis timeout, WorkPtr inner, at::Tensor box, at::Tensor target, Opening o, std::shared_ptr<BoxPool> pool)
      : Work(timeout), inner_(std::move(inner)), box_(std::move(box)), target_(std::move(target)), o_(std::move(o)),
        pool_(std::move(pool)) {}

  void wait(Millis timeout) override {
    inner_->wait(timeout);
    open();
  }
  bool is_completed() override { return inner_->is_completed(); }
  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    auto r = inner_->wait_unless(timeout, give_up);
    if (r && *r) open();
    return r;
  }

 private:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (opened_) {
      if (failed_) throw CommError(o_.context, failure());
      return;
    }
    opened_ = true;
    const size_t bytes = static_cast<size_t>(target_.nbytes());
    at::Tensor into = target_.is_contiguous() ? target_ : at::empty_like(target_, at::MemoryFormat::Contiguous);
    const auto* sealed = static_cast<const unsigned char*>(box_.data_ptr());
    failed_ = !o_.channel->in.open(sealed, bytes, into.data_ptr(), static_cast<uint32_t>(o_.tag), o_.sequence, o_.from,
                                   o_.to);
    pool_->give(std::move(box_));  // received in full: the back end is done with it
    box_ = at::Tensor();
    if (failed_) throw CommError(o_.context, failure());
    if (!into.is_same(target_)) target_.copy_(into);
  }
  std::string failure() const {
    return "message " + std::to_string(o_.sequence) + " on tag " + std::to_string(o_.tag) + " from rank " +
           std::to_string(o_.from) +
           " did not authenticate: it was changed, replayed, reordered, dropped or cut short on the way, or the peer "
           "holds another job secret. It was discarded; check the link to that rank (and who else is on it)";
  }

  WorkPtr inner_;
  at::Tensor box_, target_;
  Opening o_;
  std::shared_ptr<BoxPool> pool_;
  std::mutex mutex_;
  bool opened_ = false, failed_ = false;
};

// Who a group's members are: each one's cluster (or host, when a member did not know its cluster) and its rank in
// the job's world group (the group sealed first), which names the peer to exclude when its messages do not open.
struct Members {
  std::vector<int64_t> clusters;
  std::vector<int> world_ranks;
};

class SecureCommunicator : public ForwardingCommunicator {
 public:
  SecureCommunicator(std::unique_ptr<Communicator> inner, DataPlaneSecurity security, Members members, Cipher cipher,
                     const secure::KeyPair& mine, const std::vector<const unsigned char*>& theirs)
      : ForwardingCommunicator(std::move(inner), "sealed"), security_(std::move(security)),
        members_(std::move(members)), cipher_(cipher) {
    const secure::Key secret = secure::secret_digest(security_.secret);
    channels_.resize(size());
    for (int q = 0; q < size(); ++q)
      if (q != rank())
        channels_[q] = std::make_unique<Channel>(cipher_, secure::derive_channel_keys(mine, theirs[q], rank(), q, secret));
    algo::AlgorithmOptions ring;
    ring.tag = kRingTag;
    ring_ = algo::make_algorithm(algo::Algorithm::Ring, *this, ring);
    algo::AlgorithmOptions tree;
    tree.tag = kTreeTag;
    tree_ = algo::make_algorithm(algo::Algorithm::Tree, *this, tree);
  }

  // Every pair proves it derived the same keys: one sealed message each way, so that a peer with another secret
  // (or keys swapped in the path) is named now rather than at the first collective.
  void confirm_keys() {
    const std::string name = "key confirmation";
    t_running = &name;
    std::vector<WorkPtr> sends, recvs;
    std::vector<at::Tensor> got;
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      sends.push_back(send(confirmation(rank(), q), q, kConfirmTag));
      got.push_back(at::empty({16}, at::kByte));
      recvs.push_back(recv(got.back(), q, kConfirmTag));
    }
    try {
      for (auto& w : recvs) w->wait();
      for (auto& w : sends) w->wait();
    } catch (...) {
      t_running = nullptr;
      throw;
    }
    t_running = nullptr;
    size_t i = 0;
    for (int q = 0; q < size(); ++q)
      if (q != rank() && !at::equal(got[i++], confirmation(q, rank())))
        throw CommError(accusing(context(name, q), q),
                        "rank " + std::to_string(q) + " sent a sealed confirmation with the wrong contents");
  }

  int world_rank() const { return members_.world_ranks.at(static_cast<size_t>(rank())); }

  Cipher cipher() const { return cipher_; }

  // --- point to point: sealed as posted, opened in wait() ---------------------------------------------------------
  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    const std::string name = op_name("send", tag);
    check_tensor(name, t, "the");
    check_peer(name, dst);
    Channel& ch = *channels_[dst];
    const at::Tensor plain = t.contiguous();
    const size_t bytes = static_cast<size_t>(plain.nbytes());
    at::Tensor box = pool_->take(static_cast<int64_t>(bytes + kMacBytes));
    std::lock_guard<std::mutex> lock(ch.send_mutex);
    const uint64_t sequence = ch.sent[tag]++;
    ch.out.seal(plain.data_ptr(), bytes, box.data_ptr<uint8_t>(), static_cast<uint32_t>(tag), sequence, rank(), dst);
    return std::make_shared<SealedSendWork>(timeout(), inner_->send(box, dst, tag), box, pool_);
  }

  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    const std::string name = op_name("recv", tag);
    check_tensor(name, t, "the");
    check_peer(name, src);
    Channel& ch = *channels_[src];
    at::Tensor box = pool_->take(static_cast<int64_t>(t.nbytes() + kMacBytes));
    std::lock_guard<std::mutex> lock(ch.recv_mutex);
    const uint64_t sequence = ch.received[tag]++;
    WorkPtr inner = inner_->recv(box, src, tag);
    return std::make_shared<OpenWork>(timeout(), std::move(inner), box, t,
                                      OpenWork::Opening{&ch, tag, sequence, src, rank(), accusing(context(name, src), src)},
                                      pool_);
  }

  // --- collectives: our algorithms over the sealed messages, in order on the worker ---------------------------
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_tensor(name, t, "the");
    check_reducible(name, t, op);
    return start(name, [this, t, op]() mutable { reduce_everywhere(t, op); });
  }
  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override {
    const std::string name = std::string("reduce(") + to_string(op) + ")";
    check_tensor(name, t, "the");
    check_root(name, root);
    check_reducible(name, t, op);
    // Every rank gets the result; the contract only promises it on root.
    return start(name, [this, t, op]() mutable { reduce_everywhere(t, op); });
  }
  WorkPtr broadcast(at::Tensor& t, int root) override {
    check_tensor("broadcast", t, "the");
    check_root("broadcast", root);
    return start("broadcast", [this, t, root]() mutable {
      at::Tensor bytes = flat_bytes(t);
      pick(bytes.numel()).broadcast(bytes, root);
    });
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    check_tensor("allgather", in, "input");
    check_tensor("allgather", out, "output");
    check_same_dtype("allgather", in, out);
    check_sliced("allgather", in, out);
    return start("allgather", [this, in, out]() mutable {
      at::Tensor o = flat_bytes(out);
      pick(o.numel()).all_gather(flat_bytes(in), o);
    });
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    const std::string name = std::string("reducescatter(") + to_string(op) + ")";
    check_tensor(name, in, "input");
    check_tensor(name, out, "output");
    check_same_dtype(name, in, out);
    check_sliced(name, out, in);
    check_reducible(name, in, op);
    return start(name, [this, in, out, op]() mutable {
      if (out.numel() == 0) return;
      at::Tensor a = reducible(in), b = reducible(out);
      pick(a.nbytes()).reduce_scatter(a, b, algorithm_op(in, op));
      finish(out, b, op);
    });
  }
  WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override {
    check_tensor("gather", in, "input");
    check_root("gather", root);
    const bool is_root = rank() == root;
    if (is_root) {
      check_tensor("gather", out, "output");
      check_same_dtype("gather", in, out);
      check_sliced("gather", in, out);
    }
    return start("gather", [this, in, out, root]() mutable {
      const at::Tensor mine = flat_bytes(in);
      if (mine.numel() == 0) return;
      if (rank() != root) return wait_for(send(mine, root, kGatherTag));
      at::Tensor all = flat_bytes(out);
      const int64_t per = mine.numel();
      std::vector<WorkPtr> recvs;
      for (int q = 0; q < size(); ++q) {
        at::Tensor slot = all.slice(0, q * per, (q + 1) * per);
        if (q == rank()) slot.copy_(mine);
        else recvs.push_back(recv(slot, q, kGatherTag));
      }
      for (auto& w : recvs) wait_for(w);
    });
  }
  WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override {
    check_tensor("scatter", out, "output");
    check_root("scatter", root);
    const bool is_root = rank() == root;
    if (is_root) {
      check_tensor("scatter", in, "input");
      check_same_dtype("scatter", in, out);
      check_sliced("scatter", out, in);
    }
    return start("scatter", [this, in, out, root]() mutable {
      at::Tensor mine = flat_bytes(out);
      if (mine.numel() == 0) return;
      if (rank() != root) return wait_for(recv(mine, root, kScatterTag));
      const at::Tensor all = flat_bytes(in);
      const int64_t per = mine.numel();
      std::vector<WorkPtr> sends;
      for (int q = 0; q < size(); ++q) {
        const at::Tensor slot = all.slice(0, q * per, (q + 1) * per);
        if (q == rank()) mine.copy_(slot);
        else sends.push_back(send(slot, q, kScatterTag));
      }
      for (auto& w : sends) wait_for(w);
    });
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    check_all_to_all(in, out);
    return start("alltoall", [this, in, out]() mutable {
      at::Tensor o = flat_bytes(out);
      ring_->all_to_all(flat_bytes(in), o);
    });
  }
  WorkPtr barrier() override {
    return start("barrier", [this] {
      at::Tensor one = at::ones({1}, at::kInt);
      tree_->all_reduce(one, ReduceOp::Sum);
    });
  }

 protected:
  std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> sub) override;

 private:
  static at::Tensor confirmation(int from, int to) {
    at::Tensor t = at::zeros({16}, at::kByte);
    const char label[] = "ct-confirm";
    std::memcpy(t.data_ptr(), label, sizeof label - 1);
    t[12] = from & 0xff;
    t[13] = (from >> 8) & 0xff;
    t[14] = to & 0xff;
    t[15] = (to >> 8) & 0xff;
    return t;
  }

  static std::string op_name(const char* what, int tag) {
    std::string n = std::string(what) + "(tag " + std::to_string(tag) + ")";
    if (t_running) n = *t_running + ": " + n;
    return n;
  }

  void wait_for(const WorkPtr& w) { w->wait(timeout()); }

  // A message from `peer` that does not open is evidence against that peer (CommContext::accused).
  CommContext accusing(CommContext c, int peer) const {
    c.accused = members_.world_ranks.at(static_cast<size_t>(peer));
    return c;
  }

  void check_reducible(const std::string& name, const at::Tensor& t, ReduceOp op) const {
    const auto d = t.scalar_type();
    if (d == at::kBool && op == ReduceOp::Avg) fail(name, "avg is not defined for bool tensors; use sum (or) or min");
    if (at::isComplexType(d) && op != ReduceOp::Sum && op != ReduceOp::Avg)
      fail(name, std::string(to_string(op)) + " is not supported for complex tensors (only sum and avg)");
  }

  // The buffer our algorithms reduce: the tensor itself (or a real view of a complex one) when they take its
  // dtype; a widened copy for half, bfloat16 and bool (bool reduces as 0/1 integers: or = max, and = min).
  static at::Tensor reducible(const at::Tensor& t) {
    const auto d = t.scalar_type();
    if (at::isComplexType(d)) return at::view_as_real(t).reshape({-1});
    if (d == at::kHalf || d == at::kBFloat16) return t.to(at::kFloat).reshape({-1});
    if (d == at::kBool) return t.to(at::kInt).reshape({-1});
    return t.reshape({-1});
  }
  // What the algorithm runs: sums for avg (finish divides); or and and as max and min over bools' 0 and 1.
  static ReduceOp algorithm_op(const at::Tensor& t, ReduceOp op) {
    if (op == ReduceOp::Avg) return ReduceOp::Sum;
    if (t.scalar_type() != at::kBool) return op;
    if (op == ReduceOp::Sum) return ReduceOp::Max;
    if (op == ReduceOp::Product) return ReduceOp::Min;
    return op;
  }
  // Divides for avg (our algorithms sum; integers truncate) and copies a widened buffer back.
  void finish(at::Tensor& t, at::Tensor& buffer, ReduceOp op) const {
    if (op == ReduceOp::Avg) {
      if (at::isFloatingType(buffer.scalar_type())) buffer.div_(size());
      else buffer.copy_(at::div(buffer, size(), "trunc"));
    }
    if (buffer.data_ptr() != t.data_ptr()) t.view({-1}).copy_(t.scalar_type() == at::kBool ? buffer.ne(0) : buffer);
  }

  void reduce_everywhere(at::Tensor& t, ReduceOp op) {
    if (t.numel() == 0) return;
    at::Tensor buffer = reducible(t);
    pick(buffer.nbytes()).all_reduce(buffer, algorithm_op(t, op));
    finish(t, buffer, op);
  }

  algo::CollectiveAlgorithm& pick(int64_t bytes) { return bytes < kTreeBelowBytes ? *tree_ : *ring_; }

  WorkPtr start(const std::string& name, std::function<void()> job) {
    auto work = std::make_shared<DeferredWork>(timeout(), context(name));
    worker_.submit(work, [name, job = std::move(job)] {
      t_running = &name;
      try {
        job();
      } catch (...) {
        t_running = nullptr;
        throw;
      }
      t_running = nullptr;
    });
    return work;
  }

  DataPlaneSecurity security_;
  Members members_;
  Cipher cipher_;
  std::vector<std::unique_ptr<Channel>> channels_;  // by peer; none for this rank
  std::shared_ptr<BoxPool> pool_ = std::make_shared<BoxPool>();
  std::unique_ptr<algo::CollectiveAlgorithm> ring_, tree_;
  SerialWorker worker_;  // last: destroyed (and drained) first
};

// Each member's cluster, or (when any member does not know its own) each member's host; and its world rank.
Members gather_members(Communicator& inner, int cluster, int world_rank) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const int64_t host_id = static_cast<int64_t>(std::hash<std::string>{}(host) & 0x3fffffffffffffffLL);
  at::Tensor mine = at::tensor({static_cast<int64_t>(cluster), host_id, static_cast<int64_t>(world_rank)}, at::kLong);
  at::Tensor all = at::empty({3 * inner.size()}, at::kLong);
  inner.all_gather(mine, all)->wait();
  const auto* v = all.data_ptr<int64_t>();
  Members m;
  std::vector<int64_t> hosts;
  bool known = true;
  for (int q = 0; q < inner.size(); ++q) {
    m.clusters.push_back(v[3 * q]);
    hosts.push_back(v[3 * q + 1]);
    m.world_ranks.push_back(static_cast<int>(v[3 * q + 2]));
    known &= m.clusters.back() >= 0;
  }
  if (!known) m.clusters = hosts;
  return m;
}

// "in 2 clusters" (or hosts, when the members' clusters are not known: the ids are then host hashes).
std::string describe_span(const std::vector<int64_t>& ids) {
  std::vector<int64_t> distinct = ids;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const bool hosts = std::any_of(ids.begin(), ids.end(), [](int64_t c) { return c > (1LL << 31); });
  return "in " + std::to_string(distinct.size()) + (hosts ? " host(s)" : " cluster(s)");
}

bool spans_clusters(const std::vector<int64_t>& clusters) {
  return std::any_of(clusters.begin(), clusters.end(), [&](int64_t c) { return c != clusters[0]; });
}

// What each member publishes when a group is sealed: its group public key, whether it has AES-NI, and, with a
// cluster identity, its cluster's name and the signature of that cluster's key over its rank and group key.
struct Entry {
  static constexpr int64_t kNameBytes = 64;
  static constexpr int64_t kBytes = secure::kPublicKeyBytes + 3 + kNameBytes + secure::kSignatureBytes;
  static constexpr int64_t kAes = secure::kPublicKeyBytes, kHasIdentity = kAes + 1, kNameLength = kAes + 2,
                           kName = kAes + 3, kSignature = kName + kNameBytes;
};

void write_entry(uint8_t* e, const secure::KeyPair& mine, int rank, const DataPlaneSecurity& security) {
  std::memset(e, 0, Entry::kBytes);
  std::memcpy(e, mine.public_key.data(), secure::kPublicKeyBytes);
  e[Entry::kAes] = secure::fastest_cipher() == Cipher::Aes256Gcm ? 1 : 0;
  if (!security.has_identity()) return;
  e[Entry::kHasIdentity] = 1;
  e[Entry::kNameLength] = static_cast<uint8_t>(security.identity_cluster.size());  // <= 64: a valid name
  std::memcpy(e + Entry::kName, security.identity_cluster.data(), security.identity_cluster.size());
  const secure::Signature sig = secure::sign_group_key(security.identity_key.data(), rank, mine.public_key.data());
  std::memcpy(e + Entry::kSignature, sig.data(), sig.size());
}

// Why a group is refused ("" when it is not), and the member at fault (-1: this rank's own settings are).
struct Refusal {
  int peer = -1;
  std::string why;
};

// Every member's signature against the key held for the cluster it names.
Refusal check_identities(const uint8_t* all, int size, const DataPlaneSecurity& security) {
  for (int q = 0; q < size; ++q) {
    const uint8_t* e = all + q * Entry::kBytes;
    if (!e[Entry::kHasIdentity] && !security.has_identity()) continue;
    if (!e[Entry::kHasIdentity])
      return {q, "rank " + std::to_string(q) + " has no cluster identity (comm.identity) while this rank has one: give "
             "every rank its cluster's key, or none"};
    if (!security.has_identity())
      return {-1, "rank " + std::to_string(q) + " signs its group key with a cluster identity, but this rank has "
                  "none to check it with (comm.identity and comm.peer_keys)"};
    const std::string name(reinterpret_cast<const char*>(e + Entry::kName),
                           std::min<size_t>(e[Entry::kNameLength], Entry::kNameBytes));
    const auto key = security.peer_keys.find(name);
    if (!is_valid_name(name) || key == security.peer_keys.end())
      return {q, "rank " + std::to_string(q) + " names cluster '" + (is_valid_name(name) ? name : "?") +
                     "', which comm.peer_keys does not hold: it is refused"};
    secure::Signature sig{};
    std::memcpy(sig.data(), e + Entry::kSignature, sig.size());
    if (!secure::group_key_signed_by(key->second.data(), q, e, sig))
      return {q, "rank " + std::to_string(q) + "'s group key is not signed by cluster '" + name +
                     "''s key (another key, or the key was swapped on the way): it is refused"};
  }
  return {};
}

// The key exchange over `inner` (public keys in the clear: they are bound to the secret in the derivation, and
// signed by the cluster's key when there are identities), then the sealed communicator, which confirms the keys
// with every peer.
std::unique_ptr<Communicator> seal(std::unique_ptr<Communicator> inner, const DataPlaneSecurity& security,
                                   Members members) {
  const secure::KeyPair mine;
  at::Tensor entry = at::empty({Entry::kBytes}, at::kByte);
  write_entry(entry.data_ptr<uint8_t>(), mine, inner->rank(), security);
  at::Tensor all = at::empty({Entry::kBytes * inner->size()}, at::kByte);
  inner->all_gather(entry, all)->wait();
  const auto* base = all.data_ptr<uint8_t>();
  // Every member sees the same entries, so every member refuses the same group.
  if (const Refusal refused = check_identities(base, inner->size(), security); !refused.why.empty()) {
    CommContext where;
    where.rank = inner->rank();
    where.op = "sealing the group";
    where.group = inner->name();
    where.group_size = inner->size();
    where.peer = refused.peer;
    if (refused.peer >= 0) where.accused = members.world_ranks.at(static_cast<size_t>(refused.peer));
    throw CommError(where, refused.why);
  }
  bool aes = true;
  std::vector<const unsigned char*> theirs;
  for (int q = 0; q < inner->size(); ++q) {
    theirs.push_back(base + q * Entry::kBytes);
    aes &= base[q * Entry::kBytes + Entry::kAes] == 1;
  }
  const Cipher cipher = aes ? Cipher::Aes256Gcm : Cipher::ChaCha20Poly1305;
  const std::string spans = describe_span(members.clusters);
  auto sealed = std::make_unique<SecureCommunicator>(std::move(inner), security, std::move(members), cipher, mine,
                                                     theirs);
  sealed->confirm_keys();
  // One line per sealed group, from its first rank: which traffic pays for encryption is visible in the log.
  if (sealed->rank() == 0)
    std::fprintf(stderr, "crosstrain: group %s sealed (comm.encrypt = %s): %d ranks %s, %s\n", sealed->name().c_str(),
                 to_string(security.mode), sealed->size(), spans.c_str(), secure::to_string(cipher));
  return sealed;
}

std::unique_ptr<Communicator> SecureCommunicator::wrap_group(std::unique_ptr<Communicator> sub) {
  // The sub-group's members are known here; split() does not say which of ours they are, so they are asked again
  // (one small all-gather), keeping the rule in one place.
  if (sub->size() < 2) return sub;
  Members members = gather_members(*sub, security_.cluster, world_rank());
  if ((security_.mode == EncryptMode::Wan && !spans_clusters(members.clusters))) return sub;
  return seal(std::move(sub), security_, std::move(members));
}

}  // namespace

const char* to_string(EncryptMode m) {
  switch (m) {
    case EncryptMode::Off: return "off";
    case EncryptMode::Wan: return "wan";
    case EncryptMode::All: return "all";
  }
  return "?";
}

EncryptMode resolve_encrypt_mode(const std::string& setting, bool has_secret) {
  if (setting == "auto") return has_secret ? EncryptMode::Wan : EncryptMode::Off;
  if (setting == "off") return EncryptMode::Off;
  if (setting != "wan" && setting != "all")
    throw UsageError("comm.encrypt = \"" + setting + "\" is not one of auto, wan, all, off");
  if (!has_secret)
    throw UsageError("comm.encrypt = \"" + setting +
                     "\" needs a job secret or cluster identities to authenticate its keys: set CROSSTRAIN_SECRET "
                     "(e.g. `crosstrain keys secret --out FILE` and `export CROSSTRAIN_SECRET=$(cat FILE)` on every "
                     "node), run.secret_file, or comm.identity and comm.peer_keys");
  return setting == "all" ? EncryptMode::All : EncryptMode::Wan;
}

std::unique_ptr<Communicator> with_encryption(std::unique_ptr<Communicator> inner, const DataPlaneSecurity& security) {
  if (!inner || security.mode == EncryptMode::Off || inner->size() < 2) return inner;
  if (security.secret.empty() && !security.has_identity())
    throw UsageError("comm.encrypt needs a job secret (CROSSTRAIN_SECRET or run.secret_file) or a cluster identity "
                     "(comm.identity and comm.peer_keys)");
  Members members = gather_members(*inner, security.cluster, inner->rank());
  if (security.mode == EncryptMode::Wan && !spans_clusters(members.clusters)) return inner;
  return seal(std::move(inner), security, std::move(members));
}

bool is_encrypted(const Communicator& c) { return c.backend().find("+sealed") != std::string::npos; }

}  // namespace crosstrain::comm
