#!/usr/bin/env bash
# docs/architecture.md against the tree: every folder directly under src/ is a row of its layer table, the
# table's "depends on" column holds exactly the edges of CMakeLists.txt (the DEPS of each crosstrain_layer call;
# for apps, the crosstrain_<layer> targets that crosstrain_cli links), every folder of tests/ mirrors one of src/
# (or is support, docs, layers, install, net), and README.md links the page.
#
#   check_architecture.sh SOURCE_DIR      check; exit 1 naming every difference
#   check_architecture.sh --self-test SOURCE_DIR
#                                         the check passes on a copy of the tree and fails on each of a missing
#                                         folder, a missing edge, an extra edge, a new CMake edge, a missing link
set -euo pipefail

usage() { echo "usage: $0 [--self-test] SOURCE_DIR" >&2; exit 2; }

# "LAYER DEP DEP ..." for every row of the table in the section "## Layers" of the doc ("-": no deps).
doc_rows() {
  awk -F'|' '
    /^## / { in_layers = ($0 ~ /^## Layers[[:space:]]*$/); next }
    !in_layers || !/^[[:space:]]*\|/ { next }
    {
      name = $2; gsub(/[`[:space:]]/, "", name); sub(/\/$/, "", name)
      if (name == "layer" || name ~ /^-+$/ || name == "") next
      deps = $(NF - 1); if (deps ~ /^[[:space:]]*$/) deps = $NF
      gsub(/[`[:space:]]/, "", deps); gsub(/,/, " ", deps)
      if (deps == "-") deps = ""
      print name, deps
    }' "$1"
}

# "LAYER DEP DEP ..." for every crosstrain_layer(NAME [DEPS ...] [PURE ...]) call (calls may span lines; comments
# are dropped), then "apps DEP ..." from crosstrain_cli's target_link_libraries lines.
cmake_rows() {
  awk '
    { sub(/#.*/, "") }
    !in_call && /^[[:space:]]*crosstrain_layer[[:space:]]*\(/ { in_call = 1; call = "" }
    in_call {
      call = call " " $0
      if (index($0, ")")) {
        in_call = 0
        sub(/^[[:space:]]*crosstrain_layer[[:space:]]*\(/, "", call); sub(/\).*/, "", call)
        n = split(call, t, /[[:space:]]+/)
        name = ""; deps = ""; mode = ""
        for (i = 1; i <= n; i++) {
          if (t[i] == "") continue
          if (name == "") { name = t[i]; continue }
          if (t[i] == "DEPS" || t[i] == "PURE") { mode = t[i]; continue }
          if (mode == "DEPS") deps = deps " " t[i]
        }
        layers[name] = 1; order[++count] = name; edges[name] = deps
      }
      next
    }
    /^[[:space:]]*target_link_libraries[[:space:]]*\([[:space:]]*crosstrain_cli[[:space:]]/ { cli = cli " " $0 }
    END {
      for (i = 1; i <= count; i++) print order[i] edges[order[i]]
      n = split(cli, t, /[[:space:](),]+/); deps = ""
      for (i = 1; i <= n; i++)
        if (t[i] ~ /^crosstrain_/ && t[i] != "crosstrain_cli") {
          d = substr(t[i], 12)
          if (d in layers) deps = deps " " d
        }
      if (cli != "") print "apps" deps
    }' "$1"
}

# Prints "A -> B" for each edge of rows "A B C ..." (sorted, once each).
edges_of() { awk '{ for (i = 2; i <= NF; i++) print $1 " -> " $i }' | sort -u; }

check() {
  local src=$1 doc=$1/docs/architecture.md readme=$1/README.md cmake=$1/CMakeLists.txt
  local failures=0 d
  for f in "$doc" "$readme" "$cmake"; do
    [[ -f $f ]] || { echo "check_architecture: $f is missing"; return 1; }
  done
  local doc_table cmake_table
  doc_table=$(doc_rows "$doc")
  cmake_table=$(cmake_rows "$cmake")
  [[ -n $doc_table ]] || { echo "docs/architecture.md: no layer table under '## Layers'"; return 1; }

  # (a) every folder under src/ is a row; every row is a folder.
  local doc_layers; doc_layers=$(awk '{ print $1 }' <<<"$doc_table" | sort -u)
  for d in "$src"/src/*/; do
    d=$(basename "$d")
    if ! grep -qxF "$d" <<<"$doc_layers"; then
      echo "docs/architecture.md: src/$d/ is not a row of the layer table"
      failures=$((failures + 1))
    fi
  done
  while read -r d; do
    if [[ ! -d $src/src/$d ]]; then
      echo "docs/architecture.md: the layer table has a row '$d' but src/$d/ does not exist"
      failures=$((failures + 1))
    fi
  done <<<"$doc_layers"

  # (b) the edges, both ways.
  local doc_edges cmake_edges e
  doc_edges=$(edges_of <<<"$doc_table")
  cmake_edges=$(edges_of <<<"$cmake_table")
  while read -r e; do
    [[ -z $e ]] && continue
    if ! grep -qxF "$e" <<<"$doc_edges"; then
      echo "docs/architecture.md: missing edge $e (CMakeLists.txt has it)"
      failures=$((failures + 1))
    fi
  done <<<"$cmake_edges"
  while read -r e; do
    [[ -z $e ]] && continue
    if ! grep -qxF "$e" <<<"$cmake_edges"; then
      echo "docs/architecture.md: edge $e is not in CMakeLists.txt"
      failures=$((failures + 1))
    fi
  done <<<"$doc_edges"

  # (c) tests/ mirrors src/: every folder there tests a layer, or the repository as a whole.
  for d in "$src"/tests/*/; do
    [[ -d $d ]] || continue
    d=$(basename "$d")
    case $d in support|docs|layers|install|net) continue ;; esac
    if [[ ! -d $src/src/$d ]]; then
      echo "tests/$d/ mirrors no folder of src/: put its tests under tests/<layer>/ (support/ holds shared helpers)"
      failures=$((failures + 1))
    fi
  done

  # (c) README.md links the page.
  if ! grep -qE '\]\((\./)?docs/architecture\.md(#[^)]*)?\)' "$readme"; then
    echo "README.md: no link to docs/architecture.md (e.g. [docs/architecture.md](docs/architecture.md))"
    failures=$((failures + 1))
  fi

  if ((failures > 0)); then
    echo "check_architecture: $failures difference(s) between docs/architecture.md and the tree"
    return 1
  fi
  echo "check_architecture: $(wc -l <<<"$doc_layers") layers and $(grep -c . <<<"$cmake_edges") edges match"
}

# Copies what the check reads into a temporary tree, breaks it one way at a time, and expects each to fail
# with the right message.
self_test() {
  local src=$1 tmp bad=0
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  fresh() {
    rm -rf "$tmp/t"; mkdir -p "$tmp/t/docs" "$tmp/t/src"
    cp "$src/CMakeLists.txt" "$src/README.md" "$tmp/t/"
    cp "$src/docs/architecture.md" "$tmp/t/docs/"
    local d; for d in "$src"/src/*/; do mkdir "$tmp/t/src/$(basename "$d")"; done
    for d in "$src"/tests/*/; do mkdir -p "$tmp/t/tests/$(basename "$d")"; done
  }
  expect() {  # expect NAME pass|fail [PATTERN]
    local out rc=0
    out=$(check "$tmp/t" 2>&1) || rc=$?
    if [[ $2 == pass && $rc -ne 0 ]] || [[ $2 == fail && ( $rc -eq 0 || -z $(grep -F -- "$3" <<<"$out") ) ]]; then
      echo "self-test $1: expected $2${3:+ with '$3'}, got exit $rc:"; echo "$out"; bad=1
    else
      echo "self-test $1: ok"
    fi
  }
  fresh; expect unchanged pass
  fresh; mkdir "$tmp/t/src/zzz"; expect new_folder fail "src/zzz/ is not a row"
  fresh; sed -i -E 's/^(\| *train *\|.*\| *)models, /\1/' "$tmp/t/docs/architecture.md"
  expect missing_edge fail "missing edge train -> models"
  fresh; sed -i -E 's/^(\| *planner *\|.*\| *)models *\|/\1models, comm |/' "$tmp/t/docs/architecture.md"
  expect extra_edge fail "edge planner -> comm is not in CMakeLists.txt"
  fresh; sed -i -E 's/^crosstrain_layer\(obs DEPS core\)/crosstrain_layer(obs DEPS core\n  comm)/' "$tmp/t/CMakeLists.txt"
  expect new_cmake_edge fail "missing edge obs -> comm"
  fresh; sed -i -E '/^crosstrain_layer\(planner /s/.*/crosstrain_layer(planner DEPS models data)/' "$tmp/t/CMakeLists.txt"
  expect new_cmake_edge_one_line fail "missing edge planner -> data"
  fresh; sed -i -E 's/^(\| *apps *\|.*\| *)jobs, /\1/' "$tmp/t/docs/architecture.md"
  expect missing_apps_edge fail "missing edge apps -> jobs"
  fresh; mkdir "$tmp/t/tests/speed"; expect test_folder_by_kind fail "tests/speed/ mirrors no folder of src/"
  fresh; sed -i 's#\](docs/architecture.md)#]#g' "$tmp/t/README.md"
  expect readme_link fail "README.md: no link"
  return $bad
}

case ${1:-} in
  --self-test) [[ $# -eq 2 ]] || usage; self_test "$2" ;;
  ''|-*) usage ;;
  *) [[ $# -eq 1 ]] || usage; check "$1" ;;
esac
