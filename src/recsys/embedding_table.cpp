#include "crosstrain/recsys/embedding_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "crosstrain/core/error.h"

namespace crosstrain::recsys {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void check_sparse_optimizer(const SparseOptimizerConfig& c) {
  if (c.kind != "adagrad" && c.kind != "adam")
    throw UsageError("dlrm.sparse_optimizer = '" + c.kind + "': use adagrad (row-wise) or adam");
  if (!(c.lr > 0)) throw UsageError("dlrm.sparse_lr must be positive (it is " + std::to_string(c.lr) + ")");
}

void init_rows(at::Tensor out, uint64_t seed, int table, int64_t rows_total, int64_t first_row, int64_t col_begin) {
  const int64_t n = out.size(0), cols = out.size(1);
  const float bound = 1.0f / std::sqrt(static_cast<float>(rows_total));
  float* data = out.data_ptr<float>();
  const uint64_t key = mix(seed ^ mix(static_cast<uint64_t>(table) + 1));
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t row_key = mix(key ^ static_cast<uint64_t>(first_row + r));
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t h = mix(row_key + static_cast<uint64_t>(col_begin + c));
      const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1) with 24 bits
      data[r * cols + c] = (2 * u - 1) * bound;
    }
  }
}

// A file of `bytes` mapped shared: the table's rows live in the page cache, not in the process's own memory.
struct EmbeddingShard::Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping(const std::string& path, size_t size) : bytes(size) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) throw Error("dlrm: cannot create table file '" + path + "': " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(std::max<size_t>(size, 1))) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error("dlrm: cannot size table file '" + path + "' to " + std::to_string(size) + " bytes: " + std::strerror(e));
    }
    base = ::mmap(nullptr, std::max<size_t>(size, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (base == MAP_FAILED) throw Error("dlrm: cannot map table file '" + path + "': " + std::strerror(e));
    ::madvise(base, std::max<size_t>(size, 1), MADV_RANDOM);  // lookups are scattered: no read-ahead
  }
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, std::max<size_t>(bytes, 1));
  }
};

EmbeddingShard::EmbeddingShard(int table, int64_t rows_total, int64_t dim, int64_t first_row, int64_t rows,
                               int64_t col_begin, int64_t cols, const SparseOptimizerConfig& opt,
                               const TableStorage& storage, uint64_t seed)
    : table_(table), rows_total_(rows_total), dim_(dim), first_row_(first_row), rows_(rows), col_begin_(col_begin),
      cols_(cols), opt_(opt), storage_(storage) {
  check_sparse_optimizer(opt);
  weight_ = allocate("weight", {rows, cols});
  init_rows(weight_, seed, table, rows_total, first_row, col_begin);
  if (opt.kind == "adagrad") {
    sum_ = allocate("sum", {rows});
    sum_.zero_();
  } else {
    exp_avg_ = allocate("exp_avg", {rows, cols});
    exp_avg_sq_ = allocate("exp_avg_sq", {rows, cols});
    exp_avg_.zero_();
    exp_avg_sq_.zero_();
  }
}

EmbeddingShard::~EmbeddingShard() = default;

at::Tensor EmbeddingShard::allocate(const std::string& what, std::vector<int64_t> shape) {
  if (storage_.kind == TableStorageKind::Memory) return at::empty(shape, at::kFloat);
  std::filesystem::create_directories(storage_.dir);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const std::string path = storage_.dir + "/table" + std::to_string(table_) + "-rows" + std::to_string(first_row_) +
                           "-cols" + std::to_string(col_begin_) + "." + what + ".f32";
  mappings_.push_back(std::make_unique<Mapping>(path, static_cast<size_t>(numel) * sizeof(float)));
  return at::from_blob(mappings_.back()->base, shape, at::kFloat);
}

std::vector<std::pair<std::string, at::Tensor>> EmbeddingShard::state() const {
  if (opt_.kind == "adagrad") return {{"sum", sum_}};
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

at::Tensor EmbeddingShard::lookup(const at::Tensor& local) const { return weight_.index_select(0, local); }

at::Tensor EmbeddingShard::row_square_sums(const at::Tensor& grads) { return grads.mul(grads).sum(1); }

void EmbeddingShard::apply(const at::Tensor& local, const at::Tensor& grads, const at::Tensor& square_sums,
                           int64_t step) {
  if (local.numel() == 0) return;
  if (opt_.kind == "adagrad") {
    // G_r += mean over the whole row of g^2; the row moves by lr * g / (sqrt(G_r) + eps).
    at::Tensor g_sum = sum_.index_select(0, local).add_(square_sums, 1.0 / static_cast<double>(dim_));
    sum_.index_copy_(0, local, g_sum);
    at::Tensor scale = g_sum.sqrt_().add_(opt_.eps).reciprocal_().mul_(opt_.lr).unsqueeze(1);
    weight_.index_copy_(0, local, weight_.index_select(0, local).sub_(grads * scale));
    return;
  }
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  at::Tensor m = exp_avg_.index_select(0, local).mul_(b1).add_(grads, 1 - b1);
  at::Tensor v = exp_avg_sq_.index_select(0, local).mul_(b2).addcmul_(grads, grads, 1 - b2);
  exp_avg_.index_copy_(0, local, m);
  exp_avg_sq_.index_copy_(0, local, v);
  const double c1 = 1 - std::pow(b1, static_cast<double>(step)), c2 = 1 - std::pow(b2, static_cast<double>(step));
  at::Tensor denom = v.div(c2).sqrt_().add_(opt_.eps);
  weight_.index_copy_(0, local, weight_.index_select(0, local).sub_(m.div(denom), opt_.lr / c1));
}

int64_t EmbeddingShard::bytes() const {
  int64_t b = weight_.numel() * 4;
  for (const auto& [name, t] : state()) b += t.numel() * 4;
  return b;
}

void EmbeddingShard::sync() {
  for (auto& m : mappings_) ::msync(m->base, std::max<size_t>(m->bytes, 1), MS_ASYNC);
}

}  // namespace crosstrain::recsys
