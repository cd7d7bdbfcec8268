package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
)

// benchTree is an upload at the reference limits' scale: 32 files of
// 16 KiB each (512 KiB, the largest tree a run may send).
func benchTree() []belay.File {
	files := make([]belay.File, 32)
	line := "def f(x):\n    return x + 1  # padding padding padding padding\n"
	for i := range files {
		files[i] = belay.File{Path: fmt.Sprintf("pkg/mod_%02d.py", i), Content: strings.Repeat(line, 16<<10/len(line))}
	}
	return files
}

func BenchmarkReadFile(b *testing.B) {
	w := newWorkspace(b, benchTree())
	tools := newTools(b, w, nil)
	args := []byte(`{"path":"pkg/mod_07.py"}`)
	for b.Loop() {
		if out, isErr := tools.Call(context.Background(), sandbox.ToolReadFile, args); isErr {
			b.Fatal(out)
		}
	}
}

func BenchmarkSearchWholeTree(b *testing.B) {
	w := newWorkspace(b, benchTree())
	tools := newTools(b, w, nil)
	args := []byte(`{"pattern":"return x \\+ 2","path":""}`)
	b.SetBytes(512 << 10)
	for b.Loop() {
		if out, isErr := tools.Call(context.Background(), sandbox.ToolSearch, args); isErr {
			b.Fatal(out)
		}
	}
}

func BenchmarkWriteFile(b *testing.B) {
	w := newWorkspace(b, testFiles)
	tools := newTools(b, w, nil)
	args := []byte(`{"path":"tests/test_bench.py","content":"` + strings.Repeat("x", 16<<10) + `"}`)
	for b.Loop() {
		if out, isErr := tools.Call(context.Background(), sandbox.ToolWriteFile, args); isErr {
			b.Fatal(out)
		}
	}
}

// BenchmarkRunCommand measures starting and reaping one command with the
// clean environment, its own process group and a no_new_privs thread.
func BenchmarkRunCommand(b *testing.B) {
	dir := b.TempDir()
	for b.Loop() {
		res, err := sandbox.RunCommand(context.Background(), sandbox.Command{Argv: []string{"true"}, Dir: dir, Env: sandbox.CleanEnv(dir)})
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res.ExitCode)
		}
	}
}

// BenchmarkFinalize measures what the entry does between the agent loop
// and the first final check on a tree at the reference limits (32 files,
// 512 KiB) with one file changed: put .git back, commit the allowed
// changes, hash every object of the head, diff, and make the work tree
// exactly the head.
func BenchmarkFinalize(b *testing.B) {
	w := newWorkspace(b, benchTree())
	tools := newTools(b, w, func(c *sandbox.ToolsConfig) { c.AllowedPaths = []string{"pkg/**"} })
	if out, isErr := tools.Call(context.Background(), sandbox.ToolWriteFile,
		[]byte(`{"path":"pkg/mod_07.py","content":"def f(x):\n    return x + 2\n"}`)); isErr {
		b.Fatal(out)
	}
	for b.Loop() {
		if _, err := w.built.Finalize(context.Background(), []string{"pkg/**"}, "belay: agent changes"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReset measures putting the repository back between two final
// checks on the same tree.
func BenchmarkReset(b *testing.B) {
	w := newWorkspace(b, benchTree())
	fin, err := w.built.Finalize(context.Background(), []string{"pkg/**"}, "belay: agent changes")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := w.built.Reset(context.Background(), fin.Head); err != nil {
			b.Fatal(err)
		}
	}
}
