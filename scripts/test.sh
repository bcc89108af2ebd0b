#!/usr/bin/env bash
# Installs everything the tests need and runs all of them:
#   - Debian's tshark (independent MoldUDP64 dissector) and PyPI's itchfeed
#     (independent ITCH 5.0 decoder), which the tests compare us against;
#   - formatting and clippy checks;
#   - iproute2, for the test that runs the tree across network namespaces;
#   - Debian's nats-server, the broker the bridge's tests publish into (each
#     test starts its own on a free loopback port);
#   - Debian's prometheus, for `promtool check metrics` on every node's
#     /metrics endpoint; PyPI's kubernetes-validate and check-jsonschema, for
#     the Kubernetes manifests and the Compose file `plan --emit` writes;
#   - Debian's chromium, headless, for the live dashboard's browser test;
#   - Debian's clang (BPF target), which builds the XDP de-duplicator and the
#     TC replicator that the namespace tests attach to veth interfaces, and
#     ethtool, for the replicator's checksum test;
#   - every unit, property, integration and doc test of the workspace, in release
#     mode, with FAIRFEED_REQUIRE_TOOLS=1 so a missing external tool fails loudly
#     (and, as root, FAIRFEED_REQUIRE_NETNS=1: the namespace test must run).
# Runs as root on a fresh Debian machine (CI) or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# clang with its BPF target compiles the eBPF programs during the build;
# ethtool turns off checksum offload so a test can see every UDP checksum checked.
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
command -v ethtool >/dev/null 2>&1 || [ -x /usr/sbin/ethtool ] || [ -x /sbin/ethtool ] || need_apt+=(ethtool)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections 2>/dev/null || true
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

need_pip=()
python3 -c "import itch.messages" >/dev/null 2>&1 || need_pip+=(itchfeed)
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

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release --quiet -- -D warnings

echo "== cargo test (release)"
if [ "$(id -u)" = "0" ]; then
  export FAIRFEED_REQUIRE_NETNS=1
  # Let sockets ask for the receive buffers bursts need (the kernel's default cap is 208 KiB).
  if [ "$(cat /proc/sys/net/core/rmem_max 2>/dev/null || echo 0)" -lt 8388608 ]; then
    was=$(cat /proc/sys/net/core/rmem_max 2>/dev/null || echo "?")
    if sysctl -q -w net.core.rmem_max=8388608 2>/dev/null; then
      echo "test.sh: raised net.core.rmem_max for this whole host from $was to 8388608 (undo: sysctl -w net.core.rmem_max=$was)"
    else
      echo "test.sh: could not raise net.core.rmem_max (continuing)"
    fi
  fi
fi
# The log goes to a temporary file, not target/ (CARGO_TARGET_DIR may put the build elsewhere).
log=$(mktemp "${TMPDIR:-/tmp}/fairfeed-test.XXXXXX.log")
FAIRFEED_REQUIRE_TOOLS=1 cargo test --workspace --release 2>&1 | tee "$log"
grep -q "test result: FAILED" "$log" && exit 1
summary=$(awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d skipped", p, f, i}' "$log")
rm -f "$log"
echo "$summary"
