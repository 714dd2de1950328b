package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// TestDependencies holds the product to its dependency rules: it links no
// package of Nomad's own module (not open source from v1.7.0 on; its api
// module, open source, is allowed), no test library, no package under
// internal/testkit/ and no other *test package, and go.mod does not
// require Nomad's module. The e2e tests' agent is built from e2e/nomad's
// own go.mod, apart.
func TestDependencies(t *testing.T) {
	const testkit = "github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit"
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Skip(t, "no go command on PATH to list the binary's packages")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	must.NoError(t, err)
	var pkgs int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := sc.Text()
		pkgs++
		switch {
		case strings.HasPrefix(p, "github.com/hashicorp/nomad/") && !strings.HasPrefix(p, "github.com/hashicorp/nomad/api"):
			t.Errorf("the plugin links %s: Nomad's own module is not to be used", p)
		case strings.HasPrefix(p, "github.com/shoenig/test"), strings.HasPrefix(p, "github.com/stretchr/testify"):
			t.Errorf("the plugin links the test library %s", p)
		case strings.HasPrefix(p, testkit+"/"):
			t.Errorf("the plugin links %s: nothing under internal/testkit/ is product code", p)
		case strings.Contains(p, "nomad-device-zfs/internal/") && (strings.HasSuffix(p, "test") || strings.Contains(p, "test/")):
			t.Errorf("the plugin links the test support package %s", p)
		}
	}
	must.Positive(t, pkgs)

	mod, err := os.ReadFile("../../go.mod")
	must.NoError(t, err)
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) > 0 && f[0] == "github.com/hashicorp/nomad" {
			t.Errorf("go.mod requires github.com/hashicorp/nomad: %q", line)
		}
	}
}
