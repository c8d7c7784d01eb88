#include "crosstrain/recsys/dlrm_identity.h"

#include <functional>

#include "crosstrain/core/error.h"

namespace crosstrain::recsys {

std::vector<std::string> dlrm_model_differences(const DlrmConfig& saved, const DlrmConfig& now) {
  std::vector<std::string> out;
  auto text = [&](const char* field, const std::string& a, const std::string& b) {
    out.push_back(std::string("dlrm.") + field + ": " + a + " -> " + b);
  };
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  // A list compared by its parsed form; by its text where one side does not parse (checks report that later).
  auto list = [&](const char* field, const std::string& a, const std::string& b,
                  const std::function<std::vector<int64_t>(const DlrmConfig&)>& parse) {
    bool same = a == b;
    try {
      same = parse(saved) == parse(now);
    } catch (const UsageError&) {
    }
    if (!same) text(field, quoted(a), quoted(b));
  };
  list("tables", saved.tables, now.tables, [](const DlrmConfig& c) { return c.table_rows(); });
  if (saved.embedding_dim != now.embedding_dim)
    text("embedding_dim", std::to_string(saved.embedding_dim), std::to_string(now.embedding_dim));
  if (saved.dense_features != now.dense_features)
    text("dense_features", std::to_string(saved.dense_features), std::to_string(now.dense_features));
  // The widths end in embedding_dim (bottom) and 1 (top): compare the hidden ones only.
  auto hidden = [](std::vector<int64_t> w) {
    w.pop_back();
    return w;
  };
  list("bottom_mlp", saved.bottom_mlp, now.bottom_mlp, [&](const DlrmConfig& c) { return hidden(c.bottom_widths()); });
  list("top_mlp", saved.top_mlp, now.top_mlp, [&](const DlrmConfig& c) { return hidden(c.top_widths()); });
  if (saved.pooling != now.pooling) text("pooling", quoted(to_string(saved.pooling)), quoted(to_string(now.pooling)));
  return out;
}

}  // namespace crosstrain::recsys
