# What an application and a registry see: a downstream crate on the mock and
# on CUDA, the publish dry run, each crate's MSRV, the no_std build.

package() {
  section "downstream crate: one feature switches mock -> CUDA (13.0 bindings, not the default 12.8)"
  cargo run --release --manifest-path .ci/downstream/Cargo.toml --target-dir target/downstream
  cargo build --release --manifest-path .ci/downstream/Cargo.toml --target-dir target/downstream --features cuda
  # The same application with gpupool's default features off and CUDA 13.0 named.
  cargo build --release --manifest-path .ci/downstream-no-defaults/Cargo.toml --target-dir target/downstream

  section "publish dry run (every library crate, in dependency order, each built from its package)"
  # The dry run serves the packaged crates from a local registry keyed by the
  # package directory's path, and cargo reuses a crate's sources extracted under
  # CARGO_HOME by an earlier run from the same path if the version is the same
  # (0.1.0): a clone at a path used before would then build gpupool-cuda against
  # an old gpupool-core. Remove our crates' extractions from such local
  # registries (their names start with "-"; crates.io's do not).
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  rm -rf "$cargo_home"/registry/src/-*/gpupool-* "$cargo_home"/registry/cache/-*/gpupool-*
  cargo publish --dry-run --workspace --target-dir target/package

  section "MSRV (each crate's rust-version, with that toolchain)"
  # rust-version: core and mock 1.85; gpupool-cuda and the facade 1.88 (cudarc
  # 0.19.10 needs 1.87, libloading 0.9 needs 1.88). Libraries only: the lock
  # file's dev-dependencies may need newer toolchains.
  msrv_check 1.85 -p gpupool-core -p gpupool-mock
  msrv_check 1.85 -p gpupool-core --no-default-features
  msrv_check 1.88 -p gpupool-cuda -p gpupool --features gpupool/cuda,gpupool/nvrtc

  section "no_std build"
  cargo build -p gpupool-core --no-default-features --target thumbv7em-none-eabihf
}

# `cargo check` of the packages and features given, with toolchain $1.
msrv_check() {
  local toolchain=$1
  shift
  rustup toolchain install "$toolchain" --profile minimal
  cargo "+$toolchain" check --target-dir "target/msrv-$toolchain" "$@"
}
