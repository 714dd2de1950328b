// Package zfs is the only code in nomad-device-zfs that runs the zfs and zpool
// commands. It offers one careful runner (argument lists only, a context and a
// timeout on every call, every child in its own process group with a
// parent-death signal, standard error kept apart, busy errors retried with a
// bounded backoff), a typed *Error with sentinels, and pure parsers of the
// tab-separated output of `zfs get -H -p` and `zpool list -H`.
package zfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
)

// Defaults for Runner fields left at zero.
const (
	DefaultTimeout     = 2 * time.Minute
	DefaultBusyRetries = 6
	DefaultBusyBackoff = 250 * time.Millisecond
	// killGrace is how long a command has between SIGTERM and SIGKILL once
	// its context is done.
	killGrace = 5 * time.Second
)

// Runner runs zfs and zpool. The zero value is usable: it finds both on PATH.
// A Runner is safe for concurrent use; it holds no mutable state but a
// counter and the count of foreground commands running (see Foreground).
// On zfs-fuse, the commands that mount or unmount also take a gate shared
// by every Runner of the process, and a lock shared by every process of
// the machine that runs this package (mountgate.go, mountlock.go).
type Runner struct {
	// ZFS and Zpool are the commands to run; "zfs" and "zpool" (found on
	// PATH) when empty.
	ZFS, Zpool string
	// Timeout bounds each single run of a command (DefaultTimeout when zero).
	Timeout time.Duration
	// BusyRetries is how many times a command that failed with ErrBusy is run
	// again; BusyBackoff is the first wait, doubled each time.
	BusyRetries int
	BusyBackoff time.Duration
	// Logger receives one debug line per command; nil means no logging.
	Logger hclog.Logger
	// Observer, when set, is told of every process the runner ran (each
	// busy retry is one). Set it before the runner is first used.
	Observer Observer
	// MaxYield is how long a command waits at most, before it starts, for
	// the foreground commands running then (see Foreground);
	// DefaultMaxYield when zero, no wait when negative.
	MaxYield time.Duration

	runs atomic.Int64
	prio priority
}

// Runs reports how many processes the runner has started so far. Tests and
// benchmarks use it to prove that periodic work costs one process per refresh.
func (r *Runner) Runs() int64 { return r.runs.Load() }

// ZFSCmd runs `zfs args...` and returns its standard output.
func (r *Runner) ZFSCmd(ctx context.Context, args ...string) ([]byte, error) {
	return r.run(ctx, orDefault(r.ZFS, "zfs"), args)
}

// ZFSStream runs `zfs args...` with standard input read from in and
// standard output written to out (either may be nil): `zfs send` and `zfs
// receive`. It is never retried (a stream cannot be replayed) and has no
// Timeout of its own: a stream takes as long as its size, so ctx (which must
// have a deadline) says how long is too long. On return the process has
// exited or been killed.
func (r *Runner) ZFSStream(ctx context.Context, in io.Reader, out io.Writer, args ...string) error {
	if _, ok := ctx.Deadline(); !ok {
		return &Error{Args: append([]string{orDefault(r.ZFS, "zfs")}, args...), Kind: ErrInvalid,
			Err: errors.New("a zfs stream needs a deadline")}
	}
	_, err := r.runWith(ctx, orDefault(r.ZFS, "zfs"), args, streams{in: in, out: out, untimed: true})
	return err
}

// ZpoolCmd runs `zpool args...` and returns its standard output.
func (r *Runner) ZpoolCmd(ctx context.Context, args ...string) ([]byte, error) {
	return r.run(ctx, orDefault(r.Zpool, "zpool"), args)
}

// run runs the command, retrying ErrBusy with a doubling backoff. On return
// the process has exited (or was killed); a non-nil error is always *Error.
func (r *Runner) run(ctx context.Context, bin string, args []string) ([]byte, error) {
	return r.runWith(ctx, bin, args, streams{})
}

// streams are a stream command's standard input and output (see
// ZFSStream); the zero value is a plain command's.
type streams struct {
	in  io.Reader
	out io.Writer
	// untimed: no Timeout; the caller's ctx alone bounds the run.
	untimed bool
}

// runWith is run with the given streams.
func (r *Runner) runWith(ctx context.Context, bin string, args []string, io streams) ([]byte, error) {
	retries := r.BusyRetries
	if retries == 0 {
		retries = DefaultBusyRetries
	}
	backoff := r.BusyBackoff
	if backoff == 0 {
		backoff = DefaultBusyBackoff
	}
	for attempt := 0; ; attempt++ {
		out, err := r.runOnce(ctx, bin, args, io)
		// A stream cannot be replayed: no retry.
		if err == nil || !errors.Is(err, ErrBusy) || attempt >= retries || io.in != nil || io.out != nil {
			return out, err
		}
		if r.Logger != nil {
			r.Logger.Debug("zfs busy, retrying", "cmd", bin, "args", args, "attempt", attempt+1, "backoff", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff *= 2
	}
}

// runOnce runs the command once, in its own process group. On return the
// command has exited or been killed; after a timeout or cancel, what is left
// of its group has had SIGTERM and gets SIGKILL killGrace after it.
func (r *Runner) runOnce(ctx context.Context, bin string, args []string, io streams) ([]byte, error) {
	// Before the command's own timeout starts: a wait for foreground
	// commands (MaxYield at most) does not eat into it.
	var yielded time.Duration
	if isForeground(ctx) {
		r.prio.enter()
		defer r.prio.leave()
	} else {
		maxYield := r.MaxYield
		if maxYield == 0 {
			maxYield = DefaultMaxYield
		}
		yielded = r.prio.yield(ctx, maxYield)
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if !io.untimed {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	// On zfs-fuse, one mount or unmount at a time (mountgate.go), waited
	// for within the command's own timeout.
	note := func(n gateNote, err error) {
		if r.Logger == nil {
			return
		}
		switch n {
		case turnLapsed:
			r.Logger.Warn("a zfs command that mounts or unmounts runs past its turn; the next one goes beside it (zfs-fuse may hang)", "cmd", bin, "args", args, "turn", mountLease)
		case otherStuck:
			r.Logger.Warn("another process holds the machine's turn for commands that mount or unmount past its lease; this one goes beside it (zfs-fuse may hang)", "cmd", bin, "args", args, "lock", mountLockPath)
		case noMachineLock:
			if lockProblems.first(err.Error()) {
				r.Logger.Warn("commands that mount or unmount take turns within this process only: the machine's lock cannot be used (zfs-fuse may hang if another process mounts meanwhile)", "lock", mountLockPath, "error", err)
			}
		}
	}
	leave, gateWait, gerr := enterMountGate(ctx, bin == orDefault(r.Zpool, "zpool"), args, note)
	if gerr != nil {
		zerr := &Error{Args: append([]string{bin}, args...), ExitCode: -1, Err: gerr}
		if r.Logger != nil {
			r.Logger.Trace("not run", "cmd", bin, "args", args, "yielded", yielded, "gate_wait", gateWait, "error", gerr)
		}
		return nil, zerr
	}
	defer leave()

	cmd := exec.CommandContext(ctx, bin, args...)
	// Every child leads its own process group, so that a timeout reaches the
	// processes it starts too (zfs-fuse's zfs runs mount and umount), and
	// dies with SIGKILL when the plugin dies (Pdeathsig), so that no zfs
	// outlives the plugin.
	//
	// Go caveat: the kernel sends the parent-death signal when the OS
	// *thread* that forked the child exits, not when the process does. Go
	// ends a thread only when a goroutine that called runtime.LockOSThread
	// returns without unlocking it; the runner never calls LockOSThread, so
	// the forking thread lives as long as the plugin. (A caller that runs
	// the runner from a goroutine locked to its thread and then exits that
	// goroutine would get its zfs children killed early.) Pdeathsig reaches
	// the direct child only: a grandchild that zfs started survives a
	// SIGKILLed plugin; the group kill below covers timeouts and cancels.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// On timeout or cancel: SIGTERM to the whole group first, SIGKILL to the
	// group killGrace later (even when the leader has exited by then, for
	// the group members that ignored SIGTERM). WaitDelay bounds the wait for
	// the leader and for output pipes that a group member still holds.
	var groupKill atomic.Pointer[time.Timer]
	cmd.Cancel = func() error {
		pgid := cmd.Process.Pid
		groupKill.Store(time.AfterFunc(killGrace, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }))
		if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return os.ErrProcessDone
			}
			return err
		}
		return nil
	}
	cmd.WaitDelay = killGrace
	// A stable, parseable output regardless of the caller's locale.
	cmd.Env = append(cmd.Environ(), "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if io.out != nil {
		cmd.Stdout = io.out
	}
	cmd.Stdin = io.in

	start := time.Now()
	r.runs.Add(1)
	err := cmd.Run()
	// Run has returned, so Cancel has run or never will. Once the group is
	// empty the pending SIGKILL is dropped, so that it can never reach a
	// later group that reuses the number.
	if t := groupKill.Load(); t != nil && syscall.Kill(-cmd.Process.Pid, 0) != nil {
		t.Stop()
	}
	took := time.Since(start)
	if r.Logger != nil {
		r.Logger.Trace("ran", "cmd", bin, "args", args, "duration", took, "yielded", yielded, "gate_wait", gateWait, "error", err)
	}
	if err == nil {
		r.observe(bin, args, nil, took)
		return stdout.Bytes(), nil
	}

	full := append([]string{bin}, args...)
	zerr := &Error{Args: full, Stderr: strings.TrimSpace(stderr.String()), ExitCode: -1}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		zerr.Err = ctx.Err()
	case errors.As(err, &exitErr):
		zerr.ExitCode = exitErr.ExitCode()
		zerr.Kind = classify(zerr.Stderr)
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		zerr.Kind = ErrUnavailable
		zerr.Err = err
	default:
		zerr.Err = err
	}
	r.observe(bin, args, zerr, took)
	return stdout.Bytes(), zerr
}

// lockProblems: why the machine's lock cannot be used is logged once per
// reason, not once per command.
var lockProblems logOnce

// logOnce tells whether a text is new: mu guards seen.
type logOnce struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether text is seen for the first time.
func (o *logOnce) first(text string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[text] {
		return false
	}
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	o.seen[text] = true
	return true
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
