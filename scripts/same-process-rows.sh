#!/usr/bin/env bash
# Builds one binary holding two builds of gpupool, the one at REV and the
# working tree, timed against each other in one process
# (scripts/same-process-rows/main.rs; the rows are backend-cuda's example 08).
# Builds here (no GPU needed); run the binary on the GPU machine:
#
#   scripts/same-process-rows.sh REV [DEST [AFTER_REV]]
#
# DEST defaults to .gpu/same-process-rows; with AFTER_REV, that revision
# stands in for the working tree (for bisecting a change between commits).
#   OUT=dir PAIRS=61 BLOCK_MS=5 ROWS=scratch .gpu/same-process-rows [--mock | --bare]
#
# REV's tree is exported to $SAME_PROCESS_ROWS_DIR/before (default
# /tmp/gpupool-same-process-rows) with its crates' version renamed
# 0.1.0-before, so cargo keeps the two copies of each crate apart; the
# binary's manifest is written to $SAME_PROCESS_ROWS_DIR/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/same-process-rows.sh REV [DEST [AFTER_REV]]}
dest=${2:-.gpu/same-process-rows}
after_rev=${3:-}
root=$PWD
# Outside the repository: cargo takes a path dependency below a workspace's
# root (this repository's) for a member of that workspace, so REV's crates
# there would be read as this workspace's (same version, a lockfile clash).
work=${SAME_PROCESS_ROWS_DIR:-${TMPDIR:-/tmp}/gpupool-same-process-rows}
rm -rf "$work/before"
mkdir -p "$work/before"
# -m: the files get the time of extraction, not of the commit, so cargo
# rebuilds when the tree there is another revision's.
git archive "$rev" | tar -x -m -C "$work/before"
# The workspace's version and the version requirements of its own crates.
sed -i -e 's/^version = "0\.1\.0"$/version = "0.1.0-before"/' \
  -e 's/\(path = "[a-z-]*", version = \)"0\.1\.0"/\1"=0.1.0-before"/' \
  "$work/before/Cargo.toml"
grep -q '0.1.0-before' "$work/before/Cargo.toml" || {
  echo "could not rename the version in $rev's Cargo.toml" >&2
  exit 1
}
after=$root
if [[ -n $after_rev ]]; then
  after=$work/after
  rm -rf "$after"
  mkdir -p "$after"
  git archive "$after_rev" | tar -x -m -C "$after"
fi
# The binary's package sits beside REV's tree, not above it: cargo makes path
# dependencies below a workspace's root members of that workspace.
mkdir -p "$work/bench"
# Seeded with this workspace's lockfile, so both builds use the same crates.io versions.
cp Cargo.lock "$work/bench/Cargo.lock"
cat >"$work/bench/Cargo.toml" <<TOML
# Written by scripts/same-process-rows.sh: gpupool at $rev against ${after_rev:-the working tree}.
[package]
name = "same-process-rows"
version = "0.0.0"
edition = "2021"
publish = false

[[bin]]
name = "same-process-rows"
path = "$root/scripts/same-process-rows/main.rs"

[dependencies]
gpupool_core_before = { package = "gpupool-core", path = "../before/core", features = ["std"] }
gpupool_cuda_before = { package = "gpupool-cuda", path = "../before/backend-cuda", features = ["cuda-12080"] }
gpupool_mock_before = { package = "gpupool-mock", path = "../before/backend-mock" }
gpupool_core_after = { package = "gpupool-core", path = "$after/core", features = ["std"] }
gpupool_cuda_after = { package = "gpupool-cuda", path = "$after/backend-cuda", features = ["cuda-12080"] }
gpupool_mock_after = { package = "gpupool-mock", path = "$after/backend-mock" }

[profile.release]
debug = false

[workspace]
TOML
cargo build --release --manifest-path "$work/bench/Cargo.toml" --target-dir "$work/target"
mkdir -p "$(dirname "$dest")"
cp "$work/target/release/same-process-rows" "$dest"
strip "$dest" 2>/dev/null || true
if [[ -n $after_rev ]]; then
  echo "built $dest: gpupool at $(git rev-parse --short "$rev") against $(git rev-parse --short "$after_rev")"
else
  echo "built $dest: gpupool at $(git rev-parse --short "$rev") against the working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with uncommitted changes'))"
fi
