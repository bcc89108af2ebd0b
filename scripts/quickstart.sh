#!/usr/bin/env bash
# Builds fairfeed and runs its main job on the embedded default: `fairfeed
# demo` — a generated TotalView-ITCH 5.0 feed through a fair multicast tree
# (sibling hedging, hold-and-release, emulated cloud links) to 100 receivers on
# loopback, beside direct unicast in the same run, with a report in out/demo/.
# Then a quick look at the feed itself: generate A/B lines, characterize,
# decode (out/quickstart/). No external service is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "quickstart: cargo not found. Install Rust >= 1.85 (https://rustup.rs) and re-run." >&2
  exit 1
fi

echo "== building fairfeed (release; the first build takes minutes, cargo shows its progress)"
# shellcheck source=scripts/fairfeed-bin.sh
source scripts/fairfeed-bin.sh   # (we are at the repository root)
ff=$bin

echo "== fairfeed demo: the fair multicast tree to 100 receivers on loopback beside direct unicast (~1 min)"
"$ff" demo --receivers 100 --seconds 10 --out out/demo
echo "== the same at 16 receivers, where direct unicast is faster (Jasper's table 1): out/demo16/report.md"
"$ff" demo --receivers 16 --seconds 5 --out out/demo16 > /dev/null

out=out/quickstart
mkdir -p "$out"

echo "== fairfeed gen: 1,000,000 messages, 500 symbols, plus A/B lines with 1% loss each"
"$ff" gen --seed 1 --messages 1000000 --symbols 500 --port 26477 --out "$out/feed.pcap" \
  --a-out "$out/a.pcap" --b-out "$out/b.pcap" --loss-a 0.01 --loss-b 0.01 --reorder-b 0.005

echo; echo "== fairfeed stats $out/feed.pcap"
"$ff" stats "$out/feed.pcap"

echo; echo "== fairfeed decode $out/feed.pcap (first 2 packets, then the summary)"
"$ff" decode "$out/feed.pcap" --limit 2 | cut -c1-160

echo; echo "== fairfeed decode $out/a.pcap --quiet (the A line: gaps where it lost packets)"
"$ff" decode "$out/a.pcap" --quiet

echo
echo "Done. The demo's reports: out/demo/report.md (100 receivers) and out/demo16/report.md (16), each with report.html and its plots."
echo "Captures are in $out/ (open them in Wireshark with: Decode As… UDP port 26477 → MoldUDP64)."
