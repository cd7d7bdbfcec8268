package localsandbox

import (
	"fmt"
	"sync"
)

// idPool hands out sandbox uids. It is one per process, so two launchers
// in the same process (with overlapping ranges) never give two running
// sandboxes the same uid.
var idPool = struct {
	mu    sync.Mutex
	inUse map[int]bool
}{inUse: map[int]bool{}}

// acquireID reserves the lowest free offset in [0, count) from base and
// returns it. A sandbox's uid is base+offset and its gid gidBase+offset.
func acquireID(base, count int) (int, error) {
	idPool.mu.Lock()
	defer idPool.mu.Unlock()
	for off := 0; off < count; off++ {
		if !idPool.inUse[base+off] {
			idPool.inUse[base+off] = true
			return off, nil
		}
	}
	return 0, fmt.Errorf("all %d sandbox uids from %d are in use: wait for a run to end, or raise the count", count, base)
}

// releaseID makes uid free again.
func releaseID(uid int) {
	idPool.mu.Lock()
	defer idPool.mu.Unlock()
	delete(idPool.inUse, uid)
}
