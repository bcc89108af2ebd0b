#!/usr/bin/env bash
# Cargo's test runner for test.sh (CARGO_TARGET_<triple>_RUNNER): runs one test
# binary under a wall-clock limit, so a test that hangs costs one binary's
# budget and a one-line verdict, not the whole CI run. The limit is
# FAIRFEED_TEST_BINARY_TIMEOUT seconds (default 900); past it the binary gets
# SIGTERM, and SIGKILL 15 s later.
set -uo pipefail
limit="${FAIRFEED_TEST_BINARY_TIMEOUT:-900}"
timeout --kill-after=15 "$limit" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "test.sh: TIMEOUT $(basename "$1") ran past ${limit} s and was stopped (its tests still running are named above: 'has been running for over 60 seconds')" >&2
fi
exit "$rc"
