#!/usr/bin/env bash
# Installs everything the tests need and runs all of them:
#   - Debian's tshark (independent MoldUDP64 dissector), PyPI's itchfeed
#     (independent ITCH 5.0 decoder) and MeatPy (independent ITCH 5.0 order
#     book builder), which the tests compare us against;
#   - formatting and clippy checks;
#   - iproute2, for the test that runs the tree across network namespaces;
#   - Debian's nats-server, the broker the bridge's tests publish into (each
#     test starts its own on a free loopback port);
#   - Debian's prometheus, for `promtool check metrics` on every node's
#     /metrics endpoint; PyPI's kubernetes-validate and check-jsonschema, for
#     the Kubernetes manifests and the Compose file `plan --emit` writes;
#   - Debian's chromium, headless, for the live dashboard's browser test;
#   - Debian's chrony, whose chronyd a test starts twice on loopback (with -x:
#     it never touches the host's clock) for `--clock system --host-clock chrony`;
#   - Debian's clang (BPF target), which builds the XDP de-duplicator and the
#     TC replicator that the namespace tests attach to veth interfaces, and
#     ethtool, for the replicator's checksum test;
#   - the real NASDAQ captures some tests read: ../shared/data/itch50-real beside
#     the checkout when it is there, else fetched once by scripts/get-real-captures.sh
#     into a cache (FAIRFEED_DATA_CACHE, default ~/.cache/fairfeed); without
#     either, one line says how to get them and the script stops;
#   - every unit, property, integration and doc test of the workspace, in release
#     mode, every test binary whatever fails before it, with
#     FAIRFEED_REQUIRE_TOOLS=1 so a missing external tool fails loudly
#     (and, as root, FAIRFEED_REQUIRE_NETNS=1: the namespace test must run);
#     one summary line at the end ("N passed, N failed, N skipped"); each test
#     binary under a wall-clock limit (FAIRFEED_TEST_BINARY_TIMEOUT, 900 s), so
#     a hang fails its binary with a TIMEOUT line and the rest still run.
# Runs as root on a fresh Debian machine (CI) or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# clang with its BPF target compiles the eBPF programs during the build;
# ethtool turns off checksum offload so a test can see every UDP checksum checked.
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
command -v ethtool >/dev/null 2>&1 || [ -x /usr/sbin/ethtool ] || [ -x /sbin/ethtool ] || need_apt+=(ethtool)
# chrony: a test starts two chronyd of its own (-x: never the host's clock).
command -v chronyc >/dev/null 2>&1 || need_apt+=(chrony)
# linuxptp: a test runs two ptp4l (a grandmaster and a free-running slave,
# never the host's clock) in network namespaces it makes, read through pmc.
command -v pmc >/dev/null 2>&1 || [ -x /usr/sbin/pmc ] || need_apt+=(linuxptp)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections 2>/dev/null || true
  $SUDO apt-get update -qq
  # Packages with daemons (chrony, nats-server) must not start them on this
  # host: a policy-rc.d that refuses, where none is in place, for the install only.
  policy_added=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null && $SUDO chmod +x /usr/sbin/policy-rc.d && policy_added=1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  if [ -n "$policy_added" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
fi

need_pip=()
python3 -c "import itch.messages" >/dev/null 2>&1 || need_pip+=(itchfeed)
python3 -c "import meatpy.itch50" >/dev/null 2>&1 || need_pip+=(meatpy==0.5.0)
command -v kubernetes-validate >/dev/null 2>&1 || need_pip+=(kubernetes-validate)
command -v check-jsonschema >/dev/null 2>&1 || need_pip+=(check-jsonschema)
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "== installing ${need_pip[*]} (pip)"
  python3 -m pip install --quiet "${need_pip[@]}" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "${need_pip[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo not found. Install Rust >= 1.85 (https://rustup.rs) and re-run." >&2
  exit 1
fi

# The real NASDAQ captures (never copied into the repository): beside the
# checkout in ../shared when it is there, else a cache the fetch script fills.
if [ -z "${FAIRFEED_ITCH_REAL:-}" ]; then
  if [ -d ../shared/data/itch50-real ]; then
    FAIRFEED_ITCH_REAL="$(cd ../shared/data/itch50-real && pwd)"
  else
    FAIRFEED_ITCH_REAL="${FAIRFEED_DATA_CACHE:-$HOME/.cache/fairfeed}/itch50-real"
    echo "== real captures: ../shared/data/itch50-real is not here; using $FAIRFEED_ITCH_REAL"
    if ! ./scripts/get-real-captures.sh "$FAIRFEED_ITCH_REAL" >/dev/null 2>&1; then
      echo "test.sh: the real NASDAQ captures are missing: run scripts/get-real-captures.sh (needs raw.githubusercontent.com), or set FAIRFEED_ITCH_REAL to a directory holding them" >&2
      exit 1
    fi
  fi
fi
export FAIRFEED_ITCH_REAL

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release --quiet -- -D warnings

echo "== cargo test (release)"
if [ "$(id -u)" = "0" ]; then
  export FAIRFEED_REQUIRE_NETNS=1
  # Let sockets ask for the receive buffers bursts need (the kernel's default
  # cap is 208 KiB); this changes the whole host, so it is said, and undone at exit.
  was=$(cat /proc/sys/net/core/rmem_max 2>/dev/null || echo 0)
  if [ "$was" -lt 8388608 ]; then
    if sysctl -q -w net.core.rmem_max=8388608 2>/dev/null; then
      echo "test.sh: raised net.core.rmem_max for this whole host from $was to 8388608 for the tests (restored at exit)"
      trap 'sysctl -q -w net.core.rmem_max='"$was"' 2>/dev/null && echo "test.sh: net.core.rmem_max restored to '"$was"'"' EXIT
    else
      echo "test.sh: could not raise net.core.rmem_max (continuing)"
    fi
  fi
fi
# Every test binary runs, whatever fails before it (--no-fail-fast); one
# summary line at the end. The log goes to a temporary file, not target/
# (CARGO_TARGET_DIR may put the build elsewhere).
# Each test binary runs under a wall-clock limit (scripts/test-runner.sh as
# cargo's runner): a hung test stops its own binary with a TIMEOUT line and
# the others still run.
log=$(mktemp "${TMPDIR:-/tmp}/fairfeed-test.XXXXXX.log")
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$host")_RUNNER"
export "$runner_var=$PWD/scripts/test-runner.sh"
set +e
FAIRFEED_REQUIRE_TOOLS=1 cargo test --workspace --release --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
summary=$(awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d skipped", p, f, i}' "$log")
failing=$(grep -E "^    [A-Za-z0-9_:]+$" "$log" | sed 's/^ *//' | sort -u | head -20 | tr '\n' ' ' || true)
timedout=$(grep -o "TIMEOUT [^ ]*" "$log" | sed 's/^TIMEOUT //' | sort -u | tr '\n' ' ' || true)
[ -n "$timedout" ] && failing="$failing(timed out: $timedout)"
rm -f "$log"
if [ "$status" -ne 0 ] || grep -q " [1-9][0-9]* failed" <<<"$summary"; then
  [ -n "$failing" ] && echo "failing: $failing"
  echo "$summary"
  exit 1
fi
echo "$summary"
