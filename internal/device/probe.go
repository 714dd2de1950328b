package device

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// probePrefix starts the name of every probe dataset, directly under the
// parent. Class names cannot start with '.', so a probe never takes a class's
// place; the slot manager leaves ".probe-*" datasets alone.
const probePrefix = ".probe-"

// ownPropPrefix is the module of the plugin's own user properties, which a
// probe does not carry: a probe must never look like a managed dataset.
const ownPropPrefix = "nomad-device-zfs:"

// prober is what probing needs from ZFS; *zfs.Client provides it.
type prober interface {
	Create(ctx context.Context, name string, props map[string]string) error
	Destroy(ctx context.Context, name string) error
}

// probeProperties lets ZFS itself judge, before anything is created for a
// configuration, the properties that each class's slots will be created
// with. For each distinct property set it creates one dataset
// <parent>/.probe-<8 hex digits> with the class's SlotProps (without the
// plugin's own user properties) and canmount=off, so that nothing is
// mounted, then destroys it (plain destroy: never -f, never -r).
//
// On return with nil, ZFS accepted every class's properties and no probe is
// left. When ZFS refuses a set, each property is probed alone and the error
// names the class, the property, its value and what ZFS printed. A failure
// that is not about the properties (ZFS unavailable, the parent busy or
// gone) says so instead. A probe that cannot be destroyed is logged at error
// level with its name, and the error says so too.
func probeProperties(ctx context.Context, z prober, log hclog.Logger, parent string, classes []slots.Class) error {
	judged := make(map[string]bool, len(classes))
	for _, c := range classes {
		props := probeProps(c)
		key := propsKey(props)
		if judged[key] {
			continue
		}
		if err := probeClass(ctx, z, log, parent, c.Name, props); err != nil {
			return err
		}
		judged[key] = true
		log.Debug("zfs accepts the class properties", "class", c.Name)
	}
	return nil
}

// probeProps returns the properties a probe for class c is created with.
func probeProps(c slots.Class) map[string]string {
	props := c.SlotProps()
	for k := range props {
		if strings.HasPrefix(k, ownPropPrefix) {
			delete(props, k)
		}
	}
	props["canmount"] = "off"
	return props
}

// propsKey identifies a property set; validated values hold no NUL.
func propsKey(props map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		b.WriteString(k + "=" + props[k] + "\x00")
	}
	return b.String()
}

// probeClass probes one class's property set and, when ZFS refuses it,
// finds the property to blame.
func probeClass(ctx context.Context, z prober, log hclog.Logger, parent, class string, props map[string]string) error {
	refused, err := probeOnce(ctx, z, log, parent, props)
	if err != nil {
		return fmt.Errorf("class %q: properties cannot be checked: %w", class, err)
	}
	if refused == nil {
		return nil
	}
	// Something was refused. Make sure a dataset can be created at all
	// here, so that a property is never blamed for the pool's state.
	bare, err := probeOnce(ctx, z, log, parent, map[string]string{"canmount": "off"})
	if err != nil {
		return fmt.Errorf("class %q: properties cannot be checked: %w", class, err)
	}
	if bare != nil {
		return fmt.Errorf("class %q: properties cannot be checked: ZFS refuses to create even a plain dataset under %s: %w", class, parent, bare)
	}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		if k == "canmount" {
			continue
		}
		one, err := probeOnce(ctx, z, log, parent, map[string]string{"canmount": "off", k: props[k]})
		if err != nil {
			return fmt.Errorf("class %q: properties cannot be checked: %w", class, err)
		}
		if one != nil {
			return &refusedError{class: class, prop: k, value: props[k], err: one}
		}
	}
	delete(props, "canmount")
	return &refusedError{class: class, together: props, err: refused}
}

// probeOnce creates one probe dataset with props and destroys it. On return
// no probe it created is left, unless err says so. refused is ZFS's answer
// when it would not create the dataset for a reason that may be the
// properties; err is any other failure.
func probeOnce(ctx context.Context, z prober, log hclog.Logger, parent string, props map[string]string) (refused *zfs.Error, err error) {
	name, err := probeName(parent)
	if err != nil {
		return nil, err
	}
	cerr := z.Create(ctx, name, props)
	if cerr == nil {
		if derr := z.Destroy(ctx, name); derr != nil {
			return nil, leftBehind(log, name, derr)
		}
		return nil, nil
	}
	var zerr *zfs.Error
	switch {
	case !errors.As(cerr, &zerr) || zerr.Err != nil,
		errors.Is(cerr, zfs.ErrUnavailable), errors.Is(cerr, zfs.ErrBusy), errors.Is(cerr, zfs.ErrNotExist):
		return nil, fmt.Errorf("creating probe dataset %s: %w", name, cerr)
	case errors.Is(cerr, zfs.ErrExist):
		// Not ours: never touch it.
		return nil, fmt.Errorf("creating probe dataset %s: %w", name, cerr)
	}
	// A refused create leaves nothing on the ZFS versions we know; make
	// sure, since the promise is that a rejected configuration changes
	// nothing on the host.
	switch derr := z.Destroy(ctx, name); {
	case derr == nil:
		log.Warn("zfs create failed but left the probe dataset; destroyed it", "dataset", name, "error", cerr)
	case !errors.Is(derr, zfs.ErrNotExist):
		return nil, leftBehind(log, name, derr)
	}
	return zerr, nil
}

// probeName returns a fresh probe dataset name under parent:
// <parent>/.probe-<8 hex digits>.
func probeName(parent string) (string, error) {
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return "", fmt.Errorf("naming a probe dataset: %w", err)
	}
	return parent + "/" + probePrefix + hex.EncodeToString(suffix[:]), nil
}

// leftBehind logs and describes a probe that may still exist.
func leftBehind(log hclog.Logger, name string, err error) error {
	log.Error("probe dataset could not be destroyed; destroy it by hand", "dataset", name, "error", err)
	return fmt.Errorf("probe dataset %s could not be destroyed; destroy it by hand (zfs destroy %s): %w", name, name, err)
}

// refusedError is ZFS's refusal of a class's properties: of one property
// (prop), or of several that it accepts one by one (together).
type refusedError struct {
	class, prop, value string
	together           map[string]string
	err                *zfs.Error
}

func (e *refusedError) Error() string {
	msg := e.err.Stderr
	if msg == "" {
		msg = e.err.Error()
	}
	if e.prop != "" {
		return fmt.Sprintf("class %q: properties: %s = %q: ZFS refused it: %s", e.class, e.prop, e.value, msg)
	}
	var list []string
	for _, k := range slices.Sorted(maps.Keys(e.together)) {
		list = append(list, fmt.Sprintf("%s = %q", k, e.together[k]))
	}
	return fmt.Sprintf("class %q: properties: ZFS accepts each of %s alone but refused them together: %s",
		e.class, strings.Join(list, ", "), msg)
}

func (e *refusedError) Unwrap() error { return e.err }
