//! How a benchmark was asked to run: `--full` or smoke-sized (what `cargo test` runs), each system on a
//! control plane started anew or all on the running one, and its sizes from the environment.

/// Whether this is a full run (`--full`, as `make bench-*` asks); otherwise a smoke-sized one.
pub fn full() -> bool {
    std::env::args().any(|a| a == "--full")
}

/// Whether a full run starts each system on a control plane of its own (`FRESH=0` keeps one). Only
/// the repository's own control plane can be started anew: never with `METAHOOK_TEST_KUBECONFIG`.
pub fn fresh() -> bool {
    let own_cluster = std::env::var_os("METAHOOK_TEST_KUBECONFIG").is_none();
    full() && own_cluster && std::env::var("FRESH").map_or(true, |v| v != "0")
}

/// The number in the environment variable `key` (`N`, `CHANGES`), else `default`.
pub fn number(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Prints the benchmark's `table` and writes it to `target/bench/<bench>-<n>.md`.
pub fn report(bench: &str, n: usize, table: &str) {
    println!("{table}");
    let out = crate::support::repo_root().join(format!("target/bench/{bench}-{n}.md"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, table).unwrap();
    eprintln!("[bench-{bench}] written to {}", out.display());
}
