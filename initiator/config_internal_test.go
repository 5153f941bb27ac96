package initiator

import (
	"testing"
	"time"
)

// "Never" has a value of its own: Validate takes NoRetries and
// NeverRetry and refuses other negatives; zero takes the defaults.
func TestConfigNeverIsValid(t *testing.T) {
	dev := openTestDevice(t)
	for _, tc := range []struct {
		retries  int
		retryFor time.Duration
		ok       bool
	}{
		{0, 0, true},
		{NoRetries, NeverRetry, true},
		{-2, 0, false},
		{0, -time.Second, false},
	} {
		c := Config{Device: dev, Retries: tc.retries, RetryFor: tc.retryFor}
		c.setDefaults()
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("retries %d, retry-for %v: Validate %v, want ok %v", tc.retries, tc.retryFor, err, tc.ok)
		}
	}
	c := Config{}
	c.setDefaults()
	if d := Defaults(); c.Retries != d.Retries || c.Timeout != d.Timeout || c.RetryFor != d.RetryFor || c.ReadSize != d.ReadSize {
		t.Errorf("zero Config took %+v, want Defaults() %+v", c, d)
	}
}
