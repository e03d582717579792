// Prints the name Metacontroller gives a ControllerRevision, computed the way its Go code does, so the
// migration tests compare metahook against Go's encoding/json rather than against metahook itself.
//
// Usage: go run revision_hash.go <plural> <group> <parent-uid> < parent-patch.json
//
// Metacontroller (pkg/controller/composite/controller_revision.go): the patch is the parent's
// unstructured content (the API machinery decodes JSON numbers to int64 when they fit, else float64),
// marshalled with k8s.io/apimachinery/pkg/util/json (encoding/json); the name is
// "<plural>.<group or core>-" + hex(sha1(parentUID + patchJSON)), the prefix cut to 212 bytes.
package main

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
)

func unstructured(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			t[k] = unstructured(x)
		}
	case []interface{}:
		for i, x := range t {
			t[i] = unstructured(x)
		}
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(t), 64)
		return f
	}
	return v
}

func main() {
	plural, group, uid := os.Args[1], os.Args[2], os.Args[3]
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		panic(err)
	}
	decoder := json.NewDecoder(bytes.NewReader(input))
	decoder.UseNumber()
	var patch map[string]interface{}
	if err := decoder.Decode(&patch); err != nil {
		panic(err)
	}
	data, err := json.Marshal(unstructured(patch))
	if err != nil {
		panic(err)
	}
	if group == "" {
		group = "core"
	}
	prefix := plural + "." + group
	if len(prefix) > 212 {
		prefix = prefix[:212]
	}
	hasher := sha1.New()
	hasher.Write([]byte(uid))
	hasher.Write(data)
	fmt.Printf("%s-%s\n", prefix, hex.EncodeToString(hasher.Sum(nil)))
}
