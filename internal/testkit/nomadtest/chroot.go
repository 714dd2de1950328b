package nomadtest

import (
	"context"
	"sync"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
)

// taskPrograms are the programs the tests' exec tasks run. Every agent that
// StartAgent starts gives its exec tasks a chroot of /bin/sh and these
// (under /usr/bin), their shared objects, and taskFiles: nothing else of
// the host. The default chroot links all of /usr into every task's
// directory, about 10 s per task here and over a minute in the emulated
// OpenZFS VM (docs/testing-openzfs.md). A task script that needs another
// program fails with "not found" in its stderr: add the program here.
var taskPrograms = []string{
	"cat", "chmod", "chown", "cp", "dd", "df", "echo", "env", "grep", "head",
	"id", "ls", "mkdir", "rm", "sleep", "stat", "sync", "touch", "tr",
	"true", "wc",
}

// taskFiles are the plain files the tasks read: user and group names for
// `id` and `ls -l`.
var taskFiles = []string{"/etc/group", "/etc/passwd"}

var (
	// chrootOnce guards chrootBlock and chrootErr: the block is the same
	// for every agent of a test binary, so ldd runs once.
	chrootOnce  sync.Once
	chrootBlock string
	chrootErr   error
)

// taskChroot returns the client `chroot_env` block of taskPrograms and
// taskFiles.
func taskChroot() (string, error) {
	chrootOnce.Do(func() {
		// The jobs' command is /bin/sh; their scripts find the rest on
		// PATH. On a merged-/usr system /bin/sh and /usr/bin/sh are one
		// file, which chroot_env can map once.
		programs := []string{"/bin/sh"}
		for _, p := range taskPrograms {
			programs = append(programs, "/usr/bin/"+p)
		}
		chrootBlock, chrootErr = localagent.ChrootEnv(context.Background(), programs, taskFiles)
	})
	return chrootBlock, chrootErr
}
