#!/usr/bin/env bash
# Builds one binary holding two builds of gpupool, the one at REV and the
# working tree, timed against each other in one process
# (bench/same-process-rows/main.rs; the rows are the gpupool-rows crate,
# bench/rows/, compiled once against each build).
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
# 0.1.0-before, so cargo keeps the two copies of each crate apart. The rows
# crate's source always comes from the working tree (REV may predate it):
# it is copied twice, to rows-before/ (against REV's crates) and rows-after/
# (against the working tree's, or AFTER_REV's), each under a package name of
# its own; the binary's manifest is written to $SAME_PROCESS_ROWS_DIR/bench/.
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
# The CUDA version feature of the build in $1, where its gpupool-cuda has
# one (builds before 458e1d8 pin cudarc's version themselves).
cuda_features() {
  if grep -q '^cuda-12080 = ' "$1/backend-cuda/Cargo.toml"; then
    printf ', features = ["cuda-12080"]'
  fi
}
# The rows crate, twice: the working tree's source (the legacy rows for a
# build before the soundness change), each copy with a manifest naming one
# build's crates (the dependencies of bench/rows/Cargo.toml).
# $1: before or after; $2: the tree holding that build's crates.
rows_copy() {
  local dir=$work/rows-$1
  rm -rf "$dir"
  mkdir -p "$dir"
  if grep -q 'BackendId' "$2/core/src/lib.rs"; then
    cp -R "$root/bench/rows/src" "$dir/src"
  else
    # Before the soundness change: the same rows (src/rows.rs) in that API.
    mkdir -p "$dir/src"
    cp "$root/bench/rows/src/rows.rs" "$dir/src/rows.rs"
    cp "$root/bench/rows/legacy/lib.rs" "$dir/src/lib.rs"
  fi
  cat >"$dir/Cargo.toml" <<TOML
# Written by scripts/same-process-rows.sh: bench/rows/ of the working tree,
# against the gpupool in $2.
[package]
name = "gpupool-rows-$1"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
gpupool-core = { path = "$2/core", features = ["std"] }
gpupool-mock = { path = "$2/backend-mock" }
gpupool-cuda = { path = "$2/backend-cuda"$(cuda_features "$2") }
TOML
}
rows_copy before "$work/before"
rows_copy after "$after"
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
path = "$root/bench/same-process-rows/main.rs"

[dependencies]
rows_before = { package = "gpupool-rows-before", path = "../rows-before" }
rows_after = { package = "gpupool-rows-after", path = "../rows-after" }

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
