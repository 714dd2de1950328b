package zfs_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// helperEnv switches the test binary into runAsPluginHelper (see TestMain);
// its value is the path of the zfs command the helper's Runner runs.
const helperEnv = "NDZ_ZFS_TEST_PLUGIN_HELPER_ZFS"

// runAsPluginHelper plays the plugin: it runs one zfs command through a
// Runner and blocks in it until the test SIGKILLs this process.
func runAsPluginHelper() int {
	r := &zfs.Runner{ZFS: os.Getenv(helperEnv), Timeout: time.Hour}
	_, err := r.ZFSCmd(context.Background(), "list")
	fmt.Fprintf(os.Stderr, "helper: zfs returned: %v\n", err)
	return 3
}

// A zfs child whose plugin dies (SIGKILL, no chance to clean up) dies with
// it: the runner gives every child a parent-death signal. The child here is
// a wrapper script that records its PID and then execs a long sleep.
func TestRunner_ChildDiesWithPlugin(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "zfs.pid")
	wrapper := writeScript(t, dir, "zfs", "echo $$ > '"+pidFile+".tmp' && mv '"+pidFile+".tmp' '"+pidFile+"'\nexec sleep 600\n")

	self, err := os.Executable()
	must.NoError(t, err)
	var stderr bytes.Buffer
	plugin := exec.Command(self, "-test.run=^$")
	plugin.Env = append(os.Environ(), helperEnv+"="+wrapper)
	plugin.Stderr = &stderr
	must.NoError(t, plugin.Start())
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = plugin.Process.Kill()
			_ = plugin.Wait()
		}
	})

	child := waitPIDFile(t, pidFile, 20*time.Second)
	must.NoError(t, plugin.Process.Kill())
	_ = plugin.Wait()
	waited = true
	must.True(t, goneWithin(child, 5*time.Second),
		must.Sprintf("zfs child %d outlived its SIGKILLed parent by 5 s; helper stderr: %s", child, stderr.String()))
}

// When a command times out, the runner signals its whole process group: a
// grandchild goes too, even one that ignores SIGTERM (SIGKILL after the grace).
func TestRunner_TimeoutKillsProcessGroup(t *testing.T) {
	cases := []struct {
		name       string
		background string // how the wrapper starts its grandchild
		within     time.Duration
	}{
		{"grandchild", "sleep 600 &", 5 * time.Second},
		{"grandchild ignoring SIGTERM", "(trap '' TERM; exec sleep 600) &", 5*time.Second + 5*time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "grandchild.pid")
			wrapper := writeScript(t, dir, "zfs", tc.background+"\necho $! > '"+pidFile+".tmp' && mv '"+pidFile+".tmp' '"+pidFile+"'\nwait\n")
			r := &zfs.Runner{ZFS: wrapper, Timeout: 2 * time.Second}
			_, err := r.ZFSCmd(context.Background(), "list")
			must.ErrorIs(t, err, context.DeadlineExceeded)
			grandchild := waitPIDFile(t, pidFile, time.Second)
			must.True(t, goneWithin(grandchild, tc.within),
				must.Sprintf("grandchild %d still alive %v after the timeout", grandchild, tc.within))
		})
	}
}

// writeScript writes an executable sh script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	must.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
	return path
}

// waitPIDFile waits for a script to write its PID into path and returns it.
// A process that is still alive when the test ends is SIGKILLed (by that
// PID) at cleanup, so that a failing test leaves nothing behind.
func waitPIDFile(t *testing.T, path string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			must.NoError(t, err)
			must.Positive(t, pid)
			t.Cleanup(func() {
				if !goneWithin(pid, 0) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PID in %s after %v", path, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goneWithin polls until pid no longer runs: it does not exist, or it is a
// zombie (dead, waiting to be reaped by whichever process inherited it).
func goneWithin(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if syscall.Kill(pid, 0) == syscall.ESRCH || isZombie(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isZombie reads the state field of /proc/<pid>/stat (after the ")" that
// ends the command name).
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z'
}
