package device

// Reserve: what a task that asked for datasets gets when it starts.

import (
	"context"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Reserve is called by Nomad when a task that asked for devices of one group
// starts, with the instance IDs the scheduler picked. It hands the slots
// over (no zfs command for a fresh armed slot, its owner recorded behind
// the call; one zfs set for a free slot that is not armed) and returns one bind mount per ID plus
// environment variables. A slot whose tenant has ended is handed over as
// its spare (the old dataset archived behind it), or, with no spare,
// released first: Reserve waits for
// the fresh dataset up to reserve_timeout, then fails (Nomad's restart
// policy retries). The work is bounded by reserve_timeout alone, as it
// was before the call had a context: a Reserve is not cut short half-way
// because the agent stopped waiting.
func (p *Plugin) Reserve(_ context.Context, req *devicepb.ReserveRequest) (*devicepb.ReserveResponse, error) {
	s, err := p.current()
	if err != nil {
		return nil, err
	}
	ids := req.GetDeviceIds()
	ctx, cancel := context.WithTimeout(context.Background(), s.ReserveTimeout)
	defer cancel()
	if len(ids) > 0 {
		if c, ok := p.shared.Class(ids[0]); ok {
			st, err := p.shared.Reserve(ctx, ids)
			if err != nil {
				return nil, err
			}
			hs := make([]held, len(ids))
			for i := range hs {
				hs[i] = held{dataset: c.Dataset, mountpoint: st.Mountpoint}
			}
			return reservation(c.Name, c.MountPath, c.ReadOnly, hs), nil
		}
	}
	reserved, err := p.slots.Reserve(ctx, ids)
	if err != nil {
		return nil, err
	}
	var class slots.Class
	for _, c := range s.Slots.Classes {
		if c.Name == reserved[0].Class {
			class = c
		}
	}
	hs := make([]held, len(reserved))
	for i, sl := range reserved {
		hs[i] = held{dataset: sl.Dataset, mountpoint: sl.Mountpoint, restoredAt: sl.RestoredAt}
	}
	return reservation(class.Name, class.MountPath, class.ReadOnly, hs), nil
}

// held is one dataset Reserve hands a task: its name, where it is mounted
// on the host, and when its data was left when this Reserve restored it
// (zero otherwise).
type held struct {
	dataset, mountpoint string
	restoredAt          time.Time
}

// reservation builds the mounts and environment for the datasets reserved
// for one request of a class, in the order given: the order of the
// slots' indexes for per-slot classes (slots.Manager.Reserve).
func reservation(class, mountPath string, readOnly bool, ds []held) *devicepb.ReserveResponse {
	name := EnvName(class)
	res := &devicepb.ContainerReservation{Envs: map[string]string{}}
	for i, d := range ds {
		taskPath := mountPath
		if len(ds) > 1 {
			taskPath = path.Join(mountPath, strconv.Itoa(i))
		}
		res.Mounts = append(res.Mounts, &devicepb.Mount{TaskPath: taskPath, HostPath: d.mountpoint, ReadOnly: readOnly})
		set := func(prefix string) {
			res.Envs[prefix+"DATASET"] = d.dataset
			res.Envs[prefix+"PATH"] = taskPath
			res.Envs[prefix+"HOST_PATH"] = d.mountpoint
			if !d.restoredAt.IsZero() {
				res.Envs[prefix+"RESTORED_AT"] = d.restoredAt.UTC().Format(time.RFC3339)
			}
		}
		if i == 0 {
			set("ZFS_" + name + "_")
		}
		if len(ds) > 1 {
			set("ZFS_" + name + "_" + strconv.Itoa(i) + "_")
		}
	}
	return &devicepb.ReserveResponse{ContainerRes: res}
}

// EnvName turns a class name into the NAME of its environment variables:
// upper case, '-' becomes '_'.
func EnvName(class string) string {
	return strings.ReplaceAll(strings.ToUpper(class), "-", "_")
}

// orOff is a class's restore as the "restore" attribute shows it.
func orOff(restore string) string {
	if restore == "" {
		return slots.RestoreOff
	}
	return restore
}
