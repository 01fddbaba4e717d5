# Shared by the steps: the section headings, and the toolchain.

# Prints a section heading with the minutes and seconds since CI started.
section() { printf '== %s [%dm%02ds]\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }

# The stable components, the no_std target, and nightly's Miri.
toolchain() {
  section "toolchain"
  rustup component add rustfmt clippy
  rustup target add thumbv7em-none-eabihf
  rustup component add --toolchain nightly miri rust-src
  cargo --version
}
