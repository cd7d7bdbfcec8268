// Command flood is the local caller without a token of issue 16, hole 9,
// for cmd/belay's tests: it opens -n TCP connections to -addr and keeps
// them open, idle; every -ask-th one first asks GET /v1/runs without a
// token and reads the answer. It raises its own open-file limit to the
// hard limit first. Once every connection is open it prints one JSON line
// (Report) and holds them until its stdin closes.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

// Report is what flood prints.
type Report struct {
	Opened       int // connections that were established
	DialErrors   int
	FirstDialErr string
	Asked        int // requests without a token that got an answer
	Unauthorized int // of those, 401s
	CloseHeader  int // of those, with Connection: close
	ClosedAfter  int // of those, whose connection the server then closed
}

func main() {
	addr := flag.String("addr", "", "host:port")
	n := flag.Int("n", 10000, "connections")
	ask := flag.Int("ask", 10, "every ask-th connection asks without a token first")
	flag.Parse()

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}

	var (
		mu    sync.Mutex
		rep   Report
		conns []net.Conn
		wg    sync.WaitGroup
	)
	next := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := net.DialTimeout("tcp", *addr, 30*time.Second)
				if err != nil {
					mu.Lock()
					rep.DialErrors++
					if rep.FirstDialErr == "" {
						rep.FirstDialErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				var asked, unauth, closeHdr, closed bool
				if i%*ask == 0 {
					asked, unauth, closeHdr, closed = askWithoutToken(c)
				}
				mu.Lock()
				rep.Opened++
				conns = append(conns, c)
				if asked {
					rep.Asked++
				}
				if unauth {
					rep.Unauthorized++
				}
				if closeHdr {
					rep.CloseHeader++
				}
				if closed {
					rep.ClosedAfter++
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < *n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

// askWithoutToken sends GET /v1/runs without a token on c and reads the
// answer: whether one came, whether it was a 401 with Connection: close,
// and whether the server then closed the connection.
func askWithoutToken(c net.Conn) (asked, unauthorized, closeHeader, closed bool) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /v1/runs HTTP/1.1\r\nHost: belay\r\n\r\n"); err != nil {
		return
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	return true, resp.StatusCode == http.StatusUnauthorized, resp.Close, err == io.EOF
}
