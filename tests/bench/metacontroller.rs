//! The real Metacontroller as a bench system: its binary (`MC_BIN`, or built once from a snapshot of its
//! source, `MC_SRC`), its own CRDs, and its command line, tuned as issue 45 runs it.
//!
//! `mc-mix` (`mcmix.rs`) stays beside it: it makes Metacontroller's requests with our own client, so it
//! shows where those requests cost without Metacontroller's client and caches in the picture.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Metacontroller's own CRDs in a snapshot of its source.
const CRDS_IN_SOURCE: &str = "manifests/production/metacontroller-crds-v1.yaml";
/// Where `MC_SRC` is built to, under the repository's `target/`.
const BUILT: &str = "bench/metacontroller";

/// How to get Metacontroller when neither variable is set: the line the bench prints instead of running it.
pub const HOW_TO_GET: &str = "[bench] metacontroller: not run; give MC_SRC=<a clone of github.com/metacontroller/metacontroller> \
     (built once into target/bench/) or MC_BIN=<its built binary> to run it beside the other systems";

/// A Metacontroller binary and the CRDs that came with it.
#[derive(Debug, Clone)]
pub struct Metacontroller {
    pub bin: PathBuf,
    /// Its `metacontroller-crds-v1.yaml`, when known: from `MC_SRC`, or beside an `MC_BIN` built in its
    /// source tree. Without it, metahook's CRDs serve the same kinds.
    pub crds: Option<PathBuf>,
}

impl Metacontroller {
    /// From `MC_BIN`, else `MC_SRC` (building it into `target/bench/metacontroller` unless the binary
    /// there is newer than the source's HEAD); `None` when neither is set. Panics when the one given does
    /// not give a binary: a run asked for Metacontroller must not silently go without it.
    pub fn from_env(target: &Path) -> Option<Self> {
        let given = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(bin) = given("MC_BIN") {
            assert!(bin.is_file(), "MC_BIN={}: no such file", bin.display());
            let crds = given("MC_SRC")
                .or_else(|| bin.parent().map(Path::to_path_buf))
                .map(|dir| dir.join(CRDS_IN_SOURCE))
                .filter(|c| c.is_file());
            return Some(Self { bin, crds });
        }
        let src = given("MC_SRC")?;
        let bin = target.join(BUILT);
        if is_stale(&bin, &src) {
            eprintln!(
                "[bench] building Metacontroller from {} into {} (once; its modules come from the Go module proxy)",
                src.display(),
                bin.display()
            );
            let status = Command::new("go")
                .args(["build", "-o"])
                .arg(&bin)
                .arg("./pkg/cmd/metacontroller")
                .current_dir(&src)
                .status()
                .unwrap_or_else(|e| panic!("running go build in {}: {e}", src.display()));
            assert!(status.success(), "go build of Metacontroller in {} failed", src.display());
        }
        let crds = Some(src.join(CRDS_IN_SOURCE)).filter(|c| c.is_file());
        Some(Self { bin, crds })
    }

    /// Its command line for a controller labelled `metahook-test=<label>`: tuned (`--workers=5
    /// --client-go-qps=1000 --client-go-burst=2000`, where its defaults are 5 and 10 a second), its
    /// metrics and health on loopback ports of their own, no profiler, errors only in its log.
    pub fn args(label: &str, metrics_port: u16, health_port: u16) -> Vec<String> {
        vec![
            "--workers=5".into(),
            "--client-go-qps=1000".into(),
            "--client-go-burst=2000".into(),
            format!("--target-label-selector=metahook-test={label}"),
            format!("--metrics-address=127.0.0.1:{metrics_port}"),
            format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
            "--pprof-address=0".into(),
            format!("--zap-log-level={}", std::env::var("BENCH_MC_LOG").unwrap_or_else(|_| "error".into())),
        ]
    }
}

/// Whether `bin` must be built again from `src`: missing, or older than the source's HEAD commit (a
/// source that is not a git clone is built every time; Go's build cache makes that quick).
fn is_stale(bin: &Path, src: &Path) -> bool {
    let Some(built) = std::fs::metadata(bin).and_then(|m| m.modified()).ok() else { return true };
    let head = Command::new("git")
        .arg("-C")
        .arg(src)
        .args(["log", "-1", "--format=%ct", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u64>().ok());
    let Some(head) = head else { return true };
    built.duration_since(std::time::UNIX_EPOCH).map_or(true, |t| t.as_secs() <= head)
}
