#!/usr/bin/env bash
# Clock synchronization outside its calibration (issue 40): one
# `fairfeed sim experiment clock` run per cell — the calibrated model
# (docs/models/ntp-cloud-floor.toml) with one thing changed — and a Markdown
# table of them all (DIR/matrix.md; each cell's own summary under DIR/CELL/).
#
#   scripts/clock-matrix.sh DIR [RECEIVERS] [SECONDS] [JOBS]
#
# Defaults: 1,000 receivers, 1 simulated second of feed after the 10-s
# warm-up, 1 job at a time. CELLS=base,asym-5pct-5us,... runs only those cells. Uses the fairfeed cargo builds (or finds up to date)
# or $FAIRFEED if set.
set -euo pipefail
out=${1:?usage: clock-matrix.sh DIR [RECEIVERS] [SECONDS] [JOBS]}
n=${2:-1000}
secs=${3:-1}
jobs=${4:-1}
# shellcheck source=scripts/fairfeed-bin.sh
source "$(dirname "$0")/fairfeed-bin.sh"
base=$root/docs/models/ntp-cloud-floor.toml
mkdir -p "$out/models"

# cell name, then sed expressions applied to the base model (and lines appended after "|").
cells=(
  "base"
  "asym-1pct-20us|s/asymmetric_us = 5.0/asymmetric_us = 20.0/"
  "asym-1pct-50us|s/asymmetric_us = 5.0/asymmetric_us = 50.0/"
  "asym-5pct-5us|s/asymmetric_share = 0.01/asymmetric_share = 0.05/"
  "asym-5pct-20us|s/asymmetric_share = 0.01/asymmetric_share = 0.05/;s/asymmetric_us = 5.0/asymmetric_us = 20.0/"
  "asym-5pct-50us|s/asymmetric_share = 0.01/asymmetric_share = 0.05/;s/asymmetric_us = 5.0/asymmetric_us = 50.0/"
  "asym-10pct-5us|s/asymmetric_share = 0.01/asymmetric_share = 0.10/"
  "asym-10pct-20us|s/asymmetric_share = 0.01/asymmetric_share = 0.10/;s/asymmetric_us = 5.0/asymmetric_us = 20.0/"
  "asym-10pct-50us|s/asymmetric_share = 0.01/asymmetric_share = 0.10/;s/asymmetric_us = 5.0/asymmetric_us = 50.0/"
  "asym-20pct-5us|s/asymmetric_share = 0.01/asymmetric_share = 0.20/"
  "asym-20pct-20us|s/asymmetric_share = 0.01/asymmetric_share = 0.20/;s/asymmetric_us = 5.0/asymmetric_us = 20.0/"
  "asym-20pct-50us|s/asymmetric_share = 0.01/asymmetric_share = 0.20/;s/asymmetric_us = 5.0/asymmetric_us = 50.0/"
  "unqueued-10pct|s/unqueued = 0.3/unqueued = 0.10/"
  "unqueued-5pct|s/unqueued = 0.3/unqueued = 0.05/"
  "unqueued-2pct|s/unqueued = 0.3/unqueued = 0.02/"
  "noise-500ns|s/timestamp_noise_ns = 200.0/timestamp_noise_ns = 500.0/"
  "noise-1us|s/timestamp_noise_ns = 200.0/timestamp_noise_ns = 1000.0/"
  "raw-1s-500ppm|s/offset_us = 10000.0/offset_us = 1000000.0/;s/drift_ppm = 50.0/drift_ppm = 500.0/"
  "steps-2pct-1ms|\$astep_share = 0.02\nstep_us = 1000.0\nstep_at_s = 10.5"
  "steps-2pct-1ms-silent|\$astep_share = 0.02\nstep_us = 1000.0\nstep_at_s = 10.5\nstep_announced = false"
)

run_cell() {
  local name=${1%%|*} expr=""
  [[ $1 == *"|"* ]] && expr=${1#*|}
  local model=$out/models/$name.toml
  if [ -n "$expr" ]; then sed -e "$expr" "$base" > "$model"; else cp "$base" "$model"; fi
  local t0=$SECONDS
  if "$bin" sim experiment clock --receivers "$n" --seconds "$secs" --latency-model "$model" \
       --out "$out/$name" > "$out/$name.log" 2>&1; then
    echo "$((SECONDS - t0))" > "$out/$name/wall_s"
    echo "done $name ($((SECONDS - t0)) s)"
  else
    echo "FAILED $name (see $out/$name.log)" >&2
  fi
}

i=0
for c in "${cells[@]}"; do
  if [ -n "${CELLS:-}" ] && [[ ",$CELLS," != *",${c%%|*},"* ]]; then continue; fi
  run_cell "$c" &
  i=$((i + 1))
  if (( i % jobs == 0 )); then wait; fi
done
wait
python3 "$root/scripts/clock-matrix-summary.py" "$out" "$n" "$secs" > "$out/matrix.md"
cat "$out/matrix.md"
