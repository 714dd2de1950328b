package churn

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// The churn scenario reads what happened inside the plugin and the Nomad
// client from the agent's log (TRACE level): the agent relays the plugin's
// log lines, with the plugin's own timestamp, and the client's task runner
// times each prestart hook, the "devices" hook being the call to Reserve.

// agentTimeLayout is the timestamp the Nomad agent starts each line with.
const agentTimeLayout = "2006-01-02T15:04:05.000Z0700"

// logLine is one parsed line of the agent log.
type logLine struct {
	At    time.Time         // the plugin's timestamp when given, else the agent's
	Level string            // TRACE, DEBUG, INFO, WARN, ERROR
	Text  string            // everything after the level
	KV    map[string]string // key=value pairs, values unquoted
}

var kvRE = regexp.MustCompile(`([A-Za-z_@][\w.@-]*)=("(?:[^"\\]|\\.)*"|\S*)`)

// parseLogLine parses one agent log line; ok is false for lines that do not
// start with a timestamp and a level (continuations, panics).
func parseLogLine(s string) (l logLine, ok bool) {
	ts, rest, found := strings.Cut(strings.TrimLeft(s, " \t"), " ")
	if !found {
		return l, false
	}
	at, err := time.Parse(agentTimeLayout, ts)
	if err != nil {
		return l, false
	}
	rest = strings.TrimLeft(rest, " ")
	if !strings.HasPrefix(rest, "[") {
		return l, false
	}
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return l, false
	}
	l = logLine{At: at, Level: rest[1:end], Text: strings.TrimSpace(rest[end+1:]), KV: map[string]string{}}
	for _, m := range kvRE.FindAllStringSubmatch(l.Text, -1) {
		v := m[2]
		if strings.HasPrefix(v, `"`) {
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
		}
		l.KV[m[1]] = v
	}
	if t, err := time.Parse(time.RFC3339Nano, l.KV["timestamp"]); err == nil {
		l.At = t
	} else if t, err := time.Parse(agentTimeLayout, l.KV["timestamp"]); err == nil {
		l.At = t
	}
	return l, true
}

// churnLog is what the scenario reads from the agent log.
type churnLog struct {
	Releases  []logRelease             // "release started", in log order
	Fresh     []logEvent               // "slot changed" action "create slot"
	Retired   []logEvent               // "slot changed": a released dataset moved to the archive or destroyed
	Reserved  []logEvent               // "slot reserved"
	Waiting   []logEvent               // "reserve waiting"
	Hooks     map[string]devicesHook   // by allocation ID
	Launches  map[string]time.Duration // the "logmon" prestart hook, by allocation ID
	Sent      []logSent                // "fingerprint sent"
	Unhealthy []logEvent               // plugin lines at WARN or ERROR
	Marks     []logRan                 // "ran": the zfs set of a slot's state, on this class's slots
	Commands  []cmdSpan                // "ran": every zfs and zpool command the plugin ran, in log order
	Prepared  []logEvent               // "slot prepared": At its end, Took its zfs work, Job the asker's
	Reads     []logRead                // "read the node's allocations", blocking or not
	LockWaits []logLockWait            // "waited for the slot's lock"
}

// logLockWait is a wait for a slot's lock that the plugin logged: for
// what, behind what, and how long.
type logLockWait struct {
	At     time.Time
	For    string
	Behind string
	Waited time.Duration
}

// logRead is a read of the node's allocations that the plugin made: a
// blocking one (its watch of the node), or not (a Reserve's
// identification, a release pass's proof).
type logRead struct {
	End      time.Time
	Took     time.Duration
	Allocs   int
	Blocking bool
}

// logRan is one zfs command the plugin ran, as its runner logged it: when
// it ended, how long it took, and the dataset it named last.
type logRan struct {
	End     time.Time
	Took    time.Duration
	Device  string // the slot the dataset belongs to (its first name or its spare)
	Dataset string
}

// logSent is a fingerprint the plugin sent, with the devices it showed
// unhealthy.
type logSent struct {
	At        time.Time
	Unhealthy map[string]bool
}

type logRelease struct {
	At     time.Time
	Device string
	Job    string // the owner's job, from the owner description
	// Spare: the slot's spare served from the release's start.
	Spare bool
}

type logEvent struct {
	At     time.Time
	Device string
	Job    string
	Text   string
	Took   time.Duration // a "slot reserved" line's took: the Reserve in the plugin
	// Prepared: a "slot reserved" line's prepared=true (the slot was
	// reserved when the allocation was placed: slots.prepare).
	Prepared bool
}

// devicesHook is the Nomad client's timing of a task's "devices" prestart
// hook: the gRPC call to the plugin's Reserve and the persisting of its
// answer.
type devicesHook struct {
	Start    time.Time
	Duration time.Duration
}

var ownerJobRE = regexp.MustCompile(`\("[^"]*"/"([^"]*)"`)

// readChurnLog extracts the scenario's events; class names the class whose
// slot datasets are <parent>/<class>/<i>.
func readChurnLog(r io.Reader, parent, class string) (*churnLog, error) {
	out := &churnLog{Hooks: map[string]devicesHook{}, Launches: map[string]time.Duration{}}
	slotPrefix := parent + "/" + class + "/"
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 256<<10), 4<<20)
	for sc.Scan() {
		l, ok := parseLogLine(sc.Text())
		if !ok {
			continue
		}
		plugin := strings.Contains(l.Text, "nomad-device-zfs")
		switch {
		case plugin && strings.Contains(l.Text, "release started"):
			job := ""
			if m := ownerJobRE.FindStringSubmatch(l.KV["owner"]); m != nil {
				job = m[1]
			}
			out.Releases = append(out.Releases, logRelease{At: l.At, Device: l.KV["device"], Job: job, Spare: l.KV["spare"] != ""})
		case plugin && strings.Contains(l.Text, "slot changed") && l.KV["action"] == "create slot":
			if i, ok := strings.CutPrefix(l.KV["dataset"], slotPrefix); ok {
				out.Fresh = append(out.Fresh, logEvent{At: l.At, Device: deviceOf(class, i)})
			}
		case plugin && strings.Contains(l.Text, "slot changed") && (l.KV["action"] == "move released slot to the archive" || l.KV["action"] == "destroy released dataset"):
			if i, ok := strings.CutPrefix(l.KV["dataset"], slotPrefix); ok {
				out.Retired = append(out.Retired, logEvent{At: l.At, Device: deviceOf(class, i)})
			}
		case plugin && strings.Contains(l.Text, "slot reserved"):
			job := ""
			if m := ownerJobRE.FindStringSubmatch(l.KV["owner"]); m != nil {
				job = m[1]
			}
			took, _ := logDuration(l.KV["took"])
			out.Reserved = append(out.Reserved, logEvent{At: l.At, Device: l.KV["device"], Job: job, Text: l.KV["how"], Took: took,
				Prepared: l.KV["prepared"] == "true"})
		case plugin && strings.Contains(l.Text, "slot prepared"):
			job := ""
			if m := ownerJobRE.FindStringSubmatch(l.KV["asker"]); m != nil {
				job = m[1]
			}
			took, _ := logDuration(l.KV["took"])
			out.Prepared = append(out.Prepared, logEvent{At: l.At, Device: l.KV["device"], Job: job, Text: l.KV["how"], Took: took})
		case plugin && strings.Contains(l.Text, "reserve waiting"):
			out.Waiting = append(out.Waiting, logEvent{At: l.At, Device: l.KV["devices"], Text: l.KV["reason"]})
		case plugin && strings.Contains(l.Text, "fingerprint sent"):
			sent := logSent{At: l.At, Unhealthy: map[string]bool{}}
			for _, id := range strings.Split(l.KV["unhealthy"], ",") {
				if id != "" {
					sent.Unhealthy[id] = true
				}
			}
			out.Sent = append(out.Sent, sent)
		case plugin && strings.Contains(l.Text, "read the node's allocations:"):
			took, ok := logDuration(l.KV["took"])
			n, err := strconv.Atoi(l.KV["allocs"])
			if b := l.KV["blocking"]; ok && err == nil && (b == "true" || b == "false") {
				out.Reads = append(out.Reads, logRead{End: l.At, Took: took, Allocs: n, Blocking: b == "true"})
			}
		case plugin && strings.Contains(l.Text, "waited for the slot's lock"):
			if w, ok := logDuration(l.KV["waited"]); ok {
				out.LockWaits = append(out.LockWaits, logLockWait{At: l.At, For: l.KV["for"], Behind: l.KV["behind"], Waited: w})
			}
		case plugin && strings.Contains(l.Text, ": ran:"):
			if r, ok := stateMark(l, slotPrefix, class); ok {
				out.Marks = append(out.Marks, r)
			}
			if c, ok := commandSpan(l); ok {
				out.Commands = append(out.Commands, c)
			}
		case plugin && (l.Level == "WARN" || l.Level == "ERROR"):
			out.Unhealthy = append(out.Unhealthy, logEvent{At: l.At, Text: l.Text})
		case strings.Contains(l.Text, "finished prestart hook") && l.KV["name"] == "devices":
			d, err := time.ParseDuration(l.KV["duration"])
			if err != nil || l.KV["alloc_id"] == "" {
				continue
			}
			out.Hooks[l.KV["alloc_id"]] = devicesHook{Start: l.At.Add(-d), Duration: d}
		case strings.Contains(l.Text, "finished prestart hook") && l.KV["name"] == "logmon":
			// The task's log collector: a process the client starts, as it
			// starts the executor and the task, before the devices hook.
			if d, err := time.ParseDuration(l.KV["duration"]); err == nil && l.KV["alloc_id"] != "" {
				out.Launches[l.KV["alloc_id"]] = d
			}
		}
	}
	return out, sc.Err()
}

// stateMark reads a runner's "ran" line of a successful `zfs set
// <PropState>=... <dataset>` on one of the class's slot datasets: the
// command a Reserve runs (one on a fresh slot, two side by side for a
// spare). The args are logged as a Go slice, [set, prop=value, dataset].
func stateMark(l logLine, slotPrefix, class string) (logRan, bool) {
	args, ok := ranArgs(l)
	if !ok || l.KV["error"] != "<nil>" {
		return logRan{}, false
	}
	if len(args) != 3 || args[0] != "set" || !strings.HasPrefix(args[1], record.PropState+"=") {
		return logRan{}, false
	}
	i, ok := strings.CutPrefix(args[2], slotPrefix)
	if !ok {
		return logRan{}, false
	}
	took, ok := logDuration(l.KV["duration"])
	if !ok {
		return logRan{}, false
	}
	return logRan{End: l.At, Took: took, Device: deviceOf(class, i), Dataset: args[2]}, true
}

// ranArgs returns the args of a runner's "ran" line, logged as a Go
// slice ([set, prop=value, dataset]); false when the line has none.
func ranArgs(l logLine) ([]string, bool) {
	_, rest, ok := strings.Cut(l.Text, "args=[")
	if !ok {
		return nil, false
	}
	list, _, ok := strings.Cut(rest, "]")
	if !ok {
		return nil, false
	}
	return strings.Split(list, ", "), true
}

// logDuration reads a duration as the plugin logs it: hclog writes a
// time.Duration as its nanoseconds in a float's notation ("3.07e+07"),
// Nomad's own lines as Go prints it ("32.9ms").
func logDuration(v string) (time.Duration, bool) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, true
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(f), true
}

// deviceOf is the device ID of the slot whose dataset is leaf under the
// class: its first name ("3") or its spare's ("3.alt").
func deviceOf(class, leaf string) string {
	return class + "-" + strings.TrimSuffix(leaf, record.AltSuffix)
}
