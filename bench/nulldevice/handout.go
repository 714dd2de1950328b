package nulldevice

// The floor control's hand-over (bench/churn/floor): a device whose
// host directory is a symbolic link is given the link's target, one
// target per tenant. The churn's floor driver makes a ZFS dataset for
// each device's next tenant and points the link at it; a Reserve that
// arrives before the link has moved on from the directory its last
// tenant was given waits for it, as a plugin's Reserve waits for a
// dataset prepared for it. A plain directory is given as it is, at once:
// the null control.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Bounds of a Reserve's wait for a device's link to move on.
const (
	handOutPoll = 2 * time.Millisecond
	handOutWait = 30 * time.Second
)

// ErrNotMovedOn is wrapped by the error of a Reserve whose device's link
// still named its last tenant's directory when the wait ended.
var ErrNotMovedOn = errors.New("the device's link still names its last tenant's directory")

// handOut returns the directory a Reserve of device id binds: path
// itself when it is not a symbolic link; else its target, once that is
// another than the one the device's last Reserve was given (waiting up to
// handOutWait, or until ctx ends).
func (p *Plugin) handOut(ctx context.Context, id, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, handOutWait)
	defer cancel()
	for {
		target, err := os.Readlink(path)
		if errors.Is(err, syscall.EINVAL) { // not a link: the null control
			return path, nil
		}
		if err != nil {
			return "", fmt.Errorf("%s: device %s: %w", PluginName, id, err)
		}
		p.handMu.Lock()
		fresh := p.handed[id] != target
		if fresh {
			p.handed[id] = target
		}
		p.handMu.Unlock()
		if fresh {
			return target, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s: device %s: %s = %s: %w (%w)", PluginName, id, path, target, ErrNotMovedOn, ctx.Err())
		case <-time.After(handOutPoll):
		}
	}
}
