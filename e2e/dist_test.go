package e2e

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

const (
	// distTimeout covers `make dist`: two cross-compilations of the plugin
	// (minutes on a cold build cache) and the packaging.
	distTimeout = 20 * time.Minute
	// installedPlugin is where the packages put the binary.
	installedPlugin = "/opt/nomad/data/plugins/nomad-device-zfs"
)

// versionRe matches `nomad-device-zfs version`.
var versionRe = regexp.MustCompile(`^nomad-device-zfs (\S+) \(commit ([0-9a-f]+)\)\n$`)

// TestDist is issue 12's check of the release files: `make dist` into a
// fresh directory makes every file, SHA256SUMS verifies, the zip holds the
// binary, the amd64 .deb installs with dpkg -i and its binary prints the
// version and commit that `make build`'s does; the .rpm is an RPM (and, where
// an rpm command exists, one it reads).
func TestDist(t *testing.T) {
	testenv.SkipShort(t, "cross-compiles the plugin for two architectures and installs a .deb")
	if os.Geteuid() != 0 {
		testenv.Skip(t, "installing the .deb with dpkg -i needs root")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		testenv.Skip(t, "no dpkg to install the .deb: "+err.Error())
	}
	refuseInstalled(t)
	root, err := filepath.Abs("..")
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), distTimeout)
	t.Cleanup(cancel)

	out := t.TempDir()
	start := time.Now()
	runIn(ctx, t, root, "make", "dist", "DIST_OUT="+out)
	t.Logf("make dist took %s", time.Since(start).Round(time.Second))
	runIn(ctx, t, root, "make", "build")
	built := runIn(ctx, t, root, filepath.Join(root, "bin", "nomad-device-zfs"), "version")
	m := versionRe.FindStringSubmatch(built)
	must.NotNil(t, m, must.Sprintf("bin/nomad-device-zfs version printed %q", built))
	version := m[1]

	// Every file, named with the version, and nothing else.
	want := []string{"SHA256SUMS"}
	for _, a := range []struct{ goArch, debArch, rpmArch string }{
		{"amd64", "amd64", "x86_64"}, {"arm64", "arm64", "aarch64"},
	} {
		want = append(want,
			"nomad-device-zfs_"+version+"_linux_"+a.goArch+".zip",
			"nomad-device-zfs_"+version+"_"+a.debArch+".deb",
			"nomad-device-zfs_"+version+"_"+a.rpmArch+".rpm")
	}
	entries, err := os.ReadDir(out)
	must.NoError(t, err)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	must.Eq(t, want, got)

	// SHA256SUMS verifies, with sha256sum itself, and lists every other file.
	runIn(ctx, t, out, "sha256sum", "--check", "--strict", "SHA256SUMS")
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	must.NoError(t, err)
	must.EqOp(t, len(want)-1, strings.Count(string(sums), "\n"))

	// The zip holds the binary (executable), the README and the LICENSE.
	zipBin := zipFile(t, filepath.Join(out, "nomad-device-zfs_"+version+"_linux_amd64.zip"), "nomad-device-zfs", 0o755)
	zipFile(t, filepath.Join(out, "nomad-device-zfs_"+version+"_linux_amd64.zip"), "README.md", 0o644)
	license := zipFile(t, filepath.Join(out, "nomad-device-zfs_"+version+"_linux_amd64.zip"), "LICENSE", 0o644)
	must.StrHasPrefix(t, "Mozilla Public License Version 2.0", string(license))

	// The .deb installs where Nomad looks for plugins, and its binary is the
	// zip's and prints what make build's prints.
	deb := filepath.Join(out, "nomad-device-zfs_"+version+"_amd64.deb")
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(c, "dpkg", "--purge", "nomad-device-zfs").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge nomad-device-zfs: %v: %s", err, out)
		}
	})
	runIn(ctx, t, out, "dpkg", "-i", deb)
	info, err := os.Stat(installedPlugin)
	must.NoError(t, err)
	must.EqOp(t, os.FileMode(0o755), info.Mode().Perm())
	installed, err := os.ReadFile(installedPlugin)
	must.NoError(t, err)
	must.EqOp(t, sha256Hex(zipBin), sha256Hex(installed), must.Sprint("the installed binary is not the zip's"))
	must.EqOp(t, built, runIn(ctx, t, out, installedPlugin, "version"))
	debVersion := strings.Replace(version, "-", "~", 1) // SemVer's pre-release, Debian's way
	must.EqOp(t, debVersion, runIn(ctx, t, out, "dpkg-query", "--show", "--showformat=${Version}", "nomad-device-zfs"))
	installedLicense, err := os.ReadFile("/usr/share/doc/nomad-device-zfs/LICENSE")
	must.NoError(t, err)
	must.Eq(t, license, installedLicense)

	// The .rpm: its lead's magic, and what rpm reads in it when rpm is here.
	for _, arch := range []string{"x86_64", "aarch64"} {
		rpm := filepath.Join(out, "nomad-device-zfs_"+version+"_"+arch+".rpm")
		f, err := os.Open(rpm)
		must.NoError(t, err)
		lead := make([]byte, 4)
		_, err = io.ReadFull(f, lead)
		must.NoError(t, f.Close())
		must.NoError(t, err)
		must.Eq(t, []byte{0xed, 0xab, 0xee, 0xdb}, lead, must.Sprintf("lead of %s", rpm))
		if _, err := exec.LookPath("rpm"); err == nil {
			q := runIn(ctx, t, out, "rpm", "-qip", rpm)
			must.StrContains(t, q, "nomad-device-zfs")
			must.StrContains(t, q, arch)
			must.StrContains(t, runIn(ctx, t, out, "rpm", "-qlp", rpm), installedPlugin)
		} else {
			t.Logf("no rpm command: %s checked for its lead only", filepath.Base(rpm))
		}
	}
}

// refuseInstalled fails the test when the machine has the plugin installed,
// as a package or as a file: the test would replace it and then remove it.
func refuseInstalled(t *testing.T) {
	t.Helper()
	out, err := exec.Command("dpkg-query", "--show", "--showformat=${db:Status-Status}", "nomad-device-zfs").Output()
	if err == nil && len(bytes.TrimSpace(out)) > 0 && string(out) != "not-installed" {
		t.Fatalf("the package nomad-device-zfs is installed here (%s): TestDist would replace and purge it", out)
	}
	if _, err := os.Stat(installedPlugin); err == nil {
		t.Fatalf("%s exists: TestDist would overwrite it", installedPlugin)
	}
}

// runIn runs name with args in dir and returns its standard output; it fails
// the test, with both outputs, when the command fails.
func runIn(ctx context.Context, t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	must.NoError(t, err, must.Sprintf("%s %s in %s\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), dir, stdout.String(), stderr.String()))
	return stdout.String()
}

// zipFile returns the contents of name in the zip at path, checking its mode.
func zipFile(t *testing.T, path, name string, mode os.FileMode) []byte {
	t.Helper()
	z, err := zip.OpenReader(path)
	must.NoError(t, err)
	t.Cleanup(func() { _ = z.Close() })
	for _, f := range z.File {
		if f.Name != name {
			continue
		}
		must.EqOp(t, mode, f.Mode(), must.Sprintf("mode of %s in %s", name, path))
		r, err := f.Open()
		must.NoError(t, err)
		defer r.Close()
		data, err := io.ReadAll(r)
		must.NoError(t, err)
		return data
	}
	t.Fatalf("no %s in %s", name, path)
	return nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
