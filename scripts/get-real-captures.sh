#!/usr/bin/env bash
# Fetches the real NASDAQ TotalView-ITCH 5.0 captures the tests read — the
# Open Markets Initiative's public `omi-data-packets` collection, pinned to
# one commit — into DIR (default: $FAIRFEED_DATA_CACHE/itch50-real, or
# ~/.cache/fairfeed/itch50-real), and checks each file's SHA-256 against
# scripts/real-captures.sha256. Files already there and intact are kept.
# Needs curl and access to raw.githubusercontent.com (or FAIRFEED_CAPTURES_URL,
# a mirror with the same layout, e.g. file:///srv/omi-data-packets).
#   scripts/get-real-captures.sh [DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
manifest="$here/real-captures.sha256"
dir="${1:-${FAIRFEED_DATA_CACHE:-$HOME/.cache/fairfeed}/itch50-real}"
commit=288c0ea32341d2acd3feb6955cd21b5850fe7d0d
base="${FAIRFEED_CAPTURES_URL:-https://raw.githubusercontent.com/Open-Markets-Initiative/omi-data-packets/$commit}"
command -v curl >/dev/null 2>&1 || { echo "get-real-captures: curl is needed (apt-get install curl)" >&2; exit 1; }
mkdir -p "$dir"
fetched=0
while read -r sum name; do
  [ -n "$name" ] || continue
  out="$dir/$name"
  if [ -f "$out" ] && [ "$(sha256sum < "$out" | cut -c1-64)" = "$sum" ]; then continue; fi
  # Nasdaq_<collection>_<file>.pcap is Nasdaq/<collection>/<file>.pcap upstream.
  rest="${name#Nasdaq_}"
  path="Nasdaq/${rest%_*}/${rest##*_}"
  if ! curl -fsSL --retry 3 -o "$out.part" "$base/$path"; then
    rm -f "$out.part"
    echo "get-real-captures: could not fetch $base/$path" >&2
    exit 1
  fi
  got="$(sha256sum < "$out.part" | cut -c1-64)"
  if [ "$got" != "$sum" ]; then
    rm -f "$out.part"
    echo "get-real-captures: $path has SHA-256 $got, expected $sum" >&2
    exit 1
  fi
  mv "$out.part" "$out"
  fetched=$((fetched + 1))
done < "$manifest"
echo "get-real-captures: $(wc -l < "$manifest") captures in $dir ($fetched fetched)"
