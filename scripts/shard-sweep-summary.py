#!/usr/bin/env python3
"""The sharding sweep's cells (scripts/shard-sweep.sh) as one Markdown table,
with the issue's two checks: OML p50 against one tree's at 5,000 msg/s, and
the highest rate each K carries at P(F@1us) >= the target."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
target = float(sys.argv[2]) if len(sys.argv) > 2 else 0.999
rows = []
for f in sorted(out.glob("k*-r*/summary.json")):
    r = json.loads(f.read_text())[0]
    rows.append(r)
rows.sort(key=lambda r: (r["trees"], r["rate"]))
base = next((r for r in rows if r["trees"] == 1 and r["rate"] == 5000), None)
print(f"| trees K | rate msg/s | F×D | busiest load | OML p50 µs | OML p99 µs | ×1-tree@5k | P(F) 1 µs | lost | late |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{r['oml_p50_us'] / base['oml_p50_us']:.2f}" if base else "–"
    load = r["busiest_node_load"]
    print(
        f"| {r['trees']} | {r['rate']:.0f} | {r['fanout']}×{r['depth']} | {load:.2f}{' (overloaded)' if load > 1 else ''} "
        f"| {r['oml_p50_us']:.1f} | {r['oml_p99_us']:.1f} | {ratio} | {r['pf_1us']:.4f} | {r['lost_deliveries']} | {r['late_fraction']:.5f} |"
    )
print()
best = {}
for r in rows:
    if r["pf_1us"] >= target and r["lost_deliveries"] == 0 and r["busiest_node_load"] <= 1.0:
        best[r["trees"]] = max(best.get(r["trees"], 0), r["rate"])
for k in sorted({r["trees"] for r in rows}):
    print(f"- K = {k}: highest rate with P(F@1µs) ≥ {target} and no loss: {best.get(k, 0):.0f} msg/s")
