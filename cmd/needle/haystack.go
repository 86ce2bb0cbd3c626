package needle

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"github.com/attnkit/attn/cmd/austen"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// EnvShared names the environment variable that points at the shared
// folder (the one holding data/austen/), for runs outside the repository.
const EnvShared = "ATTN_SHARED"

// ErrNoData is wrapped by the errors of DefaultHaystack when the shared
// data folder is not there: tests skip on it.
var ErrNoData = errors.New("needle: shared data folder not found")

// maxText bounds a haystack file, read whole.
const maxText = 1 << 30

// SharedDir returns the shared folder: $ATTN_SHARED when set, else
// ../shared beside the repository. The repository is the folder of
// go.work found from the working directory upwards (its modules develop
// together), or without one the folder of the first go.mod.
func SharedDir() (string, error) {
	if d := os.Getenv(EnvShared); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoData, err)
	}
	mod := ""
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, "..", "shared"), nil
		}
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && mod == "" {
			mod = dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			if mod == "" {
				return "", fmt.Errorf("%w: no repository above the working directory", ErrNoData)
			}
			return filepath.Join(mod, "..", "shared"), nil
		}
		dir = parent
	}
}

// DefaultHaystackName is the default haystack, in the results.
const DefaultHaystackName = "persuasion.txt.gz"

// DefaultHaystack returns Jane Austen's Persuasion, the novel the
// embedded model was not trained on, as package austen embeds it (the
// same text as the shared folder's data/austen/persuasion.txt.gz), so
// that the test runs from a fresh clone.
func DefaultHaystack() (string, error) {
	return austen.HeldOut()
}

// ReadText reads a UTF-8 text file, gunzipped when its name ends in .gz.
func ReadText(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	var b bytes.Buffer
	n, err := io.Copy(&b, io.LimitReader(r, maxText+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if n > maxText {
		return "", fmt.Errorf("%s: longer than %d bytes", path, maxText)
	}
	if !utf8.Valid(b.Bytes()) {
		return "", fmt.Errorf("%s: not UTF-8 text", path)
	}
	return b.String(), nil
}
