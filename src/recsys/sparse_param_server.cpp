#include "crosstrain/recsys/sparse_param_server.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::recsys {
namespace {
// Tags of this group only (it is a dedicated split); apart from the dense server's 71xx for readable traces.
constexpr int kTagRequest = 7201, kTagIds = 7202, kTagGrads = 7203, kTagRows = 7204, kTagAck = 7205;

at::Tensor long_tensor(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
}

// "tables 0, 2" for the tables with rows in `counts` ("no rows" for a push that carries none).
std::string tables_named(const std::vector<int64_t>& counts) {
  std::string names;
  int n = 0;
  for (size_t t = 0; t < counts.size(); ++t)
    if (counts[t] > 0) names += (n++ ? ", " : "") + std::to_string(t);
  if (n == 0) return "no rows";
  return (n == 1 ? "table " : "tables ") + names;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

// One call's ids split by the server holding them, in table order: what each server is sent, and where its
// answer goes in the caller's lists.
struct SparseParameterServer::Routed {
  std::vector<std::vector<int64_t>> counts;            // [server][table]: rows asked
  std::vector<std::vector<int64_t>> ids;               // [server]: the ids, concatenated over tables
  std::vector<std::vector<std::vector<int64_t>>> pos;  // [server][table]: their positions in ids[table]
};

SparseParameterServer::SparseParameterServer(comm::Communicator& group, const std::vector<TableShape>& tables,
                                             const SparseOptimizerConfig& opt, const TableStorage& storage,
                                             uint64_t seed, comm::Millis timeout)
    : rank_(group.rank()),
      size_(group.size()),
      shapes_(tables),
      opt_(opt),
      core_(group, timeout, "sparse parameter server", kTagRequest, 2 + static_cast<int64_t>(tables.size())) {
  check_sparse_optimizer(opt);
  TableStorage mine = storage;
  if (storage.kind == TableStorageKind::Mmap) {
    if (storage.dir.empty()) throw UsageError("sparse parameter server: mmap storage needs a directory (dlrm.ps_dir)");
    mine.dir = storage.dir + "/rank" + std::to_string(rank_);
  }
  for (int t = 0; t < static_cast<int>(tables.size()); ++t) {
    const TableShape& s = tables[t];
    if (s.rows < 1 || s.dim < 1)
      throw UsageError("sparse parameter server: table " + std::to_string(t) + " is " + std::to_string(s.rows) +
                       " x " + std::to_string(s.dim) + ": rows and dim must be positive");
    const RowRange block = row_block(s.rows, rank_, size_);
    shards_.push_back(std::make_unique<EmbeddingShard>(t, s.rows, s.dim, block.first, block.last - block.first, 0,
                                                       s.dim, opt, mine, seed));
  }
  core_.start([this](int worker, const at::Tensor& header) { serve(worker, header); });
}

at::Tensor SparseParameterServer::request_header(int64_t type, int64_t clock, const std::vector<int64_t>& counts) const {
  at::Tensor h = core_.header(type, clock);
  std::copy(counts.begin(), counts.end(), h.data_ptr<int64_t>() + 2);
  return h;
}

EmbeddingShard& SparseParameterServer::shard(int t) {
  if (t < 0 || t >= tables())
    throw Error("sparse parameter server: no table " + std::to_string(t) + " (there are " +
                std::to_string(tables()) + ")");
  return *shards_[t];
}

int64_t SparseParameterServer::server_bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_) b += s->bytes();
  return b;
}

int64_t SparseParameterServer::pushes_applied() const { return core_.clocks().version; }

int64_t SparseParameterServer::rows_elements(const std::vector<int64_t>& counts) const {
  int64_t n = 0;
  for (size_t t = 0; t < counts.size(); ++t) n += counts[t] * shapes_[t].dim;
  return n;
}

SparseParameterServer::Routed SparseParameterServer::route(const std::vector<at::Tensor>& ids, const char* op) const {
  const int T = tables();
  if (static_cast<int>(ids.size()) != T)
    throw Error(std::string("sparse parameter server ") + op + ": " + std::to_string(ids.size()) +
                " id lists for " + std::to_string(T) + " tables (pass one per table, empty where none)");
  Routed r;
  r.counts.assign(size_, std::vector<int64_t>(T, 0));
  r.ids.resize(size_);
  r.pos.assign(size_, std::vector<std::vector<int64_t>>(T));
  for (int t = 0; t < T; ++t) {
    if (ids[t].dim() != 1 || ids[t].scalar_type() != at::kLong)
      throw Error(std::string("sparse parameter server ") + op + ": ids of table " + std::to_string(t) +
                  " must be a 1-D int64 tensor");
    const at::Tensor flat = ids[t].contiguous();
    const int64_t* p = flat.data_ptr<int64_t>();
    const int64_t rows = shapes_[t].rows;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      if (p[i] < 0 || p[i] >= rows)
        throw Error(std::string("sparse parameter server ") + op + ": table " + std::to_string(t) + " has no row " +
                    std::to_string(p[i]) + " (it has " + std::to_string(rows) + ")");
      const int s = row_owner(p[i], rows, size_);
      r.ids[s].push_back(p[i]);
      r.pos[s][t].push_back(i);
      ++r.counts[s][t];
    }
  }
  return r;
}

// --- worker side --------------------------------------------------------------------------------------------

void SparseParameterServer::fail(const std::exception& e, const char* op, int server,
                                 const std::vector<int64_t>& counts) const {
  const std::string what = std::string("sparse ") + op + " of " + tables_named(counts) + " from server " +
                           std::to_string(server);
  if (const auto* ce = dynamic_cast<const CommError*>(&e)) {
    CommContext c = ce->context();
    c.rank = rank_;
    c.peer = server;
    c.op = what + " (" + c.op + ")";
    throw CommError(c, ce->cause(), ce->timed_out());
  }
  throw Error("[rank " + std::to_string(rank_) + "] " + what + ": " + e.what());
}

std::vector<at::Tensor> SparseParameterServer::pull(const std::vector<at::Tensor>& ids) {
  core_.check_usable("pull");
  comm::Communicator& group = core_.group();
  const Routed r = route(ids, "pull");
  std::vector<at::Tensor> headers(size_), id_msgs(size_), replies(size_);
  std::vector<std::vector<comm::WorkPtr>> works(size_);
  for (int s = 0; s < size_; ++s) {
    if (r.ids[s].empty()) continue;
    id_msgs[s] = long_tensor(r.ids[s]);
    if (s == rank_) continue;
    headers[s] = request_header(kPull, 0, r.counts[s]);
    replies[s] = at::empty({rows_elements(r.counts[s])}, at::kFloat);
    works[s].push_back(group.send(headers[s], s, kTagRequest));
    works[s].push_back(group.send(id_msgs[s], s, kTagIds));
    works[s].push_back(group.recv(replies[s], s, kTagRows));
    core_.count_bytes((headers[s].numel() + id_msgs[s].numel()) * 8);
  }
  if (!r.ids[rank_].empty()) replies[rank_] = serve_pull(rank_, r.counts[rank_], id_msgs[rank_]);
  for (int s = 0; s < size_; ++s) {
    try {
      for (auto& w : works[s]) w->wait(core_.timeout());
    } catch (const std::exception& e) {
      fail(e, "pull", s, r.counts[s]);
    }
  }
  std::vector<at::Tensor> out;
  for (int t = 0; t < tables(); ++t) out.push_back(at::empty({ids[t].numel(), shapes_[t].dim}, at::kFloat));
  for (int s = 0; s < size_; ++s) {
    int64_t offset = 0;
    for (int t = 0; t < tables() && replies[s].defined(); ++t) {
      const int64_t n = r.counts[s][t], dim = shapes_[t].dim;
      if (n == 0) continue;
      out[t].index_copy_(0, long_tensor(r.pos[s][t]), replies[s].slice(0, offset, offset + n * dim).view({n, dim}));
      offset += n * dim;
    }
  }
  core_.rethrow_failure();
  return out;
}

SparseParameterServer::PushReply SparseParameterServer::push(const std::vector<at::Tensor>& ids,
                                                             const std::vector<at::Tensor>& grads, int64_t clock) {
  core_.check_usable("push");
  comm::Communicator& group = core_.group();
  if (opt_.kind == "adam" && clock < 1)
    throw Error("sparse parameter server push: adam's step (the clock) starts at 1, got " + std::to_string(clock));
  const Routed r = route(ids, "push");
  if (grads.size() != ids.size()) throw Error("sparse parameter server push: one gradient tensor per id list");
  std::vector<at::Tensor> g(tables());
  for (int t = 0; t < tables(); ++t) {
    const int64_t n = ids[t].numel();
    if (grads[t].dim() != 2 || grads[t].size(0) != n || grads[t].size(1) != shapes_[t].dim)
      throw Error("sparse parameter server push: gradients of table " + std::to_string(t) + " must be [" +
                  std::to_string(n) + ", " + std::to_string(shapes_[t].dim) + "]");
    if (n > 1 && std::get<0>(at::_unique(ids[t])).numel() != n)  // the optimizer updates each row once
      throw Error("sparse parameter server push: ids of table " + std::to_string(t) + " repeat (push unique ids)");
    g[t] = grads[t].to(at::kFloat).contiguous();
  }
  std::vector<at::Tensor> headers(size_), id_msgs(size_), grad_msgs(size_), acks(size_);
  std::vector<std::vector<comm::WorkPtr>> works(size_);
  for (int s = 0; s < size_; ++s) {
    std::vector<at::Tensor> parts;
    for (int t = 0; t < tables(); ++t)
      if (!r.pos[s][t].empty()) parts.push_back(g[t].index_select(0, long_tensor(r.pos[s][t])).reshape(-1));
    id_msgs[s] = long_tensor(r.ids[s]);
    grad_msgs[s] = parts.empty() ? at::empty({0}, at::kFloat) : at::cat(parts);
    acks[s] = at::zeros({3}, at::kLong);
    if (s == rank_) continue;
    headers[s] = request_header(kPush, clock, r.counts[s]);
    works[s].push_back(group.send(headers[s], s, kTagRequest));
    if (!r.ids[s].empty()) {
      works[s].push_back(group.send(id_msgs[s], s, kTagIds));
      works[s].push_back(group.send(grad_msgs[s], s, kTagGrads));
    }
    works[s].push_back(group.recv(acks[s], s, kTagAck));
    core_.count_bytes((headers[s].numel() + id_msgs[s].numel()) * 8 + grad_msgs[s].numel() * 4);
  }
  serve_push(rank_, clock, r.counts[rank_], id_msgs[rank_], grad_msgs[rank_], acks[rank_]);
  PushReply reply;
  reply.min_clock = INT64_MAX;
  for (int s = 0; s < size_; ++s) {
    try {
      for (auto& w : works[s]) w->wait(core_.timeout());
    } catch (const std::exception& e) {
      fail(e, "push", s, r.counts[s]);
    }
    const int64_t* a = acks[s].data_ptr<int64_t>();
    if (a[1] < reply.min_clock) reply = PushReply{a[1], static_cast<int>(a[2])};
  }
  core_.rethrow_failure();
  return reply;
}

SparseParameterServer::PushReply SparseParameterServer::local_clocks() const {
  const comm::ParamServerCore::Clocks c = core_.clocks();
  return PushReply{c.min_clock, c.slowest};
}

void SparseParameterServer::finish() { core_.finish(); }

// --- server side --------------------------------------------------------------------------------------------

at::Tensor SparseParameterServer::serve_pull(int worker, const std::vector<int64_t>& counts, const at::Tensor& ids) {
  std::vector<at::Tensor> parts;
  std::lock_guard<std::mutex> lock(core_.mutex());
  int64_t offset = 0;
  for (int t = 0; t < tables(); ++t) {
    const int64_t n = counts[t];
    if (n == 0) continue;
    const EmbeddingShard& shard = *shards_[t];
    const at::Tensor local = ids.slice(0, offset, offset + n) - shard.first_row();
    if (local.min().item<int64_t>() < 0 || local.max().item<int64_t>() >= shard.rows())
      throw Error("worker " + std::to_string(worker) + " asked for rows of table " + std::to_string(t) +
                  " this server does not hold (it holds rows " + std::to_string(shard.first_row()) + ".." +
                  std::to_string(shard.first_row() + shard.rows() - 1) + ")");
    parts.push_back(shard.lookup(local).reshape(-1));
    offset += n;
  }
  return parts.empty() ? at::empty({0}, at::kFloat) : at::cat(parts);
}

void SparseParameterServer::serve_push(int worker, int64_t clock, const std::vector<int64_t>& counts,
                                       const at::Tensor& ids, const at::Tensor& grads, at::Tensor& ack) {
  std::lock_guard<std::mutex> lock(core_.mutex());
  int64_t id_offset = 0, grad_offset = 0;
  for (int t = 0; t < tables(); ++t) {
    const int64_t n = counts[t], dim = shapes_[t].dim;
    if (n == 0) continue;
    EmbeddingShard& shard = *shards_[t];
    const at::Tensor local = ids.slice(0, id_offset, id_offset + n) - shard.first_row();
    if (local.min().item<int64_t>() < 0 || local.max().item<int64_t>() >= shard.rows())
      throw Error("worker " + std::to_string(worker) + " pushed rows of table " + std::to_string(t) +
                  " this server does not hold");
    const at::Tensor g = grads.slice(0, grad_offset, grad_offset + n * dim).view({n, dim});
    // Whole rows here: row-wise adagrad's sum of squares needs no exchange across column shards.
    const at::Tensor squares = opt_.kind == "adagrad" ? EmbeddingShard::row_square_sums(g) : at::Tensor();
    shard.apply(local, g, squares, clock);
    id_offset += n;
    grad_offset += n * dim;
  }
  const comm::ParamServerCore::Clocks c = core_.record_push_locked(worker, clock);
  int64_t* a = ack.data_ptr<int64_t>();
  a[0] = c.version;
  a[1] = c.min_clock;
  a[2] = c.slowest;
}

void SparseParameterServer::serve(int worker, const at::Tensor& header) {
  const int64_t* h = header.data_ptr<int64_t>();
  const int64_t type = h[0], clock = h[1];
  const std::vector<int64_t> counts(h + 2, h + 2 + tables());
  const char* op = type == kPull ? "pull" : "push";
  try {
    if (type != kPull && type != kPush) throw Error("unknown request type " + std::to_string(type));
    for (int64_t c : counts)
      if (c < 0) throw Error("negative row count in the request header");
    comm::Communicator& group = core_.group();
    at::Tensor ids = at::empty({sum(counts)}, at::kLong);
    at::Tensor grads = at::empty({type == kPush ? rows_elements(counts) : 0}, at::kFloat);
    if (ids.numel() > 0) {
      group.recv(ids, worker, kTagIds)->wait(core_.timeout());
      if (type == kPush) group.recv(grads, worker, kTagGrads)->wait(core_.timeout());
    }
    at::Tensor reply;
    if (type == kPull) {
      reply = serve_pull(worker, counts, ids);
      group.send(reply, worker, kTagRows)->wait(core_.timeout());
    } else {
      reply = at::zeros({3}, at::kLong);
      serve_push(worker, clock, counts, ids, grads, reply);
      group.send(reply, worker, kTagAck)->wait(core_.timeout());
    }
    core_.count_bytes(reply.numel() * reply.element_size());
  } catch (const std::exception& e) {
    throw Error(std::string(op) + " of " + tables_named(counts) + ": " + e.what());
  }
}

// --- the worker's cache -------------------------------------------------------------------------------------

RowCache::RowCache(std::vector<int64_t> dims, int64_t capacity, int64_t max_age)
    : dims_(std::move(dims)), capacity_(capacity), max_age_(max_age) {
  if (capacity < 0 || capacity > INT32_MAX)
    throw UsageError("row cache: capacity " + std::to_string(capacity) + " rows is outside 0..2^31-1");
  if (max_age < 0) throw UsageError("row cache: max_age must be 0 or more steps, got " + std::to_string(max_age));
  int64_t width = 1;
  for (int64_t d : dims_) width = std::max(width, d);
  storage_ = at::empty({capacity, width}, at::kFloat);
  slot_of_.resize(dims_.size());
  table_.assign(capacity, -1);
  prev_.assign(capacity, -1);
  next_.assign(capacity, -1);
  id_.assign(capacity, -1);
  fetched_.assign(capacity, 0);
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

void RowCache::unlink(int32_t slot) {
  if (prev_[slot] >= 0) next_[prev_[slot]] = next_[slot]; else head_ = next_[slot];
  if (next_[slot] >= 0) prev_[next_[slot]] = prev_[slot]; else tail_ = prev_[slot];
  prev_[slot] = next_[slot] = -1;
}

void RowCache::push_front(int32_t slot) {
  prev_[slot] = -1;
  next_[slot] = head_;
  if (head_ >= 0) prev_[head_] = slot;
  head_ = slot;
  if (tail_ < 0) tail_ = slot;
}

int32_t RowCache::take_slot() {
  int32_t s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    s = tail_;  // the least recently used
    unlink(s);
    slot_of_[table_[s]].erase(id_[s]);
    ++evictions_;
    --used_;
  }
  ++used_;
  return s;
}

RowCache::Lookup RowCache::lookup(int table, const at::Tensor& ids, int64_t now) {
  if (table < 0 || table >= static_cast<int>(dims_.size()) || ids.dim() != 1 || ids.scalar_type() != at::kLong)
    throw Error("row cache lookup: table " + std::to_string(table) + " with a 1-D int64 id tensor expected");
  const at::Tensor flat = ids.contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  std::vector<int64_t> hit_pos, hit_slot, miss_pos, miss_ids;
  auto& map = slot_of_[table];
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const auto it = map.find(p[i]);
    const bool present = it != map.end();
    if (present && now - fetched_[it->second] <= max_age_) {
      hit_pos.push_back(i);
      hit_slot.push_back(it->second);
      unlink(it->second);
      push_front(it->second);
      continue;
    }
    stale_ += present ? 1 : 0;
    miss_pos.push_back(i);
    miss_ids.push_back(p[i]);
  }
  hits_ += static_cast<int64_t>(hit_pos.size());
  misses_ += static_cast<int64_t>(miss_pos.size());
  Lookup out;
  out.hit_pos = long_tensor(hit_pos);
  out.hit_rows = storage_.index_select(0, long_tensor(hit_slot)).narrow(1, 0, dims_[table]).contiguous();
  out.miss_pos = long_tensor(miss_pos);
  out.miss_ids = long_tensor(miss_ids);
  return out;
}

void RowCache::insert(int table, const at::Tensor& ids, const at::Tensor& rows, int64_t now) {
  if (table < 0 || table >= static_cast<int>(dims_.size()) || ids.dim() != 1 || ids.scalar_type() != at::kLong ||
      rows.dim() != 2 || rows.size(0) != ids.numel() || rows.size(1) != dims_[table])
    throw Error("row cache insert: table " + std::to_string(table) + " wants ids [n] and rows [n, " +
                (table >= 0 && table < static_cast<int>(dims_.size()) ? std::to_string(dims_[table]) : "?") + "]");
  if (capacity_ == 0) return;
  // Only the last `capacity` rows can stay; inserting fewer never evicts a row of this same call.
  const int64_t n = ids.numel(), first = std::max<int64_t>(0, n - capacity_);
  const at::Tensor flat = ids.contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  std::vector<int64_t> slots;
  auto& map = slot_of_[table];
  for (int64_t i = first; i < n; ++i) {
    auto it = map.find(p[i]);
    int32_t s;
    if (it != map.end()) {
      s = it->second;
      unlink(s);
    } else {
      s = take_slot();
      map[p[i]] = s;
      table_[s] = table;
      id_[s] = p[i];
    }
    fetched_[s] = now;
    push_front(s);
    slots.push_back(s);
  }
  storage_.narrow(1, 0, dims_[table]).index_copy_(0, long_tensor(slots), rows.slice(0, first).to(at::kFloat));
}

void RowCache::invalidate(int table, const at::Tensor& ids) {
  if (table < 0 || table >= static_cast<int>(dims_.size())) return;
  const at::Tensor flat = ids.contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  auto& map = slot_of_[table];
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const auto it = map.find(p[i]);
    if (it == map.end()) continue;
    unlink(it->second);
    table_[it->second] = -1;
    free_.push_back(it->second);
    map.erase(it);
    --used_;
  }
}

// --- cache + server -----------------------------------------------------------------------------------------

CachedSparseClient::CachedSparseClient(SparseParameterServer& server, int64_t capacity, int64_t max_age)
    : server_(server), cache_([&] {
        std::vector<int64_t> dims;
        for (int t = 0; t < server.tables(); ++t) dims.push_back(server.dim(t));
        return dims;
      }(), capacity, max_age) {}

std::vector<at::Tensor> CachedSparseClient::rows_for(const std::vector<at::Tensor>& unique_ids, int64_t step) {
  const int T = server_.tables();
  if (static_cast<int>(unique_ids.size()) != T)
    throw Error("rows_for: " + std::to_string(unique_ids.size()) + " id lists for " + std::to_string(T) + " tables");
  std::vector<RowCache::Lookup> found;
  std::vector<at::Tensor> misses;
  int64_t missing = 0;
  for (int t = 0; t < T; ++t) {
    found.push_back(cache_.lookup(t, unique_ids[t], step));
    misses.push_back(found.back().miss_ids);
    missing += misses.back().numel();
  }
  std::vector<at::Tensor> pulled;
  if (missing > 0) pulled = server_.pull(misses);  // one round trip per server for every table's misses
  rows_pulled_ += missing;
  std::vector<at::Tensor> out;
  for (int t = 0; t < T; ++t) {
    out.push_back(at::empty({unique_ids[t].numel(), server_.dim(t)}, at::kFloat));
    if (found[t].hit_pos.numel() > 0) out[t].index_copy_(0, found[t].hit_pos, found[t].hit_rows);
    if (misses[t].numel() > 0) {
      out[t].index_copy_(0, found[t].miss_pos, pulled[t]);
      cache_.insert(t, misses[t], pulled[t], step);
    }
  }
  return out;
}

}  // namespace crosstrain::recsys
