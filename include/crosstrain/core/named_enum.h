// A config key whose value is one of a few names (sync.mode, model.arch, dlrm.mode...), parsed once into an enum
// when the config is read. Each enum keeps one table of its names beside it; parsing and printing both read it,
// so a new value is one row.
#pragma once

#include <cstddef>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain {

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

// The value named `text`, or a UsageError naming `key`, what was given and every choice ("dlrm.mode = 'x': use
// sharded, ps"), followed by `hint` when there is one.
template <typename Enum, size_t N>
Enum parse_enum(const EnumName<Enum> (&names)[N], const std::string& text, const std::string& key,
                const std::string& hint = "") {
  for (const auto& n : names)
    if (text == n.name) return n.value;
  std::string choices;
  for (const auto& n : names) choices += std::string(choices.empty() ? "" : ", ") + n.name;
  throw UsageError(key + " = '" + text + "': use " + choices + (hint.empty() ? "" : " (" + hint + ")"));
}

template <typename Enum, size_t N>
const char* enum_name(const EnumName<Enum> (&names)[N], Enum value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}

}  // namespace crosstrain
