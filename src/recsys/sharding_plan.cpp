// The embedding sharding planner: per table, table-wise, row-wise or column-wise, and the owner of whole tables.
//
// The auto rules, in order, for more than one rank (one rank holds everything table-wise):
// 1. Column-wise when the table is wide (dim >= 64) and hot: its lookup traffic (ids per example x distinct
//    fraction x dim) is more than one rank's even share of all tables' traffic, so whichever rank held it whole
//    would be the slowest in every all-to-all. Split by columns, every rank serves every lookup on dim/world
//    columns: perfectly balanced whatever the id skew. Needs dim divisible by the world; 64 keeps at least 16
//    columns per rank on 4 ranks (narrow slices waste the per-id overhead of every message).
// 2. Row-wise when the table is big: more than a quarter of a rank's memory budget (held whole it would leave too
//    little room to pack the others, and a table over the budget cannot be held at all), or, with no budget, more
//    than the even per-rank share of all tables' bytes (whole, it would leave its rank above the mean whatever
//    the packing) and over 4 MiB (below that an imbalance costs less than the all-to-all a split adds). Row
//    blocks are contiguous; the ids are hashed or scrambled, so hot rows spread over the blocks.
// 3. Otherwise table-wise: the whole table on one rank, no split lookups. Whole tables go largest first onto the
//    rank with the least load, counting bytes and lookup traffic each as a fraction of its even share, among the
//    ranks where the table still fits the budget; an auto table that fits none is split by rows instead.
#include "crosstrain/recsys/sharding_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::recsys {

namespace {

constexpr int64_t kWideDim = 64;
constexpr double kBudgetShare = 0.25;
constexpr int64_t kBalanceFloorBytes = int64_t{4} << 20;

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, bytes >= 100 || u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

std::string fixed(double value, const char* format) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

int64_t table_bytes(const ShardingInputs& in, size_t t) {
  return in.tables[t].rows * in.tables[t].dim * in.bytes_per_row_element;
}

// Embedding elements a rank gathers for this table per example (the relative lookup traffic).
double lookup_traffic(const TableShape& t) {
  return t.ids_per_example * t.unique_fraction * static_cast<double>(t.dim);
}

void check_inputs(const ShardingInputs& in) {
  if (in.world < 1) throw UsageError("sharding plan for " + std::to_string(in.world) + " ranks; it needs 1 or more");
  for (size_t t = 0; t < in.tables.size(); ++t) {
    const TableShape& s = in.tables[t];
    if (s.rows < 1 || s.dim < 1)
      throw UsageError("embedding table " + std::to_string(t) + " has " + std::to_string(s.rows) + " rows of dim " +
                       std::to_string(s.dim) + "; both must be at least 1");
    if (!(s.ids_per_example >= 0) || !(s.unique_fraction > 0 && s.unique_fraction <= 1))
      throw UsageError("embedding table " + std::to_string(t) + ": ids_per_example must be >= 0 and "
                       "unique_fraction in (0, 1]");
  }
}

// One entry per table: the requested sharding, or none for auto.
std::vector<std::optional<Sharding>> parse_requested(const ShardingInputs& in) {
  std::vector<std::string> names;
  std::string rest = in.requested.empty() ? "auto" : in.requested;
  for (size_t comma; (comma = rest.find(',')) != std::string::npos; rest = rest.substr(comma + 1))
    names.push_back(trim(rest.substr(0, comma)));
  names.push_back(trim(rest));
  if (names.size() != 1 && names.size() != in.tables.size())
    throw UsageError("dlrm.sharding = \"" + in.requested + "\" names " + std::to_string(names.size()) +
                     " shardings for " + std::to_string(in.tables.size()) +
                     " tables; give one name for every table or one per table, each auto, table, row or column");
  std::vector<std::optional<Sharding>> out;
  for (size_t t = 0; t < in.tables.size(); ++t) {
    const std::string& name = names[names.size() == 1 ? 0 : t];
    if (name == "auto") out.emplace_back();
    else if (name == "table" || name == "row" || name == "column") out.emplace_back(parse_sharding(name));
    else
      throw UsageError("dlrm.sharding = \"" + in.requested + "\": '" + name + "' (table " + std::to_string(t) +
                       ") is not one of auto, table, row, column");
  }
  return out;
}

std::string split_reason(Sharding s, const ShardingInputs& in, size_t t) {
  const std::string ranks = std::to_string(in.world) + " ranks";
  if (s == Sharding::Row) return "row-wise over " + ranks;
  return "column-wise over " + ranks + ", " + std::to_string(in.tables[t].dim / in.world) + " columns each";
}

struct Totals {
  double bytes = 0, traffic = 0;
};

// Rules 1 and 2 of the file comment; a placement with an empty reason means "whole, owner to be chosen".
TablePlacement auto_split(const ShardingInputs& in, size_t t, const Totals& total) {
  const TableShape& s = in.tables[t];
  const double bytes = static_cast<double>(table_bytes(in, t));
  const double share = total.traffic > 0 ? lookup_traffic(s) / total.traffic : 0;
  if (s.dim >= kWideDim && s.dim % in.world == 0 && share > 1.0 / in.world)
    return {Sharding::Column, 0,
            "dim " + std::to_string(s.dim) + ", " + fixed(s.ids_per_example, "%.1f") + " lookups/example (" +
                fixed(100 * share, "%.0f") + "% of the lookup traffic > 1/" + std::to_string(in.world) +
                " per rank): " + split_reason(Sharding::Column, in, t)};
  const double budget = static_cast<double>(in.budget_bytes_per_rank);
  if (budget > 0 && bytes > kBudgetShare * budget)
    return {Sharding::Row, 0,
            human_bytes(bytes) + " > 25% of the " + human_bytes(budget) + " budget: " +
                split_reason(Sharding::Row, in, t)};
  if (budget <= 0 && bytes > kBalanceFloorBytes && bytes > total.bytes / in.world)
    return {Sharding::Row, 0,
            human_bytes(bytes) + " > the " + human_bytes(total.bytes / in.world) +
                " even share of all tables per rank: " + split_reason(Sharding::Row, in, t)};
  return {Sharding::Table, 0, ""};
}

void check_column(const ShardingInputs& in, size_t t) {
  const int64_t dim = in.tables[t].dim;
  if (dim % in.world != 0)
    throw UsageError("dlrm.sharding: table " + std::to_string(t) + " has dim " + std::to_string(dim) +
                     ", which column-wise sharding cannot split over " + std::to_string(in.world) +
                     " ranks (dim must be divisible by the number of ranks); request row or table for it, or auto");
}

// The per-rank load the greedy packing balances: bytes and traffic, each relative to its even share.
struct Loads {
  std::vector<double> bytes, traffic;
  void add(const ShardingInputs& in, size_t t, const TablePlacement& p) {
    const double whole_traffic = lookup_traffic(in.tables[t]);
    for (int r = 0; r < in.world; ++r) {
      const bool whole = p.sharding == Sharding::Table;
      if (whole && r != p.owner) continue;
      bytes[r] += static_cast<double>(table_bytes(in, t)) / (whole ? 1 : in.world);
      traffic[r] += whole_traffic / (whole ? 1 : in.world);
    }
  }
};

// The least loaded rank on which table t still fits the budget; -1 when none.
int least_loaded(const ShardingInputs& in, size_t t, const Loads& loads, const Totals& total) {
  const double even_bytes = std::max(total.bytes / in.world, 1.0);
  const double even_traffic = std::max(total.traffic / in.world, 1e-12);
  const double bytes = static_cast<double>(table_bytes(in, t));
  int best = -1;
  double best_load = 0;
  for (int r = 0; r < in.world; ++r) {
    if (in.budget_bytes_per_rank > 0 && loads.bytes[r] + bytes > static_cast<double>(in.budget_bytes_per_rank))
      continue;
    const double load = loads.bytes[r] / even_bytes + loads.traffic[r] / even_traffic;
    if (best < 0 || load < best_load) best = r, best_load = load;
  }
  return best;
}

[[noreturn]] void whole_table_fits_nowhere(const ShardingInputs& in, size_t t, const Loads& loads) {
  const double least = *std::min_element(loads.bytes.begin(), loads.bytes.end());
  throw UsageError("dlrm.sharding requests table " + std::to_string(t) + " (" +
                   human_bytes(static_cast<double>(table_bytes(in, t))) + ") table-wise, but no rank has room: the "
                   "least loaded holds " + human_bytes(least) + " of its " +
                   human_bytes(static_cast<double>(in.budget_bytes_per_rank)) +
                   " budget; request row or column for it, or auto");
}

// Rule 3: whole tables, largest first, onto the least loaded rank that has room.
void place_whole_tables(const ShardingInputs& in, const std::vector<std::optional<Sharding>>& requested,
                        std::vector<TablePlacement>& plan, Loads& loads, const Totals& total) {
  std::vector<size_t> order;
  for (size_t t = 0; t < plan.size(); ++t)
    if (plan[t].sharding == Sharding::Table) order.push_back(t);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (table_bytes(in, a) != table_bytes(in, b)) return table_bytes(in, a) > table_bytes(in, b);
    return lookup_traffic(in.tables[a]) > lookup_traffic(in.tables[b]);
  });
  for (size_t t : order) {
    const int rank = least_loaded(in, t, loads, total);
    const std::string size = human_bytes(static_cast<double>(table_bytes(in, t)));
    if (rank < 0 && requested[t]) whole_table_fits_nowhere(in, t, loads);
    if (rank < 0)
      plan[t] = {Sharding::Row, 0, size + " fits no rank whole beside the other tables: " +
                                       split_reason(Sharding::Row, in, t)};
    else if (requested[t])
      plan[t] = {Sharding::Table, rank, "requested table-wise: on rank " + std::to_string(rank)};
    else if (in.world == 1)
      plan[t] = {Sharding::Table, 0, "one rank: table-wise on rank 0"};
    else
      plan[t] = {Sharding::Table, rank, size + " fits one rank: table-wise on rank " + std::to_string(rank)};
    loads.add(in, t, plan[t]);
  }
}

// Names the first table that takes a rank past the budget, counting the split tables first: whole tables were
// only placed where they fit beside them, so the split tables are what overflows.
void check_budget(const ShardingInputs& in, const std::vector<TablePlacement>& plan) {
  if (in.budget_bytes_per_rank <= 0) return;
  std::vector<size_t> order(plan.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(), [&](size_t t) { return plan[t].sharding != Sharding::Table; });
  std::vector<int64_t> held(static_cast<size_t>(in.world), 0);
  for (size_t t : order) {
    ShardingInputs one = in;
    one.tables = {in.tables[t]};
    const std::vector<int64_t> add = bytes_per_rank(one, {plan[t]});
    for (int r = 0; r < in.world; ++r) {
      held[r] += add[r];
      if (held[r] <= in.budget_bytes_per_rank) continue;
      throw UsageError("embedding table " + std::to_string(t) + " (" +
                       human_bytes(static_cast<double>(table_bytes(in, t))) + ", " +
                       sharding_name(plan[t].sharding) + "-wise: " + human_bytes(static_cast<double>(add[r])) +
                       " on rank " + std::to_string(r) + ") does not fit: rank " + std::to_string(r) + " would hold " +
                       human_bytes(static_cast<double>(held[r])) + " of tables, over its " +
                       human_bytes(static_cast<double>(in.budget_bytes_per_rank)) +
                       " budget; add ranks, shrink the tables (rows or dim) or raise the budget");
    }
  }
}

// Split (column, row) placements first, in table order, so the whole tables are packed around them.
std::vector<TablePlacement> split_tables(const ShardingInputs& in, const std::vector<std::optional<Sharding>>& req,
                                         const Totals& total) {
  std::vector<TablePlacement> plan(in.tables.size());
  for (size_t t = 0; t < in.tables.size(); ++t) {
    if (req[t] == Sharding::Column) check_column(in, t);
    if (req[t] == Sharding::Row || req[t] == Sharding::Column)
      plan[t] = {*req[t], 0, "requested " + split_reason(*req[t], in, t)};
    else if (!req[t] && in.world > 1)
      plan[t] = auto_split(in, t, total);
  }
  return plan;
}

}  // namespace

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::Table: return "table";
    case Sharding::Row: return "row";
    case Sharding::Column: return "column";
  }
  return "?";
}

Sharding parse_sharding(const std::string& s) {
  if (s == "table") return Sharding::Table;
  if (s == "row") return Sharding::Row;
  if (s == "column") return Sharding::Column;
  throw UsageError("sharding '" + s + "' is not one of table, row, column");
}

std::vector<TablePlacement> plan_sharding(const ShardingInputs& in) {
  check_inputs(in);
  const std::vector<std::optional<Sharding>> requested = parse_requested(in);
  Totals total;
  for (size_t t = 0; t < in.tables.size(); ++t) {
    total.bytes += static_cast<double>(table_bytes(in, t));
    total.traffic += lookup_traffic(in.tables[t]);
  }
  std::vector<TablePlacement> plan = split_tables(in, requested, total);
  Loads loads{std::vector<double>(in.world, 0.0), std::vector<double>(in.world, 0.0)};
  for (size_t t = 0; t < plan.size(); ++t)
    if (plan[t].sharding != Sharding::Table) loads.add(in, t, plan[t]);
  place_whole_tables(in, requested, plan, loads, total);
  check_budget(in, plan);
  return plan;
}

RowRange row_block(int64_t rows, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world || rows < 0)
    throw Error("row_block: rank " + std::to_string(rank) + " of " + std::to_string(world) + " ranks, " +
                std::to_string(rows) + " rows");
  const int64_t base = rows / world, extra = rows % world;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

int row_owner(int64_t row, int64_t rows, int world) {
  if (world < 1 || row < 0 || row >= rows)
    throw Error("row_owner: row " + std::to_string(row) + " of a table of " + std::to_string(rows) + " rows over " +
                std::to_string(world) + " ranks");
  const int64_t base = rows / world, extra = rows % world;
  const int64_t in_long_blocks = extra * (base + 1);  // the first `extra` ranks hold base + 1 rows
  if (row < in_long_blocks) return static_cast<int>(row / (base + 1));
  return static_cast<int>(extra + (row - in_long_blocks) / base);
}

std::vector<int64_t> bytes_per_rank(const ShardingInputs& in, const std::vector<TablePlacement>& placements) {
  if (placements.size() != in.tables.size())
    throw Error("bytes_per_rank: " + std::to_string(placements.size()) + " placements for " +
                std::to_string(in.tables.size()) + " tables");
  std::vector<int64_t> bytes(static_cast<size_t>(std::max(in.world, 1)), 0);
  for (size_t t = 0; t < placements.size(); ++t) {
    const TableShape& s = in.tables[t];
    for (int r = 0; r < in.world; ++r) {
      switch (placements[t].sharding) {
        case Sharding::Table:
          if (r == placements[t].owner) bytes[r] += s.rows * s.dim * in.bytes_per_row_element;
          break;
        case Sharding::Row: {
          const RowRange block = row_block(s.rows, r, in.world);
          bytes[r] += (block.last - block.first) * s.dim * in.bytes_per_row_element;
          break;
        }
        case Sharding::Column: {
          const RowRange columns = row_block(s.dim, r, in.world);
          bytes[r] += s.rows * (columns.last - columns.first) * in.bytes_per_row_element;
          break;
        }
      }
    }
  }
  return bytes;
}

}  // namespace crosstrain::recsys
