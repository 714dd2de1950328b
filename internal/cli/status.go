package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Slot states as `status` shows them.
const (
	stateFree      = "free"
	stateInUse     = "in use"
	stateReleasing = "releasing"
	stateUnhealthy = "unhealthy"
)

// statusNomadTimeout bounds status's read of the node's allocations:
// status answers from ZFS alone when Nomad is slow or down.
const statusNomadTimeout = 5 * time.Second

// statusReport is what `status` shows; -json prints it as is.
type statusReport struct {
	Parent  string         `json:"parent"`
	Pool    poolStatus     `json:"pool"`
	Nomad   nomadStatus    `json:"nomad"`
	Classes []classSummary `json:"classes"`
	Slots   []slotRow      `json:"slots"`
	// Shared are the shared classes (read only: never changed).
	Shared []sharedSummary `json:"shared,omitempty"`
	// Foreign datasets under the parent: reported, never touched.
	Foreign    []string `json:"foreign,omitempty"`
	Unreadable []string `json:"unreadable,omitempty"`
	Archive    archive  `json:"archive"`
	// Backups is backup_dir, per identity of the classes that back up;
	// nil without a backup_dir (or without -config).
	Backups *backupsStatus `json:"backups,omitempty"`
}

type poolStatus struct {
	Name   string `json:"name"`
	Health string `json:"health,omitempty"`
	Error  string `json:"error,omitempty"`
	// AvailableBytes is what the parent's datasets may still write; nil
	// when it could not be read.
	AvailableBytes *uint64 `json:"available_bytes,omitempty"`
}

type nomadStatus struct {
	Address string `json:"address"`
	// Read: the node's allocations were read, so the ALLOC column shows
	// each holder's status from Nomad; otherwise Error says why and every
	// state and holder is what ZFS records.
	Read   bool   `json:"read"`
	NodeID string `json:"node_id,omitempty"`
	Error  string `json:"error,omitempty"`
	// Incomplete says why the token may not see every allocation of the
	// node ("" when it does): Nomad leaves out those of namespaces the
	// token cannot read, so a holder missing from the read proves nothing.
	Incomplete string `json:"incomplete,omitempty"`
}

type classSummary struct {
	Name       string `json:"name"`
	Slots      int    `json:"slots"`
	QuotaBytes uint64 `json:"quota_bytes"`
	Free       int    `json:"free"`
	InUse      int    `json:"in_use"`
	Releasing  int    `json:"releasing"`
	Unhealthy  int    `json:"unhealthy"`
	// Source is the snapshot fresh slots are cloned from ("" for none);
	// Older are the slots still on another one.
	Source string        `json:"source,omitempty"`
	Older  []olderSource `json:"older_sources,omitempty"`
}

// sharedSummary is one shared class: the operator's dataset, whether it
// can be handed out, and how many allocations hold it (nil when Nomad was
// not read).
type sharedSummary struct {
	Name       string `json:"name"`
	Dataset    string `json:"dataset"`
	Mountpoint string `json:"mountpoint,omitempty"`
	Slots      int    `json:"slots"`
	ReadOnly   bool   `json:"read_only"`
	Healthy    bool   `json:"healthy"`
	Reason     string `json:"reason,omitempty"`
	UsedBytes  uint64 `json:"used_bytes"`
	InUse      *int   `json:"in_use,omitempty"`
}

type slotRow struct {
	Class   string `json:"class"`
	Device  string `json:"device"`
	Dataset string `json:"dataset"`
	State   string `json:"state"`
	// Reason says why a slot is unhealthy or releasing, or what else is
	// worth knowing of a healthy one (a previous dataset still kept).
	Reason string  `json:"reason,omitempty"`
	Holder *holder `json:"holder,omitempty"`
	// AllocStatus is the holder's client status as Nomad reports it ("" when
	// Nomad was not read).
	AllocStatus string `json:"alloc_status,omitempty"`
	UsedBytes   uint64 `json:"used_bytes"`
	QuotaBytes  uint64 `json:"quota_bytes"`
	// Spare is the fresh dataset beside an in-use slot, "" when none.
	Spare string `json:"spare,omitempty"`
}

type holder struct {
	Namespace string `json:"namespace"`
	Job       string `json:"job"`
	Group     string `json:"group"`
	Task      string `json:"task"`
	AllocID   string `json:"alloc_id"`
	// Recorded: the holder is recorded on the dataset; otherwise it is
	// what Nomad's allocations say holds the device.
	Recorded bool `json:"recorded"`
}

type archive struct {
	Datasets  int    `json:"datasets"`
	UsedBytes uint64 `json:"used_bytes"`
}

// gatherStatus reads ZFS (changing nothing) and, when it answers within
// ctx, the node's allocations from Nomad.
func gatherStatus(ctx context.Context, z statusReader, c *common, log hclog.Logger) (statusReport, error) {
	cfg := c.settings.Slots
	obs, err := view.Observe(ctx, z, cfg)
	if err != nil {
		return statusReport{}, err
	}
	r := statusReport{Parent: cfg.Parent, Foreign: obs.Foreign, Unreadable: obs.Unreadable,
		Archive: archive{Datasets: obs.Archived, UsedBytes: obs.ArchivedBytes}}
	r.Pool = poolStatus{Name: obs.Pool, Health: obs.PoolHealth}
	if obs.PoolErr != nil {
		r.Pool.Error = obs.PoolErr.Error()
	}
	if obs.AvailableKnown {
		n := obs.Available
		r.Pool.AvailableBytes = &n
	}

	snap, nomadErr := readNomad(ctx, c, log, &r.Nomad)
	if nomadErr != nil {
		r.Nomad.Error = nomadErr.Error()
	}
	quota := map[string]uint64{}
	for _, cl := range cfg.Classes {
		quota[cl.Name] = cl.Quota
	}
	for _, s := range obs.Slots {
		row := slotRow{Class: s.Class, Device: s.ID, Dataset: s.Dataset, UsedBytes: s.Usage.Used,
			QuotaBytes: s.Usage.Quota, Spare: s.Spare}
		if row.QuotaBytes == 0 {
			row.QuotaBytes = quota[s.Class]
		}
		row.State, row.Reason = stateOf(s)
		if old := obs.Old[s.ID]; old != "" && row.Reason == "" {
			row.Reason = "previous dataset " + old + " on its way to the archive"
		}
		if s.Owner.Known() {
			o := s.Owner
			row.Holder = &holder{Namespace: o.Namespace, Job: o.Job, Group: o.Group, Task: o.Task, AllocID: o.AllocID, Recorded: true}
		}
		if snap != nil {
			annotate(&row, snap, r.Nomad.Incomplete != "")
		}
		r.Slots = append(r.Slots, row)
	}
	r.Classes = summarize(cfg, r.Slots)
	for i, cl := range cfg.Classes {
		r.Classes[i].Source, r.Classes[i].Older = cl.Source, olderSources(cl, obs.Slots)
	}
	r.Shared = sharedStatus(ctx, z, c, snap)
	if c.settings.BackupDir != "" {
		b := readBackupsStatus(c.settings.BackupDir, c.settings.BackupClasses)
		r.Backups = &b
	}
	return r, nil
}

// statusReader is what status reads ZFS with. *zfs.Client implements it.
type statusReader interface {
	view.Reader
	shared.Reader
}

// sharedStatus reads the shared classes' datasets (one zfs get) and counts
// the live allocations that hold each class's instances.
func sharedStatus(ctx context.Context, z shared.Reader, c *common, snap *allocwatch.Snapshot) []sharedSummary {
	if len(c.settings.Shared) == 0 {
		return nil
	}
	set := shared.NewSet(z)
	set.SetConfig(c.settings.Slots.Parent, []string{c.settings.Slots.KeyDir, c.settings.BackupDir}, c.settings.Shared)
	set.Refresh(ctx)
	var out []sharedSummary
	for _, st := range set.States() {
		cl := st.Class
		sum := sharedSummary{Name: cl.Name, Dataset: cl.Dataset, Mountpoint: st.Mountpoint, Slots: cl.Slots,
			ReadOnly: cl.ReadOnly, Healthy: st.Healthy, Reason: st.Why, UsedBytes: st.Usage.Used}
		if snap != nil {
			n := 0
			for _, id := range shared.IDs(cl) {
				for _, a := range snap.Allocs {
					if task, ok := a.Devices[id]; ok && !a.Ended(task) {
						n++
					}
				}
			}
			sum.InUse = &n
		}
		out = append(out, sum)
	}
	return out
}

// readNomad reads the node's allocations; the error says why not.
func readNomad(ctx context.Context, c *common, log hclog.Logger, ns *nomadStatus) (*allocwatch.Snapshot, error) {
	w, err := allocwatch.New(c.settings.Nomad, log)
	if err != nil {
		ns.Address = orDash(c.settings.Nomad.Address)
		return nil, err
	}
	ns.Address = w.Address()
	ctx, cancel := context.WithTimeout(ctx, statusNomadTimeout)
	defer cancel()
	snap, err := w.NodeAllocations(ctx)
	if err != nil {
		return nil, err
	}
	ns.Read = true
	ns.NodeID, _ = w.NodeID(ctx)
	if v := w.Visibility(ctx); !v.All {
		ns.Incomplete = v.Reason
	}
	return snap, nil
}

// stateOf maps a slot to the four states an operator reads, as the
// plugin's metrics count them: a slot held by an allocation is in use
// whatever its health (the reason says why it is unhealthy), one being
// released is releasing, and a slot that is neither is free when healthy.
func stateOf(s slots.Slot) (state, reason string) {
	switch {
	case s.Present() && (s.State == record.StateReleasing || s.State == record.StateDestroying):
		return stateReleasing, s.HealthDesc
	case s.Present() && s.State == record.StateReserved:
		return stateInUse, s.HealthDesc
	case !s.Healthy:
		return stateUnhealthy, s.HealthDesc
	}
	return stateFree, s.HealthDesc
}

// annotate adds what Nomad says: the recorded holder's client status, or,
// for a slot in use whose holder is not recorded yet, the live allocation
// whose devices include the slot. With an incomplete read (a token that
// cannot see every namespace) a holder missing from it is "not visible",
// never "not on this node".
func annotate(row *slotRow, snap *allocwatch.Snapshot, incomplete bool) {
	if row.Holder != nil {
		a, ok := snap.Allocs[row.Holder.AllocID]
		switch {
		case ok:
			row.AllocStatus = a.ClientStatus
		case incomplete:
			row.AllocStatus = "not visible to the token"
		default:
			row.AllocStatus = "not on this node"
		}
		return
	}
	if row.State == stateFree {
		return
	}
	var ids []string
	for id, a := range snap.Allocs {
		if task, ok := a.Devices[row.Device]; ok && !a.Ended(task) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	if len(ids) == 1 {
		a := snap.Allocs[ids[0]]
		row.Holder = &holder{Namespace: a.Namespace, Job: a.JobID, Group: a.TaskGroup, Task: a.Devices[row.Device], AllocID: a.ID}
		row.AllocStatus = a.ClientStatus
	}
}

func summarize(cfg slots.Config, rows []slotRow) []classSummary {
	var out []classSummary
	for _, cl := range cfg.Classes {
		cs := classSummary{Name: cl.Name, Slots: cl.Slots, QuotaBytes: cl.Quota}
		for _, r := range rows {
			if r.Class != cl.Name {
				continue
			}
			switch r.State {
			case stateFree:
				cs.Free++
			case stateInUse:
				cs.InUse++
			case stateReleasing:
				cs.Releasing++
			case stateUnhealthy:
				cs.Unhealthy++
			}
		}
		out = append(out, cs)
	}
	return out
}

// renderStatus writes the report as the operator reads it: one row per
// slot, the reasons below, then a line per class, the pool, the archive,
// backup_dir and Nomad; then, with a backup_dir, a row per identity backed
// up, its newest backup's age at now, and why a chain is broken.
func renderStatus(w io.Writer, r statusReport, now time.Time) error {
	rows := [][]string{{"CLASS", "DEVICE", "DATASET", "STATE", "HOLDER", "ALLOC", "USED", "QUOTA"}}
	var notes []string
	for _, s := range r.Slots {
		h, alloc := "-", "-"
		if s.Holder != nil {
			h = oneLine(fmt.Sprintf("%s/%s/%s/%s", s.Holder.Namespace, s.Holder.Job, s.Holder.Group, s.Holder.Task))
			alloc = shortID(s.Holder.AllocID)
			if s.AllocStatus != "" {
				alloc += " (" + s.AllocStatus + ")"
			}
			if !s.Holder.Recorded {
				alloc += " *"
			}
		}
		rows = append(rows, []string{s.Class, s.Device, s.Dataset, s.State, h, alloc, bytesIEC(s.UsedBytes), bytesIEC(s.QuotaBytes)})
		if s.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", s.Device, oneLine(s.Reason)))
		}
	}
	if err := table(w, rows); err != nil {
		return err
	}
	var b strings.Builder
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			b.WriteString(n + "\n")
		}
	}
	b.WriteString("\n")
	for _, c := range r.Classes {
		fmt.Fprintf(&b, "class %s: %s of %s: %d in use, %d free, %d releasing, %d unhealthy\n",
			c.Name, plural(c.Slots, "slot"), bytesIEC(c.QuotaBytes), c.InUse, c.Free, c.Releasing, c.Unhealthy)
		if c.Source != "" {
			fmt.Fprintf(&b, "class %s: source %s", c.Name, c.Source)
			if len(c.Older) > 0 {
				fmt.Fprintf(&b, "; still on an older source: %s", describeOlder(c.Older))
			}
			b.WriteString("\n")
		}
	}
	for _, sc := range r.Shared {
		access, state, held := "read-write", "healthy", ""
		if sc.ReadOnly {
			access = "read-only"
		}
		if !sc.Healthy {
			state = "unhealthy: " + oneLine(sc.Reason)
		}
		if sc.InUse != nil {
			held = fmt.Sprintf(", %d in use", *sc.InUse)
		}
		fmt.Fprintf(&b, "shared class %s: %s (%s, %s used), %s%s: %s\n",
			sc.Name, sc.Dataset, access, bytesIEC(sc.UsedBytes), plural(sc.Slots, "slot"), held, state)
	}
	switch {
	case r.Pool.Error != "":
		fmt.Fprintf(&b, "pool %s: %s\n", r.Pool.Name, r.Pool.Error)
	case r.Pool.AvailableBytes != nil:
		fmt.Fprintf(&b, "pool %s: %s, %s available to %s\n", r.Pool.Name, r.Pool.Health, bytesIEC(*r.Pool.AvailableBytes), r.Parent)
	default:
		fmt.Fprintf(&b, "pool %s: %s; %s cannot be read\n", r.Pool.Name, r.Pool.Health, r.Parent)
	}
	fmt.Fprintf(&b, "archive: %d datasets, %s\n", r.Archive.Datasets, bytesIEC(r.Archive.UsedBytes))
	if r.Backups != nil {
		b.WriteString(backupsLine(*r.Backups) + "\n")
	}
	if len(r.Foreign) > 0 {
		fmt.Fprintf(&b, "not the plugin's (left alone): %s\n", strings.Join(r.Foreign, ", "))
	}
	if len(r.Unreadable) > 0 {
		fmt.Fprintf(&b, "properties that do not parse (left alone): %s\n", strings.Join(r.Unreadable, ", "))
	}
	switch {
	case r.Nomad.Read && r.Nomad.Incomplete != "":
		fmt.Fprintf(&b, "nomad: node %s at %s: ALLOC is the holder's status in Nomad (* not recorded on the dataset yet); the token may not see every allocation: %s\n",
			shortID(r.Nomad.NodeID), r.Nomad.Address, oneLine(r.Nomad.Incomplete))
	case r.Nomad.Read:
		fmt.Fprintf(&b, "nomad: node %s at %s: ALLOC is the holder's status in Nomad (* not recorded on the dataset yet)\n", shortID(r.Nomad.NodeID), r.Nomad.Address)
	default:
		fmt.Fprintf(&b, "nomad: the node's allocations could not be read at %s (%s): states and holders are what ZFS records\n", r.Nomad.Address, oneLine(r.Nomad.Error))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if r.Backups == nil || len(r.Backups.Identities) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	if err := table(w, chainTable(r.Backups.Identities, now)); err != nil {
		return err
	}
	for _, c := range r.Backups.Identities {
		if !c.OK {
			if _, err := fmt.Fprintf(w, "BROKEN chain of %s: %s\n", oneLine(c.Identity.String()), oneLine(c.Error)); err != nil {
				return err
			}
		}
	}
	return nil
}

// runStatus is `nomad-device-zfs status`.
func runStatus(ctx context.Context, c *common, z *zfs.Client, stdout io.Writer, log hclog.Logger) error {
	r, err := gatherStatus(ctx, z, c, log)
	if err != nil {
		return err
	}
	if c.jsonOut {
		return writeJSON(stdout, r)
	}
	return renderStatus(stdout, r, time.Now())
}
