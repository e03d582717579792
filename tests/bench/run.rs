//! How a benchmark was asked to run: `--full` or smoke-sized (what `cargo test` runs), each system on a
//! control plane started anew or all on the running one, and its sizes from the environment.

/// Whether this is a full run (`--full`, as `make bench-*` asks); otherwise a smoke-sized one.
pub fn full() -> bool {
    std::env::args().any(|a| a == "--full")
}

/// Whether a full run starts each system on a control plane of its own (`FRESH=0` keeps one). Only
/// the repository's own control plane can be started anew: never with `METAHOOK_TEST_KUBECONFIG`.
pub fn fresh(full: bool) -> bool {
    let own_cluster = std::env::var_os("METAHOOK_TEST_KUBECONFIG").is_none();
    full && own_cluster && std::env::var("FRESH").map_or(true, |v| v != "0")
}

/// The number in the environment variable `key` (`N`, `CHANGES`), else `default`.
pub fn number(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
