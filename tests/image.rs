//! The image `make image` builds (`deploy/image/build.sh`): an OCI image archive made offline, without a
//! container engine. The test builds one from the test binary, unpacks it as a runtime would (index →
//! manifest → config and layers, every blob checked against its digest), and runs `metahook version`
//! from the unpacked root filesystem with `chroot`, as the image's non-root user; and
//! `/usr/bin/metacontroller`, the command of Metacontroller's chart and manifest, which reads
//! Metacontroller's flags.
//!
//! The first run on a fresh machine builds the image tool from the Go module proxy (seconds; see
//! deploy/README.md). Needs root for chroot (as tests run here); it is skipped with a message otherwise.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Reads blob `digest` from the layout, checking that its content has that digest.
fn blob(layout: &Path, digest: &str) -> std::path::PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    let sum = run(Command::new("sha256sum").arg(&path));
    assert_eq!(sum.split_whitespace().next(), Some(hex), "blob {digest} does not match its digest");
    path
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_image_archive_unpacks_to_a_root_filesystem_that_runs_metahook_as_non_root() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("metahook-image.tar");
    run(Command::new("bash")
        .arg(support::repo_root().join("deploy/image/build.sh"))
        .arg(env!("CARGO_BIN_EXE_metahook"))
        .arg(&archive));
    let size = std::fs::metadata(&archive).unwrap().len();

    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&layout));
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    let entry = &index["manifests"][0];
    let reference = format!("ghcr.io/metahook/metahook:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], reference.as_str());
    let manifest = json(&blob(&layout, entry["digest"].as_str().unwrap()));
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let config = json(&blob(&layout, manifest["config"]["digest"].as_str().unwrap()));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532", "non-root");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/metahook"]), "no shell in the entrypoint");

    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
        let path = blob(&layout, layer["digest"].as_str().unwrap());
        run(Command::new("tar").arg("-xzf").arg(&path).arg("-C").arg(&rootfs));
    }
    for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox"] {
        assert!(!rootfs.join(shell).exists(), "the image has no shell, but {shell} exists");
    }
    assert!(rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file(), "CA certificates for https hooks");
    let link = std::fs::symlink_metadata(rootfs.join("usr/bin/metacontroller")).expect("/usr/bin/metacontroller");
    assert!(link.file_type().is_symlink(), "a link to /metahook, not a second copy of the binary");
    assert_eq!(std::fs::read_link(rootfs.join("usr/bin/metacontroller")).unwrap(), Path::new("/metahook"));

    if run(Command::new("id").arg("-u")).trim() != "0" {
        eprintln!("skipping the chroot run: it needs root");
        return;
    }
    let version = run(Command::new("chroot").arg("--userspec=65532:65532").arg(&rootfs).args(["/metahook", "version"]));
    assert_eq!(version.trim(), format!("metahook {}", env!("CARGO_PKG_VERSION")));
    let crds = run(Command::new("chroot").arg("--userspec=65532:65532").arg(&rootfs).args(["/metahook", "crds"]));
    assert!(crds.contains("compositecontrollers.metacontroller.k8s.io"));

    // Metacontroller's chart runs `command: /usr/bin/metacontroller`: the hub under that name reads
    // Metacontroller's flags (here `-help`, which needs no cluster; the full start is
    // tests/metacontroller_cli.rs), and refuses one it does not know with Go's status 2.
    let usage = run(Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(&rootfs)
        .args(["/usr/bin/metacontroller", "-help"]));
    assert!(usage.contains("-health-probe-bind-address") && usage.contains("-zap-log-level"), "{usage}");
    let unknown = Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(&rootfs)
        .args(["/usr/bin/metacontroller", "--zap-log-level=4", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("flag provided but not defined: --no-such-flag"), "{stderr}");
    println!(
        "image archive (from the test binary, debug build, stripped): {:.1} MiB, layout {} blobs",
        f64::from(u32::try_from(size).unwrap_or(u32::MAX)) / 1_048_576.0,
        std::fs::read_dir(layout.join("blobs/sha256")).unwrap().count()
    );
}
