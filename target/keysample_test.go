package target_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/target"
)

// The shipped sample keys file, copied as it is (README's install steps
// do), must not serve: its keys are placeholders anyone can read, and
// the parser says so, naming the line and how to make a key. With a key
// of each client's own in their place, it parses.
func TestKeysSampleRefusedAsShipped(t *testing.T) {
	b, err := os.ReadFile("../contrib/keys.sample")
	if err != nil {
		t.Fatal(err)
	}
	_, err = target.ParseKeys(strings.NewReader(string(b)), "keys.sample")
	if err == nil || !strings.Contains(err.Error(), "placeholder") || !strings.Contains(err.Error(), "openssl rand -base64 32") {
		t.Fatalf("the sample as shipped: %v; want its placeholder keys refused", err)
	}
	n := 0
	filled := regexp.MustCompile(`<KEY-OF-[a-z]+>`).ReplaceAllStringFunc(string(b), func(string) string {
		n++
		return fmt.Sprintf("a-key-of-its-own-%04d", n)
	})
	k, err := target.ParseKeys(strings.NewReader(filled), "keys.sample")
	if err != nil {
		t.Fatalf("the sample with keys filled in: %v", err)
	}
	if got := strings.Join(k.Names(), ","); got != "alice,backup,build" {
		t.Fatalf("the sample with keys filled in has clients %s", got)
	}
}
