package agent

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
)

// ReadSkillTool is the tool the model reads a session skill's body with.
// The loop answers it from Config.Skills; Tools never sees it, and it is
// offered only when the run has skills.
const ReadSkillTool = "read_skill"

// readSkillDef is read_skill as the model sees it.
var readSkillDef = ToolDef{
	Name:        ReadSkillTool,
	Description: "Read the full instructions of one of the skills listed in the system prompt, by its name.",
	Parameters: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"name": map[string]any{"type": "string", "description": "the skill's name"},
		},
		"required":             []string{"name"},
		"additionalProperties": false,
	},
}

// skillsPrompt lists the skills for the system prompt: names and
// descriptions only; the bodies are read on demand.
func skillsPrompt(skills []belay.Skill) string {
	if len(skills) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nSkills (named instructions for this session; call %s with a name to read one before you rely on it):\n", ReadSkillTool)
	for _, s := range skills {
		fmt.Fprintf(&b, "- %s: %s\n", s.Name, s.Description)
	}
	return b.String()
}

// readSkill answers a read_skill call: the body of the named skill, or an
// error naming the skills there are.
func readSkill(skills []belay.Skill, rawArgs string) (string, bool) {
	var args struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(rawArgs), &args); err != nil || args.Name == "" {
		return `read_skill takes {"name": "<skill name>"}`, true
	}
	names := make([]string, 0, len(skills))
	for _, s := range skills {
		if s.Name == args.Name {
			return s.Body, false
		}
		names = append(names, s.Name)
	}
	return fmt.Sprintf("no skill is named %q; the skills are: %s", args.Name, strings.Join(names, ", ")), true
}
