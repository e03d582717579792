//! `metahook render` runs real Python and Node hooks on fixtures, with no cluster.

use std::process::Command;

use support_free::render;

mod support_free {
    use std::process::{Command, Output};

    /// Runs `metahook render ARGS` from the repository root, with the Python helper library importable
    /// (as after `pip install examples-python/metahook-hooks`).
    pub fn render(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_metahook"))
            .arg("render")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/examples-python/metahook-hooks"))
            .output()
            .expect("running metahook render")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn python_hook_renders_desired_children_status_and_diff_against_observed() {
    let out = render(&[
        "--controller",
        "examples-python/hello-world/controller.yaml",
        "--parent",
        "examples-python/hello-world/hello.yaml",
        "--children",
        "tests/fixtures/render/observed-pods.yaml",
        "--hook-cmd",
        "python3 examples-python/hello-world/hook.py",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(stdout.contains("message: Hello, World!"), "{stdout}");
    assert!(stdout.contains("pods: 2"), "observed children reached the hook: {stdout}");
    assert!(stdout.contains("# update Pod default/world-0"), "{stdout}");
    assert!(stdout.contains("-     - Hi, World!") && stdout.contains("+     - Hello, World!"), "{stdout}");
    assert!(stdout.contains("# create Pod default/world-1"), "{stdout}");
    assert!(stdout.contains("# delete Pod default/world-9"), "{stdout}");
    assert!(stdout.contains("controller-uid: 00000000-0000-0000-0000-000000000000"), "generateSelector label added");
}

#[test]
fn node_hook_renders_with_v2_keys_and_its_status() {
    let out = render(&[
        "--controller",
        "tests/fixtures/render/controller.yaml",
        "--parent",
        "tests/fixtures/render/parent.yaml",
        "--hook-cmd",
        "node tests/fixtures/render/hook.mjs",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    for i in 0..3 {
        assert!(stdout.contains(&format!("# create ConfigMap shop/w-{i}")), "{stdout}");
    }
    assert!(stdout.contains("size: 3"), "{stdout}");
}

#[test]
fn invalid_response_exits_non_zero_with_the_reason() {
    let out = render(&[
        "--controller",
        "tests/fixtures/render/controller.yaml",
        "--parent",
        "tests/fixtures/render/parent-bad.yaml",
        "--hook-cmd",
        "node tests/fixtures/render/hook.mjs",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("v1/Secret is not a declared child resource"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing is rendered from an invalid response");
}

#[test]
fn unusable_input_exits_with_two() {
    let out = render(&["--controller", "does/not/exist.yaml", "--parent", "tests/fixtures/render/parent.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("does/not/exist.yaml"));
    let status = Command::new(env!("CARGO_BIN_EXE_metahook")).arg("render").arg("--help").output().unwrap();
    assert!(text(&status.stdout).contains("--hook-cmd"));
}

#[test]
fn objects_the_hub_would_not_own_are_shown_as_ignored_or_released_never_deleted() {
    let out = render(&[
        "--controller",
        "examples-python/hello-world/controller.yaml",
        "--parent",
        "examples-python/hello-world/hello.yaml",
        "--children",
        "tests/fixtures/render/observed-pods.yaml",
        "--hook-cmd",
        "python3 examples-python/hello-world/hook.py",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    // The hub's claim rules: an orphan the selector matches is adopted, and only then updated or deleted.
    assert!(stdout.contains("# update Pod default/world-0 (adopted first"), "{stdout}");
    assert!(stdout.contains("# delete Pod default/world-9 (adopted first"), "{stdout}");
    // Another app's Pod, and one another controller owns: none of this parent's business.
    assert!(stdout.contains("# ignore Pod default/other-app (no controller, and the parent's selector"), "{stdout}");
    assert!(stdout.contains("# ignore Pod default/owned-elsewhere (controlled by another owner)"), "{stdout}");
    // Owned by the parent, but no longer selected: released (ownerReference removed), not deleted.
    assert!(stdout.contains("# release Pod default/world-relabelled"), "{stdout}");
    for name in ["other-app", "owned-elsewhere", "world-relabelled"] {
        assert!(!stdout.contains(&format!("# delete Pod default/{name}")), "{name} must not be deleted: {stdout}");
    }
    assert!(stdout.contains("pods: 2"), "the hook saw only the claimed children: {stdout}");
    let summary = stdout.lines().last().unwrap();
    assert_eq!(summary, "# summary: 1 created, 1 updated, 1 deleted, 2 adopted, 1 released, 2 ignored, status changed");
}

#[test]
fn hook_output_goes_to_stderr_and_the_report_alone_to_stdout() {
    let out = render(&[
        "--controller",
        "examples-python/hello-world/controller.yaml",
        "--parent",
        "examples-python/hello-world/hello.yaml",
        "--hook-cmd",
        "python3 examples-python/hello-world/hook.py",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // hello-world's hook prints its address on stdout and logs each call on stderr.
    assert!(stderr.contains("hello-world hook listening on 127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("POST /sync"), "{stderr}");
    assert!(!stdout.contains("listening"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("# summary: 2 created, 0 updated, 0 deleted, status changed"));
}

#[test]
fn an_unreachable_hook_is_reported_with_the_root_cause() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/sync");
    let out = render(&[
        "--controller",
        "tests/fixtures/render/controller.yaml",
        "--parent",
        "tests/fixtures/render/parent.yaml",
        "--hook",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&url), "{stderr}");
    assert!(stderr.contains("Connection refused"), "the cause, not only 'error sending request': {stderr}");
}

#[test]
fn json_output_is_one_object_with_actions_and_the_summary() {
    let out = render(&[
        "--controller",
        "examples-python/hello-world/controller.yaml",
        "--parent",
        "examples-python/hello-world/hello.yaml",
        "--children",
        "tests/fixtures/render/observed-pods.yaml",
        "--hook-cmd",
        "python3 examples-python/hello-world/hook.py",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(report["controller"], serde_json::json!({"kind": "CompositeController", "name": "hello-world"}));
    assert_eq!(report["status"]["message"], "Hello, World!");
    let action = |name: &str| {
        let children = report["children"].as_array().unwrap();
        let child = children.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{name} in {children:?}"));
        (child["action"].as_str().unwrap().to_owned(), child["adopted"].as_bool().unwrap())
    };
    assert_eq!(action("world-0"), ("update".to_owned(), true));
    assert_eq!(action("world-1"), ("create".to_owned(), false));
    assert_eq!(action("world-9"), ("delete".to_owned(), true));
    assert_eq!(action("other-app"), ("ignore".to_owned(), false));
    assert_eq!(action("world-relabelled"), ("release".to_owned(), false));
    let summary = &report["summary"];
    assert_eq!(
        (summary["created"].as_u64(), summary["updated"].as_u64(), summary["deleted"].as_u64()),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(summary["statusChanged"], true);
    assert!(report["children"][0]["object"]["metadata"]["ownerReferences"].is_array(), "desired objects in full");
}

#[test]
fn decorator_controllers_render_attachments_merged_labels_and_untouched_objects() {
    let out = render(&[
        "--controller",
        "examples-python/namespace-defaults/controller.yaml",
        "--target",
        "examples-python/namespace-defaults/namespace.yaml",
        "--attachments",
        "tests/fixtures/render/namespace-attachments.yaml",
        "--hook-cmd",
        "python3 examples-python/namespace-defaults/hook.py",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(stdout.contains("# status: left alone"), "{stdout}");
    assert!(stdout.contains("# merged into Namespace team-a"), "{stdout}");
    assert!(stdout.contains("defaults.examples.metahook.dev/applied-tier: small"), "{stdout}");
    assert!(stdout.contains("# create ResourceQuota team-a/defaults"), "{stdout}");
    assert!(stdout.contains("# update ConfigMap team-a/namespace-defaults"), "{stdout}");
    assert!(stdout.contains("-   tier: large") && stdout.contains("+   tier: small"), "{stdout}");
    assert!(stdout.contains("metacontroller.k8s.io/decorator-controller: namespace-defaults"), "{stdout}");
    assert!(stdout.contains("# ignore ConfigMap team-a/team-settings (not an attachment of this target"), "{stdout}");
    assert!(stdout.contains("# ignore ConfigMap team-a/other-decorator (not an attachment"), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("# summary: 1 created, 1 updated, 0 deleted, 2 ignored, status unchanged, labels/annotations changed")
    );
}

#[test]
fn a_node_decorator_renders_its_finalize_hook() {
    let out = render(&[
        "--controller",
        "examples-js/crd-roles/controller.yaml",
        "--target",
        "examples-js/crd-roles/gadgets-crd.yaml",
        "--finalizing",
        "--hook-cmd",
        "node examples-js/crd-roles/hook.mjs",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["controller"]["kind"], "DecoratorController");
    assert_eq!(report["finalized"], true, "no roles left: finalized");
    assert_eq!(report["attachments"], serde_json::json!([]));
}

#[test]
fn plurals_come_from_kube_rules_so_boxes_are_boxes() {
    let out = render(&[
        "--controller",
        "tests/fixtures/render/boxes-controller.yaml",
        "--parent",
        "tests/fixtures/render/boxes-parent.yaml",
        "--children",
        "tests/fixtures/render/boxes-observed.yaml",
        "--hook-cmd",
        "python3 tests/fixtures/render/boxes_hook.py",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("boxes hook: 3 observed children"), "{stderr}");
    for (kind, name) in [("Box", "depot-box"), ("Policy", "depot-policy"), ("Gateway", "depot-gateway")] {
        assert!(stdout.contains(&format!("# unchanged {kind} shop/{name}")), "{stdout}");
    }
    assert!(stdout.contains("# create Box shop/depot-box-2"), "{stdout}");
}

#[test]
fn example_hooks_that_read_port_render_with_hook_cmd() {
    // The examples call serve() without a port: it comes from $PORT, which render sets.
    let python = render(&[
        "--controller",
        "examples-python/indexed-job/controller.yaml",
        "--parent",
        "examples-python/indexed-job/job.yaml",
        "--hook-cmd",
        "python3 examples-python/indexed-job/hook.py",
    ]);
    let stdout = text(&python.stdout);
    assert!(python.status.success(), "stderr: {}", text(&python.stderr));
    assert!(stdout.contains("reason: Running"), "the Complete condition, set with set_condition: {stdout}");
    let node = render(&[
        "--controller",
        "examples-js/catset/controller.yaml",
        "--parent",
        "examples-js/catset/catset.yaml",
        "--hook-cmd",
        "node examples-js/catset/hook.mjs",
    ]);
    assert!(node.status.success(), "stderr: {}", text(&node.stderr));
    assert!(text(&node.stdout).contains("# create Service"), "{}", text(&node.stdout));
}

/// Step 1 of the README's path to the cluster: the in-cluster examples' hooks (whose controllers call a
/// Service) render on a laptop, the hook started by render on a free port.
#[test]
fn in_cluster_example_hooks_render_on_a_laptop() {
    for (dir, program) in [
        ("examples-python/in-cluster", "python3 examples-python/in-cluster/hook.py"),
        ("examples-js/in-cluster", "node examples-js/in-cluster/hook.mjs"),
    ] {
        let controller = format!("{dir}/controller.yaml");
        let parent = format!("{dir}/greeting.yaml");
        let out = render(&["--controller", &controller, "--parent", &parent, "--hook-cmd", program]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{dir}: {}", text(&out.stderr));
        assert!(stdout.contains("# create ConfigMap default/world-greeting"), "{dir}: {stdout}");
        assert!(stdout.contains("message: Hello, World!"), "{dir}: {stdout}");
        assert!(stdout.contains("reason: Publishing"), "{dir}: {stdout}");
        assert_eq!(stdout.lines().last(), Some("# summary: 1 created, 0 updated, 0 deleted, status changed"), "{dir}");
    }
}

/// The first code block of `section` in a README, with its language tag.
fn readme_block(readme: &str, section: &str, language: &str) -> String {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(readme)).unwrap();
    let after = &text[text.find(section).unwrap_or_else(|| panic!("{readme} has no {section}"))..];
    let start = after.find(&format!("```{language}\n")).unwrap() + language.len() + 4;
    let end = start + after[start..].find("```").unwrap();
    after[start..end].to_owned()
}

/// The libraries' READMEs show a 20-line hook; it must work as shown with `render --hook-cmd` (the hook
/// reads `PORT` through `serve()`: a hard-coded port made render wait 15 s and fail).
#[test]
fn the_readme_hooks_in_20_lines_render_as_shown() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("hook.py");
    std::fs::write(
        &python,
        readme_block("examples-python/metahook-hooks/README.md", "## A hook in 20 lines", "python"),
    )
    .unwrap();
    // The Node hook imports "metahook-hooks" by name, as an installed package.
    let node = dir.path().join("hook.mjs");
    std::fs::write(&node, readme_block("examples-js/metahook-hooks/README.md", "## A hook in 20 lines", "js")).unwrap();
    std::fs::create_dir(dir.path().join("node_modules")).unwrap();
    std::os::unix::fs::symlink(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples-js/metahook-hooks"),
        dir.path().join("node_modules/metahook-hooks"),
    )
    .unwrap();
    for command in [format!("python3 {}", python.display()), format!("node {}", node.display())] {
        let out = render(&[
            "--controller",
            "tests/fixtures/render/readme-controller.yaml",
            "--parent",
            "tests/fixtures/render/readme-greeting.yaml",
            "--hook-cmd",
            &command,
        ]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{command}: {}", text(&out.stderr));
        assert!(
            stdout.contains("# create Pod default/hello-0") && stdout.contains("# create Pod default/hello-1"),
            "{stdout}"
        );
        assert!(stdout.contains("# event Normal Scaling: 0 -> 2 pods"), "{stdout}");
    }
}
