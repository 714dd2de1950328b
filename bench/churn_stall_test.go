package bench

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestStalledProcs_NamesTheAgentAndThePlugin(t *testing.T) {
	self := os.Getpid()
	lines := stalledProcs(self, -1)
	var mine []string
	for _, l := range lines {
		if strings.HasPrefix(l, fmt.Sprintf("pid %d ", self)) {
			mine = append(mine, l)
		}
	}
	must.SliceLen(t, 1, mine, must.Sprintf("lines: %q", lines))
	must.StrContains(t, mine[0], "wchan ")
	must.StrContains(t, mine[0], " threads ") // the Go runtime runs several
}

func TestStallPath(t *testing.T) {
	cases := []struct{ keep, batch, want string }{
		{"/tmp/zfsbench-churn-20261129T150405-agent.log", "", "/tmp/zfsbench-churn-20261129T150405-agent-stall.txt"},
		{"/tmp/zfsbench-churn-20261129T150405-agent.log", "churn-07-device", "/tmp/zfsbench-churn-20261129T150405-agent-churn-07-device-stall.txt"},
		{"/x/agent", "", "/x/agent-stall.txt"},
	}
	for _, c := range cases {
		must.Eq(t, c.want, stallPath(c.keep, c.batch))
	}
	must.StrHasSuffix(t, "-stall.txt", stallPath("", ""))
}
