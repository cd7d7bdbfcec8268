package sandbox

import "github.com/belay-dev/belay/internal/agent"

// Definitions returns the tools as the model sees them: each tool's name,
// what it does and its arguments as a JSON schema.
func (t *Tools) Definitions() []agent.ToolDef {
	specs := t.specs()
	defs := make([]agent.ToolDef, len(specs))
	for i, s := range specs {
		defs[i] = agent.ToolDef{Name: s.name, Description: s.description, Parameters: s.parameters}
	}
	return defs
}

var (
	_ agent.Tools     = (*Tools)(nil)
	_ agent.EventSink = (*EventClient)(nil)
)
