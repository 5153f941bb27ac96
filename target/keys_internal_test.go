package target

import (
	"strings"
	"testing"
)

func TestHostsMatch(t *testing.T) {
	k, err := ParseKeys(strings.NewReader("client a 0123456789abcdef *=push home=read\nhosts home 127.0.0.2 10.0.0.0/8 fd00::/8\nhosts * 192.168.1.0/24\n"), "k")
	if err != nil {
		t.Fatal(err)
	}
	c := k.clients["a"]
	for _, tc := range []struct {
		export, addr string
		want         Right
	}{
		{"home", "127.0.0.2:7362", RightRead},
		{"home", "127.0.0.1:7362", RightNone},
		{"home", "10.9.8.7:1", RightRead},
		{"home", "[::ffff:10.1.1.1]:1", RightRead}, // a v4-mapped peer matches v4 rules
		{"home", "[fd12::1]:1", RightRead},
		{"home", "[fe80::1]:1", RightNone},
		{"scratch", "192.168.1.9:1", RightPush}, // hosts *: the exports without a line of their own
		{"scratch", "127.0.0.2:1", RightNone},
		{"home", "garbage", RightNone},
	} {
		if got := k.level(c, tc.export, peerAddr(tc.addr)); got != tc.want {
			t.Errorf("%s from %s: %v, want %v", tc.export, tc.addr, got, tc.want)
		}
	}
	if got := k.level(nil, "home", peerAddr("127.0.0.2:1")); got != RightNone {
		t.Errorf("no client: %v", got)
	}
}
