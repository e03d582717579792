// Command registry is a small in-memory OCI registry (go-containerregistry's pkg/registry) that
// serves the images of local OCI image archives, so that a container runtime with no network "pulls"
// them: the local test node's containerd names it as the mirror of every registry (hosts.toml), and a
// Pod whose imagePullPolicy is Always (an image with no tag, or :latest) still starts.
//
//	registry -addr 127.0.0.1:5000 -image pause.tar -image busybox.tar -image x.tar=example.com/x:1 \
//	         [-ready-file FILE]
//	registry -push-to 127.0.0.1:5000 -image more.tar ...
//
// With -push-to, the archives are pushed to a registry already serving (the same requests, over HTTP)
// and the command exits: images a later test needs join the running node's mirror without a restart.
//
// Each archive (a tar of an OCI image layout, as deploy/image/node-images.sh and build.sh write
// them, or `skopeo copy ... oci-archive:`) is pushed, before the first request is served, under the
// repository of its reference without the registry host: registry.k8s.io/pause:3.10 as pause:3.10,
// busybox (docker.io/library/busybox:latest) as library/busybox:latest, ghcr.io/metahook/metahook:0.1.0
// as metahook/metahook:0.1.0 — the path containerd asks a mirror for
// (/v2/library/busybox/manifests/latest?ns=docker.io; the ns parameter is ignored, so two registries'
// repositories of the same path would collide, which is refused at start). The reference is the
// archive's org.opencontainers.image.ref.name annotation, or the one given after '='. Every image
// manifest and index in the archive's index.json is pushed (the manifests of every platform it holds).
//
// Once every image is pushed and the address listens, it prints "ready" on stdout (and writes
// -ready-file, if given). Each request is logged on stderr: method, path with query, status, bytes.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

const refAnnotation = "org.opencontainers.image.ref.name"

func main() {
	addr := flag.String("addr", "127.0.0.1:5000", "address to listen on (host:port)")
	readyFile := flag.String("ready-file", "", "file to write (the address) once every image is pushed and the address listens")
	var images list
	flag.Var(&images, "image", "OCI image archive to serve, ARCHIVE or ARCHIVE=REFERENCE (repeatable)")
	pushTo := flag.String("push-to", "", "push the images to the registry serving at this address (host:port), then exit")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("[registry] ")
	if *pushTo != "" {
		pushed := map[string]string{}
		for _, arg := range images {
			archive, ref, _ := strings.Cut(arg, "=")
			if err := load(remote{addr: *pushTo}, archive, ref, pushed); err != nil {
				log.Fatalf("%s: %v", archive, err)
			}
		}
		return
	}

	// One line per request, from logged (the package's own log repeats the path and names errors,
	// which logged adds for failed requests).
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("listen on %s: %v", *addr, err)
	}
	pushed := map[string]string{} // repository:tag -> archive
	for _, arg := range images {
		archive, ref, _ := strings.Cut(arg, "=")
		if err := load(reg, archive, ref, pushed); err != nil {
			log.Fatalf("%s: %v", archive, err)
		}
	}
	server := &http.Server{Handler: logged(reg), ReadHeaderTimeout: 30 * time.Second}
	errs := make(chan error, 1)
	go func() { errs <- server.Serve(listener) }()
	log.Printf("serving %d image(s) on http://%s", len(pushed), listener.Addr())
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte(listener.Addr().String()+"\n"), 0o644); err != nil {
			log.Fatalf("write %s: %v", *readyFile, err)
		}
	}
	fmt.Println("ready")
	log.Fatal(<-errs)
}

// load pushes every manifest of the archive's index.json under its reference's repository.
func load(reg http.Handler, archive, override string, pushed map[string]string) error {
	files, err := readArchive(archive)
	if err != nil {
		return err
	}
	raw, ok := files["index.json"]
	if !ok {
		return errors.New("no index.json: not an OCI image layout archive")
	}
	index, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	if len(index.Manifests) == 0 {
		return errors.New("index.json lists no manifest")
	}
	if override != "" && len(index.Manifests) > 1 {
		return fmt.Errorf("a reference is given but index.json lists %d manifests", len(index.Manifests))
	}
	p := pusher{reg: reg, files: files}
	for _, desc := range index.Manifests {
		refName := override
		if refName == "" {
			refName = desc.Annotations[refAnnotation]
		}
		if refName == "" {
			return fmt.Errorf("manifest %s has no %s annotation; give ARCHIVE=REFERENCE", desc.Digest, refAnnotation)
		}
		ref, err := name.ParseReference(refName)
		if err != nil {
			return fmt.Errorf("reference %q: %w", refName, err)
		}
		repo := ref.Context().RepositoryStr()
		if err := p.push(repo, desc); err != nil {
			return fmt.Errorf("%s: %w", refName, err)
		}
		target := repo + "@" + desc.Digest.String()
		if tag, ok := ref.(name.Tag); ok {
			target = repo + ":" + tag.TagStr()
			if other, dup := pushed[target]; dup {
				return fmt.Errorf("%s is also %s's (the registry host is not part of the path)", target, other)
			}
			if err := p.put(repo, tag.TagStr(), desc); err != nil {
				return fmt.Errorf("%s: %w", refName, err)
			}
		}
		pushed[target] = archive
		log.Printf("%s: %s as %s (%s)", archive, refName, target, desc.Digest)
	}
	return nil
}

// readArchive reads the archive's regular files (relative paths) into memory.
func readArchive(archive string) (map[string][]byte, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[path.Clean(strings.TrimPrefix(hdr.Name, "./"))] = data
	}
}

type pusher struct {
	reg   http.Handler
	files map[string][]byte
}

func (p pusher) blob(h v1.Hash) ([]byte, error) {
	data, ok := p.files[path.Join("blobs", h.Algorithm, h.Hex)]
	if !ok {
		return nil, fmt.Errorf("blob %s is not in the archive", h)
	}
	return data, nil
}

// push uploads what desc refers to (blobs, child manifests), then the manifest itself by digest.
func (p pusher) push(repo string, desc v1.Descriptor) error {
	raw, err := p.blob(desc.Digest)
	if err != nil {
		return err
	}
	switch {
	case desc.MediaType.IsIndex():
		index, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return err
		}
		for _, child := range index.Manifests {
			if child.MediaType.IsIndex() || child.MediaType.IsImage() {
				if err := p.push(repo, child); err != nil {
					return err
				}
			}
		}
	case desc.MediaType.IsImage():
		manifest, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return err
		}
		for _, b := range append([]v1.Descriptor{manifest.Config}, manifest.Layers...) {
			if len(b.URLs) > 0 || !b.MediaType.IsDistributable() {
				continue // a foreign layer: the runtime fetches it from its URLs
			}
			if err := p.upload(repo, b.Digest); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("manifest %s has media type %q, neither an image nor an index", desc.Digest, desc.MediaType)
	}
	return p.put(repo, desc.Digest.String(), desc)
}

// upload pushes one blob, in a single request (POST with ?digest=).
func (p pusher) upload(repo string, h v1.Hash) error {
	data, err := p.blob(h)
	if err != nil {
		return err
	}
	req := httptest.NewRequest(http.MethodPost, "/v2/"+repo+"/blobs/uploads/?digest="+h.String(), bytes.NewReader(data))
	req.ContentLength = int64(len(data))
	req.Header.Set("Content-Type", "application/octet-stream")
	return p.do(req, http.StatusCreated)
}

// put stores the manifest desc names under reference (a tag or its digest).
func (p pusher) put(repo, reference string, desc v1.Descriptor) error {
	raw, err := p.blob(desc.Digest)
	if err != nil {
		return err
	}
	mediaType := desc.MediaType
	if mediaType == "" {
		var m struct {
			MediaType types.MediaType `json:"mediaType"`
		}
		_ = json.Unmarshal(raw, &m)
		mediaType = m.MediaType
	}
	req := httptest.NewRequest(http.MethodPut, "/v2/"+repo+"/manifests/"+reference, bytes.NewReader(raw))
	req.ContentLength = int64(len(raw))
	req.Header.Set("Content-Type", string(mediaType))
	return p.do(req, http.StatusCreated)
}

func (p pusher) do(req *http.Request, want int) error {
	rec := httptest.NewRecorder()
	p.reg.ServeHTTP(rec, req)
	if rec.Code != want {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}

// remote forwards each request to the registry at addr, answering with its reply.
type remote struct{ addr string }

func (r remote) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	out, err := http.NewRequestWithContext(req.Context(), req.Method, "http://"+r.addr+req.URL.RequestURI(), req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.ContentLength = req.ContentLength
	out.Header = req.Header.Clone()
	resp, err := http.DefaultClient.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// logged logs each request once answered: method, path and query, status, bytes, time taken, and
// for a failed one the start of the error the registry answered.
func logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &recorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rw, r)
		detail := ""
		if rw.status >= 400 {
			detail = " " + strings.TrimSpace(rw.body.String())
		}
		log.Printf("%s %s %d %dB %s%s", r.Method, r.URL.RequestURI(), rw.status, rw.bytes, time.Since(start).Round(time.Microsecond), detail)
	})
}

type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	body   bytes.Buffer // the start of an error's body
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status >= 400 && r.body.Len() < 300 {
		r.body.Write(b[:min(len(b), 300-r.body.Len())])
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}
