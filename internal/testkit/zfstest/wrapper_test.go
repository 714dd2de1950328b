package zfstest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { Main(m) }

// viaPATH returns a command that runs name looked up on the PATH of env,
// the way another process (a plugin, say) finds zfs. The shell execs it, so
// the command's PID is the wrapper's.
func viaPATH(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", append([]string{"-c", `exec "$0" "$@"`, name}, args...)...)
	cmd.Env = env
	return cmd
}

// run runs a command with a deadline and returns stdout, stderr, error.
func run(t *testing.T, cmd *exec.Cmd) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	must.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return stdout.String(), stderr.String(), err
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not finish within a minute", cmd)
		return "", "", nil
	}
}

// exists reports whether a dataset exists, asking the real zfs.
func exists(t *testing.T, w *Wrapper, dataset string) bool {
	t.Helper()
	_, _, err := run(t, exec.Command(w.ZFS, "list", "-H", "-o", "name", dataset))
	return err == nil
}

func TestWrapperEnv(t *testing.T) {
	w := &Wrapper{Dir: "/w"}
	cases := []struct {
		name     string
		in, want []string
	}{
		{"prefixes PATH", []string{"HOME=/root", "PATH=/usr/bin:/bin"}, []string{"HOME=/root", "PATH=/w:/usr/bin:/bin"}},
		{"adds PATH", []string{"HOME=/root"}, []string{"HOME=/root", "PATH=/w:/usr/sbin:/usr/bin:/sbin:/bin"}},
		{"leaves similar names", []string{"XPATH=/x", "PATH="}, []string{"XPATH=/x", "PATH=/w:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]string(nil), tc.in...)
			must.Eq(t, tc.want, w.Env(in))
			must.Eq(t, tc.in, in, must.Sprint("the input is not changed"))
		})
	}
}

func TestWrapperParseCalls(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    []Call
		wantErr bool
	}{
		{name: "empty", in: ""},
		{name: "one", in: "2\x00zfs\x00list\x00-H\x00",
			want: []Call{{Cmd: "zfs", Args: []string{"list", "-H"}}}},
		{name: "no arguments, then empty and odd ones", in: "0\x00zfs\x003\x00zpool\x00get\x00\x00a\nb\tc\x00",
			want: []Call{{Cmd: "zfs", Args: []string{}}, {Cmd: "zpool", Args: []string{"get", "", "a\nb\tc"}}}},
		{name: "cut short", in: "3\x00zfs\x00list\x00", wantErr: true},
		{name: "no final NUL", in: "1\x00zfs\x00list", wantErr: true},
		{name: "bad count", in: "x\x00zfs\x00", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCalls([]byte(tc.in))
			if tc.wantErr {
				must.Error(t, err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}

// TestWrapperRecords runs the real zfs and zpool through the wrappers, found
// on PATH by another process and by zfs.Runner in this one.
func TestWrapperRecords(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	env := w.Env(os.Environ())

	out, stderr, err := run(t, viaPATH(env, "zfs", "list", "-H", "-o", "name", p.Name))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, p.Name+"\n", out)
	out, stderr, err = run(t, viaPATH(env, "zpool", "list", "-H", "-o", "name", p.Name))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, p.Name+"\n", out)

	w.SetPATH(t)
	found, err := exec.LookPath("zfs")
	must.NoError(t, err)
	must.EqOp(t, filepath.Join(w.Dir, "zfs"), found)
	_, err = (&zfs.Runner{}).ZFSCmd(context.Background(), "get", "-H", "-o", "value", "name", p.Name)
	must.NoError(t, err)

	must.Eq(t, []Call{
		{Cmd: "zfs", Args: []string{"list", "-H", "-o", "name", p.Name}},
		{Cmd: "zpool", Args: []string{"list", "-H", "-o", "name", p.Name}},
		{Cmd: "zfs", Args: []string{"get", "-H", "-o", "value", "name", p.Name}},
	}, w.Calls())
	must.EqOp(t, 1, w.Count("list"))
	must.EqOp(t, 1, w.Count("zpool list"))
	must.EqOp(t, 1, w.Count("zfs get"))
}

// TestWrapperPauseRename pauses a real rename, checks that nothing has
// happened yet, and resumes it.
func TestWrapperPauseRename(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	from, to := p.Dataset("a"), p.Dataset("b")
	p.ZFS(t, "create", "-o", "canmount=noauto", from) // zfs-fuse renames unmounted datasets only

	w.Pause("rename")
	cmd := viaPATH(w.Env(os.Environ()), "zfs", "rename", from, to)
	type result struct {
		stderr string
		err    error
	}
	done := make(chan result, 1)
	go func() { _, stderr, err := run(t, cmd); done <- result{stderr, err} }()

	must.Eq(t, []string{"rename", from, to}, w.WaitPaused(t, "rename", 30*time.Second))
	time.Sleep(300 * time.Millisecond) // a few pause polls
	must.True(t, exists(t, w, from), must.Sprint("paused: not renamed yet"))
	must.False(t, exists(t, w, to))
	select {
	case r := <-done:
		t.Fatalf("the paused rename finished: %v %s", r.err, r.stderr)
	default:
	}

	w.Resume("rename")
	select {
	case r := <-done:
		must.NoError(t, r.err, must.Sprint(r.stderr))
	case <-time.After(30 * time.Second):
		t.Fatal("the rename did not finish within 30s of Resume")
	}
	must.False(t, exists(t, w, from))
	must.True(t, exists(t, w, to))
	paused, err := w.paused("rename")
	must.NoError(t, err)
	must.SliceEmpty(t, paused, must.Sprint("the marker is gone"))
	must.EqOp(t, 1, w.Count("rename"))
}

// TestWrapperPausedSignal sends a paused wrapper a signal: it ends by that
// signal, removes its marker, and the real command never runs.
func TestWrapperPausedSignal(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	from := p.Dataset("a")
	p.ZFS(t, "create", "-o", "canmount=noauto", from) // zfs-fuse renames unmounted datasets only
	w.Pause("rename")

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			// Under nohup (or any parent that ignores the signal) the
			// wrapper's shell inherits the signal ignored and, by POSIX,
			// cannot trap it. Catching it here makes exec give the
			// child the default disposition again.
			if signal.Ignored(sig) {
				signal.Notify(make(chan os.Signal, 1), sig)
				t.Cleanup(func() { signal.Reset(sig) })
			}
			to := p.Dataset("b")
			cmd := viaPATH(w.Env(os.Environ()), "zfs", "rename", from, to)
			must.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			w.WaitPaused(t, "rename", 30*time.Second)

			must.NoError(t, cmd.Process.Signal(sig))
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("the paused wrapper did not exit within 5s of %s", sig)
			}
			var exitErr *exec.ExitError
			must.True(t, errors.As(err, &exitErr), must.Sprintf("error %v", err))
			ws := exitErr.Sys().(syscall.WaitStatus)
			must.True(t, ws.Signaled(), must.Sprintf("status %v", ws))
			must.EqOp(t, sig, ws.Signal())

			paused, perr := w.paused("rename")
			must.NoError(t, perr)
			must.SliceEmpty(t, paused)
			must.True(t, exists(t, w, from))
			must.False(t, exists(t, w, to))
		})
	}
}

// TestWrapperExecs checks that after a pause the PID the caller started is
// the real zfs: a `zfs send` into a pipe nobody reads stays running.
func TestWrapperExecs(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	ds := p.Dataset("a")
	p.ZFS(t, "create", ds)
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, more than a pipe holds
	must.NoError(t, os.WriteFile(filepath.Join(p.Mountpoint, "a", "data"), data, 0o644))
	p.ZFS(t, "snapshot", ds+"@s")

	w.Pause("send")
	r, wr, err := os.Pipe()
	must.NoError(t, err)
	defer r.Close()
	cmd := viaPATH(w.Env(os.Environ()), "zfs", "send", ds+"@s")
	cmd.Stdout = wr
	must.NoError(t, cmd.Start())
	_ = wr.Close()
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()

	w.WaitPaused(t, "send", 30*time.Second)
	exe := func() string { s, _ := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe"); return s }
	must.StrNotContains(t, exe(), "zfs", must.Sprint("paused: the PID is the shell"))

	w.Resume("send")
	real, err := filepath.EvalSymlinks(w.ZFS)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return exe() == real }),
		wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)),
		must.Func(func() string { return "exe is " + exe() }))

	n, err := io.Copy(io.Discard, r)
	must.NoError(t, err)
	must.Greater(t, int64(len(data)), n)
	select {
	case <-exited:
		must.NoError(t, waitErr)
	case <-time.After(30 * time.Second):
		t.Fatal("zfs send did not finish within 30s")
	}
}

// TestWrapperFail makes subcommands fail without running the real command.
func TestWrapperFail(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	ds := p.Dataset("a")
	p.ZFS(t, "create", ds)
	env := w.Env(os.Environ())

	cases := []struct {
		sub, msg string
		cmd      []string
		effect   func() string // what the real command would change
	}{
		{"set", "cannot set property: out of space", []string{"zfs", "set", "user:x=1", ds},
			func() string { return p.Prop(t, ds, "user:x") }},
		{"zpool set", "cannot set property for 'pool': permission denied", []string{"zpool", "set", "failmode=continue", p.Name},
			func() string {
				out, _, _ := run(t, exec.Command(w.Zpool, "get", "failmode", p.Name))
				return out
			}},
	}
	for _, tc := range cases {
		t.Run(tc.sub, func(t *testing.T) {
			unchanged := tc.effect()
			w.Fail(tc.sub, tc.msg)
			_, stderr, err := run(t, viaPATH(env, tc.cmd[0], tc.cmd[1:]...))
			var exitErr *exec.ExitError
			must.True(t, errors.As(err, &exitErr), must.Sprintf("error %v", err))
			must.EqOp(t, 1, exitErr.ExitCode())
			must.EqOp(t, tc.msg+"\n", stderr)
			must.EqOp(t, unchanged, tc.effect())
			must.EqOp(t, 1, w.Count(tc.sub), must.Sprint("a failed call is recorded"))

			w.Unfail(tc.sub)
			_, stderr, err = run(t, viaPATH(env, tc.cmd[0], tc.cmd[1:]...))
			must.NoError(t, err, must.Sprint(stderr))
			must.NotEq(t, unchanged, tc.effect())
		})
	}
}

// TestWrapperFailFor fails only the runs given the named argument.
func TestWrapperFailFor(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	a, b := p.Dataset("a"), p.Dataset("b")
	p.ZFS(t, "create", a)
	p.ZFS(t, "create", b)
	env := w.Env(os.Environ())
	const msg = "cannot set property: out of space"

	w.FailFor("set", a, msg)
	_, stderr, err := run(t, viaPATH(env, "zfs", "set", "user:x=1", a))
	var exitErr *exec.ExitError
	must.True(t, errors.As(err, &exitErr), must.Sprintf("error %v", err))
	must.EqOp(t, msg+"\n", stderr)
	must.EqOp(t, "", p.Prop(t, a, "user:x"))
	_, stderr, err = run(t, viaPATH(env, "zfs", "set", "user:x=1", b))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, "1", p.Prop(t, b, "user:x"))

	w.Unfail("set")
	_, stderr, err = run(t, viaPATH(env, "zfs", "set", "user:x=1", a))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, "1", p.Prop(t, a, "user:x"))
}

// TestWrapperFailAfterFor runs the real command for the runs given the
// named argument, then fails them all the same; other runs go on.
func TestWrapperFailAfterFor(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	ds := p.Dataset("a")
	p.ZFS(t, "create", ds)
	env := w.Env(os.Environ())
	const msg = "signal: killed"

	w.FailAfterFor("set", "user:x=1", msg)
	cases := []struct {
		prop, want string
		fails      bool
	}{
		{"user:x=1", "1", true},  // landed, and reported failed
		{"user:x=2", "2", false}, // another argument: as given
	}
	for _, tc := range cases {
		_, stderr, err := run(t, viaPATH(env, "zfs", "set", tc.prop, ds))
		if tc.fails {
			var exitErr *exec.ExitError
			must.True(t, errors.As(err, &exitErr), must.Sprintf("error %v", err))
			must.EqOp(t, msg+"\n", stderr)
		} else {
			must.NoError(t, err, must.Sprint(stderr))
		}
		must.EqOp(t, tc.want, p.Prop(t, ds, "user:x"), must.Sprint(tc.prop))
	}

	w.Unfail("set")
	_, stderr, err := run(t, viaPATH(env, "zfs", "set", "user:x=1", ds))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, "1", p.Prop(t, ds, "user:x"))
}

// TestWrapperArgsExact passes values with tabs, spaces, newlines, quotes,
// globs and dollars through the wrapper byte for byte, to the real zfs and
// into the call log.
func TestWrapperArgsExact(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	ds := p.Dataset("a")
	p.ZFS(t, "create", ds)
	env := w.Env(os.Environ())

	value := "a\tb  c * $HOME 'q' \"d\" \\n `x`"
	_, stderr, err := run(t, viaPATH(env, "zfs", "set", "user:x="+value, ds))
	must.NoError(t, err, must.Sprint(stderr))
	out, stderr, err := run(t, exec.Command(w.ZFS, "get", "-H", "-o", "value", "user:x", ds))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, value+"\n", out)

	// Arguments the real zfs would refuse, checked in the log only.
	w.Fail("get", "refused")
	odd := []string{"get", "", "line\nbreak", " lead", "trail\t", "*"}
	_, _, err = run(t, viaPATH(env, "zfs", odd...))
	must.Error(t, err)

	must.Eq(t, []Call{
		{Cmd: "zfs", Args: []string{"set", "user:x=" + value, ds}},
		{Cmd: "zfs", Args: odd},
	}, w.Calls())
}

// TestWrapperCallsReadsAHalfWrittenRecordAgain: a read that meets a record
// half appended (its count written, its arguments not yet) reads the log
// again, and returns the whole record once it is complete, instead of
// taking the log for broken.
func TestWrapperCallsReadsAHalfWrittenRecordAgain(t *testing.T) {
	w := NewWrapper(t)
	log := filepath.Join(w.ControlDir, "calls")
	first := "2\x00zfs\x00get\x00a\x00"
	must.NoError(t, os.WriteFile(log, []byte(first+"3\x00zfs\x00set\x00"), 0o644))
	finished := time.AfterFunc(100*time.Millisecond, func() {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Errorf("completing the record: %v", err)
			return
		}
		if _, err := f.WriteString("p=v\x00b\x00"); err != nil {
			t.Errorf("completing the record: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("completing the record: %v", err)
		}
	})
	t.Cleanup(func() { finished.Stop() })
	must.Eq(t, []Call{
		{Cmd: "zfs", Args: []string{"get", "a"}},
		{Cmd: "zfs", Args: []string{"set", "p=v", "b"}},
	}, w.Calls())
}

// TestWrapperCallsPanicsOnALogThatStaysBroken: a log that still does not
// parse after the reads again (about a second) is broken, and Calls says so.
func TestWrapperCallsPanicsOnALogThatStaysBroken(t *testing.T) {
	w := NewWrapper(t)
	must.NoError(t, os.WriteFile(filepath.Join(w.ControlDir, "calls"), []byte("x\x00zfs\x00"), 0o644))
	began := time.Now()
	var got any
	func() {
		defer func() { got = recover() }()
		w.Calls()
	}()
	err, ok := got.(error)
	must.True(t, ok, must.Sprintf("Calls panicked with %v, not an error", got))
	must.Error(t, err)
	must.GreaterEq(t, 900*time.Millisecond, time.Since(began), must.Sprint("read again before it counts as broken"))
}

// TestWrapperCutAfter: a cut run passes on only the first bytes of the real
// command's output, then fails; Unfail ends it.
func TestWrapperCutAfter(t *testing.T) {
	p := NewPool(t, 0)
	w := NewWrapper(t)
	ds := p.Dataset("a")
	p.ZFS(t, "create", ds)
	p.ZFS(t, "snapshot", ds+"@s")
	env := w.Env(os.Environ())

	whole, stderr, err := run(t, viaPATH(env, "zfs", "send", ds+"@s"))
	must.NoError(t, err, must.Sprint(stderr))
	must.Greater(t, 1000, len(whole))

	w.CutAfter("send", 1000)
	cut, stderr, err := run(t, viaPATH(env, "zfs", "send", ds+"@s"))
	var exitErr *exec.ExitError
	must.True(t, errors.As(err, &exitErr), must.Sprintf("error %v", err))
	must.StrContains(t, stderr, "cut off after 1000 bytes")
	must.EqOp(t, whole[:1000], cut)

	w.Unfail("send")
	again, stderr, err := run(t, viaPATH(env, "zfs", "send", ds+"@s"))
	must.NoError(t, err, must.Sprint(stderr))
	must.EqOp(t, len(whole), len(again))
}
