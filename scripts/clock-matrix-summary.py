#!/usr/bin/env python3
"""Summarizes scripts/clock-matrix.sh runs (DIR/CELL/summary.json) as one Markdown table."""
import json, os, sys

out, n, secs = sys.argv[1], sys.argv[2], sys.argv[3]
order = []
for line in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "clock-matrix.sh")):
    line = line.strip()
    if line.startswith('"') and (line.endswith('"')):
        order.append(line.strip('"').split("|")[0])
print(f"N = {n} receivers, {secs} s of feed after the 10-s warm-up, seed 1. "
      "P(F) columns count the receivers whose bound was within 1 µs; *all* counts every receiver.\n")
print("| cell | sync error p50 / p99 / max ns | bound coverage | P(F) 1 / 5 / 10 µs | P(F@1µs) all | unsynced share | fair window at target, synced / all µs | OML p50 µs | steps seen | contested nodes | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
chosen = [c for c in os.environ.get("CELLS", "").split(",") if c]
for c in order:
    if chosen and c not in chosen:
        continue
    f = os.path.join(out, c, "summary.json")
    if not os.path.exists(f):
        print(f"| {c} | (no result) | | | | | | | | | |")
        continue
    d = json.load(open(f))
    wall = open(os.path.join(out, c, "wall_s")).read().strip() if os.path.exists(os.path.join(out, c, "wall_s")) else "?"
    print(f"| {c} | {d['sync_error_p50_ns']:.0f} / {d['sync_error_p99_ns']:.0f} / {d['sync_error_max_ns']:.0f} "
          f"| {d['bound_coverage']*100:.3f} % | {d['pf_1us']:.4f} / {d['pf_5us']:.4f} / {d['pf_10us']:.4f} "
          f"| {d['pf_1us_all']:.4f} | {d['unsynced_share']*100:.2f} % | {d['fair_window_us']:.2f} / {d['fair_window_all_us']:.2f} "
          f"| {d['oml_p50_us']:.1f} | {d['steps_detected']} | {d.get('contested_nodes', '—')} | {wall} |")
