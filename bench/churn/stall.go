package churn

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
)

// stallReport writes what a batch that did not end left behind: every
// allocation of prefix* that is not terminal, with its tasks' states and
// last events, and every process of the machine in uninterruptible sleep
// (D) or belonging to zfs-fuse, the agent or the plugin, with its kernel
// wait channel. With quit, it then asks the plugin for its goroutines
// (SIGQUIT: the Go runtime prints them to stderr, which the agent logs, and
// the plugin exits): only once the batch has failed. It is written after
// the batch's figures are taken, so it changes none of them.
func (r *churnRun) stallReport(w io.Writer, prefix string, quit bool) {
	fmt.Fprintf(w, "stall report, %s\n\n", time.Now().UTC().Format(time.RFC3339))
	qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the agent may be what stalled
	defer cancel()
	all, _, err := r.a.API.Allocations().List((&api.QueryOptions{}).WithContext(qctx))
	if err != nil {
		fmt.Fprintf(w, "allocations: %v\n", err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].JobID < all[j].JobID })
	for _, s := range all {
		if !strings.HasPrefix(s.JobID, prefix) || s.ClientStatus == api.AllocClientStatusComplete || s.ClientStatus == api.AllocClientStatusFailed || s.ClientStatus == api.AllocClientStatusLost {
			continue
		}
		fmt.Fprintf(w, "alloc %s job %s client %s desired %s\n", s.ID, s.JobID, s.ClientStatus, s.DesiredStatus)
		for _, n := range slices.Sorted(maps.Keys(s.TaskStates)) {
			ts := s.TaskStates[n]
			fmt.Fprintf(w, "  task %s %s\n", n, ts.State)
			for _, e := range lastEvents(ts.Events, 4) {
				fmt.Fprintf(w, "    %s %s: %s %s\n", time.Unix(0, e.Time).UTC().Format("15:04:05.000"), e.Type, e.DisplayMessage, e.Message)
			}
		}
	}

	fmt.Fprintf(w, "\nprocesses (D state, zfs-fuse, zfs, the agent and the plugin)\n")
	for _, p := range stalledProcs(r.a.PID, r.plugin) {
		fmt.Fprintln(w, p)
	}

	if quit && r.plugin > 0 {
		if err := syscall.Kill(r.plugin, syscall.SIGQUIT); err != nil {
			fmt.Fprintf(w, "\nSIGQUIT to the plugin (pid %d): %v\n", r.plugin, err)
		} else {
			fmt.Fprintf(w, "\nthe plugin (pid %d) was sent SIGQUIT: its goroutines are in the agent log\n", r.plugin)
			time.Sleep(2 * time.Second) // let the agent copy the dump into its log
		}
	}
}

func lastEvents(ev []*api.TaskEvent, n int) []*api.TaskEvent {
	if len(ev) > n {
		return ev[len(ev)-n:]
	}
	return ev
}

// stalledProcs lists, one line each, the machine's processes that are in D
// state, or named zfs-fuse or zfs, or children of a zfs command (the
// mount or unmount helper it waits for), or are agentPID or pluginPID,
// with their threads counted by state and wait channel, and the kernel
// stack of those in D state and of a zfs command's children. A process in
// D state is listed without its command line (reading it can wait on the
// process's own memory lock, which may be what it is stuck on).
func stalledProcs(agentPID, pluginPID int) []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []string{err.Error()}
	}
	type proc struct {
		pid         int
		comm, state string
		ppid        int
	}
	var procs []proc
	zfsPIDs := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, f, err := localagent.ProcStat(filepath.Join("/proc", e.Name()))
		if err != nil || len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		procs = append(procs, proc{pid, comm, f[0], ppid})
		if comm == "zfs" {
			zfsPIDs[pid] = true
		}
	}
	var out []string
	for _, p := range procs {
		child := zfsPIDs[p.ppid]
		if p.state != "D" && p.comm != "zfs-fuse" && p.comm != "zfs" && !child && p.pid != agentPID && p.pid != pluginPID {
			continue
		}
		dir := filepath.Join("/proc", strconv.Itoa(p.pid))
		var args []byte
		if p.state != "D" {
			args, _ = os.ReadFile(filepath.Join(dir, "cmdline"))
		}
		line := fmt.Sprintf("pid %d %s state %s wchan %s: %s", p.pid, p.comm, p.state, readTrim(filepath.Join(dir, "wchan")), strings.ReplaceAll(strings.TrimRight(string(args), "\x00"), "\x00", " "))
		if child {
			line += fmt.Sprintf(" (child of zfs pid %d)", p.ppid)
		}
		threads := map[string]int{}
		tasks, _ := os.ReadDir(filepath.Join(dir, "task"))
		for _, t := range tasks {
			tdir := filepath.Join(dir, "task", t.Name())
			if _, ts, ok := procCommState(tdir); ok {
				threads[ts+" "+readTrim(filepath.Join(tdir, "wchan"))]++
			}
		}
		for _, k := range slices.Sorted(maps.Keys(threads)) {
			line += fmt.Sprintf("\n    %d threads %s", threads[k], k)
		}
		if p.state == "D" || child {
			if stack := readTrim(filepath.Join(dir, "stack")); stack != "?" && stack != "" {
				line += "\n    kernel stack:\n      " + strings.ReplaceAll(stack, "\n", "\n      ")
			}
		}
		out = append(out, line)
	}
	return out
}

// procCommState reads the command name and state of /proc/PID/stat (or of
// a thread's task directory).
func procCommState(dir string) (comm, state string, ok bool) {
	comm, f, err := localagent.ProcStat(dir)
	if err != nil || len(f) < 1 {
		return "", "", false
	}
	return comm, f[0], true
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// stalled writes the stall report of the batch prefix* to stallPath and
// returns err naming where it is (or why it could not be written).
func (r *churnRun) stalled(prefix string, err error) error {
	return r.report(stallPath(r.o.KeepLog, ""), prefix, true, err)
}

// unsettled writes the stall report of a batch whose slots did not settle
// (its allocations all ended: the run goes on, and the plugin is left
// running) beside the kept log, and returns err naming where it is.
func (r *churnRun) unsettled(prefix string, err error) error {
	return r.report(stallPath(r.o.KeepLog, strings.TrimSuffix(prefix, "-")), prefix, false, err)
}

func (r *churnRun) report(path, prefix string, quit bool, err error) error {
	f, ferr := os.Create(path)
	if ferr != nil {
		return fmt.Errorf("%w (no stall report: %w)", err, ferr)
	}
	r.stallReport(f, prefix, quit)
	if ferr := f.Close(); ferr != nil {
		return fmt.Errorf("%w (no stall report: %w)", err, ferr)
	}
	r.logf("stall report: %s", path)
	return fmt.Errorf("%w (stall report: %s)", err, path)
}

// stallPath is the stall report's file: beside the kept agent log, or in
// the temporary directory when none is kept; batch, when set, names the
// batch in it.
func stallPath(keepLog, batch string) string {
	suffix := "-stall.txt"
	if batch != "" {
		suffix = "-" + batch + suffix
	}
	if keepLog == "" {
		return filepath.Join(os.TempDir(), fmt.Sprintf("zfsbench-churn-%d%s", os.Getpid(), suffix))
	}
	return strings.TrimSuffix(keepLog, ".log") + suffix
}
