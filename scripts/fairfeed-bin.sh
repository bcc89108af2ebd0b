# Sourced by the scripts: sets $root (the repository) and $bin (the
# fairfeed binary: $FAIRFEED if set, else built — or found up to date — by
# cargo, which says where it is, CARGO_TARGET_DIR or not). A binary left
# from older sources is never used: cargo rebuilds it first.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${FAIRFEED:-}" ]; then
  bin=$FAIRFEED
else
  bin=$(cd "$root" && cargo build --release --bin fairfeed --message-format=json-render-diagnostics \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "fairfeed":
        print(m["executable"])')
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "$(basename "$0"): no fairfeed binary (got: '$bin')" >&2
  exit 1
fi
