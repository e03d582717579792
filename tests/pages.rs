//! The commands the tutorial and the operations page tell a user to run, run as written against the test
//! cluster, so a page cannot drift from the commands: a renamed flag, a moved file or a changed output
//! fails here.
//!
//! Every `sh`/`bash` block of those pages carries a marker just above it, an HTML comment mdBook does not
//! show:
//! - `<!-- page-test: run -->`: run here, in the page's order, by `bash -euo pipefail` in a sandbox (a
//!   directory whose entries link to the repository's, so relative paths work and nothing is written into
//!   the repository; `metahook`, `kubectl` and `helm` first on `PATH`, a fresh Python virtual environment
//!   activated, `KUBECONFIG` the test cluster's). A comment line of the block that quotes text in double
//!   quotes says what the block prints: each quoted text must be in its output.
//! - `<!-- page-test: make <target> -->`: run by `make test` as that target (the block is that command).
//! - `<!-- page-test: not run: <why> -->`: the few that cannot run here, with the reason.
//!
//! A block without a marker, or a marker not followed by a block, fails the test. Files a block expects
//! the user to have (a `controller.yaml`, a certificate pair) are made in the sandbox before it runs;
//! what the blocks create in the cluster is removed at the end.

mod support;

use std::path::Path;
use std::process::Command;

/// One shell block of a page and what its marker says about it.
#[derive(Debug)]
struct Block {
    line: usize,
    marker: String,
    code: String,
}

/// The `sh`/`bash` blocks of `page` (under docs/src) with their markers; panics on a block without one.
fn blocks(page: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(support::repo_root().join("docs/src").join(page)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if let Some(rest) = trimmed.strip_prefix("<!-- page-test:") {
            let marker = rest.trim_end().strip_suffix("-->").expect("a one-line marker").trim().to_owned();
            let fence = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or_default();
            assert!(
                fence == "```sh" || fence == "```bash",
                "{page}:{}: a page-test marker must be followed by a sh or bash block",
                i + 1
            );
            let indent = lines[i + 1].len() - fence.len();
            let mut code = String::new();
            let mut j = i + 2;
            while lines[j].trim_start() != "```" {
                code.push_str(lines[j].get(indent..).unwrap_or_default());
                code.push('\n');
                j += 1;
            }
            found.push(Block { line: i + 2, marker, code });
            i = j + 1;
            continue;
        }
        if trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell" || trimmed == "```console" {
            panic!(
                "{page}:{}: a shell block without a page-test marker (run, make <target>, or not run: <why>)",
                i + 1
            );
        }
        i += 1;
    }
    found
}

/// The double-quoted texts of the block's comment lines: what it says it prints.
fn promised_output(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .flat_map(|comment| comment.split('"').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>())
        .filter(|t| !t.is_empty())
        .collect()
}

/// A directory that looks like the repository to a block: a link for each top-level entry but the
/// build output, a bin directory with the tools, and a Python virtual environment.
struct Sandbox {
    dir: tempfile::TempDir,
    path: String,
}

impl Sandbox {
    fn new() -> Self {
        let root = support::repo_root();
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&root).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if [".git", "target", ".cluster", "node_modules"].contains(&name.to_str().unwrap()) {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).unwrap();
        }
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_metahook"), bin.join("metahook")).unwrap();
        for tool in ["kubectl", "helm"] {
            std::os::unix::fs::symlink(root.join("tests/cluster/bin").join(tool), bin.join(tool)).unwrap();
        }
        let venv = dir.path().join(".venv");
        run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv");
        let path =
            format!("{}:{}:{}", venv.join("bin").display(), bin.display(), std::env::var("PATH").unwrap_or_default());
        Self { dir, path }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `code` as the page's reader would, in the sandbox; returns stdout and stderr together.
    fn run(&self, page: &str, block: &Block) -> String {
        let mut command = Command::new("timeout");
        command
            .args(["300", "bash", "-euo", "pipefail", "-c", &block.code])
            .current_dir(self.path())
            .env("PATH", &self.path)
            .env("VIRTUAL_ENV", self.path().join(".venv"))
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("npm_config_update_notifier", "false")
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
        let output = command.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(
            output.status.success(),
            "{page}:{}: the block failed ({}):\n{}\n---- output ----\n{text}",
            block.line,
            output.status,
            block.code
        );
        for promised in promised_output(&block.code) {
            assert!(
                text.contains(&promised),
                "{page}:{}: the block says it prints {promised:?}; it printed:\n{text}",
                block.line
            );
        }
        text
    }
}

fn run_ok(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

fn kubectl(args: &[&str]) -> String {
    run_ok(
        Command::new(support::repo_root().join("tests/cluster/bin/kubectl"))
            .args(args)
            .env("KUBECONFIG", support::kubeconfig_path()),
        &format!("kubectl {args:?}"),
    )
}

/// The cluster up, the metahook CRDs in, helm built.
fn cluster() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = support::client().await;
        support::install_metahook_crds(&client).await;
    });
    run_ok(
        Command::new("bash").arg(support::repo_root().join("deploy/helm/tools/build.sh")),
        "deploy/helm/tools/build.sh",
    );
}

/// The markers of `page` that are not `run`: each says why, or names a target `make test` runs.
fn check_not_run(page: &str, blocks: &[Block]) {
    let makefile = std::fs::read_to_string(support::repo_root().join("Makefile")).unwrap();
    let test_target = makefile.lines().find(|l| l.starts_with("test:")).expect("a test target");
    for block in blocks {
        if block.marker == "run" {
            continue;
        }
        if let Some(target) = block.marker.strip_prefix("make ") {
            assert_eq!(block.code.trim(), format!("make {target}"), "{page}:{}: the block is the target", block.line);
            assert!(
                test_target.split_whitespace().any(|t| t == target),
                "{page}:{}: `make test` must run `{target}`: {test_target}",
                block.line
            );
        } else {
            let why = block.marker.strip_prefix("not run:").map(str::trim).unwrap_or_default();
            assert!(
                why.len() > 20,
                "{page}:{}: `{}`: say `run`, `make <target>` or `not run: <why>`",
                block.line,
                block.marker
            );
        }
    }
}

#[test]
fn the_tutorials_commands_run_as_written() {
    let page = "tutorial.md";
    let blocks = blocks(page);
    check_not_run(page, &blocks);
    cluster();
    let sandbox = Sandbox::new();
    let cleanup = Cleanup(vec![
        "kubectl delete --ignore-not-found --wait=false -f examples-python/in-cluster/greeting.yaml".into(),
        "kubectl kustomize --load-restrictor LoadRestrictionsNone examples-python/in-cluster | kubectl delete --ignore-not-found --wait=false -f -".into(),
    ], &sandbox);
    let mut ran = 0;
    for block in blocks.iter().filter(|b| b.marker == "run") {
        let output = sandbox.run(page, block);
        ran += 1;
        if block.code.contains("kubectl get greetings") {
            assert!(
                output.contains("greeting.example.metahook.dev/world") || output.contains("world"),
                "the Greeting is listed:\n{output}"
            );
        }
    }
    assert!(ran >= 3, "{ran} blocks ran");
    // What the blocks left behind is what they say: the libraries installed, the example applied.
    let venv_python = sandbox.path().join(".venv/bin/python");
    run_ok(Command::new(venv_python).args(["-c", "import metahook_hooks"]), "the Python library is installed");
    assert!(sandbox.path().join("node_modules/metahook-hooks/package.json").exists(), "the Node library is installed");
    kubectl(&["get", "-n", "hooks", "deployment/greeter-py"]);
    drop(cleanup);
}

#[test]
fn the_operations_pages_commands_run_as_written() {
    let page = "operations.md";
    let blocks = blocks(page);
    check_not_run(page, &blocks);
    cluster();
    let sandbox = Sandbox::new();
    // What the page's reader has: a controller of theirs, a serving certificate pair, the Prometheus
    // Operator's ServiceMonitor type (the chart's ServiceMonitor needs it).
    std::fs::copy(
        support::repo_root().join("examples-python/in-cluster/controller.yaml"),
        sandbox.path().join("controller.yaml"),
    )
    .unwrap();
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
            .args(["-days", "1", "-subj", "/CN=metahook-metrics.metahook.svc", "-keyout", "tls.key", "-out", "tls.crt"])
            .current_dir(sandbox.path()),
        "openssl req",
    );
    let crd = support::repo_root().join("tests/fixtures/servicemonitor-crd.yaml");
    kubectl(&["apply", "--server-side", "-f", crd.to_str().unwrap()]);
    let cleanup = Cleanup(
        vec![
            "helm uninstall metahook --namespace metahook --ignore-not-found --wait".into(),
            "metahook rbac -f controller.yaml --related v1/namespaces | kubectl delete --ignore-not-found -f -".into(),
            "kubectl delete namespace metahook --ignore-not-found --wait=false".into(),
        ],
        &sandbox,
    );
    let hub_config =
        || kubectl(&["get", "configmaps", "-n", "metahook", "-l", "app.kubernetes.io/instance=metahook", "-o", "json"]);
    let mut ran = 0;
    for block in blocks.iter().filter(|b| b.marker == "run") {
        sandbox.run(page, block);
        ran += 1;
        // What each block is there for reached the cluster.
        if block.code.contains("config.workers=10") {
            let config = hub_config();
            assert!(config.contains("workers: 10"), "config.workers=10 reached the hub's configuration:\n{config}");
        }
        if block.code.contains("metahook rbac") {
            let roles = kubectl(&["get", "clusterroles", "-l", "metahook.dev/aggregate-to-hub=true", "-o", "name"]);
            assert!(roles.contains("greeter-py"), "the controller's role is applied: {roles}");
        }
        if block.code.contains("metrics.tls.secretName") {
            let config = hub_config();
            assert!(config.contains("metricsCertDir"), "metrics.tls.secretName reached the configuration:\n{config}");
            let scheme = kubectl(&[
                "get",
                "servicemonitors",
                "-n",
                "metahook",
                "-o",
                "jsonpath={.items[0].spec.endpoints[0].scheme}",
            ]);
            assert_eq!(scheme.trim(), "https", "the ServiceMonitor scrapes in HTTPS");
        }
    }
    assert!(ran >= 3, "{ran} blocks ran");
    drop(cleanup);
}

/// Runs the commands in the sandbox when the test ends, passing or not.
struct Cleanup<'a>(Vec<String>, &'a Sandbox);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for command in &self.0 {
            let _ = Command::new("bash")
                .args(["-c", command])
                .current_dir(self.1.path())
                .env("PATH", &self.1.path)
                .env("KUBECONFIG", support::kubeconfig_path())
                .output();
        }
    }
}
