// Package bench measures nomad-device-zfs on a real pool against floors: the
// cheapest zfs command that could possibly answer the same question, run in
// the same process, on the same pool, interleaved with the plugin's runs. It
// holds the harness behind `make bench` (see Run and cmd/zfsbench), the
// helpers that count zfs processes through a wrapper script, which the
// process-count test in this package also uses, and the pools, statistics
// and verdicts the other scenarios share (bench/churn).
//
// The package uses only the public API of internal/device, internal/slots and
// internal/zfs, with internal/testkit/sandbox for its pools, internal/testkit/pluginhost to
// launch the plugin binary and internal/nomadplugin to reach a plugin over
// gRPC, in this process or launched; it imports no test package.
package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// The one class every benchmark configures.
const (
	ClassName  = "bench"
	ClassQuota = 64 << 20
	MountPath  = "/zfs/bench"
	ownerUID   = 65534
	ownerGID   = 65534
	classMode  = 0o770
)

// PluginConfig returns the agent-style `config { ... }` block of a plugin
// with one class of n slots under parent.
func PluginConfig(parent string, n int, fingerprintPeriod, statsPeriod string) string {
	return fmt.Sprintf(`config {
  parent_dataset     = %q
  fingerprint_period = %q
  stats_period       = %q
  class %q {
    slots      = %d
    quota      = "%d"
    mount_path = %q
    owner      = "%d:%d"
    mode       = "%04o"
  }
}`, parent, fingerprintPeriod, statsPeriod, ClassName, n, ClassQuota, MountPath, ownerUID, ownerGID, classMode)
}

// SlotsConfig is the slot manager configuration equal to what the plugin
// makes of PluginConfig(parent, n, ...). A manager given it and the datasets
// the plugin provisioned has nothing to change.
func SlotsConfig(parent string, n int) slots.Config {
	return slots.Config{Parent: parent, Classes: []slots.Class{{
		Name: ClassName, Slots: n, Quota: ClassQuota, MountPath: MountPath,
		UID: ownerUID, GID: ownerGID, Mode: classMode, Properties: map[string]string{},
	}}}
}

// DeviceID is the Nomad device ID of slot i of the bench class.
func DeviceID(i int) string { return record.DeviceID(ClassName, i) }

// SlotDataset is the dataset of slot i of the bench class under parent.
func SlotDataset(parent string, i int) string {
	return SlotsConfig(parent, 0).SlotDataset(ClassName, i)
}

// callTimeout bounds one unary call to a plugin: SetConfig's checks are
// bounded by a minute each, and a Reserve by reserve_timeout (2 minutes by
// default), both inside the plugin.
const callTimeout = 5 * time.Minute

// Plugin is the plugin in the benchmark's process, driven as Nomad's agent
// drives it: every call Nomad makes (Conn) travels over real gRPC on an
// in-memory connection (nomadplugin.Connect), through the same generated
// code as the launched binary's. Settle and Close, which Nomad never
// calls, go to the plugin value itself.
type Plugin struct {
	nomadplugin.Conn

	local *device.Plugin
	stop  func() // ends the connection and the gRPC server
}

// NewPlugin returns an unconfigured in-process plugin that runs zfs through
// r and logs nothing, served until Close. Its view of the node's
// allocations is a Tenants with none (no Nomad runs here): Adopt makes the
// datasets an earlier plugin armed its own, as a restarted plugin's first
// pass does with Nomad's answer.
func NewPlugin(r *zfs.Runner) (*Plugin, error) {
	local := device.New(hclog.NewNullLogger(), r)
	if err := local.UseAllocations(NewTenants()); err != nil {
		return nil, err
	}
	conn, stop, err := nomadplugin.Connect(local)
	if err != nil {
		local.Close()
		return nil, err
	}
	return &Plugin{Conn: conn, local: local, stop: stop}, nil
}

// Settle returns once no slot work runs in the background (releases,
// spares being made), or with ctx's error (device.Plugin.Settle).
func (p *Plugin) Settle(ctx context.Context) error { return p.local.Settle(ctx) }

// Adopt runs one release pass and waits for what it started: the fresh
// datasets an earlier run armed, which nobody holds, become this plugin's
// to hand over (internal/slots/armed.go). Call it after the first
// fingerprint; it is the restarted plugin's first pass, untimed.
func (p *Plugin) Adopt(ctx context.Context) error {
	if err := p.local.ReleaseEnded(ctx); err != nil {
		return err
	}
	return p.local.Settle(ctx)
}

// Close ends the gRPC server, and with it every stream still open (the
// fingerprint stream's end stops the plugin's background parts), and the
// plugin's metrics server. Calls after it fail. It is safe to call more
// than once.
func (p *Plugin) Close() {
	p.stop()
	p.local.Close()
}

// Configure encodes block as a Nomad agent would, with the schema the
// plugin returns over the wire (ConfigSchema), and sends it to SetConfig.
// The error is the encoding's (the block does not fit the schema) or the
// plugin's answer. Each call is bounded by callTimeout and by ctx.
func Configure(ctx context.Context, c nomadplugin.Conn, block string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	schema, err := c.Base.ConfigSchema(ctx, &basepb.ConfigSchemaRequest{})
	if err != nil {
		return fmt.Errorf("ConfigSchema: %w", err)
	}
	b, err := pluginhost.EncodeConfig(schema.GetSpec(), block)
	if err != nil {
		return err
	}
	if _, err := c.Base.SetConfig(ctx, &basepb.SetConfigRequest{MsgpackConfig: b, PluginApiVersion: nomadplugin.DeviceAPIVersion}); err != nil {
		return fmt.Errorf("SetConfig: %w", err)
	}
	return nil
}

// Reserve asks the plugin for the instances ids, as the Nomad client does
// when a task starts, and returns what the task gets. The call is bounded
// by callTimeout and by ctx (the plugin bounds its own work by
// reserve_timeout).
func Reserve(ctx context.Context, c nomadplugin.Conn, ids ...string) (*devicepb.ContainerReservation, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	res, err := c.Device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: ids})
	if err != nil {
		return nil, err
	}
	return res.GetContainerRes(), nil
}

// FirstFingerprint opens the fingerprint stream of a configured plugin and
// waits up to within for its first message, which it checks: the stream did
// not fail and reports want healthy devices. On success the stream stays
// open until stop ends it; on error it is ended.
func FirstFingerprint(c nomadplugin.Conn, want int, within time.Duration) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening the fingerprint stream: %w", err)
	}
	late := time.AfterFunc(within, cancel)
	fp, err := st.Recv()
	if !late.Stop() { // the timer has fired, and ended the stream
		return nil, fmt.Errorf("no fingerprint within %s", within)
	}
	switch {
	case errors.Is(err, io.EOF):
		cancel()
		return nil, errors.New("fingerprint stream closed before the first message")
	case err != nil:
		cancel()
		return nil, fmt.Errorf("fingerprint error: %w", err)
	}
	if err := checkFingerprint(fp, want); err != nil {
		cancel()
		return nil, err
	}
	return cancel, nil
}

func checkFingerprint(fp *devicepb.FingerprintResponse, want int) error {
	healthy, total := 0, 0
	var first string
	for _, g := range fp.GetDeviceGroup() {
		for _, d := range g.GetDevices() {
			total++
			if d.GetHealthy() {
				healthy++
			} else if first == "" {
				first = d.GetID() + ": " + d.GetHealthDescription()
			}
		}
	}
	if healthy != want {
		return fmt.Errorf("fingerprint: %d of %d devices healthy, want %d (first unhealthy: %s)", healthy, total, want, first)
	}
	return nil
}

// Counter counts zfs and zpool processes through two wrapper scripts that
// append one line per run to a log file and then exec the real command. A
// runner whose ZFS and Zpool are the wrappers (see Runner) is counted
// whatever code path starts the process.
type Counter struct {
	ZFS, Zpool string // the wrapper scripts
	Log        string // one line per process: "zfs get -H ...", "zpool list ..."
}

// NewCounter writes the wrapper scripts into dir, in front of the zfs and
// zpool found on PATH.
func NewCounter(dir string) (*Counter, error) {
	c := &Counter{ZFS: filepath.Join(dir, "zfs"), Zpool: filepath.Join(dir, "zpool"), Log: filepath.Join(dir, "zfs-processes.log")}
	for wrapper, name := range map[string]string{c.ZFS: "zfs", c.Zpool: "zpool"} {
		real, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("counting wrapper: %w", err)
		}
		script := fmt.Sprintf("#!/bin/sh\n# Counts %s processes for nomad-device-zfs benchmarks.\nprintf '%%s\\n' \"%s $*\" >> %s\nexec %s \"$@\"\n",
			name, name, shellQuote(c.Log), shellQuote(real))
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(c.Log, nil, 0o644); err != nil {
		return nil, err
	}
	return c, nil
}

// Runner returns a new runner that goes through the wrappers.
func (c *Counter) Runner() *zfs.Runner { return &zfs.Runner{ZFS: c.ZFS, Zpool: c.Zpool} }

// Mark returns how many processes have been logged so far.
func (c *Counter) Mark() (int, error) {
	lines, err := c.lines()
	return len(lines), err
}

// Since returns the processes logged after mark, by command and subcommand
// ("zfs set", "zpool list"); a recursive read of a tree counts as
// "zfs get -r", apart from reads of named datasets ("zfs get").
func (c *Counter) Since(mark int) (Counts, error) {
	lines, err := c.lines()
	if err != nil {
		return nil, err
	}
	if mark > len(lines) {
		return nil, fmt.Errorf("counter log shrank: mark %d, %d lines", mark, len(lines))
	}
	counts := Counts{}
	for _, l := range lines[mark:] {
		f := strings.Fields(l)
		key := strings.Join(f[:min(2, len(f))], " ")
		if key == "zfs get" && slices.Contains(f, "-r") {
			key = "zfs get -r"
		}
		counts[key]++
	}
	return counts, nil
}

// Count runs f and returns the processes it started.
func (c *Counter) Count(f func() error) (Counts, error) {
	mark, err := c.Mark()
	if err != nil {
		return nil, err
	}
	if err := f(); err != nil {
		return nil, err
	}
	return c.Since(mark)
}

func (c *Counter) lines() ([]string, error) {
	f, err := os.Open(c.Log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines, sc.Err()
}

// Counts is a number of processes by command and subcommand.
type Counts map[string]int

// Total is the number of processes of every kind.
func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

func (c Counts) String() string {
	if len(c) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(c))
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, strconv.Itoa(c[k])+"× "+k)
	}
	return strings.Join(parts, ", ")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// FloorGetArgs is the floor of every periodic path: one batched zfs get of
// the properties the plugin reads, over the whole parent, as the plugin asks
// for them.
func FloorGetArgs(parent string) []string {
	return []string{"get", "-H", "-p", "-o", "name,property,value,source", "-r", "-d", "2",
		strings.Join(slots.ObservedProps, ","), parent}
}

// Mounted reports whether dir is a mount point: its device differs from its
// parent directory's.
func Mounted(dir string) bool {
	var a, b os.FileInfo
	var err error
	if a, err = os.Stat(dir); err != nil {
		return false
	}
	if b, err = os.Stat(filepath.Dir(dir)); err != nil {
		return false
	}
	return devOf(a) != devOf(b)
}

// ZFSMounts counts the ZFS file systems mounted on this machine (zfs-fuse
// mounts have the type fuse.zfs, the kernel module's zfs).
func ZFSMounts() (int, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 2 && (f[2] == "zfs" || f[2] == "fuse.zfs") {
			n++
		}
	}
	return n, nil
}

// PeakRSS returns the peak resident set size (VmHWM) of a process, in bytes.
func PeakRSS(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("unexpected VmHWM line %q", l)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

func devOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev)
	}
	return 0
}
