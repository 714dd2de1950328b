package churn

import (
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The machine's and this process's CPU times read from /proc are
// cumulative: a later sample is never below an earlier one, and burning CPU
// shows in both.
func TestSampleCPU(t *testing.T) {
	self := os.Getpid()
	a, err := sampleCPU(self, os.Getppid())
	must.NoError(t, err)
	// Spin until this process has used 0.15 s of CPU (however busy the
	// machine is), within 10 s.
	u := &CPUUse{}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && u.Plugin <= 0.15; {
		for spin := time.Now().Add(50 * time.Millisecond); time.Now().Before(spin); {
		}
		b, err := sampleCPU(self, os.Getppid())
		must.NoError(t, err)
		u = b.since(a)
	}
	must.Greater(t, 0.1, u.Plugin)
	must.GreaterEq(t, u.Plugin-0.05, u.Machine) // ticks are 10 ms; the two files are read apart
	must.GreaterEq(t, 0, u.AgentChildren)
}
