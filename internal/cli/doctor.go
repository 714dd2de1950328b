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
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/version"
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

// phase gives a group of checks (ZFS, then Nomad) its own -timeout, so a
// slow ZFS does not make Nomad look down, nor the reverse.
func (d *doctor) phase(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.c.deadline <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d.c.deadline)
}

// run performs every check and returns them.
func (d *doctor) run(ctx context.Context) []check {
	d.checkConfig()
	d.checkPluginDir(ctx)
	zctx, cancel := d.phase(ctx)
	defer cancel()
	zfsOK := d.checkZFS(zctx)
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
		obs, err := view.Observe(zctx, d.z, d.c.settings.Slots)
		if err != nil {
			for _, n := range []string{"pool", "parent", "slots"} {
				d.add(n, checkFail, err.Error(), "ZFS did not answer in time: check zpool status, or give a longer -timeout")
			}
		} else {
			d.checks = append(d.checks, treeChecks(d.c.settings.Slots, obs)...)
		}
	}
	if d.loadErr != nil {
		for _, n := range []string{"nomad-api", "node", "token", "allocations"} {
			d.skip(n, "needs the plugin's configuration")
		}
		return d.checks
	}
	nctx, cancel2 := d.phase(ctx)
	defer cancel2()
	d.checkNomad(nctx)
	return d.checks
}

func (d *doctor) checkConfig() {
	const name = "config"
	c := d.c
	if c.agent == nil {
		switch {
		case errors.Is(d.loadErr, errClassesFromZFS):
			d.add(name, checkFail, d.loadErr.Error(), "see the zfs line; or give -config=<agent configuration> instead of -parent")
		case errors.Is(d.loadErr, errFlag), errors.Is(d.loadErr, errParentFlag):
			d.add(name, checkFail, d.loadErr.Error(), "correct the flag")
		case d.loadErr != nil:
			d.add(name, checkFail, d.loadErr.Error(), "point -config at the agent's configuration file or directory (as given to nomad agent -config)")
		default:
			d.add(name, checkWarn, fmt.Sprintf("no -config: checking the classes found under %s", c.settings.Slots.Parent),
				"give -config=<agent configuration> to check the plugin block and plugin_dir too")
		}
		return
	}
	blocks := c.agent.Blocks(config.PluginName)
	files := strings.Join(c.agent.Files, ", ")
	switch {
	case len(blocks) == 0:
		d.add(name, checkFail, fmt.Sprintf("no plugin %q block in %s", config.PluginName, files),
			fmt.Sprintf("add a plugin %q { config { … } } block to the client's agent configuration (see examples/agent.hcl) and restart the agent", config.PluginName))
		return
	case len(blocks) > 1:
		var where []string
		for _, b := range blocks {
			where = append(where, b.File)
		}
		d.add(name, checkFail, fmt.Sprintf("%d plugin %q blocks (in %s): Nomad keeps only the last one's config", len(blocks), config.PluginName, strings.Join(where, ", ")),
			"keep exactly one plugin block for nomad-device-zfs")
		return
	case errors.Is(d.loadErr, errFlag), errors.Is(d.loadErr, errParentFlag):
		d.add(name, checkFail, d.loadErr.Error(), "correct the flag, or leave it out to use the configuration's value")
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
	bin := filepath.Join(dir, config.PluginName)
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
	if got != version.String() {
		d.add(name, checkWarn, fmt.Sprintf("%s is %q; this command is %q", bin, got, version.String()),
			"install the same build on the agent, or run the doctor of the installed binary")
		return
	}
	d.add(name, checkOK, fmt.Sprintf("%s is %s", bin, got), "")
}

// withoutPluginCookie keeps a child from thinking Nomad launched it.
func withoutPluginCookie(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, nomadplugin.MagicCookieKey+"=") {
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

// treeChecks judges the pool, the parent dataset and the slots from one
// read-only observation. It is a pure function of the configuration and
// what ZFS said.
func treeChecks(cfg slots.Config, obs view.Observation) []check {
	var out []check
	add := func(name, status, msg, fix string) {
		out = append(out, check{Name: name, Status: status, Message: oneLine(msg), Fix: fix})
	}
	// pool
	switch {
	case obs.PoolErr != nil:
		add("pool", checkFail, obs.PoolErr.Error(), fmt.Sprintf("import the pool (zpool import %s)", obs.Pool))
	case obs.PoolHealth != "ONLINE":
		add("pool", checkFail, fmt.Sprintf("pool %s is %s", obs.Pool, obs.PoolHealth),
			fmt.Sprintf("repair the pool (zpool status -x %s); no slot is offered meanwhile", obs.Pool))
	case !obs.AvailableKnown:
		add("pool", checkWarn, fmt.Sprintf("pool %s is ONLINE; the space available to %s is not known", obs.Pool, cfg.Parent), "check zfs get available "+cfg.Parent)
	default:
		out = append(out, roomCheck(cfg, obs))
	}
	// parent
	switch {
	case obs.PoolErr != nil:
		add("parent", checkSkip, "needs the pool", "")
	case errors.Is(obs.ParentErr, zfs.ErrNotExist):
		add("parent", checkFail, fmt.Sprintf("parent dataset %s does not exist", cfg.Parent), fmt.Sprintf("zfs create %s (the plugin never creates it)", cfg.Parent))
	case obs.ParentErr != nil:
		add("parent", checkFail, fmt.Sprintf("parent dataset %s cannot be read: %v", cfg.Parent, obs.ParentErr), "check zfs get all "+cfg.Parent)
	case len(obs.Foreign) > 0 || len(obs.Unreadable) > 0:
		var parts []string
		if len(obs.Foreign) > 0 {
			parts = append(parts, fmt.Sprintf("%d datasets not the plugin's (left alone): %s", len(obs.Foreign), strings.Join(obs.Foreign, ", ")))
		}
		if len(obs.Unreadable) > 0 {
			parts = append(parts, fmt.Sprintf("%d datasets whose properties do not parse: %s", len(obs.Unreadable), strings.Join(obs.Unreadable, ", ")))
		}
		add("parent", checkWarn, fmt.Sprintf("%s exists; %s", cfg.Parent, strings.Join(parts, "; ")),
			"move datasets you made yourself out of the plugin's parent; the plugin never touches them, and a foreign dataset where a slot belongs keeps that slot out of service")
	default:
		add("parent", checkOK, fmt.Sprintf("%s exists; everything under it is the plugin's", cfg.Parent), "")
	}
	// slots
	if obs.ParentErr != nil {
		add("slots", checkSkip, "needs the parent dataset", "")
		return out
	}
	n := map[string]int{}
	var missing int
	var bad []string
	for _, s := range obs.Slots {
		state, reason := stateOf(s)
		switch {
		case !s.Present():
			missing++
		case state == stateUnhealthy, state == stateInUse && !s.Healthy:
			bad = append(bad, s.ID+": "+reason)
		}
		if s.Present() {
			n[state]++
		}
	}
	summary := fmt.Sprintf("%s: %d free, %d in use, %d releasing", plural(len(obs.Slots), "slot"), n[stateFree], n[stateInUse], n[stateReleasing])
	switch {
	case len(bad) > 0:
		add("slots", checkWarn, fmt.Sprintf("%s; %d unhealthy: %s", summary, len(bad), strings.Join(bad, "; ")),
			"see `nomad-device-zfs status` and docs/troubleshooting.md for each reason")
	case missing > 0:
		add("slots", checkWarn, fmt.Sprintf("%s; %d not created yet", summary, missing),
			"the plugin creates missing slots at its next fingerprint: is the agent running with this configuration?")
	default:
		add("slots", checkOK, summary, "")
	}
	if c, ok := sourceCheck(cfg, obs); ok {
		out = append(out, c)
	}
	return out
}

// roomCheck compares the pool's space with the classes' quotas. What the
// slots may still write is the parent's available space plus what they
// already use; promised is every slot's quota. A free slot whose class
// quota exceeds what is available is not offered by the plugin: that
// fails. Promising more than the pool holds is a warning (deliberate
// over-commitment is common).
func roomCheck(cfg slots.Config, obs view.Observation) check {
	quota := map[string]uint64{}
	var promised uint64
	for _, cl := range cfg.Classes {
		quota[cl.Name] = cl.Quota
		promised += uint64(cl.Slots) * cl.Quota
	}
	var used uint64
	var starved []string
	for _, s := range obs.Slots {
		used += s.Usage.Used
		if s.Present() && s.State == record.StateFree && obs.Available < quota[s.Class] {
			starved = append(starved, s.ID)
		}
	}
	room := obs.Available + used
	msg := fmt.Sprintf("pool %s is ONLINE; the slots may write %s (%s available, %s used), their quotas add up to %s",
		obs.Pool, bytesIEC(room), bytesIEC(obs.Available), bytesIEC(used), bytesIEC(promised))
	c := check{Name: "pool", Status: checkOK, Message: msg}
	switch {
	case len(starved) > 0:
		c.Status = checkFail
		c.Message += fmt.Sprintf("; free slots %s are not offered: %s available is less than their quota", strings.Join(starved, ", "), bytesIEC(obs.Available))
		c.Fix = "free space in the pool (the archive under " + cfg.ArchiveDataset() + " may hold old tenants' data), or lower the quota"
	case room < promised:
		c.Status = checkWarn
		c.Message += ": over-committed, tenants together could fill the pool before reaching their quotas"
		c.Fix = "add space, or lower slots or quota, unless the over-commitment is deliberate"
	}
	return c
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
