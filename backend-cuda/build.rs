//! Build script: the one list of the crate's CUDA version features
//! (`cuda-NNNNN` in Cargo.toml, forwarded to cudarc), and the cfgs derived
//! from the version named, so that code gated on a range of versions names
//! the range instead of repeating the list.
//!
//! - `cuda_non_primary_context`: a version is named, and cudarc's bindings
//!   for it have `CudaContext::new_non_primary` (CUDA 13.1 and older).
//!
//! With no version named (cudarc then follows the installed toolkit, or
//! takes its newest bindings), no cfg is set.

/// Every `cuda-NNNNN` feature of Cargo.toml, oldest first: CUDA major * 1000
/// + minor * 10.
const CUDA_VERSIONS: [u32; 19] = [
    11040, 11050, 11060, 11070, 11080, 12000, 12010, 12020, 12030, 12040, 12050, 12060, 12080,
    12090, 13000, 13010, 13020, 13030, 13040,
];

/// The newest version whose cudarc bindings have
/// `CudaContext::new_non_primary`.
const LAST_WITH_NON_PRIMARY_CONTEXT: u32 = 13010;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(cuda_non_primary_context)");

    // A `cuda-NNNNN` feature this list lacks: the list is out of date.
    for (key, _) in std::env::vars() {
        if let Some(digits) = key.strip_prefix("CARGO_FEATURE_CUDA_") {
            if let Ok(v) = digits.parse::<u32>() {
                assert!(
                    CUDA_VERSIONS.contains(&v),
                    "feature cuda-{v} is not in build.rs's CUDA_VERSIONS: add it there"
                );
            }
        }
    }

    let named: Vec<u32> = CUDA_VERSIONS
        .iter()
        .copied()
        .filter(|v| std::env::var_os(format!("CARGO_FEATURE_CUDA_{v}")).is_some())
        .collect();
    if named.iter().any(|&v| v <= LAST_WITH_NON_PRIMARY_CONTEXT) {
        println!("cargo::rustc-cfg=cuda_non_primary_context");
    }
}
