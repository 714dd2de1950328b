// Package shared holds the shared classes: one dataset that the operator
// owns and fills, offered as several device instances so that that many
// tasks can hold it at once. The plugin only reads it: it never creates,
// writes, renames, mounts, unmounts or destroys it, and nothing is released
// when an allocation ends (Nomad unmounts its bind mount).
//
// A class is healthy when its dataset exists, is a mounted filesystem, and
// the mount at its mountpoint is that dataset (so that a task never gets
// whatever else happens to sit at the path). Anything else makes every
// instance of the class unhealthy with the reason, and Reserve refuses it;
// neither is ever an error that stops the plugin or another class.
package shared

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Class is one validated shared class of the operator's configuration.
type Class struct {
	Name string
	// Dataset is the operator's dataset, outside the plugin's parent.
	Dataset   string
	Slots     int
	MountPath string
	// ReadOnly: tasks get a read-only bind mount (the default; writes
	// need allow_shared_writes).
	ReadOnly bool
}

// State is what the last read found for one class's dataset.
type State struct {
	Class Class
	// Healthy: the dataset is a mounted filesystem and the mount at
	// Mountpoint is it. Why says what is wrong otherwise.
	Healthy bool
	Why     string
	// Mountpoint is the dataset's mountpoint (what Reserve bind-mounts).
	Mountpoint string
	GUID       string
	Usage      zfs.Usage
}

// IDs returns the device instance IDs of a class: "<class>-<index>", as
// for exclusive classes (class names are unique, so they never collide).
func IDs(c Class) []string {
	ids := make([]string, c.Slots)
	for i := range ids {
		ids[i] = c.Name + "-" + strconv.Itoa(i)
	}
	return ids
}

// Props are what one read asks of each shared dataset (and of the parent,
// for its mountpoint).
var Props = []string{"type", "mounted", "mountpoint", "used", "available", "referenced", "compressratio", "guid"}

// Reader is what the set needs from ZFS. *zfs.Client implements it.
type Reader interface {
	GetNames(ctx context.Context, names []string, props ...string) ([]zfs.Dataset, error)
}

// Set is the shared classes of one plugin and what was last read of them.
type Set struct {
	z Reader
	// mounts reads the host's mount table (hostfs.ReadTable; tests
	// replace it).
	mounts func() (hostfs.Table, error)

	// mu guards the fields below. No zfs command runs under it.
	mu      sync.Mutex
	parent  string
	private []privatePath    // paths no shared mount may hold (key_dir, backup_dir)
	classes []Class          // sorted by Name
	states  map[string]State // by class name
	readAt  time.Time

	// changed has room for one signal: a send never blocks.
	changed chan struct{}
}

// NewSet returns a set with no classes that reads ZFS through z.
func NewSet(z Reader) *Set {
	return &Set{z: z, mounts: hostfs.ReadTable, states: map[string]State{}, changed: make(chan struct{}, 1)}
}

// SetConfig replaces the classes. parent is the plugin's parent dataset,
// and private the host paths of the plugin's own (its key directory, the
// backup directory): a shared dataset whose mount would show either is
// never healthy, also when a symlink leads there: private is resolved
// here (RealPath), once per configuration, so that no Reserve waits on the
// host paths (a hung NFS backup_dir, say). The states of classes that
// remain are kept until the next Refresh.
func (s *Set) SetConfig(parent string, private []string, classes []Class) {
	cs := append([]Class(nil), classes...)
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	var priv []privatePath
	for _, p := range private {
		if p != "" {
			priv = append(priv, privatePath{path: p, real: hostfs.RealPath(p)})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.parent, s.classes, s.private = parent, cs, priv
	states := make(map[string]State, len(cs))
	for _, c := range cs {
		st, ok := s.states[c.Name]
		if !ok || st.Class.Dataset != c.Dataset {
			st = State{Why: "not read yet"}
		}
		st.Class = c
		states[c.Name] = st
	}
	s.states = states
}

// Class returns the class that offers device id, if any.
func (s *Set) Class(id string) (Class, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.classes {
		if i, ok := strings.CutPrefix(id, c.Name+"-"); ok {
			n, err := strconv.Atoi(i)
			if err == nil && n >= 0 && n < c.Slots && strconv.Itoa(n) == i {
				return c, true
			}
		}
	}
	return Class{}, false
}

// States returns what the last Refresh found, sorted by class name.
func (s *Set) States() []State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]State, 0, len(s.classes))
	for _, c := range s.classes {
		out = append(out, s.states[c.Name])
	}
	return out
}

// Refresh reads every shared dataset in one `zfs get` (with the parent,
// for its mountpoint) and the mount table once, and records each class's
// state. When the batched read fails (a dataset does not exist, or cannot
// be read) each is read alone (a fault path: at most one command per
// shared class), so that one class's fault is its own. On return every
// class's state is from this read, unhealthy with the reason when it
// could not be read; Changed has a signal when any class's health changed.
func (s *Set) Refresh(ctx context.Context) {
	s.mu.Lock()
	parent, private, classes := s.parent, s.private, append([]Class(nil), s.classes...)
	s.mu.Unlock()
	if len(classes) == 0 {
		return
	}
	states := s.read(ctx, parent, private, classes)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range states {
		s.recordLocked(st)
	}
	s.readAt = time.Now()
}

// recordLocked records st as its class's state, when the class is still
// configured with the same dataset, and signals Changed when its health
// changed. s.mu is held.
func (s *Set) recordLocked(st State) {
	old, ok := s.states[st.Class.Name]
	if !ok || old.Class.Dataset != st.Class.Dataset {
		return
	}
	s.states[st.Class.Name] = st
	if old.Healthy != st.Healthy || old.Why != st.Why {
		loop.Kick(s.changed) // a signal already waiting is enough
	}
}

// Run refreshes the shared classes every period until ctx is done, apart
// from the fingerprint and stats loops: a slow read of the operator's
// datasets never delays the plugin's own classes. The first read is the
// fingerprint's, so Run's first comes a period after it starts; each read
// is bounded by timeout.
func (s *Set) Run(ctx context.Context, period time.Duration, timeout time.Duration) {
	cfg := loop.Config{Name: "shared classes", First: loop.After(period), Timeout: timeout}
	loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		s.Refresh(ctx)
		return loop.After(period)
	})
}

// Check reads one class's dataset now and returns its state: what Reserve
// relies on, so that a dataset unmounted since the last Refresh is never
// handed out. It records the state too.
func (s *Set) Check(ctx context.Context, c Class) State {
	s.mu.Lock()
	parent, private := s.parent, s.private
	s.mu.Unlock()
	st := s.read(ctx, parent, private, []Class{c})[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordLocked(st)
	return st
}

// read returns one state per class, in order.
func (s *Set) read(ctx context.Context, parent string, private []privatePath, classes []Class) []State {
	names := []string{parent}
	for _, c := range classes {
		names = append(names, c.Dataset)
	}
	byName := map[string]zfs.Dataset{}
	readErr := map[string]error{}
	ds, err := s.z.GetNames(ctx, names, Props...)
	if err != nil {
		// One of them is missing or cannot be read: read each alone,
		// so that one class's fault is its own.
		ds = nil
		for _, n := range names {
			one, err := s.z.GetNames(ctx, []string{n}, Props...)
			if err != nil {
				readErr[n] = err
				continue
			}
			for _, d := range one {
				byName[d.Name] = d
			}
		}
	}
	for _, d := range ds {
		byName[d.Name] = d
	}
	table, tableErr := s.mounts()
	var parentMP string
	if d, ok := byName[parent]; ok && d.Err == nil {
		parentMP, _ = d.Value("mountpoint")
	}
	out := make([]State, len(classes))
	for i, c := range classes {
		out[i] = judge(c, byName[c.Dataset], readErr[c.Dataset], parentMP, private, table, tableErr)
	}
	return out
}

// judge decides one class's state from what was read. It is pure.
func judge(c Class, d zfs.Dataset, readErr error, parentMP string, private []privatePath, table hostfs.Table, tableErr error) State {
	st := State{Class: c}
	bad := func(format string, args ...any) State {
		st.Healthy, st.Why = false, "shared dataset "+c.Dataset+": "+fmt.Sprintf(format, args...)
		return st
	}
	switch {
	case errors.Is(readErr, zfs.ErrNotExist):
		return bad("does not exist (the operator creates and fills it; the plugin never does)")
	case readErr != nil:
		return bad("cannot be read: %v", readErr)
	case d.Name == "":
		return bad("zfs get printed nothing for it")
	case d.Err != nil:
		return bad("its properties do not parse: %v", d.Err)
	}
	if t, _ := d.Value("type"); t != "filesystem" {
		return bad("is a %s, not a filesystem", orDash(t))
	}
	mp, _ := d.Value("mountpoint")
	st.Mountpoint = mp
	st.GUID, _ = d.Value("guid")
	st.Usage = d.Usage()
	if m, _ := d.Value("mounted"); m != "yes" {
		return bad("is not mounted (mounted=%s, mountpoint=%s)", orDash(m), orDash(mp))
	}
	if !path.IsAbs(mp) || path.Clean(mp) != mp || mp == "/" {
		return bad("mountpoint %q is not a path a task can be given", mp)
	}
	if parentMP != "" && path.IsAbs(parentMP) && within(parentMP, mp) {
		return bad("its mountpoint %s holds the plugin's parent dataset (mounted at %s): every tenant's data would be visible", mp, parentMP)
	}
	for _, p := range private {
		if within(p.path, mp) || within(p.real, mp) {
			name := p.path
			if p.real != p.path {
				name += " (" + p.real + ")"
			}
			return bad("its mountpoint %s holds %s, the plugin's own: every task holding it would see it", mp, name)
		}
	}
	if tableErr != nil {
		return bad("the mount table cannot be read: %v", tableErr)
	}
	m, ok := table.At(mp)
	if !ok {
		return bad("nothing is mounted at its mountpoint %s", mp)
	}
	if m.Source != c.Dataset || m.Root != "/" || !zfsMount(m) {
		return bad("the mount at %s is %s (%s, root %s), not this dataset", mp, m.Source, m.FSType, m.Root)
	}
	// A bind mount carries what is mounted below: only the dataset's own
	// children may be there.
	for _, o := range table {
		if o.MountPoint != mp && within(o.MountPoint, mp) && !within(o.Source, c.Dataset) {
			return bad("%s (%s) is mounted inside it at %s: every task holding it would see it", o.Source, o.FSType, o.MountPoint)
		}
	}
	if !c.ReadOnly && (!m.HasOption("nosuid") || !m.HasOption("nodev")) {
		return bad("writes are allowed and its mount at %s lacks nosuid or nodev (options %s): a task could leave a setuid program or a device node for the others; set setuid=off and devices=off on it (zfs-fuse: mount it with -o nosuid,nodev)",
			mp, strings.Join(m.Options, ","))
	}
	st.Healthy, st.Why = true, ""
	return st
}

// privatePath is one of the plugin's own host paths (key_dir,
// backup_dir), as configured and with its symlinks resolved (RealPath).
type privatePath struct{ path, real string }

// within reports whether path p is dir or below it (both clean).
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// zfsMount reports whether a mount is a ZFS filesystem: the kernel
// module's, or zfs-fuse's (FUSE, run by root).
func zfsMount(m hostfs.Mount) bool {
	if m.FSType == "zfs" {
		return true
	}
	return strings.HasPrefix(m.FSType, "fuse") && slices.Contains(m.SuperOptions, "user_id=0")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ErrUnhealthy is returned by Reserve when the class's dataset cannot be
// handed out; the error says why.
var ErrUnhealthy = errors.New("shared dataset not usable")

// Reserve checks ids (all of class c) and the dataset now, and returns the
// dataset's state. It changes nothing. On a nil error the dataset was a
// mounted filesystem at st.Mountpoint when it returned.
func (s *Set) Reserve(ctx context.Context, ids []string) (State, error) {
	if len(ids) == 0 {
		return State{}, errors.New("no device IDs to reserve")
	}
	c, ok := s.Class(ids[0])
	if !ok {
		return State{}, fmt.Errorf("unknown device ID %q", ids[0])
	}
	for _, id := range ids[1:] {
		if o, ok := s.Class(id); !ok || o.Name != c.Name {
			return State{}, fmt.Errorf("device IDs %q and %q are not of one shared class: reserve one class at a time", ids[0], id)
		}
	}
	st := s.Check(ctx, c)
	if !st.Healthy {
		return st, fmt.Errorf("class %q: %w: %s", c.Name, ErrUnhealthy, st.Why)
	}
	return st, nil
}

// Changed returns a channel that receives when a read found a class's
// health changed (the fingerprint loop sends it then).
func (s *Set) Changed() <-chan struct{} { return s.changed }

// EverRead reports whether a Refresh has ended.
func (s *Set) EverRead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.readAt.IsZero()
}
