package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// SecretsManagerSource fetches a secret's current version (AWSCURRENT) from
// AWS Secrets Manager. The call is kept thin: everything worth testing
// about the answer is in SecretValue.
type SecretsManagerSource struct {
	client   *secretsmanager.Client
	secretID string
	field    string
}

// SecretsManagerOption configures a SecretsManagerSource.
type SecretsManagerOption func(*SecretsManagerSource)

// WithJSONField reads the secret as a JSON object and takes the string
// field name from it, for secrets stored as {"apiKey": "..."} (the shape
// the Secrets Manager console writes for key/value secrets).
func WithJSONField(name string) SecretsManagerOption {
	return func(s *SecretsManagerSource) { s.field = name }
}

// NewSecretsManagerSource returns a Source for the secret secretID (a name
// or ARN). Without WithJSONField the whole SecretString is the value.
func NewSecretsManagerSource(client *secretsmanager.Client, secretID string, opts ...SecretsManagerOption) *SecretsManagerSource {
	s := &SecretsManagerSource{client: client, secretID: secretID}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Fetch calls GetSecretValue and extracts the value.
func (s *SecretsManagerSource) Fetch(ctx context.Context) (string, error) {
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(s.secretID)})
	if err != nil {
		return "", fmt.Errorf("secrets: get secret %s: %w", s.secretID, err)
	}
	if out.SecretString == nil {
		return "", fmt.Errorf("secrets: secret %s has no string value (binary secrets are not supported)", s.secretID)
	}
	v, err := SecretValue(*out.SecretString, s.field)
	if err != nil {
		return "", fmt.Errorf("secrets: secret %s: %w", s.secretID, err)
	}
	return v, nil
}

// String names the secret, which is not itself secret.
func (s *SecretsManagerSource) String() string {
	if s.field != "" {
		return "SecretsManagerSource(" + s.secretID + "#" + s.field + ")"
	}
	return "SecretsManagerSource(" + s.secretID + ")"
}

// SecretValue extracts the value from a SecretString: the whole string
// (trimmed) when field is empty, else the string member field of the JSON
// object it holds. Its errors never quote the secret, not even the single
// character a JSON syntax error would.
func SecretValue(secretString, field string) (string, error) {
	if field == "" {
		v := strings.TrimSpace(secretString)
		if v == "" {
			return "", errors.New("the secret is empty")
		}
		return v, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(secretString), &obj); err != nil || obj == nil {
		return "", fmt.Errorf("the secret is not a JSON object, so it has no field %q", field)
	}
	raw, ok := obj[field]
	if !ok {
		return "", fmt.Errorf("the secret's JSON object has no field %q", field)
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", fmt.Errorf("the secret's field %q is not a JSON string", field)
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return "", fmt.Errorf("the secret's field %q is empty", field)
	}
	return v, nil
}
