#!/usr/bin/env bash
# Installs the Debian packages crosstrain needs, only when some are missing.
# Idempotent and quiet when everything is present. Not root: prints the command instead.
# Usage: scripts/install-deps.sh [--core] [extra-package ...]
# libcpp-httplib-dev serves the live metrics; libjs-chart.js is inlined into the run report; chromium renders
# the report in its test (headless; with the fonts and the software GL driver it recommends, as recommends are
# not installed here).
# libopenblas0-pthread replaces Debian's reference BLAS behind libtorch: about 10x faster CPU matmuls.
# libblas-dev: cblas.h and the link library for the fused attention's tile GEMMs (OpenBLAS answers at run time).
# slurm-wlm and munge: the scheduler's tests start small real Slurm clusters (scripts/slurm_testbed.sh).
# libsentencepiece-dev trains and runs SentencePiece tokenizers (crosstrain tokenize).
# fortunes brings the English text the demo trains on (/usr/share/games/fortunes).
# --core: only what building the binaries and running the demo need (make app, make demo): no browser, no Slurm.
set -euo pipefail
core=(cmake make g++ pkg-config libtorch-dev libgloo-dev libcli11-dev nlohmann-json3-dev openmpi-bin libopenmpi-dev
      libtomlplusplus-dev libsodium-dev libgtest-dev libgmock-dev libopenblas0-pthread libblas-dev fortunes
      libcpp-httplib-dev libssl-dev libsentencepiece-dev libsqlite3-dev)
# The test suite's and the report's: Chart.js for the report, Chromium (with fonts and the software GL driver) to
# render it in its test, Slurm and munge for the scheduler's clusters.
suite=(openssl libjs-chart.js chromium fonts-dejavu-core fonts-liberation libgl1-mesa-dri slurm-wlm munge)
if [[ "${1:-}" == "--core" ]]; then
  shift
  packages=("${core[@]}" "$@")
else
  packages=("${core[@]}" "${suite[@]}" "$@")
fi
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "crosstrain needs these Debian packages: ${missing[*]}" >&2
  echo "install them with:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "apt-get install failed for: ${missing[*]}" >&2
  exit 1
fi
rm -f "$log"
