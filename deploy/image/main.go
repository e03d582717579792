// Command ocibuild writes an OCI image archive (a tar of an OCI image layout, as `skopeo copy
// oci-archive:` and `podman load` read it) from a root filesystem directory, with go-containerregistry,
// and an SPDX 2.3 SBOM of what the image holds. It needs no container engine and no network:
// deploy/image/build.sh runs it for `make image`.
//
//	ocibuild -rootfs DIR -out image.tar -ref ghcr.io/metahook/metahook:0.1.0 \
//	         -entrypoint /metahook -user 65532:65532 -arch amd64 [-variant v7] [-env K=V ...] [-label K=V ...] \
//	         [-sbom image.spdx.json -sbom-binary /metahook -sbom-version 0.1.0 \
//	          -sbom-crates crates.tsv -sbom-cargo-lock Cargo.lock]
//
// The layer is written in sorted path order, owned by root, with the times of SOURCE_DATE_EPOCH (or
// 0), so the same rootfs always gives the same digests. The SBOM lists the Debian packages recorded in
// the rootfs's /var/lib/dpkg/status.d/, the binary (its SHA-256 as it is in the image), and the Rust
// crates compiled into it (crates.tsv: name, version, license per line; checksums from Cargo.lock); its
// namespace is named after the image's digest and its time is SOURCE_DATE_EPOCH, so it is reproducible
// too.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	rootfs := flag.String("rootfs", "", "root filesystem directory (becomes the single layer)")
	out := flag.String("out", "", "OCI archive to write")
	ref := flag.String("ref", "", "image reference recorded as org.opencontainers.image.ref.name")
	entrypoint := flag.String("entrypoint", "", "entrypoint (one path, no shell)")
	workdir := flag.String("workdir", "/", "the working directory of the image's process")
	user := flag.String("user", "65532:65532", "uid:gid the image runs as")
	arch := flag.String("arch", "", "platform architecture, as OCI (Go's GOARCH) names it: amd64, arm64, ...")
	variant := flag.String("variant", "", "platform variant (arm: v7, ...)")
	sbomOut := flag.String("sbom", "", "SPDX 2.3 JSON SBOM to write (optional)")
	sbomBinary := flag.String("sbom-binary", "", "the application binary, as a path in the image")
	sbomVersion := flag.String("sbom-version", "", "the application's version")
	sbomCrates := flag.String("sbom-crates", "", "Rust crates in the binary: name<TAB>version<TAB>license per line")
	sbomLock := flag.String("sbom-cargo-lock", "", "Cargo.lock, for the crates' checksums")
	var env, labels, args list
	flag.Var(&args, "arg", "an argument after the entrypoint, in the entrypoint itself (repeatable)")
	flag.Var(&env, "env", "environment variable K=V (repeatable)")
	flag.Var(&labels, "label", "image label K=V (repeatable)")
	flag.Parse()
	if *rootfs == "" || *out == "" || *ref == "" || *entrypoint == "" || *arch == "" {
		fail(fmt.Errorf("-rootfs, -out, -ref, -entrypoint and -arch are required"))
	}
	if *sbomOut != "" && (*sbomBinary == "" || *sbomVersion == "") {
		fail(fmt.Errorf("-sbom needs -sbom-binary and -sbom-version"))
	}
	created := time.Unix(0, 0).UTC()
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		secs, err := strconv.ParseInt(epoch, 10, 64)
		check(err)
		created = time.Unix(secs, 0).UTC()
	}
	layerTar, err := tarDir(*rootfs, created)
	check(err)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	check(err)
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "deploy/image/build.sh (ocibuild)",
	}})
	check(err)
	cfg, err := img.ConfigFile()
	check(err)
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.Variant, cfg.OS, cfg.Created = *arch, *variant, "linux", v1.Time{Time: created}
	cfg.Config.Entrypoint = append([]string{*entrypoint}, args...)
	cfg.Config.Cmd = nil
	cfg.Config.User = *user
	cfg.Config.WorkingDir = *workdir
	cfg.Config.Env = env
	cfg.Config.Labels = map[string]string{}
	for _, kv := range labels {
		k, v, _ := strings.Cut(kv, "=")
		cfg.Config.Labels[k] = v
	}
	img, err = mutate.ConfigFile(img, cfg)
	check(err)

	dir, err := os.MkdirTemp("", "ocibuild-")
	check(err)
	defer os.RemoveAll(dir)
	path, err := layout.Write(dir, empty.Index)
	check(err)
	check(path.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": *ref,
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: *arch, Variant: *variant})))
	archive, err := tarDir(dir, created)
	check(err)
	check(os.WriteFile(*out, archive, 0o644))
	digest, err := img.Digest()
	check(err)
	fmt.Printf("%s %s\n", *out, digest)
	if *sbomOut != "" {
		doc, err := sbom(sbomInput{
			rootfs: *rootfs, ref: *ref, digest: digest, arch: *arch, created: created,
			binary: *sbomBinary, version: *sbomVersion, crates: *sbomCrates, cargoLock: *sbomLock,
		})
		check(err)
		check(os.WriteFile(*sbomOut, doc, 0o644))
		fmt.Printf("%s\n", *sbomOut)
	}
}

// tarDir archives dir's contents (relative paths, sorted), owned by root, with fixed times.
func tarDir(dir string, mtime time.Time) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, path := range paths {
		info, err := os.Lstat(path)
		if err != nil {
			return nil, err
		}
		link := ""
		if info.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return nil, err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(dir, path)
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = mtime, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ocibuild:", err)
	os.Exit(1)
}
