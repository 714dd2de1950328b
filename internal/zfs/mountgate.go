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
	"syscall"
	"time"
)

// mountGate is held while a command that may mount or unmount runs on
// zfs-fuse, for mountLease at most: one for the whole process, as the
// daemon is one for the whole machine.
var mountGate = make(chan struct{}, 1)

// mountLockPath is the file whose lock (flock) extends mountGate to every
// process of the machine that runs zfs through this package. A process
// that cannot open it (no /run/lock, a user who may not write there)
// keeps to its own gate. A variable for the tests.
var mountLockPath = "/run/lock/nomad-device-zfs.zfs-fuse-mounts"

// mountLease is how long a command holds mountGate at most. Such a
// command takes well under a second, even under churn; one that runs
// longer is stuck (a hung daemon, a dataset busy for long), and holding
// every other slot's mounts behind it would turn one slot's fault into
// all of theirs. A variable for the tests.
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

// enterMountGate takes mountGate for a command that may mount or unmount
// on zfs-fuse, then the machine's lock (lockMachine), waiting for the gate
// at most until ctx is done, and returns the function that gives both
// back and how long it waited. When the command still runs after
// mountLease, both are given back by themselves and lapsed(false) is
// called; when another process holds the machine's lock past its own
// lease (stopped, say), the command goes on without it after mountLease
// and lapsed(true) is called. Other commands, and any command elsewhere,
// pass at once.
func enterMountGate(ctx context.Context, pool bool, args []string, lapsed func(elsewhere bool)) (leave func(), waited time.Duration, err error) {
	if !mountChanging(pool, args) || !mountsOneAtATime() {
		return func() {}, 0, nil
	}
	start := time.Now()
	select {
	case mountGate <- struct{}{}:
	case <-ctx.Done():
		return nil, time.Since(start), fmt.Errorf("waiting for another command that mounts or unmounts to end (on zfs-fuse they run one at a time): %w", ctx.Err())
	}
	lock, past, err := lockMachine(ctx, mountLease)
	if err != nil {
		<-mountGate
		return nil, time.Since(start), fmt.Errorf("waiting for another process's command that mounts or unmounts to end (on zfs-fuse they run one at a time, machine-wide): %w", err)
	}
	if past && lapsed != nil {
		lapsed(true)
	}
	waited = time.Since(start)
	var once sync.Once
	give := func() {
		once.Do(func() {
			if lock != nil {
				lock.Close() // gives the lock back (this process's only descriptor of it)
			}
			<-mountGate
		})
	}
	lease := time.AfterFunc(mountLease, func() {
		give()
		if lapsed != nil {
			lapsed(false)
		}
	})
	return func() {
		lease.Stop()
		give()
	}, waited, nil
}

// lockMachine takes the lock on mountLockPath for a command about to run,
// waiting at most lease (a process that holds it gives it back after its
// own lease, unless it is stopped) or until ctx is done. It returns the
// open file, whose closing gives the lock back; nil with past set when
// lease passed first, and nil alone when the file cannot be opened or
// locked (the gate is then this process's alone). Only one goroutine of a
// process calls it at a time (under mountGate). The file is opened
// close-on-exec, so no zfs child holds the lock on.
func lockMachine(ctx context.Context, lease time.Duration) (f *os.File, past bool, err error) {
	f, err = os.OpenFile(mountLockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, nil
	}
	deadline := time.Now().Add(lease)
	pause := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return f, false, nil
		case !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR):
			f.Close()
			return nil, false, nil
		case !time.Now().Before(deadline):
			f.Close()
			return nil, true, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, false, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 20*time.Millisecond)
	}
}
