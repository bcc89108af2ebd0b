# Sourced by the experiment scripts: sets $root (the repository) and $bin
# (the fairfeed binary: $FAIRFEED if set, else $CARGO_TARGET_DIR/release/fairfeed,
# built first if absent).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bin=${FAIRFEED:-$target/release/fairfeed}
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p fairfeed)
fi
