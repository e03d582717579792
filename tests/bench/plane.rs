//! What the benchmarks (`main.rs`, `map.rs`) ask of the local control plane itself: to be started anew,
//! and the requests it has counted.

use kube::Client;

use crate::support;

/// `tests/cluster/down.sh`, then `up.sh`: the repository's control plane with no history (the scripts'
/// output goes to `target/bench/control-planes.log`).
pub async fn restart() {
    let log = support::repo_root().join("target/bench/control-planes.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    for script in ["down.sh", "up.sh"] {
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let status = tokio::process::Command::new("bash")
            .arg(support::repo_root().join("tests/cluster").join(script))
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .status()
            .await
            .unwrap_or_else(|e| panic!("running tests/cluster/{script}: {e}"));
        assert!(status.success(), "tests/cluster/{script} failed; see {}", log.display());
    }
}

/// One line of the API server's `apiserver_request_total`.
pub struct Requests {
    pub resource: String,
    pub subresource: String,
    pub verb: String,
    pub count: u64,
}

impl Requests {
    /// A write: the verbs that change an object.
    pub fn writes(&self) -> bool {
        matches!(self.verb.as_str(), "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE")
    }
}

/// The requests the API server has counted so far, by resource, subresource and verb.
pub async fn request_totals(client: &Client) -> Vec<Requests> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap_or_default();
    let mut totals = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let label = |name: &str| {
            let value = labels.split(&format!("{name}=\"")).nth(1).and_then(|rest| rest.split('"').next());
            value.unwrap_or_default().to_owned()
        };
        totals.push(Requests {
            resource: label("resource"),
            subresource: label("subresource"),
            verb: label("verb"),
            count: value.parse::<f64>().unwrap_or(0.0) as u64,
        });
    }
    totals
}
