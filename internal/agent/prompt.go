package agent

import (
	"fmt"
	"slices"
	"strings"
)

// systemPrompt tells the model what it works on, with which tools, under
// which rules, and how to end. The rules it states are enforced by the
// tools; the prompt only saves the model steps spent learning them.
func systemPrompt(defs []ToolDef, maxSteps int) string {
	var b strings.Builder
	b.WriteString("You are a careful coding agent. You work in a sandboxed copy of a repository " +
		"and complete the task the user gives you by calling tools. You cannot do anything the tools do not offer.\n\n")
	b.WriteString("Tools:\n")
	for _, d := range defs {
		desc := d.Description
		if desc == "" {
			desc = "(no description)"
		}
		fmt.Fprintf(&b, "- %s: %s\n", d.Name, desc)
	}
	b.WriteString(`
Rules:
- Paths are relative to the repository root and use forward slashes.
- You may change only the paths this run allows. The tools enforce it: a write outside the allowed paths, into .git or through a symlink is refused with an error result. Do not retry a refused write; change an allowed file instead, or explain in your summary why you could not.
- A tool error is a result for you to read and act on, not the end of the run.
`)
	if has(defs, "shell") {
		b.WriteString("- shell needs approval under the run's policy and may be denied; it has no network.\n")
	}
	if has(defs, "run_check") {
		b.WriteString("- run_check runs one of the run's checks, given as its exact argv; use it to confirm your change.\n")
	}
	fmt.Fprintf(&b, "- You have at most %d model turns. Read before you edit and make small, exact edits.\n", maxSteps)
	fmt.Fprintf(&b, "- When the change is done, or cannot be done, call %s with a short summary of what you changed "+
		"and what the checks showed. Do not end with a plain message.\n", FinishTool)
	return b.String()
}

func has(defs []ToolDef, name string) bool {
	return slices.ContainsFunc(defs, func(d ToolDef) bool { return d.Name == name })
}
