//! `metahook render` runs real Python and Node hooks on fixtures, with no cluster.
//!
//! Table-driven: each test is the list of runs it makes, each a [`Case`] (arguments, exit code, what
//! stdout and stderr must and must not contain), and [`check`] runs and checks them all, naming the case
//! in every failure. The tests that read `-o json` or set files up check the rest themselves.

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

/// One `metahook render` run and what it must show.
#[derive(Clone, Copy)]
struct Case<'a> {
    /// Which of its test's runs this is, named in every failure.
    name: &'a str,
    args: &'a [&'a str],
    /// The exit code, if the test checks it.
    exit: Option<i32>,
    /// What stdout must contain.
    stdout: &'a [&'a str],
    /// What stderr must contain.
    stderr: &'a [&'a str],
    /// What stdout must not contain.
    not_in_stdout: &'a [&'a str],
    /// The last line of stdout.
    last_line: Option<&'a str>,
    /// Nothing at all on stdout.
    empty_stdout: bool,
}

/// A run that succeeds and is checked for nothing more (rows say what else they check).
const OK: Case<'static> = Case {
    name: "render",
    args: &[],
    exit: Some(0),
    stdout: &[],
    stderr: &[],
    not_in_stdout: &[],
    last_line: None,
    empty_stdout: false,
};

impl Case<'_> {
    /// Runs `metahook render` with the case's arguments and checks all it says; returns stdout.
    fn check(&self) -> String {
        let out = render(self.args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        let name = self.name;
        if let Some(exit) = self.exit {
            assert_eq!(out.status.code(), Some(exit), "{name}: exit code; stderr: {stderr}");
        }
        for wanted in self.stdout {
            assert!(stdout.contains(wanted), "{name}: no {wanted:?} on stdout:\n{stdout}");
        }
        for wanted in self.stderr {
            assert!(stderr.contains(wanted), "{name}: no {wanted:?} on stderr:\n{stderr}");
        }
        for unwanted in self.not_in_stdout {
            assert!(!stdout.contains(unwanted), "{name}: {unwanted:?} on stdout:\n{stdout}");
        }
        if let Some(last) = self.last_line {
            assert_eq!(stdout.lines().last(), Some(last), "{name}: the last line of stdout");
        }
        if self.empty_stdout {
            assert!(stdout.is_empty(), "{name}: stdout must be empty: {stdout}");
        }
        stdout
    }
}

/// The one loop: every case of a test, in order.
fn check(cases: &[Case]) {
    for case in cases {
        case.check();
    }
}

/// The arguments for the render fixtures' controller (`tests/fixtures/render/controller.yaml`) with the
/// parent `parent` and the hook `hook` given by `hook_flag` (`--hook-cmd` or `--hook`).
fn fixture<'a>(parent: &'a str, hook_flag: &'a str, hook: &'a str) -> [&'a str; 6] {
    ["--controller", "tests/fixtures/render/controller.yaml", "--parent", parent, hook_flag, hook]
}

/// hello-world's controller, sample and hook, with observed Pods of every kind the hub's claim rules know.
const HELLO_WORLD_OBSERVED: &[&str] = &[
    "--controller",
    "examples-python/hello-world/controller.yaml",
    "--parent",
    "examples-python/hello-world/hello.yaml",
    "--children",
    "tests/fixtures/render/observed-pods.yaml",
    "--hook-cmd",
    "python3 examples-python/hello-world/hook.py",
];

#[test]
fn python_hook_renders_desired_children_status_and_diff_against_observed() {
    check(&[Case {
        args: HELLO_WORLD_OBSERVED,
        stdout: &[
            "message: Hello, World!",
            "pods: 2", // observed children reached the hook
            "# update Pod default/world-0",
            "-     - Hi, World!",
            "+     - Hello, World!",
            "# create Pod default/world-1",
            "# delete Pod default/world-9",
            "controller-uid: 00000000-0000-0000-0000-000000000000", // generateSelector label added
        ],
        ..OK
    }]);
}

#[test]
fn node_hook_renders_with_v2_keys_and_its_status() {
    check(&[Case {
        args: &fixture("tests/fixtures/render/parent.yaml", "--hook-cmd", "node tests/fixtures/render/hook.mjs"),
        stdout: &[
            "# create ConfigMap shop/w-0",
            "# create ConfigMap shop/w-1",
            "# create ConfigMap shop/w-2",
            "size: 3",
        ],
        ..OK
    }]);
}

#[test]
fn invalid_response_exits_non_zero_with_the_reason() {
    check(&[Case {
        args: &fixture("tests/fixtures/render/parent-bad.yaml", "--hook-cmd", "node tests/fixtures/render/hook.mjs"),
        exit: Some(1),
        stderr: &["v1/Secret is not a declared child resource"],
        empty_stdout: true, // nothing is rendered from an invalid response
        ..OK
    }]);
}

#[test]
fn unusable_input_exits_with_two() {
    check(&[
        Case {
            name: "a controller file that does not exist",
            args: &["--controller", "does/not/exist.yaml", "--parent", "tests/fixtures/render/parent.yaml"],
            exit: Some(2),
            stderr: &["does/not/exist.yaml"],
            ..OK
        },
        Case { name: "--help", args: &["--help"], exit: None, stdout: &["--hook-cmd"], ..OK },
    ]);
}

#[test]
fn objects_the_hub_would_not_own_are_shown_as_ignored_or_released_never_deleted() {
    check(&[Case {
        args: HELLO_WORLD_OBSERVED,
        stdout: &[
            // The hub's claim rules: an orphan the selector matches is adopted, and only then updated or deleted.
            "# update Pod default/world-0 (adopted first",
            "# delete Pod default/world-9 (adopted first",
            // Another app's Pod, and one another controller owns: none of this parent's business.
            "# ignore Pod default/other-app (no controller, and the parent's selector",
            "# ignore Pod default/owned-elsewhere (controlled by another owner)",
            // Owned by the parent, but no longer selected: released (ownerReference removed), not deleted.
            "# release Pod default/world-relabelled",
            "pods: 2", // the hook saw only the claimed children
        ],
        not_in_stdout: &[
            "# delete Pod default/other-app",
            "# delete Pod default/owned-elsewhere",
            "# delete Pod default/world-relabelled",
        ],
        last_line: Some("# summary: 1 created, 1 updated, 1 deleted, 2 adopted, 1 released, 2 ignored, status changed"),
        ..OK
    }]);
}

#[test]
fn hook_output_goes_to_stderr_and_the_report_alone_to_stdout() {
    check(&[Case {
        args: &[
            "--controller",
            "examples-python/hello-world/controller.yaml",
            "--parent",
            "examples-python/hello-world/hello.yaml",
            "--hook-cmd",
            "python3 examples-python/hello-world/hook.py",
        ],
        // hello-world's hook prints its address on stdout and logs each call on stderr.
        stderr: &["hello-world hook listening on 127.0.0.1:", "POST /sync"],
        not_in_stdout: &["listening"],
        last_line: Some("# summary: 2 created, 0 updated, 0 deleted, status changed"),
        ..OK
    }]);
}

#[test]
fn an_unreachable_hook_is_reported_with_the_root_cause() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/sync");
    check(&[Case {
        args: &fixture("tests/fixtures/render/parent.yaml", "--hook", &url),
        exit: Some(1),
        // The cause, not only "error sending request".
        stderr: &[&url, "Connection refused"],
        ..OK
    }]);
}

#[test]
fn json_output_is_one_object_with_actions_and_the_summary() {
    let stdout = Case { args: &[HELLO_WORLD_OBSERVED, &["-o", "json"]].concat(), ..OK }.check();
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
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
    check(&[Case {
        args: &[
            "--controller",
            "examples-python/namespace-defaults/controller.yaml",
            "--target",
            "examples-python/namespace-defaults/namespace.yaml",
            "--attachments",
            "tests/fixtures/render/namespace-attachments.yaml",
            "--hook-cmd",
            "python3 examples-python/namespace-defaults/hook.py",
        ],
        stdout: &[
            "# status: left alone",
            "# merged into Namespace team-a",
            "defaults.examples.metahook.dev/applied-tier: small",
            "# create ResourceQuota team-a/defaults",
            "# update ConfigMap team-a/namespace-defaults",
            "-   tier: large",
            "+   tier: small",
            "metacontroller.k8s.io/decorator-controller: namespace-defaults",
            "# ignore ConfigMap team-a/team-settings (not an attachment of this target",
            "# ignore ConfigMap team-a/other-decorator (not an attachment",
        ],
        last_line: Some(
            "# summary: 1 created, 1 updated, 0 deleted, 2 ignored, status unchanged, labels/annotations changed",
        ),
        ..OK
    }]);
}

#[test]
fn a_node_decorator_renders_its_finalize_hook() {
    let stdout = Case {
        args: &[
            "--controller",
            "examples-js/crd-roles/controller.yaml",
            "--target",
            "examples-js/crd-roles/gadgets-crd.yaml",
            "--finalizing",
            "--hook-cmd",
            "node examples-js/crd-roles/hook.mjs",
            "-o",
            "json",
        ],
        ..OK
    }
    .check();
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["controller"]["kind"], "DecoratorController");
    assert_eq!(report["finalized"], true, "no roles left: finalized");
    assert_eq!(report["attachments"], serde_json::json!([]));
}

#[test]
fn plurals_come_from_kube_rules_so_boxes_are_boxes() {
    check(&[Case {
        args: &[
            "--controller",
            "tests/fixtures/render/boxes-controller.yaml",
            "--parent",
            "tests/fixtures/render/boxes-parent.yaml",
            "--children",
            "tests/fixtures/render/boxes-observed.yaml",
            "--hook-cmd",
            "python3 tests/fixtures/render/boxes_hook.py",
        ],
        stderr: &["boxes hook: 3 observed children"],
        stdout: &[
            "# unchanged Box shop/depot-box",
            "# unchanged Policy shop/depot-policy",
            "# unchanged Gateway shop/depot-gateway",
            "# create Box shop/depot-box-2",
        ],
        ..OK
    }]);
}

/// The examples call serve() without a port: it comes from $PORT, which render sets.
#[test]
fn example_hooks_that_read_port_render_with_hook_cmd() {
    check(&[
        Case {
            name: "python: indexed-job",
            args: &[
                "--controller",
                "examples-python/indexed-job/controller.yaml",
                "--parent",
                "examples-python/indexed-job/job.yaml",
                "--hook-cmd",
                "python3 examples-python/indexed-job/hook.py",
            ],
            stdout: &["reason: Running"], // the Complete condition, set with set_condition
            ..OK
        },
        Case {
            name: "node: catset",
            args: &[
                "--controller",
                "examples-js/catset/controller.yaml",
                "--parent",
                "examples-js/catset/catset.yaml",
                "--hook-cmd",
                "node examples-js/catset/hook.mjs",
            ],
            stdout: &["# create Service"],
            ..OK
        },
    ]);
}

/// Step 1 of the README's path to the cluster: the in-cluster examples' hooks (whose controllers call a
/// Service) render on a laptop, the hook started by render on a free port.
#[test]
fn in_cluster_example_hooks_render_on_a_laptop() {
    let in_cluster = Case {
        stdout: &["# create ConfigMap default/world-greeting", "message: Hello, World!", "reason: Publishing"],
        last_line: Some("# summary: 1 created, 0 updated, 0 deleted, status changed"),
        ..OK
    };
    check(&[
        Case {
            name: "examples-python/in-cluster",
            args: &[
                "--controller",
                "examples-python/in-cluster/controller.yaml",
                "--parent",
                "examples-python/in-cluster/greeting.yaml",
                "--hook-cmd",
                "python3 examples-python/in-cluster/hook.py",
            ],
            ..in_cluster
        },
        Case {
            name: "examples-js/in-cluster",
            args: &[
                "--controller",
                "examples-js/in-cluster/controller.yaml",
                "--parent",
                "examples-js/in-cluster/greeting.yaml",
                "--hook-cmd",
                "node examples-js/in-cluster/hook.mjs",
            ],
            ..in_cluster
        },
    ]);
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
    let commands = [format!("python3 {}", python.display()), format!("node {}", node.display())];
    let args = commands.each_ref().map(|command| {
        [
            "--controller",
            "tests/fixtures/render/readme-controller.yaml",
            "--parent",
            "tests/fixtures/render/readme-greeting.yaml",
            "--hook-cmd",
            command.as_str(),
        ]
    });
    let cases = args.each_ref().map(|args| Case {
        name: args[5],
        args,
        stdout: &[
            "# create Pod default/hello-0",
            "# create Pod default/hello-1",
            "# event Normal Scaling: 0 -> 2 pods",
        ],
        ..OK
    });
    check(&cases);
}

#[test]
fn a_map_controller_renders_one_inputs_outputs_and_leaves_other_inputs_outputs_alone() {
    let map = |extra: &'static [&'static str]| -> Vec<&'static str> {
        [
            &[
                "--controller",
                "tests/fixtures/render/map/controller.yaml",
                "--parent",
                "tests/fixtures/render/map/parent.yaml",
                "--children",
                "tests/fixtures/render/map/outputs.yaml",
                "--kind",
                "copiers=Copier",
                "--hook-cmd",
                "python3 tests/fixtures/render/map/map_hook.py",
            ][..],
            extra,
        ]
        .concat()
    };
    let with_input = map(&["--input", "tests/fixtures/render/map/input.yaml"]);
    check(&[
        Case {
            name: "one input",
            args: &with_input,
            stdout: &[
                "# update ConfigMap team/settings-copy",
                "+   color: blue",
                "metahook.dev/map-key: 22222222-2222-2222-2222-222222222222",
                "metahook.dev/map-input: v1/ConfigMap team/settings",
                "# delete ConfigMap team/settings-old",
                "# ignore ConfigMap team/other-copy (an output of another input",
                "# ignore ConfigMap team/loose (not controlled by the parent",
            ],
            not_in_stdout: &["# delete ConfigMap team/other-copy", "# delete ConfigMap team/loose"],
            last_line: Some("# summary: 0 created, 1 updated, 1 deleted, 2 ignored, status unchanged"),
            ..OK
        },
        Case { name: "no input", args: &map(&[]), exit: Some(2), stderr: &["--input"], ..OK },
    ]);
}
