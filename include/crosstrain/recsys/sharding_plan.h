// Which rank holds which embedding table, and how (TorchRec's table-wise, row-wise and column-wise sharding).
// Pure: sizes and access counts in, a placement per table out; the sharded embedding follows it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::recsys {

enum class Sharding { Table, Row, Column };
const char* sharding_name(Sharding s);          // "table", "row", "column"
Sharding parse_sharding(const std::string& s);  // throws UsageError listing the valid names

struct TableShape {
  int64_t rows = 0;
  int64_t dim = 0;
  double ids_per_example = 1;  // lookups per example (multi-hot pooling factor)
  double unique_fraction = 1;  // distinct ids per lookup in a batch (skew: hot rows repeat), in (0, 1]
};

struct TablePlacement {
  Sharding sharding = Sharding::Table;
  int owner = 0;               // table-wise: the rank holding the whole table
  std::string reason;          // one line for the log and the closing note: why this sharding
};

struct ShardingInputs {
  std::vector<TableShape> tables;
  int world = 1;
  int64_t bytes_per_row_element = 8;   // weight + optimizer state per element (fp32 + row-wise or Adam state)
  int64_t budget_bytes_per_rank = 0;   // memory for tables per rank; 0: unlimited
  int64_t batch_per_rank = 0;          // examples per rank per step (for the traffic estimate)
  // "auto", or one name for every table, or a comma list with one name per table ("table,row,column,auto").
  std::string requested = "auto";
};

// Auto rule: a table that fits its share of a rank's budget and is small is held whole by one rank (table-wise;
// tables assigned to ranks largest first onto the least loaded, by bytes and lookup traffic); a table too big
// for one rank, or so large it would unbalance the ranks, is split by rows (row-wise: contiguous row blocks);
// a wide (dim >= 64) and heavily read table is split by columns (every rank serves every lookup, on dim/world
// columns). Throws UsageError when even the split tables exceed the budget (naming the table, its bytes and
// the budget) or when a requested sharding cannot apply (column-wise needs dim divisible by world).
std::vector<TablePlacement> plan_sharding(const ShardingInputs& in);

// Rows [first, last) of table `rows` held by `rank` of `world` under row-wise sharding (contiguous blocks, the
// first rows % world ranks one row more).
struct RowRange { int64_t first = 0, last = 0; };
RowRange row_block(int64_t rows, int rank, int world);
// The rank holding `row` under row-wise sharding.
int row_owner(int64_t row, int64_t rows, int world);

// Bytes each rank holds under `placements` (weights and state at bytes_per_row_element).
std::vector<int64_t> bytes_per_rank(const ShardingInputs& in, const std::vector<TablePlacement>& placements);

}  // namespace crosstrain::recsys
