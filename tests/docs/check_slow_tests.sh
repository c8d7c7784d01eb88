#!/usr/bin/env bash
# Every case that tests/slow_tests.cmake labels `slow` exists: CTest ignores a property set on a name it does not
# know, so a renamed test would drop the label silently and slow down make test. Usage: check_slow_tests.sh BUILD_DIR FILE
set -euo pipefail
build=$1 file=$2
want=$(grep -c '^set_tests_properties(' "$file")
got=$(cd "$build" && ctest -N -L slow | sed -n 's/^Total Tests: //p')
if [[ "$got" != "$want" ]]; then
  echo "check_slow_tests: $file labels $want cases slow, but ctest finds $got with the label;" \
       "a name there no longer matches a test (compare with: ctest -N)" >&2
  exit 1
fi
echo "check_slow_tests: all $want slow cases exist"
