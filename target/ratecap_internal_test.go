package target

import (
	"errors"
	"strings"
	"testing"
)

// TestKeysBwLimit: a keys file's bwlimit line caps its client, in
// --bwlimit's units; mistakes name their line.
func TestKeysBwLimit(t *testing.T) {
	const aliceKey, bobKey = "alice-key-0123456789", "bob-key-0123456789ab"
	k, err := ParseKeys(strings.NewReader("client alice "+aliceKey+" *=read\nclient bob "+bobKey+" *=read\nbwlimit alice 1.5M # 1.5 MiB/s\n"), "keys")
	if err != nil {
		t.Fatal(err)
	}
	if got := k.clients["alice"].BwLimit; got != 3<<19 {
		t.Errorf("alice's bwlimit: %d, want %d", got, 3<<19)
	}
	if got := k.clients["bob"].BwLimit; got != 0 {
		t.Errorf("bob's bwlimit: %d, want none", got)
	}
	for _, tc := range []struct{ text, want string }{
		{"bwlimit alice 1M\nclient alice " + aliceKey, "keys:1: bwlimit for client \"alice\": no client line names it before this one"},
		{"client alice " + aliceKey + "\nbwlimit alice", "keys:2: want bwlimit NAME RATE"},
		{"client alice " + aliceKey + "\nbwlimit alice fast", "keys:2: bwlimit for client \"alice\": invalid rate \"fast\""},
		{"client alice " + aliceKey + "\nbwlimit alice 1M\nbwlimit alice 2M", "keys:3: bwlimit for client \"alice\" given twice"},
	} {
		_, err := ParseKeys(strings.NewReader(tc.text), "keys")
		var ke *KeysError
		if !errors.As(err, &ke) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}
