#!/usr/bin/env bash
# Seed 002's latency matrix on this machine for both exchange pipelines, and
# the hostile-client table, REPS runs each (alternating), JSON per run in
# OUT, then OUT/summary.md (medians; every run's p99 beside them).
#   scripts/exchange-matrix.sh OUT [REPS]      (default REPS 3; ~3 min a rep)
# Uses `fairfeed` from $FAIRFEED, else $CARGO_TARGET_DIR/release, else PATH.
set -euo pipefail
out="${1:?usage: scripts/exchange-matrix.sh OUT [REPS]}"
reps="${2:-3}"
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FAIRFEED:-${CARGO_TARGET_DIR:-$here/../target}/release/fairfeed}"
[ -x "$bin" ] || bin="$(command -v fairfeed)"
mkdir -p "$out"
for rep in $(seq 1 "$reps"); do
  for row in "10000 1" "50000 1" "100000 2" "250000 5" "500000 10"; do
    set -- $row
    for p in run-to-completion threaded; do
      echo "rep $rep: $p, $1 orders/s, $2 products" >&2
      "$bin" exchange bench --rate "$1" --products "$2" --seconds 5 --pipeline "$p" --json \
        > "$out/matrix-$p-$1-$2-r$rep.json" 2>/dev/null
    done
  done
  for a in none idle-connections slow-reader login-guessing garbage; do
    echo "rep $rep: attack $a" >&2
    extra=(); [ "$a" = none ] || extra=(--attack "$a")
    "$bin" exchange bench --rate 10000 --products 1 --seconds 5 --pipeline run-to-completion "${extra[@]}" --json \
      > "$out/attack-$a-r$rep.json" 2>/dev/null
  done
done
python3 "$here/exchange-matrix-summary.py" "$out" > "$out/summary.md"
cat "$out/summary.md"
