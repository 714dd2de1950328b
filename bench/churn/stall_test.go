package churn

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestStalledProcs_NamesTheAgentAndThePlugin(t *testing.T) {
	self := os.Getpid()
	lines := stalledProcs(self, -1)
	var mine []string
	for _, l := range lines {
		if strings.HasPrefix(l, fmt.Sprintf("pid %d ", self)) {
			mine = append(mine, l)
		}
	}
	must.SliceLen(t, 1, mine, must.Sprintf("lines: %q", lines))
	must.StrContains(t, mine[0], "wchan ")
	must.StrContains(t, mine[0], " threads ") // the Go runtime runs several
}

// A zfs command's child (the mount or unmount helper a hung `zfs unmount`
// waits for) is listed, named as such: here a script named zfs that waits
// for a sleep.
func TestStalledProcs_NamesTheChildOfAZFSCommand(t *testing.T) {
	script := filepath.Join(t.TempDir(), "zfs")
	must.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nsleep 60\n"), 0o755))
	cmd := exec.Command(script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the script's group, by its PID
		_ = cmd.Wait()
	})
	want := fmt.Sprintf("(child of zfs pid %d)", cmd.Process.Pid)
	// The sleep is read asleep once it is: just started, it may still be
	// running (state R) on its way into the nanosleep.
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lines = stalledProcs(-1, -1)
		for _, l := range lines {
			if strings.Contains(l, want) && strings.Contains(l, " sleep state S ") {
				return
			}
		}
	}
	t.Fatalf("no line names the child of the zfs script (pid %d), asleep: %q", cmd.Process.Pid, lines)
}

func TestStallPath(t *testing.T) {
	cases := []struct{ keep, batch, want string }{
		{"/tmp/zfsbench-churn-20261129T150405-agent.log", "", "/tmp/zfsbench-churn-20261129T150405-agent-stall.txt"},
		{"/tmp/zfsbench-churn-20261129T150405-agent.log", "churn-07-device", "/tmp/zfsbench-churn-20261129T150405-agent-churn-07-device-stall.txt"},
		{"/x/agent", "", "/x/agent-stall.txt"},
	}
	for _, c := range cases {
		must.Eq(t, c.want, stallPath(c.keep, c.batch))
	}
	must.StrHasSuffix(t, "-stall.txt", stallPath("", ""))
}
