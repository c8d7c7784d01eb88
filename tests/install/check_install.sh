#!/usr/bin/env bash
# Installs crosstrain from BUILD into a temporary prefix, then builds and runs a consumer with find_package.
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
cmake -S "$src" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/consumer" > /dev/null
"$tmp/consumer/consumer"
