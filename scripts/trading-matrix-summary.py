#!/usr/bin/env python3
"""One Markdown table of a trading-matrix.sh run: DIR/*/summary.json."""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
rows = []
for p in sorted(root.glob("*/summary.json")):
    s = json.loads(p.read_text())
    if not isinstance(s, dict) or "profit_share" not in s:
        continue
    rows.append((p.parent.name, s))

print("| cell | model | ordering | shares P1/P2/P3/P4 (P4 slow path) | max dev | P(F@1µs) / P(F@5µs) at firms | window p99 at firms | OML p50 | buffer hold p50 / p99 | late | cheater flagged after | false flags |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, s in rows:
    shares = " / ".join(f"{x * 100:.1f}" for x in s["profit_share"])
    ordering = s["ordering"]
    if s.get("batch_us"):
        ordering += f" {s['batch_us']:g} µs"
    if s.get("dbo_bound_us"):
        ordering += f" (bound {s['dbo_bound_us']:.0f} µs)"
    flagged = s.get("cheater_flagged_after_orders")
    cheat = "—" if s.get("cheater") is None else (f"{flagged} orders" if flagged else "never")
    print(
        f"| {name} | {s['model']} | {ordering} | {shares} | {s['max_deviation_pp']:.1f} pp "
        f"| {s['pf_1us']:.4f} / {s['pf_5us']:.4f} | {s['window_p99_us']:.2f} µs | {s['oml_p50_us']:.1f} µs "
        f"| {s['order_hold_p50_us']:.1f} / {s['order_hold_p99_us']:.1f} µs | {s['ordering_stats']['late']} "
        f"| {cheat} | {s['false_flags']} |"
    )
