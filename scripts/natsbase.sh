#!/usr/bin/env bash
# Builds tools/natsbase (NATS's Go client, the bridge bench's peer baseline)
# into $CARGO_TARGET_DIR (default target/) and prints the binary's path.
# Needs Go (the module cache fetches nats.go from the Go module proxy once).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-$PWD/target}/natsbase"
mkdir -p "$(dirname "$out")"
(cd tools/natsbase && go build -o "$out" .) >&2
echo "$out"
