//! The processes a benchmark runs beside the control plane: its Node hook (`hook.mjs`, `map-hook.mjs`,
//! `fair-hook.mjs`, each printing the port it listens on, as the test hook servers do), and the
//! controllers it stops as a rolling upgrade would. Each benchmark adds the questions it asks its hook
//! in an `impl Hook` of its own.

use std::time::Duration;

use crate::support;

/// A benchmark's Node hook, killed on drop.
pub struct Hook {
    pub port: u16,
    /// The hook process's pid, for its CPU time (`make bench` reads it).
    #[allow(dead_code)]
    pub pid: u32,
    pub http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Hook {
    /// Starts `node tests/bench/<script>` and waits for the port it announces.
    pub async fn start(script: &str) -> Self {
        let mut child = tokio::process::Command::new("node")
            .arg(support::repo_root().join("tests/bench").join(script))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting node tests/bench/{script}: {e}"));
        let port = support::port_line(&mut child).await;
        let pid = child.id().unwrap_or(0);
        Self { port, pid, http: reqwest::Client::new(), _child: child }
    }
}

/// SIGTERM, as a rolling upgrade would, and waits up to 10 s for `child` to go (then kills it).
pub async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}
