package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// EnvECSMetadata is the variable the ECS agent sets in every container of a
// Fargate task: the base URL of the task metadata endpoint (version 4).
const EnvECSMetadata = "ECS_CONTAINER_METADATA_URI_V4"

// ecsMetadataTimeout bounds the metadata call: it is on the task's own
// link-local address and answers at once, or not at all.
const ecsMetadataTimeout = 3 * time.Second

// ECSTaskARN returns the ARN of the ECS task the entry runs in, read from
// the task metadata endpoint, or "" outside ECS or when the endpoint does
// not answer. The entry sends it with its claim, and the control plane
// records it so cancel and cleanup can stop this task. It is MainClaim's
// taskARN on Fargate.
func ECSTaskARN(ctx context.Context) string {
	return ecsTaskARN(ctx, os.Getenv(EnvECSMetadata), http.DefaultClient)
}

func ecsTaskARN(ctx context.Context, base string, client *http.Client) string {
	if base == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, ecsMetadataTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/task", nil)
	if err != nil {
		return ""
	}
	resp, err := client.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	var task struct {
		TaskARN string `json:"TaskARN"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&task); err != nil {
		return ""
	}
	if belay.CheckSandboxRef(task.TaskARN) != nil {
		return ""
	}
	return task.TaskARN
}
