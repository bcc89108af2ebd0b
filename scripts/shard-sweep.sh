#!/usr/bin/env bash
# Sharded trees (issue 42): Jasper + controller over K trees at several
# aggregate rates, one `fairfeed sim experiment fairness --trees K` run per
# cell on the calibrated cloud model, and a Markdown table of them all
# (DIR/sweep.md; each cell's own summary under DIR/kK-rR/).
#
#   scripts/shard-sweep.sh DIR [RECEIVERS] [MESSAGES] [TARGET_PF]
#
# Defaults: 1,000 receivers, 20,000 messages per cell, target P(F) 0.999;
# K in {1, 4, 8, 16}, rates in {5,000, 20,000, 50,000, 100,000} msg/s
# (override with TREES="1 2" RATES="5000"; MODEL=FILE for another link
# model, e.g. docs/models/cloud-tree-lanes.toml: the sender's copies queue
# per tree). Uses
# the fairfeed cargo builds (or finds up to date) for these sources, or $FAIRFEED if set.
set -euo pipefail
out=${1:?usage: shard-sweep.sh DIR [RECEIVERS] [MESSAGES] [TARGET_PF]}
n=${2:-1000}
messages=${3:-20000}
target_pf=${4:-0.999}
trees=${TREES:-1 4 8 16}
rates=${RATES:-5000 20000 50000 100000}
# shellcheck source=scripts/fairfeed-bin.sh
source "$(dirname "$0")/fairfeed-bin.sh"
mkdir -p "$out"
cells=0
for k in $trees; do for r in $rates; do cells=$((cells + 1)); done; done
i=0
for k in $trees; do
  for r in $rates; do
    i=$((i + 1))
    cell="$out/k$k-r$r"
    if [ -f "$cell/summary.json" ]; then
      echo "shard-sweep: [$i/$cells] K = $k at $r msg/s: done before" >&2
      continue
    fi
    echo "shard-sweep: [$i/$cells] K = $k at $r msg/s …" >&2
    rm -rf "$cell"
    "$bin" sim experiment fairness --receivers "$n" --trees "$k" --rate "$r" --messages "$messages" \
      --target-pf "$target_pf" --schemes jasper+controller ${MODEL:+--latency-model "$MODEL"} --out "$cell" \
      2>"$out/k$k-r$r.log"
  done
done
python3 "$root/scripts/shard-sweep-summary.py" "$out" "$target_pf" >"$out/sweep.md"
cat "$out/sweep.md"
