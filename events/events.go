// Package events holds the JSON Schemas of what belay puts on its
// EventBridge bus, with a sample of each: repo-event.schema.json (a
// repository event normalized by the webhook, which the dispatcher turns
// into a run) and run-status.schema.json (a run reaching a state, which the
// publisher and anyone else may hook into). The schemas describe whole
// EventBridge events: the envelope and its detail.
//
// Validate checks a document against one of them with a maintained JSON
// Schema implementation (draft 2020-12, formats asserted), so tests of the
// code that produces these events hold it to the published contract.
package events

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The schemas, by file name.
const (
	RepoEventSchema = "repo-event.schema.json"
	RunStatusSchema = "run-status.schema.json"
)

//go:embed *.schema.json samples/*.json
var files embed.FS

var (
	compileOnce sync.Once
	compiled    map[string]*jsonschema.Schema
	compileErr  error
)

func compile() {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	compiled = map[string]*jsonschema.Schema{}
	for _, name := range []string{RepoEventSchema, RunStatusSchema} {
		b, err := files.ReadFile(name)
		if err != nil {
			compileErr = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			compileErr = fmt.Errorf("events: %s: %w", name, err)
			return
		}
		if err := c.AddResource(name, doc); err != nil {
			compileErr = fmt.Errorf("events: %s: %w", name, err)
			return
		}
		if compiled[name], err = c.Compile(name); err != nil {
			compileErr = fmt.Errorf("events: compile %s: %w", name, err)
			return
		}
	}
}

// Validate checks the JSON document doc against the schema named schema
// (RepoEventSchema or RunStatusSchema). The error says where and why a
// document fails.
func Validate(schema string, doc []byte) error {
	compileOnce.Do(compile)
	if compileErr != nil {
		return compileErr
	}
	sch, ok := compiled[schema]
	if !ok {
		return fmt.Errorf("events: no schema %q", schema)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("events: not JSON: %w", err)
	}
	return sch.Validate(inst)
}

// Samples returns the sample events by file name (repo-event-*.json and
// run-status-*.json).
func Samples() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := fs.WalkDir(files, "samples", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		out[path.Base(p)] = b
		return err
	})
	return out, err
}

// SchemaOf returns the schema a sample's file name says it is an instance
// of: RepoEventSchema for repo-event-*, RunStatusSchema for run-status-*.
func SchemaOf(sample string) (string, bool) {
	switch {
	case strings.HasPrefix(sample, "repo-event-"):
		return RepoEventSchema, true
	case strings.HasPrefix(sample, "run-status-"):
		return RunStatusSchema, true
	}
	return "", false
}

// SampleNames returns the samples' file names, sorted.
func SampleNames() []string {
	s, _ := Samples()
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
