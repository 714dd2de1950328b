package reconcile

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestSlotOf(t *testing.T) {
	cfg := Config{Parent: "tank/nomad"}
	cases := []struct{ name, want string }{
		{"tank/nomad/scratch/3", "scratch-3"},
		{"tank/nomad/.archive/scratch-3.default.job.g.t.0a1b2c3d.20261123T120000Z", "scratch-3"},
		{"tank/nomad/.archive/scratch-3.h0011223344.0a1b2c3d.20261123T120000Z", "scratch-3"},
		{"tank/nomad/scratch", ""},
		{"tank/nomad/scratch/03", ""},
		{"tank/nomad/scratch/3/child", ""},
		{"tank/other/scratch/3", ""},
		{"tank/nomad", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, cfg.SlotOf(tc.name))
		})
	}
}
