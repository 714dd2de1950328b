package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Outcomes of a check. A skipped check depends on one that failed.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
	checkSkip = "skip"
)

// check is one line of `doctor`.
type check struct {
	Name    string `json:"check"`
	Status  string `json:"status"`
	Message string `json:"message"`
	// Fix says what to do, for anything not ok.
	Fix string `json:"fix,omitempty"`
}

// doctor runs the checks in order; later ones are skipped when what they
// need failed.
type doctor struct {
	c      *common
	z      *zfs.Client
	log    hclog.Logger
	checks []check
	// loadErr is why the settings could not be loaded (nil when they were).
	loadErr error
}

func (d *doctor) add(name, status, msg, fix string) {
	d.checks = append(d.checks, check{Name: name, Status: status, Message: oneLine(msg), Fix: fix})
}

func (d *doctor) skip(name, why string) { d.add(name, checkSkip, why, "") }

// run performs every check and returns them.
func (d *doctor) run(ctx context.Context) []check {
	d.checkConfig()
	d.checkPluginDir(ctx)
	zfsOK := d.checkZFS(ctx)
	switch {
	case !zfsOK:
		for _, n := range []string{"pool", "parent", "slots"} {
			d.skip(n, "needs zfs")
		}
	case d.loadErr != nil:
		for _, n := range []string{"pool", "parent", "slots"} {
			d.skip(n, "needs the plugin's configuration")
		}
	default:
		d.checkTree(ctx)
	}
	if d.loadErr != nil {
		for _, n := range []string{"nomad-api", "node", "token", "allocations"} {
			d.skip(n, "needs the plugin's configuration")
		}
		return d.checks
	}
	d.checkNomad(ctx)
	return d.checks
}

func (d *doctor) checkConfig() {
	const name = "config"
	c := d.c
	if c.agent == nil {
		switch {
		case d.loadErr != nil:
			d.add(name, checkFail, d.loadErr.Error(), "point -config at the agent's configuration file or directory (as given to nomad agent -config)")
		default:
			d.add(name, checkWarn, fmt.Sprintf("no -config: checking the classes found under %s", c.settings.Slots.Parent),
				"give -config=<agent configuration> to check the plugin block and plugin_dir too")
		}
		return
	}
	blocks := c.agent.Blocks(device.PluginName)
	files := strings.Join(c.agent.Files, ", ")
	switch {
	case len(blocks) == 0:
		d.add(name, checkFail, fmt.Sprintf("no plugin %q block in %s", device.PluginName, files),
			fmt.Sprintf("add a plugin %q { config { … } } block to the client's agent configuration (see examples/agent.hcl) and restart the agent", device.PluginName))
		return
	case len(blocks) > 1:
		var where []string
		for _, b := range blocks {
			where = append(where, b.File)
		}
		d.add(name, checkFail, fmt.Sprintf("%d plugin %q blocks (in %s): Nomad keeps only the last one's config", len(blocks), device.PluginName, strings.Join(where, ", ")),
			"keep exactly one plugin block for nomad-device-zfs")
		return
	case d.loadErr != nil:
		d.add(name, checkFail, d.loadErr.Error(), "correct the field named; the agent would refuse to start the plugin with the same error")
		return
	}
	s := c.settings.Slots
	var cls []string
	for _, cl := range s.Classes {
		cls = append(cls, fmt.Sprintf("%s: %d × %s", cl.Name, cl.Slots, bytesIEC(cl.Quota)))
	}
	d.add(name, checkOK, fmt.Sprintf("%s: one plugin block; parent %s; classes %s", blocks[0].File, s.Parent, strings.Join(cls, ", ")), "")
}

// checkPluginDir checks that the agent's plugin_dir holds this plugin.
func (d *doctor) checkPluginDir(ctx context.Context) {
	const name = "plugin_dir"
	if d.c.agent == nil {
		d.skip(name, "needs -config")
		return
	}
	dir := d.c.agent.EffectivePluginDir()
	if dir == "" {
		d.add(name, checkWarn, "neither plugin_dir nor data_dir is set in the configuration files",
			"set plugin_dir (or check the agent's -plugin-dir / -data-dir flags) and put nomad-device-zfs there")
		return
	}
	bin := filepath.Join(dir, device.PluginName)
	fi, err := os.Stat(bin)
	switch {
	case errors.Is(err, os.ErrNotExist):
		d.add(name, checkFail, fmt.Sprintf("%s does not exist", bin),
			fmt.Sprintf("copy the nomad-device-zfs binary to %s (mode 0755), or install the package, and restart the agent", bin))
		return
	case err != nil:
		d.add(name, checkFail, err.Error(), "make the plugin binary readable by the agent")
		return
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		d.add(name, checkFail, fmt.Sprintf("%s is not an executable file (mode %s)", bin, fi.Mode()), fmt.Sprintf("chmod 0755 %s", bin))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "version")
	cmd.Stdout = &out
	cmd.Env = withoutPluginCookie(os.Environ())
	if err := cmd.Run(); err != nil {
		d.add(name, checkFail, fmt.Sprintf("%s version: %v", bin, err), "replace it with a working build of nomad-device-zfs")
		return
	}
	got := strings.TrimSpace(out.String())
	if got != device.VersionString() {
		d.add(name, checkWarn, fmt.Sprintf("%s is %q; this command is %q", bin, got, device.VersionString()),
			"install the same build on the agent, or run the doctor of the installed binary")
		return
	}
	d.add(name, checkOK, fmt.Sprintf("%s is %s", bin, got), "")
}

// withoutPluginCookie keeps a child from thinking Nomad launched it.
func withoutPluginCookie(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, magicCookieKey+"=") {
			out = append(out, e)
		}
	}
	return out
}

// checkZFS checks that zfs and zpool are found and answer.
func (d *doctor) checkZFS(ctx context.Context) bool {
	const name = "zfs"
	for _, bin := range []string{"zfs", "zpool"} {
		if _, err := exec.LookPath(bin); err != nil {
			d.add(name, checkFail, fmt.Sprintf("no %s command on PATH (%s)", bin, os.Getenv("PATH")),
				"install OpenZFS (zfsutils-linux) or zfs-fuse, and make sure the agent's PATH has zfs and zpool")
			return false
		}
	}
	impl, err := d.z.Implementation(ctx)
	if err != nil {
		fix := "make ZFS answer `zpool list`"
		if errors.Is(err, zfs.ErrUnavailable) {
			fix = "load the ZFS kernel module (modprobe zfs) or start the zfs-fuse daemon, and run as root"
		}
		d.add(name, checkFail, err.Error(), fix)
		return false
	}
	d.add(name, checkOK, fmt.Sprintf("%s answers (zfs and zpool on PATH)", impl), "")
	return true
}

// checkTree checks the pool, the parent dataset and the slots, from one
// read-only observation.
func (d *doctor) checkTree(ctx context.Context) {
	cfg := d.c.settings.Slots
	obs, err := slots.Observe(ctx, d.z, cfg)
	if err != nil {
		for _, n := range []string{"pool", "parent", "slots"} {
			d.add(n, checkFail, err.Error(), "ZFS did not answer in time: check zpool status")
		}
		return
	}
	// pool
	switch {
	case obs.PoolErr != nil:
		d.add("pool", checkFail, obs.PoolErr.Error(), fmt.Sprintf("import the pool (zpool import %s)", obs.Pool))
	case obs.PoolHealth != "ONLINE":
		d.add("pool", checkFail, fmt.Sprintf("pool %s is %s", obs.Pool, obs.PoolHealth),
			fmt.Sprintf("repair the pool (zpool status -x %s); no slot is offered meanwhile", obs.Pool))
	case !obs.AvailableKnown:
		d.add("pool", checkWarn, fmt.Sprintf("pool %s is ONLINE; the space available to %s is not known", obs.Pool, cfg.Parent), "")
	default:
		d.checkRoom(cfg, obs)
	}
	// parent
	switch {
	case obs.PoolErr != nil:
		d.skip("parent", "needs the pool")
	case errors.Is(obs.ParentErr, zfs.ErrNotExist):
		d.add("parent", checkFail, fmt.Sprintf("parent dataset %s does not exist", cfg.Parent), fmt.Sprintf("zfs create %s (the plugin never creates it)", cfg.Parent))
	case obs.ParentErr != nil:
		d.add("parent", checkFail, fmt.Sprintf("parent dataset %s cannot be read: %v", cfg.Parent, obs.ParentErr), "check zfs get all "+cfg.Parent)
	case len(obs.Foreign) > 0 || len(obs.Unreadable) > 0:
		var parts []string
		if len(obs.Foreign) > 0 {
			parts = append(parts, fmt.Sprintf("%d datasets not the plugin's (left alone): %s", len(obs.Foreign), strings.Join(obs.Foreign, ", ")))
		}
		if len(obs.Unreadable) > 0 {
			parts = append(parts, fmt.Sprintf("%d datasets whose properties do not parse: %s", len(obs.Unreadable), strings.Join(obs.Unreadable, ", ")))
		}
		d.add("parent", checkWarn, fmt.Sprintf("%s exists; %s", cfg.Parent, strings.Join(parts, "; ")),
			"move datasets you made yourself out of the plugin's parent; the plugin never touches them, and a foreign dataset where a slot belongs keeps that slot out of service")
	default:
		d.add("parent", checkOK, fmt.Sprintf("%s exists; everything under it is the plugin's", cfg.Parent), "")
	}
	// slots
	if obs.ParentErr != nil {
		d.skip("slots", "needs the parent dataset")
		return
	}
	var free, inUse, releasing, missing int
	var bad []string
	for _, s := range obs.Slots {
		state, reason := stateOf(s)
		switch state {
		case stateFree:
			free++
		case stateInUse:
			inUse++
		case stateReleasing:
			releasing++
		default:
			if strings.HasSuffix(reason, "is missing") {
				missing++
				continue
			}
			bad = append(bad, s.ID+": "+reason)
		}
	}
	summary := fmt.Sprintf("%d slots: %d free, %d in use, %d releasing", len(obs.Slots), free, inUse, releasing)
	switch {
	case len(bad) > 0:
		d.add("slots", checkWarn, fmt.Sprintf("%s, %d unhealthy: %s", summary, len(bad), strings.Join(bad, "; ")),
			"see `nomad-device-zfs status` and docs/troubleshooting.md for each reason")
	case missing > 0:
		d.add("slots", checkWarn, fmt.Sprintf("%s, %d not created yet", summary, missing),
			"the plugin creates missing slots at its next fingerprint: is the agent running with this configuration?")
	default:
		d.add("slots", checkOK, summary, "")
	}
}

// checkRoom compares the space the parent may still use with the classes'
// quotas.
func (d *doctor) checkRoom(cfg slots.Config, obs slots.Observation) {
	var total, largest uint64
	var largestClass string
	for _, cl := range cfg.Classes {
		total += uint64(cl.Slots) * cl.Quota
		if cl.Quota > largest {
			largest, largestClass = cl.Quota, cl.Name
		}
	}
	avail := obs.Available
	msg := fmt.Sprintf("pool %s is ONLINE; %s available to %s; the classes' quotas add up to %s", obs.Pool, bytesIEC(avail), cfg.Parent, bytesIEC(total))
	switch {
	case avail < largest:
		d.add("pool", checkFail, msg+fmt.Sprintf(": less than one quota of class %s (%s), so its free slots are not offered", largestClass, bytesIEC(largest)),
			"free space in the pool, or lower the quota")
	case avail < total:
		d.add("pool", checkWarn, msg+": over-committed, tenants together could fill the pool before reaching their quotas",
			"add space, or lower slots or quota, unless the over-commitment is deliberate")
	default:
		d.add("pool", checkOK, msg, "")
	}
}

// checkNomad checks the API, the node ID, the token and the node's
// allocations, as the plugin will use them.
func (d *doctor) checkNomad(ctx context.Context) {
	w, err := allocwatch.New(d.c.settings.Nomad, d.log)
	if err != nil {
		d.add("nomad-api", checkFail, err.Error(), "fix the nomad block's TLS files or address")
		for _, n := range []string{"node", "token", "allocations"} {
			d.skip(n, "needs the Nomad API")
		}
		return
	}
	leader, err := w.Ping(ctx)
	if err != nil {
		d.add("nomad-api", checkFail, err.Error(),
			"start the agent, or set the nomad block's address (and ca_file, cert_file, key_file for TLS) to where it listens")
		for _, n := range []string{"node", "token", "allocations"} {
			d.skip(n, "needs the Nomad API")
		}
		return
	}
	d.add("nomad-api", checkOK, fmt.Sprintf("%s answers (leader %s)", w.Address(), orDash(leader)), "")

	nodeID, err := w.NodeID(ctx)
	if err != nil {
		d.add("node", checkFail, err.Error(), "set nomad { node_id = \"…\" }, or give the token agent:read or node:read")
		d.skip("allocations", "needs the node ID")
	} else {
		how := "learned from the agent"
		if d.c.settings.Nomad.NodeID != "" {
			how = "configured"
		}
		d.add("node", checkOK, fmt.Sprintf("node %s (%s)", nodeID, how), "")
	}

	vis := w.Visibility(ctx)
	if vis.All {
		d.add("token", checkOK, "sees every namespace: "+vis.Reason, "")
	} else {
		d.add("token", checkFail, vis.Reason,
			`apply examples/acl/zfs-plugin.policy.hcl (node read, read-job on namespace "*") to the plugin's token; until then every slot a job uses is kept, unhealthy`)
	}
	if err != nil {
		return
	}
	snap, err := w.NodeAllocations(ctx)
	if err != nil {
		fix := "check the agent and the token"
		if errors.Is(err, allocwatch.ErrPermission) {
			fix = `grant the token node { policy = "read" } and namespace "*" { capabilities = ["read-job"] }`
		}
		d.add("allocations", checkFail, err.Error(), fix)
		return
	}
	d.add("allocations", checkOK, fmt.Sprintf("read %s of node %s", plural(len(snap.Allocs), "allocation"), shortID(nodeID)), "")
}

// renderDoctor writes one line per check, and below each one not ok what
// to do.
func renderDoctor(w io.Writer, checks []check) error {
	var b strings.Builder
	for _, c := range checks {
		fmt.Fprintf(&b, "%-4s  %-11s  %s\n", c.Status, c.Name, c.Message)
		if c.Fix != "" && c.Status != checkOK {
			fmt.Fprintf(&b, "%-4s  %-11s  fix: %s\n", "", "", c.Fix)
		}
	}
	n := map[string]int{}
	for _, c := range checks {
		n[c.Status]++
	}
	fmt.Fprintf(&b, "\n%d ok, %d warn, %d fail, %d skipped\n", n[checkOK], n[checkWarn], n[checkFail], n[checkSkip])
	_, err := io.WriteString(w, b.String())
	return err
}

func failed(checks []check) bool {
	for _, c := range checks {
		if c.Status == checkFail {
			return true
		}
	}
	return false
}
