#!/usr/bin/env bash
# Receivers that need not be trusted (issue 44): one
# `fairfeed sim experiment trading --model M --ordering O` run per cell —
# Jasper's deployment models 1–3 × the exchange's orderings fifo / dbo /
# batch, a cheater (model 1: a firm running its own receiver releases 5 µs
# early), and models 2 and 3 with a hold at the far end (the firm's host, the
# enclave) — then a Markdown table of
# them all (DIR/matrix.md; each cell's own summary under DIR/CELL/).
#
#   scripts/trading-matrix.sh DIR [RECEIVERS] [MESSAGES] [SEED]
#
# Defaults: 100 receivers, 6,250 messages (1,250 warm-up), seed 1. Receivers ×
# messages at most 10,000,000 (every release is kept).
# CELLS=m1-fifo,m2-dbo,... runs only those cells. Uses
# the fairfeed cargo builds (or finds up to date) for these sources, or $FAIRFEED if set.
set -euo pipefail
out=${1:?usage: trading-matrix.sh DIR [RECEIVERS] [MESSAGES] [SEED]}
n=${2:-100}
messages=${3:-6250}
seed=${4:-1}
# shellcheck source=scripts/fairfeed-bin.sh
source "$(dirname "$0")/fairfeed-bin.sh"
mkdir -p "$out"

# cell name, then the flags that make it.
cells=()
for m in 1 2 3; do
  for o in fifo dbo batch; do
    cells+=("m$m-$o|--model $m --ordering $o")
  done
done
for o in fifo dbo batch; do
  cells+=("m1-$o-cheat5|--model 1 --ordering $o --cheat-us 5")
  cells+=("m3-$o-hold|--model 3 --ordering $o --enclave-hold-q 0.999999")
  cells+=("m2-$o-hold|--model 2 --ordering $o --host-hold-q 0.999999")
done
cells+=("m1-batch-100us|--model 1 --ordering batch --batch-us 100")
cells+=("m1-fifo-equal-paths|--model 1 --ordering fifo --slow-path-us 0")

total=${#cells[@]}
i=0
for c in "${cells[@]}"; do
  name=${c%%|*}
  flags=${c#*|}
  i=$((i + 1))
  if [ -n "${CELLS:-}" ] && [[ ",$CELLS," != *",$name,"* ]]; then continue; fi
  t0=$SECONDS
  # shellcheck disable=SC2086
  if "$bin" sim experiment trading --receivers "$n" --messages "$messages" --seed "$seed" $flags \
       --out "$out/$name" > "$out/$name.log" 2>&1; then
    echo "[$i/$total] $name ($((SECONDS - t0)) s)"
  else
    echo "[$i/$total] $name FAILED (see $out/$name.log)" >&2
    exit 1
  fi
done
python3 "$root/scripts/trading-matrix-summary.py" "$out" > "$out/matrix.md"
cat "$out/matrix.md"
