package zfs

// zfs-fuse serves every mounted dataset of the machine from one daemon,
// which hands each new mount to its FUSE listener through one pipe. When
// commands that mount or unmount run side by side, their records can
// interleave there: the listener reads a bad length and blocks holding
// the lock every file operation needs (all its threads wait on locks,
// file operations and `zfs unmount` never return, only SIGKILL stops it),
// or libfuse crashes. The plugin met it under churn; a stress of four
// slots' release cycles hung or crashed it within minutes, and ran 13
// minutes without either with those commands one at a time
// (docs/troubleshooting.md#zfs-fuse-limits). So on zfs-fuse every Runner
// of the process runs them one at a time, and the processes that run
// this package (the plugin, its operator CLI, the plugin of a second agent
// on the machine) take turns through a lock on a file (mountLockPath); the
// other commands, and file work on the mounts, go on beside them. The
// kernel module has no such daemon, and is left alone.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// mountGate is held by a command that may mount or unmount on zfs-fuse
// while it waits for the machine's turn (mountlock.go) and then while it
// runs, for mountLease at most: one for the whole process, as the daemon
// is one for the whole machine.
var mountGate = make(chan struct{}, 1)

// mountLease is how long a running command holds mountGate and the
// machine's turn at most. Such a command takes well under a second, even
// under churn; one that runs longer is stuck (a hung daemon, a dataset
// busy for long), and holding every other slot's mounts behind it would
// turn one slot's fault into all of theirs. A variable for the tests.
var mountLease = 2 * time.Second

// onFuse caches whether this machine runs zfs-fuse (no /dev/zfs, which
// the kernel module makes).
var onFuse = sync.OnceValue(func() bool {
	_, err := os.Stat("/dev/zfs")
	return errors.Is(err, fs.ErrNotExist)
})

// mountsOneAtATime is onFuse, a variable for the tests that check the gate
// where the kernel module runs.
var mountsOneAtATime = onFuse

// zfsMounting are the zfs subcommands that may mount or unmount a
// filesystem, but for `receive -u`; set and inherit do when they touch
// mountpoint or canmount (mountChanging).
var zfsMounting = map[string]bool{
	"create": true, "clone": true, "mount": true, "unmount": true, "umount": true,
	"rename": true, "destroy": true, "rollback": true, "receive": true, "recv": true,
}

// mountChanging reports whether `zfs args` (zpool when pool is set) may
// mount or unmount a filesystem.
func mountChanging(pool bool, args []string) bool {
	if len(args) == 0 {
		return false
	}
	if pool {
		switch args[0] {
		case "create", "import", "export", "destroy":
			return true
		}
		return false
	}
	if args[0] == "receive" || args[0] == "recv" {
		for _, a := range args[1:] {
			if a == "-u" {
				return false // received unmounted
			}
		}
	}
	if zfsMounting[args[0]] {
		return true
	}
	if args[0] == "set" || args[0] == "inherit" {
		for _, a := range args[1:] {
			if strings.HasPrefix(a, "mountpoint") || strings.HasPrefix(a, "canmount") {
				return true
			}
		}
	}
	return false
}

// gateNote is what enterMountGate tells its caller (the runner logs it).
type gateNote int

const (
	// turnLapsed: the command still runs after mountLease; the next one
	// goes beside it.
	turnLapsed gateNote = iota
	// otherStuck: another process holds the machine's turn past its own
	// lease (stopped, say); the command goes beside it, as the ones after
	// it do until that holder is gone (told once per holder).
	otherStuck
	// noMachineLock: the machine's lock cannot be used (err says why);
	// this process keeps to its own turns.
	noMachineLock
)

// enterMountGate takes mountGate for a command that may mount or unmount
// on zfs-fuse, then the machine's turn (lockMachine), waiting at most
// until ctx is done, and returns the function that gives both back and
// how long it waited. The command then holds both for mountLease at
// most: after that they are given back by themselves and note(turnLapsed)
// is called. note is also told when the command goes beside another
// process's stuck turn, or without the machine's lock. Other commands,
// and any command elsewhere, pass at once.
func enterMountGate(ctx context.Context, pool bool, args []string, note func(gateNote, error)) (leave func(), waited time.Duration, err error) {
	if !mountChanging(pool, args) || !mountsOneAtATime() {
		return func() {}, 0, nil
	}
	if note == nil {
		note = func(gateNote, error) {}
	}
	start := time.Now()
	select {
	case mountGate <- struct{}{}:
	case <-ctx.Done():
		return nil, time.Since(start), fmt.Errorf("waiting for another command that mounts or unmounts to end (on zfs-fuse they run one at a time): %w", ctx.Err())
	}
	turn, err := lockMachine(ctx)
	if err != nil {
		<-mountGate
		return nil, time.Since(start), fmt.Errorf("waiting for another process's command that mounts or unmounts to end (on zfs-fuse they run one at a time, machine-wide): %w", err)
	}
	switch {
	case turn.stuck && turn.newly:
		note(otherStuck, nil)
	case turn.unusable != nil:
		note(noMachineLock, turn.unusable)
	}
	waited = time.Since(start)
	var once sync.Once
	give := func() {
		once.Do(func() {
			turn.lock.release()
			<-mountGate
		})
	}
	lease := time.AfterFunc(mountLease, func() {
		give()
		note(turnLapsed, nil)
	})
	return func() {
		lease.Stop()
		give()
	}, waited, nil
}
