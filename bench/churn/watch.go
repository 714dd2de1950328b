package churn

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
)

// nodeWatch polls the node API every period and keeps, per sample, the
// health of each device instance of one group as the Nomad server has it.
type nodeWatch struct {
	mu      sync.Mutex
	samples []nodeSample
	descs   map[string][]healthChange // transitions, per instance
	errs    int
}

type nodeSample struct {
	At      time.Time       // when the answer arrived
	Healthy map[string]bool // by instance ID
}

type healthChange struct {
	At      time.Time `json:"at"`
	Healthy bool      `json:"healthy"`
	Desc    string    `json:"desc,omitempty"`
}

// watchNode polls until ctx is done; the returned wait returns once the
// poller has stopped.
func watchNode(ctx context.Context, c *api.Client, nodeID, vendor, typ, name string, period time.Duration) (*nodeWatch, func()) {
	w := &nodeWatch{descs: map[string][]healthChange{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			node, _, err := c.Nodes().Info(nodeID, (&api.QueryOptions{}).WithContext(qctx))
			cancel()
			w.record(node, err, vendor, typ, name)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w, func() { <-done }
}

func (w *nodeWatch) record(node *api.Node, err error, vendor, typ, name string) {
	at := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil || node == nil || node.NodeResources == nil {
		w.errs++
		return
	}
	s := nodeSample{At: at, Healthy: map[string]bool{}}
	for _, g := range node.NodeResources.Devices {
		if g.Vendor != vendor || g.Type != typ || g.Name != name {
			continue
		}
		for _, in := range g.Instances {
			s.Healthy[in.ID] = in.Healthy
			ch := w.descs[in.ID]
			if len(ch) == 0 || ch[len(ch)-1].Healthy != in.Healthy || ch[len(ch)-1].Desc != in.HealthDescription {
				w.descs[in.ID] = append(ch, healthChange{At: at, Healthy: in.Healthy, Desc: in.HealthDescription})
			}
		}
	}
	w.samples = append(w.samples, s)
}

// snapshot returns the samples so far.
func (w *nodeWatch) snapshot() []nodeSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]nodeSample(nil), w.samples...)
}

// changes returns each instance's health transitions so far.
func (w *nodeWatch) changes() map[string][]healthChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]healthChange, len(w.descs))
	for k, v := range w.descs {
		out[k] = append([]healthChange(nil), v...)
	}
	return out
}

// healthyCount is how many instances the latest sample shows healthy, and
// how many there are.
func (w *nodeWatch) healthyCount() (healthy, total int, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return 0, 0, time.Time{}
	}
	s := w.samples[len(w.samples)-1]
	for _, h := range s.Healthy {
		total++
		if h {
			healthy++
		}
	}
	return healthy, total, s.At
}

// firstSample returns the first sample in [from, to) for which cond holds
// of the instance's health; ok is false when there is none.
func firstSample(samples []nodeSample, id string, from, to time.Time, cond func(healthy bool) bool) (time.Time, bool) {
	for _, s := range samples {
		if s.At.Before(from) || !s.At.Before(to) {
			continue
		}
		if h, ok := s.Healthy[id]; ok && cond(h) {
			return s.At, true
		}
	}
	return time.Time{}, false
}
