// Command testentry stands in for the sandbox entry in localsandbox's
// tests. It takes the same argument (--workspace WS), reads spec.json and
// its token files the way the real entry does (sandbox.ReadTokenFile), and
// then does what spec.Instruction asks, reporting what it saw of its own
// process into out/report.json:
//
//	report ADDR   report uid, env, token files, and whether TCP to ADDR and
//	              the events route on api.sock work
//	sleep         start `sleep 3600` in its process group, tell the control
//	              plane it is ready (events route), then sleep
//	leak          print the tokens to stderr and exit 3
//	mess          leave an unsearchable folder behind, then exit 0
//	peek DIR      try to list DIR and read DIR/spec.json (another sandbox's
//	              workspace); report the errors
//	procattack WS find the sandbox entry running in workspace WS through
//	              /proc (its command line), then try to read and change its
//	              workspace through /proc/PID/cwd, /proc/PID/root and WS
//	              itself; report what was found and each attempt's outcome
//	bigfile N     write a file of N bytes into home/; report the error
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// Report is what the entry saw; the tests decode it.
type Report struct {
	UID, EUID, GID int
	Groups         []int
	PID            int
	SID            int
	Cwd            string
	Args           []string
	Env            []string
	TokenFiles     map[string]TokenFile
	TokensLeft     []string
	TCPError       string
	APIStatus      int
	APIError       string
	Interfaces     []string
	PeekErrors     []string
	// AttackTarget is the pid procattack found for its workspace, 0 when
	// none; Attacks maps each attempt to "ok" or its error.
	AttackTarget int
	Attacks      map[string]string
	WriteError   string
}

// TokenFile is what the entry found of one token file before reading it.
type TokenFile struct {
	Mode    string
	UID     int
	ReadErr string
}

func main() {
	ws := flag.String("workspace", "", "the workspace")
	flag.Parse()
	if err := run(sandbox.Workspace(*ws)); err != nil {
		fmt.Fprintln(os.Stderr, "testentry:", err)
		os.Exit(1)
	}
}

func run(ws sandbox.Workspace) error {
	spec, err := sandbox.ReadSpec(ws.SpecPath())
	if err != nil {
		return err
	}
	rep := Report{
		UID: os.Getuid(), EUID: os.Geteuid(), GID: os.Getgid(), PID: os.Getpid(),
		Args: os.Args, Env: os.Environ(), TokenFiles: map[string]TokenFile{},
	}
	rep.Groups, _ = os.Getgroups()
	rep.SID, _ = unix.Getsid(0)
	rep.Cwd, _ = os.Getwd()
	tokens := map[string]string{}
	for _, name := range []string{workspace.ModelTokenFile, workspace.EventsTokenFile, workspace.ApprovalsTokenFile} {
		var tf TokenFile
		if fi, err := os.Lstat(filepath.Join(ws.TokensDir(), name)); err == nil {
			tf.Mode = fmt.Sprintf("%v", fi.Mode())
			tf.UID = int(fi.Sys().(*syscall.Stat_t).Uid)
		}
		tok, err := sandbox.ReadTokenFile(ws.TokensDir(), name)
		if err != nil {
			tf.ReadErr = err.Error()
		}
		tokens[name] = tok
		rep.TokenFiles[name] = tf
	}
	if ents, err := os.ReadDir(ws.TokensDir()); err == nil {
		for _, e := range ents {
			rep.TokensLeft = append(rep.TokensLeft, e.Name())
		}
	}
	out := ws.OutDir()
	mode, arg, _ := strings.Cut(spec.Instruction, " ")
	switch mode {
	case "report":
		if c, err := net.DialTimeout("tcp", arg, 5*time.Second); err != nil {
			rep.TCPError = err.Error()
		} else {
			c.Close()
		}
		rep.APIStatus, rep.APIError = postEvent(spec, tokens[workspace.EventsTokenFile])
		ifs, _ := net.Interfaces()
		for _, i := range ifs {
			rep.Interfaces = append(rep.Interfaces, i.Name+" "+i.Flags.String())
		}
	case "sleep":
		cmd := exec.Command("sleep", "3600")
		if err := cmd.Start(); err != nil {
			return err
		}
		if status, msg := postEvent(spec, tokens[workspace.EventsTokenFile]); status != http.StatusOK {
			return fmt.Errorf("ready: %d %s", status, msg)
		}
		time.Sleep(time.Hour)
	case "leak":
		for name, tok := range tokens {
			fmt.Fprintf(os.Stderr, "%s is %s\n", name, tok)
		}
		os.Exit(3)
	case "peek":
		if _, err := os.ReadDir(arg); err != nil {
			rep.PeekErrors = append(rep.PeekErrors, err.Error())
		}
		if _, err := os.ReadFile(filepath.Join(arg, "spec.json")); err != nil {
			rep.PeekErrors = append(rep.PeekErrors, err.Error())
		}
	case "procattack":
		rep.Attacks = map[string]string{}
		rep.AttackTarget = findEntry(arg)
		if rep.AttackTarget != 0 {
			procAttack(rep.Attacks, rep.AttackTarget, arg)
		}
	case "bigfile":
		var n int64
		if _, err := fmt.Sscan(arg, &n); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(ws.HomeDir(), "big"), make([]byte, n), 0o644); err != nil {
			rep.WriteError = err.Error()
		}
	case "mess":
		locked := filepath.Join(out, "locked")
		if err := os.Mkdir(locked, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(locked, "f"), []byte("x"), 0o400); err != nil {
			return err
		}
		if err := os.Chmod(locked, 0); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "report.json"), b, 0o644)
}

// findEntry returns the pid of the process whose command line is
// `... --workspace ws`, the way anyone on the host can find a sandbox.
func findEntry(ws string) int {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscan(p.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] == "--workspace" && argv[i+1] == ws {
				return pid
			}
		}
	}
	return 0
}

// procAttack tries, as another sandbox's attacker would, to read and change
// the workspace ws of the entry pid.
func procAttack(res map[string]string, pid int, ws string) {
	proc := fmt.Sprintf("/proc/%d", pid)
	outcome := func(name string, err error) {
		if err != nil {
			res[name] = err.Error()
		} else {
			res[name] = "ok"
		}
	}
	_, err := os.Readlink(proc + "/cwd")
	outcome("readlink cwd", err)
	_, err = os.ReadDir(proc + "/cwd")
	outcome("list cwd", err)
	_, err = os.ReadFile(proc + "/cwd/spec.json")
	outcome("read cwd/spec.json", err)
	_, err = os.ReadFile(proc + "/root" + ws + "/spec.json")
	outcome("read root/spec.json", err)
	_, err = os.ReadFile(proc + "/environ")
	outcome("read environ", err)
	_, err = os.ReadFile(filepath.Join(ws, "spec.json"))
	outcome("read spec.json", err)
	err = os.WriteFile(filepath.Join(ws, "repo", "a.py"), []byte("planted\n"), 0o644)
	outcome("write repo/a.py", err)
	err = os.WriteFile(proc+"/cwd/repo/a.py", []byte("planted\n"), 0o644)
	outcome("write cwd/repo/a.py", err)
}

// postEvent appends one sandbox.ready event through the internal API and
// returns the answer's status, or 0 and the transport error.
func postEvent(spec belay.SandboxSpec, tok string) (int, string) {
	body := `{"batchId":"b1","events":[{"type":"sandbox.ready","time":"` + time.Now().UTC().Format(time.RFC3339) + `","data":{}}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		spec.APIBaseURL+"/internal/v1/runs/"+spec.RunID+"/events", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	var peer *sandbox.APIPeer
	if spec.APIPeerUID != nil {
		peer = &sandbox.APIPeer{UID: *spec.APIPeerUID, SharesUID: spec.APIPeerSharesUID}
	}
	client, err := sandbox.NewAPIClient(spec.APISocket, peer)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	resp.Body.Close()
	return resp.StatusCode, ""
}
