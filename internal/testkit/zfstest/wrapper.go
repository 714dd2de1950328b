package zfstest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PauseLimit is how long a paused wrapper waits at most before it runs the
// real command anyway, so that a forgotten Resume never hangs anything for
// good.
const PauseLimit = 10 * time.Minute

// pausePoll is how often a paused wrapper looks for Resume.
const pausePoll = 100 * time.Millisecond

// wrapperScript is the zfs and zpool wrapper. It is run by other processes
// (a plugin started by a Nomad agent, say), so every control is a file in
// the control directory: pause.<cmd>.<sub> pauses, fail.<cmd>.<sub> holds
// the stderr of a failure, failfor.<cmd>.<sub> the argument that fails a
// run, then its stderr, failafter.<cmd>.<sub> the same for a run that
// fails after the real command ran, cut.<cmd>.<sub> the bytes of output a
// run passes on before it fails. It records the call, then pauses, then
// fails, and otherwise execs the real command with the arguments as given, so that
// the PID its caller started becomes the real command.
const wrapperScript = `#!/bin/sh
# Written by zfstest.NewWrapper. Runs the real %[1]s after the faults set in
# the control directory.
name=%[1]s
real=%[2]s
ctl=%[3]s
sub=$1

# One record per call, in one write (dash buffers up to 8 KiB): the
# argument count, the command and each argument, NUL-terminated.
printf '%%s\0' "$#" "$name" "$@" >>"$ctl/calls"

# given WANT ARG...: whether this run was given argument WANT.
given() {
	want=$1
	shift
	for a in "$@"; do
		if [ "$a" = "$want" ]; then return 0; fi
	done
	return 1
}

# A pause file that names an argument pauses only the runs given it.
pause=0
if [ -e "$ctl/pause.$name.$sub" ]; then
	want=$(cat "$ctl/pause.$name.$sub" 2>/dev/null)
	if [ -z "$want" ] || given "$want" "$@"; then pause=1; fi
fi
if [ "$pause" = 1 ]; then
	marker="$ctl/paused.$name.$sub.$$"
	printf '%%s\0' "$@" >"$marker.tmp" && mv -f "$marker.tmp" "$marker"
	# A signal ends the pause the way it would end the real command.
	stop() { rm -f "$marker"; trap - "$1"; kill -"$1" $$; }
	trap 'stop TERM' TERM
	trap 'stop INT' INT
	trap 'stop HUP' HUP
	n=0
	while [ -e "$ctl/pause.$name.$sub" ] && [ "$n" -lt %[4]d ]; do
		sleep %[5]s
		n=$((n + 1))
	done
	trap - TERM INT HUP
	rm -f "$marker"
fi

if [ -e "$ctl/fail.$name.$sub" ]; then
	cat "$ctl/fail.$name.$sub" >&2
	exit 1
fi
# A failfor file names an argument on its first line, the stderr after it.
if [ -e "$ctl/failfor.$name.$sub" ] && given "$(head -n 1 "$ctl/failfor.$name.$sub" 2>/dev/null)" "$@"; then
	tail -n +2 "$ctl/failfor.$name.$sub" >&2
	exit 1
fi

# A cut file holds a byte count: the runs pass on only that much of the
# real command's output (the command is cut off mid-stream by the closed
# pipe, as by a lost connection or a killed process), then fail.
if [ -e "$ctl/cut.$name.$sub" ]; then
	n=$(cat "$ctl/cut.$name.$sub" 2>/dev/null)
	"$real" "$@" | head -c "$n"
	echo "$name $sub: cut off after $n bytes (zfstest)" >&2
	exit 1
fi

# A failafter file names an argument on its first line, the stderr after
# it: the runs given it run the real command, then fail all the same.
if [ -e "$ctl/failafter.$name.$sub" ] && given "$(head -n 1 "$ctl/failafter.$name.$sub" 2>/dev/null)" "$@"; then
	"$real" "$@"
	tail -n +2 "$ctl/failafter.$name.$sub" >&2
	exit 1
fi

exec "$real" "$@"
`

// Wrapper is a directory of zfs and zpool wrapper scripts that tests put
// first on PATH, to pause or fail chosen subcommands of the real commands
// that other processes run, and to count the calls.
//
// A subcommand is named as "rename" (zfs rename) or "zpool import".
type Wrapper struct {
	// Dir holds the executable scripts zfs and zpool.
	Dir string
	// ControlDir holds the control files and the call log.
	ControlDir string
	// ZFS and Zpool are the real commands the scripts exec (absolute).
	ZFS, Zpool string
}

// Call is one recorded run of a wrapper.
type Call struct {
	// Cmd is "zfs" or "zpool".
	Cmd string
	// Args are the arguments after the command, subcommand first, exactly.
	Args []string
}

// String shows the call with each argument quoted.
func (c Call) String() string {
	var b strings.Builder
	b.WriteString(c.Cmd)
	for _, a := range c.Args {
		b.WriteString(" ")
		b.WriteString(strconv.Quote(a))
	}
	return b.String()
}

// NewWrapper writes the wrapper scripts, which exec the zfs and zpool found
// on PATH now (absolute paths, so a wrapper never runs itself). When the
// test ends, every pause is lifted, so a wrapper still waiting goes on.
// Without zfs or zpool on PATH the test is skipped (failed under CI=true).
func NewWrapper(t testing.TB) *Wrapper {
	t.Helper()
	w := &Wrapper{}
	for _, c := range []struct {
		name string
		real *string
	}{{"zfs", &w.ZFS}, {"zpool", &w.Zpool}} {
		p, err := exec.LookPath(c.name)
		if err != nil {
			Unavailable(t, fmt.Sprintf("no %s on PATH: %v", c.name, err))
		}
		if *c.real, err = filepath.Abs(p); err != nil {
			t.Fatalf("%v", err)
		}
	}
	tmp := t.TempDir()
	w.Dir = filepath.Join(tmp, "bin")
	w.ControlDir = filepath.Join(tmp, "ctl")
	for _, d := range []string{w.Dir, w.ControlDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("%v", err)
		}
	}
	loops := int(PauseLimit / pausePoll)
	poll := strconv.FormatFloat(pausePoll.Seconds(), 'f', -1, 64)
	for name, real := range map[string]string{"zfs": w.ZFS, "zpool": w.Zpool} {
		script := fmt.Sprintf(wrapperScript, name, shellQuote(real), shellQuote(w.ControlDir), loops, poll)
		if err := os.WriteFile(filepath.Join(w.Dir, name), []byte(script), 0o755); err != nil {
			t.Fatalf("writing %s wrapper: %v", name, err)
		}
	}
	t.Cleanup(func() {
		pauses, _ := filepath.Glob(filepath.Join(w.ControlDir, "pause.*"))
		for _, p := range pauses {
			_ = os.Remove(p)
		}
	})
	return w
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Env returns a copy of environ (as from os.Environ) with Dir first on PATH,
// for processes that look zfs up on their own PATH. It does not change how
// this process finds zfs: exec.Command looks it up on the test's own PATH
// (see SetPATH).
func (w *Wrapper) Env(environ []string) []string {
	env := make([]string, 0, len(environ)+1)
	found := false
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + w.Dir + string(os.PathListSeparator) + v
			found = true
		}
		env = append(env, kv)
	}
	if !found {
		env = append(env, "PATH="+w.Dir+string(os.PathListSeparator)+"/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return env
}

// SetPATH puts Dir first on the test process's PATH until the test ends, so
// that zfs.Runner and the processes the test starts run the wrappers.
func (w *Wrapper) SetPATH(t testing.TB) {
	t.Helper()
	t.Setenv("PATH", w.Dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// Pause makes every later run of sub wait, before it runs the real command,
// until Resume (or for PauseLimit at most). On return the pause is in force.
func (w *Wrapper) Pause(sub string) {
	w.writeControl("pause", sub, nil)
}

// PauseFor is Pause for the runs of sub given arg as one of their
// arguments (a dataset name, say); other runs of sub go on. Resume ends it.
func (w *Wrapper) PauseFor(sub, arg string) {
	w.writeControl("pause", sub, []byte(arg))
}

// Resume lets the runs of sub waiting in Pause go on (within 100 ms) and
// stops pausing later ones.
func (w *Wrapper) Resume(sub string) {
	w.removeControl("pause", sub)
}

// Fail makes every later run of sub print stderr (plus a newline) to its
// standard error and exit 1 without running the real command, for faults a
// real pool cannot easily show.
func (w *Wrapper) Fail(sub, stderr string) {
	w.writeControl("fail", sub, []byte(stderr+"\n"))
}

// FailFor is Fail for the runs of sub given arg as one of their arguments
// (a dataset name, say); other runs of sub go on. Unfail ends it.
func (w *Wrapper) FailFor(sub, arg, stderr string) {
	w.writeControl("failfor", sub, []byte(arg+"\n"+stderr+"\n"))
}

// FailAfterFor makes the runs of sub given arg as one of their arguments
// (a property assignment, say) run the real command, then print stderr
// (plus a newline) and exit 1 all the same: a change that landed although
// its caller was told it failed, as when a command is cut short by its
// deadline after ZFS applied it. Unfail ends it.
func (w *Wrapper) FailAfterFor(sub, arg, stderr string) {
	w.writeControl("failafter", sub, []byte(arg+"\n"+stderr+"\n"))
}

// CutAfter makes every later run of sub (a `zfs send`, say) pass on only
// the first n bytes of the real command's output, then exit 1: the real
// command is cut off mid-stream by the closed pipe. Unfail ends it.
func (w *Wrapper) CutAfter(sub string, n int) {
	w.writeControl("cut", sub, []byte(strconv.Itoa(n)))
}

// Unfail ends Fail, FailFor, FailAfterFor and CutAfter for sub.
func (w *Wrapper) Unfail(sub string) {
	w.removeControl("cut", sub)
	w.removeControl("fail", sub)
	w.removeControl("failfor", sub)
	w.removeControl("failafter", sub)
}

// WaitPaused waits until a run of sub is paused and returns its arguments
// (subcommand first). It fails the test after timeout.
func (w *Wrapper) WaitPaused(t testing.TB, sub string, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		args, err := w.paused(sub)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if len(args) > 0 {
			return args[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s paused within %s", sub, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// IsPaused reports whether a run of sub given argument arg is paused now.
// Unlike WaitPaused it does not wait, so that a test can watch for
// something else meanwhile.
func (w *Wrapper) IsPaused(t testing.TB, sub, arg string) bool {
	t.Helper()
	runs, err := w.paused(sub)
	if err != nil {
		t.Fatalf("%v", err)
	}
	for _, args := range runs {
		if slices.Contains(args, arg) {
			return true
		}
	}
	return false
}

// paused returns the arguments of the runs of sub paused now, oldest PID
// first, leaving out markers of processes that no longer exist.
func (w *Wrapper) paused(sub string) ([][]string, error) {
	prefix := w.control("paused", sub) + "."
	markers, err := filepath.Glob(prefix + "*")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, m := range markers {
		pid, err := strconv.Atoi(strings.TrimPrefix(m, prefix))
		if err != nil || pid <= 0 {
			continue // a .tmp being written
		}
		if syscall.Kill(pid, 0) != nil {
			continue // killed before it could remove its marker
		}
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	var all [][]string
	for _, pid := range pids {
		b, err := os.ReadFile(prefix + strconv.Itoa(pid))
		if errors.Is(err, os.ErrNotExist) {
			continue // resumed meanwhile
		}
		if err != nil {
			return nil, err
		}
		all = append(all, splitNUL(b))
	}
	return all, nil
}

// Calls returns every call recorded so far, in order. It panics when the
// log cannot be read or parsed: the log is the test's own. A record is one
// append, but a read may see one half written: a log that does not parse
// is read again, for up to a second, before it counts as broken.
func (w *Wrapper) Calls() []Call {
	var err error
	for try := 0; try < 50; try++ {
		if try > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		var b []byte
		b, err = os.ReadFile(filepath.Join(w.ControlDir, "calls"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			break
		}
		var calls []Call
		if calls, err = parseCalls(b); err == nil {
			return calls
		}
	}
	panic(fmt.Errorf("zfstest: reading wrapper calls: %w", err))
}

// Count returns how many recorded calls ran sub.
func (w *Wrapper) Count(sub string) int {
	cmd, name := splitSub(sub)
	n := 0
	for _, c := range w.Calls() {
		if c.Cmd == cmd && len(c.Args) > 0 && c.Args[0] == name {
			n++
		}
	}
	return n
}

// parseCalls parses the call log: per call, the argument count, the command
// and the arguments, each terminated by NUL.
func parseCalls(b []byte) ([]Call, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[len(b)-1] != 0 {
		return nil, errors.New("log does not end with a NUL")
	}
	fields := splitNUL(b)
	var calls []Call
	for i := 0; i < len(fields); {
		n, err := strconv.Atoi(fields[i])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("call %d: bad argument count %q", len(calls)+1, fields[i])
		}
		end := i + 2 + n
		if end > len(fields) {
			return nil, fmt.Errorf("call %d: %d fields for %d arguments", len(calls)+1, len(fields)-i, n)
		}
		calls = append(calls, Call{Cmd: fields[i+1], Args: fields[i+2 : end]})
		i = end
	}
	return calls, nil
}

// splitNUL splits NUL-terminated fields.
func splitNUL(b []byte) []string {
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

// splitSub splits "zpool import" into ("zpool", "import") and "rename" or
// "zfs rename" into ("zfs", "rename").
func splitSub(sub string) (cmd, name string) {
	if c, n, ok := strings.Cut(sub, " "); ok && (c == "zfs" || c == "zpool") {
		return c, n
	}
	return "zfs", sub
}

// control returns the control file path for kind and sub.
func (w *Wrapper) control(kind, sub string) string {
	cmd, name := splitSub(sub)
	return filepath.Join(w.ControlDir, kind+"."+cmd+"."+name)
}

// writeControl writes a control file atomically (a wrapper never reads a
// part of it). It panics on failure: the directory is the test's own.
func (w *Wrapper) writeControl(kind, sub string, content []byte) {
	path := w.control(kind, sub)
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, content, 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		panic(fmt.Errorf("zfstest: writing %s: %w", path, err))
	}
}

func (w *Wrapper) removeControl(kind, sub string) {
	path := w.control(kind, sub)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		panic(fmt.Errorf("zfstest: removing %s: %w", path, err))
	}
}
