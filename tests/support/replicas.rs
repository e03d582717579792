//! Hubs as the replicas of one Deployment: `metahook run` processes (the binary this test build made)
//! sharing one config file in a folder of their own, each with its own `POD_NAME` and its log (stdout and
//! stderr) in `<name>.log` there. The leader-election and sharding tests start, pause, kill and read them.

use std::path::PathBuf;
use std::process::Stdio;

use super::kubeconfig_path;

/// The folder of a set of replicas: their config file and their logs (gone when this is dropped).
pub struct Replicas {
    dir: tempfile::TempDir,
}

impl Replicas {
    /// A folder whose replicas run with the config file `config` (YAML).
    pub fn new(config: &str) -> Self {
        let replicas = Self { dir: tempfile::tempdir().unwrap() };
        std::fs::write(replicas.config_path(), config).unwrap();
        replicas
    }

    /// The config file every replica runs with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("metahook.yaml")
    }

    /// Starts replica `name` (its `POD_NAME`), with more arguments after `run` and more environment
    /// variables; killed when the handle is dropped.
    pub fn start(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Child {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
            .arg("run")
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .arg("--kubeconfig")
            .arg(kubeconfig_path())
            .env("POD_NAME", name)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting metahook run")
    }

    /// What replica `name` has logged so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// The config lines of a sharded replica: leader election and the ring on the test's own Lease and
/// ring (`label`, in `namespace`), with 6 s leases, and a rebalance every `rebalance_s` seconds.
pub fn sharded_config(label: &str, namespace: &str, rebalance_s: u64) -> String {
    format!(
        "leaderElection:\n  leaseName: {label}\n  leaseNamespace: {namespace}\n  leaseDuration: 6\n  \
         renewDeadline: 4\n  retryPeriod: 1\nsharding:\n  enabled: true\n  ring: {label}\n  \
         rebalanceInterval: {rebalance_s}\n"
    )
}
