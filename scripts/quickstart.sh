#!/usr/bin/env bash
# Builds fairfeed and runs its main job on the embedded default: generate a
# realistic TotalView-ITCH 5.0 feed (MoldUDP64, pcap), characterize it, decode it.
# Output lands in out/quickstart/. No external service is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "quickstart: cargo not found. Install Rust >= 1.85 (https://rustup.rs) and re-run." >&2
  exit 1
fi

echo "== building fairfeed (release)"
cargo build --release --quiet --bin fairfeed
ff=target/release/fairfeed
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
echo "Done. Captures are in $out/ (open them in Wireshark with: Decode As… UDP port 26477 → MoldUDP64)."
