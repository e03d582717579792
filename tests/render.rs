//! `metahook render` runs real Python and Node hooks on fixtures, with no cluster.

use std::process::Command;

use support_free::render;

mod support_free {
    use std::process::{Command, Output};

    /// Runs `metahook render ARGS` from the repository root.
    pub fn render(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_metahook"))
            .arg("render")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
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
