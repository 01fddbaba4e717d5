#!/usr/bin/env bash
# ThreadSanitizer over the multi-threaded tests (nightly, std rebuilt with TSan).
#
#   bash scripts/tsan.sh            # the generic suite (stress included), the soundness tests, the stack's own tests
#
# Installs the nightly components it needs. Builds in target/tsan. Exits
# non-zero on any report (TSAN_OPTIONS halt_on_error=1).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup component add --toolchain nightly rust-src >/dev/null
target=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Zsanitizer=thread"
export RUSTDOCFLAGS="-Zsanitizer=thread"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
common=(+nightly test -Zbuild-std --target "$target" --target-dir target/tsan)

echo "== gpupool-core: stack tests under TSan"
cargo "${common[@]}" -p gpupool-core --lib
echo "== gpupool-tests: multi-threaded tests under TSan"
cargo "${common[@]}" -p gpupool-tests --test suite
cargo "${common[@]}" -p gpupool-tests --test mock -- soundness::
echo "== TSan: clean"
