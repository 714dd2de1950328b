package e2e

import (
	"fmt"
	"testing"
	"time"
)

// stepper returns a logger of a test's steps, each with the time since
// the test began.
func stepper(t *testing.T) func(format string, args ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		t.Helper()
		t.Logf("[%6.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
}
