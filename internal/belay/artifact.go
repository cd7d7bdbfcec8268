package belay

import (
	"slices"
	"strconv"
)

// MaxArtifactIDLen bounds a run id and an artifact name in an artifact store.
const MaxArtifactIDLen = 128

// CheckArtifactRunID admits 1–128 characters of [A-Za-z0-9_-]: enough for
// belay's run ids, and never a path separator or a dot segment, so a run id
// can never reach another run's folder or objects. Returns invalid.
func CheckArtifactRunID(id string) error {
	if id == "" || len(id) > MaxArtifactIDLen {
		return FieldErrorf(CodeInvalid, "runId", "must be 1 to %d characters", MaxArtifactIDLen)
	}
	for i := 0; i < len(id); i++ {
		if !isArtifactIDByte(id[i]) {
			return FieldErrorf(CodeInvalid, "runId", "may hold only letters, digits, '_' and '-'")
		}
	}
	return nil
}

// CheckArtifactName admits 1–128 characters of [A-Za-z0-9._-] not starting
// with ".": a plain file name, never hidden, never a path. Returns invalid.
func CheckArtifactName(name string) error {
	if name == "" || len(name) > MaxArtifactIDLen {
		return FieldErrorf(CodeInvalid, "name", "must be 1 to %d characters", MaxArtifactIDLen)
	}
	if name[0] == '.' {
		return FieldErrorf(CodeInvalid, "name", "must not start with '.'")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isArtifactIDByte(c) && c != '.' {
			return FieldErrorf(CodeInvalid, "name", "may hold only letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}

// CheckArtifact checks the run id and the artifact name of one artifact
// store call. Returns invalid.
func CheckArtifact(runID, name string) error {
	if err := CheckArtifactRunID(runID); err != nil {
		return err
	}
	return CheckArtifactName(name)
}

// CheckArtifactPut checks what PutArtifact is asked to store, before an
// adapter writes anything: the run id, the name, and content of at most
// MaxArtifactBytes. Returns invalid or too_large.
func CheckArtifactPut(runID, name string, content []byte) error {
	if err := CheckArtifact(runID, name); err != nil {
		return err
	}
	if len(content) > MaxArtifactBytes {
		return Errorf(CodeTooLarge, "artifact %s is %d bytes; the limit is %d", name, len(content), MaxArtifactBytes)
	}
	return nil
}

func isArtifactIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// StagedOutputName is the artifact name under which a sandbox's output
// (one of ArtifactNames) waits, for one attempt, until the control plane
// has read and validated it: "sandbox-<attempt>-<name>". Only validated
// outputs are stored under their public names; staged ones are never
// listed or served to callers (see IsPublicArtifact).
func StagedOutputName(attempt int, name string) string {
	return "sandbox-" + strconv.Itoa(attempt) + "-" + name
}

// IsPublicArtifact reports whether name is one a caller may list and read:
// one of ArtifactNames.
func IsPublicArtifact(name string) bool { return slices.Contains(ArtifactNames, name) }
