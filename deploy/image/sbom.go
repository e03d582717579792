package main

// The SPDX 2.3 SBOM of the image (https://spdx.github.io/spdx-spec/v2.3/), as JSON: the image, the
// Debian packages its dpkg status records, the application binary and the Rust crates in it.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

type sbomInput struct {
	rootfs, ref, arch, binary, version, crates, cargoLock string
	digest                                                v1.Hash
	created                                               time.Time
}

type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name                  string         `json:"name"`
	SPDXID                string         `json:"SPDXID"`
	VersionInfo           string         `json:"versionInfo"`
	Supplier              string         `json:"supplier"`
	DownloadLocation      string         `json:"downloadLocation"`
	FilesAnalyzed         bool           `json:"filesAnalyzed"`
	Checksums             []spdxChecksum `json:"checksums,omitempty"`
	Homepage              string         `json:"homepage,omitempty"`
	SourceInfo            string         `json:"sourceInfo,omitempty"`
	LicenseConcluded      string         `json:"licenseConcluded"`
	LicenseDeclared       string         `json:"licenseDeclared"`
	CopyrightText         string         `json:"copyrightText"`
	PrimaryPackagePurpose string         `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs          []spdxRef      `json:"externalRefs,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

const noAssertion = "NOASSERTION"

var notInID = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(parts ...string) string {
	return "SPDXRef-" + notInID.ReplaceAllString(strings.Join(parts, "-"), "-")
}

func purl(kind string) spdxRef {
	return spdxRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: kind}
}

// A license expression as SPDX reads it, or NOASSERTION: Cargo's old "MIT/Apache-2.0" is "MIT OR Apache-2.0".
var licenseExpression = regexp.MustCompile(`^[A-Za-z0-9.+-]+( (OR|AND|WITH) [A-Za-z0-9.+-]+)*$`)

func spdxLicense(cargo string) string {
	l := strings.TrimSpace(strings.ReplaceAll(cargo, "/", " OR "))
	if l == "" || !licenseExpression.MatchString(l) {
		return noAssertion
	}
	return l
}

// controlFields parses one dpkg control stanza (continuation lines are folded into the field).
func controlFields(text string) map[string]string {
	fields := map[string]string{}
	key := ""
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if key != "" {
				fields[key] += "\n" + line
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key = k
		fields[key] = strings.TrimSpace(v)
	}
	return fields
}

// osRelease reads ID and VERSION_ID of the image's /etc/os-release (base-files'), for the purls.
func osRelease(rootfs string) (id, version string) {
	for _, p := range []string{"usr/lib/os-release", "etc/os-release"} {
		data, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, _ := strings.Cut(line, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "ID":
				id = v
			case "VERSION_ID":
				version = v
			}
		}
		return id, version
	}
	return "", ""
}

// cargoChecksums maps "name version" to the .crate's SHA-256 recorded in Cargo.lock.
func cargoChecksums(path string) (map[string]string, error) {
	sums := map[string]string{}
	if path == "" {
		return sums, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var name, version string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "[[package]]" {
			name, version = "", ""
			continue
		}
		k, v, ok := strings.Cut(line, " = ")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		switch k {
		case "name":
			name = v
		case "version":
			version = v
		case "checksum":
			sums[name+" "+version] = v
		}
	}
	return sums, scanner.Err()
}

func sbom(in sbomInput) ([]byte, error) {
	image := spdxPackage{
		Name: in.ref, SPDXID: "SPDXRef-Image", VersionInfo: in.version, Supplier: noAssertion,
		DownloadLocation: noAssertion, LicenseConcluded: noAssertion, LicenseDeclared: noAssertion,
		CopyrightText: noAssertion, PrimaryPackagePurpose: "CONTAINER",
		Checksums: []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: in.digest.Hex}},
	}
	repo, tag, _ := strings.Cut(in.ref, ":")
	if slash := strings.LastIndex(repo, "/"); slash >= 0 {
		image.ExternalRefs = []spdxRef{purl(fmt.Sprintf("pkg:oci/%s@%s?arch=%s&repository_url=%s&tag=%s",
			repo[slash+1:], url.PathEscape(in.digest.String()), in.arch, url.QueryEscape(repo), url.QueryEscape(tag)))}
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: in.ref,
		DocumentNamespace: "https://github.com/metahook/metahook/spdx/image/" + in.digest.Algorithm + "-" + in.digest.Hex,
		CreationInfo: spdxCreationInfo{
			Created:  in.created.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: deploy/image/build.sh (ocibuild)", "Organization: metahook"},
		},
		Packages:      []spdxPackage{image},
		Relationships: []spdxRelationship{{"SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-Image"}},
	}

	// The Debian packages, as dpkg's status in the image records them.
	distro, distroVersion := osRelease(in.rootfs)
	statusDir := filepath.Join(in.rootfs, "var/lib/dpkg/status.d")
	entries, err := os.ReadDir(statusDir)
	if err != nil {
		return nil, fmt.Errorf("the image records no Debian packages: %w", err)
	}
	for _, entry := range entries { // ReadDir sorts by name
		if entry.IsDir() || strings.Contains(entry.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(statusDir, entry.Name()))
		if err != nil {
			return nil, err
		}
		f := controlFields(string(data))
		if f["Package"] == "" || f["Version"] == "" {
			return nil, fmt.Errorf("%s: no Package or Version", entry.Name())
		}
		source, sourceVersion, _ := strings.Cut(f["Source"], " ")
		sourceVersion = strings.Trim(sourceVersion, "()")
		if source == "" {
			source = f["Package"]
		}
		if sourceVersion == "" {
			sourceVersion = f["Version"]
		}
		locator := fmt.Sprintf("pkg:deb/%s/%s@%s?arch=%s", distro, f["Package"], url.PathEscape(f["Version"]), f["Architecture"])
		if source != f["Package"] {
			locator += "&upstream=" + url.QueryEscape(source)
		}
		if distro != "" && distroVersion != "" {
			locator += "&distro=" + distro + "-" + distroVersion
		}
		supplier := noAssertion
		if m := strings.TrimSpace(f["Maintainer"]); m != "" {
			supplier = "Organization: " + strings.NewReplacer("<", "(", ">", ")").Replace(m)
		}
		id := spdxID("Package", "deb", f["Package"])
		doc.Packages = append(doc.Packages, spdxPackage{
			Name: f["Package"], SPDXID: id, VersionInfo: f["Version"], Supplier: supplier,
			DownloadLocation: noAssertion, Homepage: f["Homepage"],
			SourceInfo:       fmt.Sprintf("built package from: %s %s", source, sourceVersion),
			LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
			ExternalRefs: []spdxRef{purl(locator)},
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-Image", "CONTAINS", id})
	}

	// The application binary, as it is in the image.
	binary, err := os.ReadFile(filepath.Join(in.rootfs, strings.TrimPrefix(in.binary, "/")))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(binary)
	name := filepath.Base(in.binary)
	app := spdxID("Package", name)
	doc.Packages = append(doc.Packages, spdxPackage{
		Name: name, SPDXID: app, VersionInfo: in.version, Supplier: "Organization: metahook",
		DownloadLocation: "https://github.com/metahook/metahook", Homepage: "https://github.com/metahook/metahook",
		Checksums:        []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(sum[:])}},
		LicenseConcluded: noAssertion, LicenseDeclared: "Apache-2.0", CopyrightText: noAssertion,
		PrimaryPackagePurpose: "APPLICATION",
		ExternalRefs:          []spdxRef{purl(fmt.Sprintf("pkg:github/metahook/metahook@%s", url.PathEscape(in.version)))},
	})
	doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-Image", "CONTAINS", app})

	// The Rust crates compiled into it.
	if in.crates != "" {
		sums, err := cargoChecksums(in.cargoLock)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(in.crates)
		if err != nil {
			return nil, err
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		sort.Strings(lines)
		for _, line := range lines {
			cols := strings.Split(line, "\t")
			if len(cols) < 2 {
				return nil, fmt.Errorf("%s: not name<TAB>version<TAB>license: %q", in.crates, line)
			}
			license := ""
			if len(cols) > 2 {
				license = cols[2]
			}
			crate, version := cols[0], cols[1]
			id := spdxID("Package", "crate", crate, version)
			p := spdxPackage{
				Name: crate, SPDXID: id, VersionInfo: version, Supplier: noAssertion,
				DownloadLocation: fmt.Sprintf("https://crates.io/api/v1/crates/%s/%s/download", crate, version),
				LicenseConcluded: noAssertion, LicenseDeclared: spdxLicense(license), CopyrightText: noAssertion,
				PrimaryPackagePurpose: "LIBRARY",
				ExternalRefs:          []spdxRef{purl(fmt.Sprintf("pkg:cargo/%s@%s", crate, url.PathEscape(version)))},
			}
			if sum := sums[crate+" "+version]; sum != "" {
				p.Checksums = []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: sum}}
			}
			doc.Packages = append(doc.Packages, p)
			doc.Relationships = append(doc.Relationships, spdxRelationship{app, "STATIC_LINK", id})
		}
	}

	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
