package bench

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
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
	Releases  []logRelease           // "release started", in log order
	Fresh     []logEvent             // "slot changed" action "create slot"
	Retired   []logEvent             // "slot changed": a released dataset moved to the archive or destroyed
	Reserved  []logEvent             // "slot reserved"
	Waiting   []logEvent             // "reserve waiting"
	Hooks     map[string]devicesHook // by allocation ID
	Sent      []logSent              // "fingerprint sent"
	Unhealthy []logEvent             // plugin lines at WARN or ERROR
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
	out := &churnLog{Hooks: map[string]devicesHook{}}
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
				out.Fresh = append(out.Fresh, logEvent{At: l.At, Device: class + "-" + strings.TrimSuffix(i, slots.AltSuffix)})
			}
		case plugin && strings.Contains(l.Text, "slot changed") && (l.KV["action"] == "move released slot to the archive" || l.KV["action"] == "destroy released dataset"):
			if i, ok := strings.CutPrefix(l.KV["dataset"], slotPrefix); ok {
				out.Retired = append(out.Retired, logEvent{At: l.At, Device: class + "-" + strings.TrimSuffix(i, slots.AltSuffix)})
			}
		case plugin && strings.Contains(l.Text, "slot reserved"):
			job := ""
			if m := ownerJobRE.FindStringSubmatch(l.KV["owner"]); m != nil {
				job = m[1]
			}
			out.Reserved = append(out.Reserved, logEvent{At: l.At, Device: l.KV["device"], Job: job, Text: l.KV["how"]})
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
		case plugin && (l.Level == "WARN" || l.Level == "ERROR"):
			out.Unhealthy = append(out.Unhealthy, logEvent{At: l.At, Text: l.Text})
		case strings.Contains(l.Text, "finished prestart hook") && l.KV["name"] == "devices":
			d, err := time.ParseDuration(l.KV["duration"])
			if err != nil || l.KV["alloc_id"] == "" {
				continue
			}
			out.Hooks[l.KV["alloc_id"]] = devicesHook{Start: l.At.Add(-d), Duration: d}
		}
	}
	return out, sc.Err()
}
