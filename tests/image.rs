//! The image `make image` builds (`deploy/image/build.sh`): an OCI image archive made offline, without a
//! container engine, from Debian packages. The tests build one from the test binary, unpack it as a
//! runtime would (index → manifest → config and layers, every blob checked against its digest), and run
//! `metahook version` from the unpacked root filesystem with `chroot`, as the image's non-root user; and
//! `/usr/bin/metacontroller`, the command of Metacontroller's chart and manifest, which reads
//! Metacontroller's flags. They check that the dpkg status the image keeps for scanners says what is in
//! it (every file of every package, with its checksum), that the SPDX SBOM beside the archive lists those
//! packages, the binary and its crates, that the platform is the build host's, and that two builds in
//! different directories give the same digest.
//!
//! The first run on a fresh machine builds the image tool from the Go module proxy and downloads the
//! Debian packages into target/image-debs/ (seconds; see deploy/README.md). Needs root for chroot (as
//! tests run here); that part is skipped with a message otherwise.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    assert_eq!(sha256(&path), hex, "blob {digest} does not match its digest");
    path
}

fn sha256(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path)).split_whitespace().next().unwrap().to_owned()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// One run of `deploy/image/build.sh` on the test binary, into `dir` (emptied first): the archive and
/// the SBOM beside it.
struct Build {
    archive: PathBuf,
    sbom: PathBuf,
}

fn build(dir: &Path) -> Build {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let archive = dir.join("metahook-image.tar");
    run(Command::new("bash")
        .arg(support::repo_root().join("deploy/image/build.sh"))
        .arg(env!("CARGO_BIN_EXE_metahook"))
        .arg(&archive));
    let sbom = dir.join("metahook-image.spdx.json");
    assert!(sbom.is_file(), "no SBOM next to the archive: {}", sbom.display());
    Build { archive, sbom }
}

/// The build both tests look at (under target/tmp, so that it is not left behind in /tmp: the next run
/// replaces it), made once per test run.
fn first_build() -> &'static Build {
    static BUILD: OnceLock<Build> = OnceLock::new();
    BUILD.get_or_init(|| build(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("image/first")))
}

/// The image unpacked as a runtime would: the layout, its index entry, manifest and config, and the
/// root filesystem from its layers.
struct Unpacked {
    _dir: tempfile::TempDir,
    layout: PathBuf,
    index: Value,
    manifest_digest: String,
    config: Value,
    rootfs: PathBuf,
}

fn unpack(archive: &Path) -> Unpacked {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(&layout));
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    let entry = &index["manifests"][0];
    let manifest_digest = entry["digest"].as_str().unwrap().to_owned();
    let manifest = json(&blob(&layout, &manifest_digest));
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let config = json(&blob(&layout, manifest["config"]["digest"].as_str().unwrap()));
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
        let path = blob(&layout, layer["digest"].as_str().unwrap());
        run(Command::new("tar").arg("-xzf").arg(&path).arg("-C").arg(&rootfs));
    }
    Unpacked { _dir: dir, layout, index, manifest_digest, config, rootfs }
}

/// The OCI (Go) name of the architecture this test runs on, which is the build host's.
fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[test]
fn the_image_archive_unpacks_to_a_root_filesystem_that_runs_metahook_as_non_root() {
    let built = first_build();
    let size = std::fs::metadata(&built.archive).unwrap().len();
    let image = unpack(&built.archive);
    let entry = &image.index["manifests"][0];
    let reference = format!("ghcr.io/metahook/metahook:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], reference.as_str());
    let config = &image.config;
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], host_architecture(), "the build host's architecture");
    assert_eq!(entry["platform"]["architecture"], host_architecture(), "the index names the platform too");
    assert_eq!(config["config"]["User"], "65532:65532", "non-root");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/metahook"]), "no shell in the entrypoint");

    let rootfs = &image.rootfs;
    for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox", "usr/bin/dpkg", "usr/bin/apt"] {
        assert!(!rootfs.join(shell).exists(), "the image has no shell or package manager, but {shell} exists");
    }
    assert!(rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file(), "CA certificates for https hooks");
    let link = std::fs::symlink_metadata(rootfs.join("usr/bin/metacontroller")).expect("/usr/bin/metacontroller");
    assert!(link.file_type().is_symlink(), "a link to /metahook, not a second copy of the binary");
    assert_eq!(std::fs::read_link(rootfs.join("usr/bin/metacontroller")).unwrap(), Path::new("/metahook"));

    if run(Command::new("id").arg("-u")).trim() != "0" {
        eprintln!("skipping the chroot run: it needs root");
        return;
    }
    let version = run(Command::new("chroot").arg("--userspec=65532:65532").arg(rootfs).args(["/metahook", "version"]));
    assert_eq!(version.trim(), format!("metahook {}", env!("CARGO_PKG_VERSION")));
    let crds = run(Command::new("chroot").arg("--userspec=65532:65532").arg(rootfs).args(["/metahook", "crds"]));
    assert!(crds.contains("compositecontrollers.metacontroller.k8s.io"));

    // Metacontroller's chart runs `command: /usr/bin/metacontroller`: the hub under that name reads
    // Metacontroller's flags (here `-help`, which needs no cluster; the full start is
    // tests/metacontroller_cli.rs), and refuses one it does not know with Go's status 2.
    let usage = run(Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(rootfs)
        .args(["/usr/bin/metacontroller", "-help"]));
    assert!(usage.contains("-health-probe-bind-address") && usage.contains("-zap-log-level"), "{usage}");
    let unknown = Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(rootfs)
        .args(["/usr/bin/metacontroller", "--zap-log-level=4", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("flag provided but not defined: --no-such-flag"), "{stderr}");
    println!(
        "image archive (from the test binary, debug build, stripped): {:.1} MiB, layout {} blobs",
        f64::from(u32::try_from(size).unwrap_or(u32::MAX)) / 1_048_576.0,
        std::fs::read_dir(image.layout.join("blobs/sha256")).unwrap().count()
    );
}

/// The fields of a dpkg control stanza (continuation lines left out).
fn control_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with([' ', '\t']))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// Where `path` leads inside `rootfs`, following symbolic links as the image's loader would (an
/// absolute target is relative to the image's root, not the host's).
fn resolve_in(rootfs: &Path, path: &str) -> String {
    let mut path = PathBuf::from(path);
    for _ in 0..10 {
        let Ok(target) = std::fs::read_link(rootfs.join(path.strip_prefix("/").unwrap())) else { break };
        path = if target.is_absolute() { target } else { path.parent().unwrap().join(target) };
    }
    path.display().to_string()
}

/// `name version` → checksum of every package in Cargo.lock.
fn cargo_lock() -> BTreeMap<String, Option<String>> {
    let text = std::fs::read_to_string(support::repo_root().join("Cargo.lock")).unwrap();
    let mut packages = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key} = \"")))
                .map(|v| v.trim_end_matches('"').to_owned())
        };
        packages.insert(format!("{} {}", field("name").unwrap(), field("version").unwrap()), field("checksum"));
    }
    packages
}

#[test]
fn the_dpkg_status_and_the_sbom_say_what_the_image_holds() {
    let built = first_build();
    let image = unpack(&built.archive);
    let rootfs = &image.rootfs;

    // dpkg's status, as distroless keeps it: one stanza per package, and the files it installed.
    let status = rootfs.join("var/lib/dpkg/status.d");
    let host = run(Command::new("dpkg").arg("--print-architecture")).trim().to_owned();
    let mut packages = BTreeMap::new();
    let mut owned = BTreeSet::new();
    for entry in std::fs::read_dir(&status).expect("/var/lib/dpkg/status.d for image scanners") {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(package) = name.strip_suffix(".md5sums") {
            // Every file the package lists is in the image, as the package shipped it.
            run(Command::new("md5sum")
                .args(["--check", "--quiet", "--strict"])
                .arg(status.join(&name))
                .current_dir(rootfs));
            let list = std::fs::read_to_string(status.join(&name)).unwrap();
            owned.extend(list.lines().map(|l| format!("/{}", l.split_once("  ").unwrap().1)));
            assert!(status.join(package).is_file(), "{name} without its status stanza");
            continue;
        }
        let fields = control_fields(&std::fs::read_to_string(status.join(&name)).unwrap());
        assert_eq!(fields["Package"], name);
        assert_eq!(fields["Status"], "install ok installed", "{name}");
        let architecture = fields["Architecture"].as_str();
        assert!(architecture == "all" || architecture == host, "{name}: {architecture}, not this host's {host}");
        packages.insert(name, fields["Version"].clone());
    }
    for package in ["libc6", "libgcc-s1", "ca-certificates", "base-files"] {
        assert!(packages.contains_key(package), "{package} not recorded: {packages:?}");
    }
    // glibc's loader and every library the binary links come from those packages (the loader as the
    // link the package ships: lib64/ld-linux-x86-64.so.2 on amd64).
    let ldd = run(Command::new("ldd").arg(env!("CARGO_BIN_EXE_metahook")));
    for lib in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        let real = resolve_in(rootfs, lib);
        assert!(rootfs.join(&real[1..]).is_file(), "{lib} is not in the image");
        assert!(owned.contains(&real), "{lib} ({real}) is not a file of a recorded package");
    }
    let os_release = std::fs::read_to_string(rootfs.join("usr/lib/os-release")).expect("os-release for scanners");
    assert!(os_release.lines().any(|l| l.starts_with("ID=")), "{os_release}");

    // The SPDX SBOM beside the archive: the image, those packages with their versions, the binary as it
    // is in the image, and the crates in it as Cargo.lock pins them.
    let sbom = json(&built.sbom);
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    assert_eq!(sbom["dataLicense"], "CC0-1.0");
    let manifest_hex = image.manifest_digest.strip_prefix("sha256:").unwrap();
    assert!(sbom["documentNamespace"].as_str().unwrap().ends_with(manifest_hex), "namespaced by the image digest");
    let by_id: BTreeMap<&str, &Value> =
        sbom["packages"].as_array().unwrap().iter().map(|p| (p["SPDXID"].as_str().unwrap(), p)).collect();
    assert_eq!(by_id.len(), sbom["packages"].as_array().unwrap().len(), "SPDX ids are unique");
    let image_package = by_id["SPDXRef-Image"];
    assert_eq!(image_package["checksums"][0]["checksumValue"], manifest_hex);
    let relationships: BTreeSet<(String, String, String)> = sbom["relationships"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap().to_owned();
            (field("spdxElementId"), field("relationshipType"), field("relatedSpdxElement"))
        })
        .collect();
    assert!(relationships.contains(&("SPDXRef-DOCUMENT".into(), "DESCRIBES".into(), "SPDXRef-Image".into())));
    let purl = |p: &Value| p["externalRefs"][0]["referenceLocator"].as_str().unwrap_or_default().to_owned();
    let debs: BTreeMap<String, String> = by_id
        .values()
        .filter(|p| purl(p).starts_with("pkg:deb/"))
        .map(|p| (p["name"].as_str().unwrap().to_owned(), p["versionInfo"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(debs, packages, "the SBOM lists exactly the packages dpkg's status records, same versions");
    for (id, package) in &by_id {
        if purl(package).starts_with("pkg:deb/") {
            assert!(relationships.contains(&("SPDXRef-Image".into(), "CONTAINS".into(), (*id).to_owned())), "{id}");
        }
    }
    let binary = by_id["SPDXRef-Package-metahook"];
    assert_eq!(binary["versionInfo"], env!("CARGO_PKG_VERSION"));
    assert_eq!(binary["checksums"][0]["algorithm"], "SHA256");
    assert_eq!(binary["checksums"][0]["checksumValue"], sha256(&rootfs.join("metahook")), "the binary in the image");
    let lock = cargo_lock();
    let crates: Vec<&&Value> = by_id.values().filter(|p| purl(p).starts_with("pkg:cargo/")).collect();
    let names: BTreeSet<&str> = crates.iter().map(|p| p["name"].as_str().unwrap()).collect();
    for dependency in ["kube-client", "tokio", "rustls", "prometheus-client"] {
        assert!(names.contains(dependency), "{dependency} is compiled into the hub but not in the SBOM");
    }
    for dev_only in ["reqwest", "proptest", "plotters", "pulldown-cmark", "serde_derive"] {
        assert!(!names.contains(dev_only), "{dev_only} is not in the binary (dev-only or a proc macro)");
    }
    for package in crates {
        let key = format!("{} {}", package["name"].as_str().unwrap(), package["versionInfo"].as_str().unwrap());
        let checksum = lock.get(&key).unwrap_or_else(|| panic!("{key} is not in Cargo.lock"));
        assert_eq!(package["checksums"][0]["checksumValue"].as_str(), checksum.as_deref(), "{key}");
        let id = package["SPDXID"].as_str().unwrap().to_owned();
        assert!(relationships.contains(&("SPDXRef-Package-metahook".into(), "STATIC_LINK".into(), id)), "{key}");
    }
}

#[test]
fn two_builds_in_different_directories_give_the_same_digest() {
    let first = first_build();
    let second = build(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("image/elsewhere/second"));
    assert_ne!(first.archive.parent(), second.archive.parent());
    let digest = |archive: &Path| unpack(archive).manifest_digest;
    assert_eq!(digest(&first.archive), digest(&second.archive), "the image digest");
    assert_eq!(sha256(&first.archive), sha256(&second.archive), "the archive, byte for byte");
    assert_eq!(std::fs::read(&first.sbom).unwrap(), std::fs::read(&second.sbom).unwrap(), "the SBOM");
}
