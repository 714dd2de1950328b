// Package release builds the release files of nomad-device-zfs (`make dist`):
// for each of linux/amd64 and linux/arm64 the plugin binary cross-compiled
// from the repository, a zip of it with the README, a .deb and an .rpm that
// install it where Nomad looks for plugins, and SHA256SUMS over them all.
// The packages are written with nfpm, a Go library: no dpkg-deb, rpmbuild or
// other packaging toolchain is needed.
package release

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
	"github.com/goreleaser/nfpm/v2/rpm"

	"github.com/nomad-device-zfs/nomad-device-zfs/dist/version"
)

const (
	// Name is the plugin's name: its binary's, its packages' and the prefix
	// of every release file.
	Name = "nomad-device-zfs"
	// Module is the product's Go module, whose internal/version package holds
	// the Version and Commit that -ldflags -X sets.
	Module = "github.com/nomad-device-zfs/nomad-device-zfs"
	// PluginDir is where the packages put the binary: Nomad's plugin_dir
	// defaults to <data_dir>/plugins, and HashiCorp's Linux packages of
	// Nomad use the data_dir /opt/nomad/data.
	PluginDir = "/opt/nomad/data/plugins"
	// BinaryPath is the installed binary.
	BinaryPath = PluginDir + "/" + Name
	// DocDir holds the README and the LICENSE in the packages.
	DocDir = "/usr/share/doc/" + Name
	// License is the product's licence, as an SPDX identifier: the
	// packages' License field (the LICENSE file holds its text).
	License = "MPL-2.0"

	homepage   = "https://github.com/nomad-device-zfs/nomad-device-zfs"
	maintainer = "nomad-device-zfs maintainers <https://github.com/nomad-device-zfs/nomad-device-zfs/issues>"
	summary    = "Nomad device plugin that gives each task its own ZFS dataset"
	// description is the packages' long description.
	description = summary + "\n" +
		"The plugin binary is installed as " + BinaryPath + ":\n" +
		"Nomad's plugin_dir defaults to <data_dir>/plugins and HashiCorp's\n" +
		"Nomad packages use data_dir /opt/nomad/data. With another data_dir or\n" +
		"plugin_dir, copy or link the binary there. Configure it with a\n" +
		"plugin \"" + Name + "\" block in the Nomad client's configuration."

	// buildTimeout bounds one cross-compilation of the plugin.
	buildTimeout = 15 * time.Minute
)

// Arch is one target architecture, named as each format names it.
type Arch struct {
	Go, Deb, RPM string
}

// Arches are the architectures released.
var Arches = []Arch{
	{Go: "amd64", Deb: "amd64", RPM: "x86_64"},
	{Go: "arm64", Deb: "arm64", RPM: "aarch64"},
}

// Config says what to build and where.
type Config struct {
	// Repo is the repository's root, where ./cmd/nomad-device-zfs is built.
	Repo string
	// Out is the directory the release files are written to (created).
	Out string
	// Info is the version, commit and time of the build.
	Info version.Info
	// Go is the go command; "go" when empty.
	Go string
	// Arches are the architectures to build; all of Arches when empty.
	Arches []Arch
	// Log, when not nil, is told what is being done.
	Log io.Writer
}

// Names are the files made for one architecture, relative to Config.Out.
type Names struct {
	Zip, Deb, RPM string
}

// FileNames names the release files of version v for arch a:
// nomad-device-zfs_<v>_linux_<go arch>.zip, nomad-device-zfs_<v>_<deb
// arch>.deb and nomad-device-zfs_<v>_<rpm arch>.rpm. For a release tag
// (v is MAJOR.MINOR.PATCH) the .deb's name is Debian's own convention.
func FileNames(v string, a Arch) Names {
	return Names{
		Zip: fmt.Sprintf("%s_%s_linux_%s.zip", Name, v, a.Go),
		Deb: fmt.Sprintf("%s_%s_%s.deb", Name, v, a.Deb),
		RPM: fmt.Sprintf("%s_%s_%s.rpm", Name, v, a.RPM),
	}
}

// SumsName is the checksum file, in the format of `sha256sum -c`.
const SumsName = "SHA256SUMS"

// safeRe is what a version and a commit may hold: they go into -ldflags and
// into file names.
var safeRe = regexp.MustCompile(`^[0-9A-Za-z.+~-]+$`)

// Run builds every release file into c.Out and returns their names, the
// SHA256SUMS last.
func Run(ctx context.Context, c Config) ([]string, error) {
	if !safeRe.MatchString(c.Info.Version) {
		return nil, fmt.Errorf("version %q: want letters, digits and . + ~ -", c.Info.Version)
	}
	if !safeRe.MatchString(c.Info.Commit) {
		return nil, fmt.Errorf("commit %q: want letters and digits", c.Info.Commit)
	}
	if c.Go == "" {
		c.Go = "go"
	}
	if len(c.Arches) == 0 {
		c.Arches = Arches
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	if err := removeOld(c.Out); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "nomad-device-zfs-dist-")
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)
	// Copies, so that every file holds the same README and LICENSE even
	// if they are being edited.
	docs := Docs{Readme: filepath.Join(work, "README.md"), License: filepath.Join(work, "LICENSE")}
	if err := copyFile(filepath.Join(c.Repo, "README.md"), docs.Readme); err != nil {
		return nil, fmt.Errorf("the README to package: %w", err)
	}
	if err := copyFile(filepath.Join(c.Repo, "LICENSE"), docs.License); err != nil {
		return nil, fmt.Errorf("the LICENSE to package: %w", err)
	}

	var made []string
	for _, a := range c.Arches {
		bin := filepath.Join(work, a.Go, Name)
		fmt.Fprintf(c.Log, "building %s for linux/%s\n", Name, a.Go)
		if err := Build(ctx, c, a, bin); err != nil {
			return nil, err
		}
		n := FileNames(c.Info.Version, a)
		fmt.Fprintf(c.Log, "packaging %s, %s, %s\n", n.Zip, n.Deb, n.RPM)
		if err := WriteZip(filepath.Join(c.Out, n.Zip), c.Info.Time, bin, docs); err != nil {
			return nil, err
		}
		for _, p := range []struct {
			format, name string
		}{{"deb", n.Deb}, {"rpm", n.RPM}} {
			if err := WritePackage(filepath.Join(c.Out, p.name), p.format, c.Info, a, bin, docs); err != nil {
				return nil, err
			}
		}
		made = append(made, n.Zip, n.Deb, n.RPM)
	}
	if err := WriteSums(c.Out, made); err != nil {
		return nil, err
	}
	return append(made, SumsName), nil
}

// removeOld removes the release files of earlier runs from dir, so that
// SHA256SUMS covers everything there; it leaves other files alone.
func removeOld(dir string) error {
	old, err := filepath.Glob(filepath.Join(dir, Name+"_*"))
	if err != nil {
		return fmt.Errorf("old release files in %s: %w", dir, err)
	}
	for _, p := range append(old, filepath.Join(dir, SumsName)) {
		switch filepath.Ext(p) {
		case ".zip", ".deb", ".rpm", ".part", "":
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("old release file: %w", err)
			}
		}
	}
	return nil
}

// LDFlags are the linker flags of a release binary, as the Makefile's build
// target sets them: the version and commit stamped in, and no symbol table
// or DWARF (-s -w: a third of the size; panics still print their stacks).
func LDFlags(info version.Info) string {
	return fmt.Sprintf("-s -w -X %s/internal/version.Version=%s -X %s/internal/version.Commit=%s",
		Module, info.Version, Module, info.Commit)
}

// Build cross-compiles ./cmd/nomad-device-zfs of c.Repo for linux/a into
// bin, statically (CGO_ENABLED=0) and without local paths (-trimpath).
func Build(ctx context.Context, c Config, a Arch, bin string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	args := []string{"build", "-trimpath", "-ldflags", LDFlags(c.Info), "-o", bin, "./cmd/" + Name}
	cmd := exec.CommandContext(ctx, c.Go, args...)
	cmd.Dir = c.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+a.Go)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s (GOARCH=%s) in %s: %w: %s", c.Go, strings.Join(args, " "), a.Go, c.Repo, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Docs are the files that go with the binary in every release file.
type Docs struct {
	// Readme and License are the paths of README.md and LICENSE.
	Readme, License string
}

// WriteZip writes the zip at path: the binary (mode 0755), the README and
// the LICENSE at its top, with the times mtime.
func WriteZip(path string, mtime time.Time, bin string, docs Docs) error {
	return writeFile(path, func(f io.Writer) error { return writeZip(f, mtime, bin, docs) })
}

func writeZip(f io.Writer, mtime time.Time, bin string, docs Docs) error {
	z := zip.NewWriter(f)
	for _, e := range []struct {
		src, name string
		mode      os.FileMode
	}{{bin, Name, 0o755}, {docs.Readme, "README.md", 0o644}, {docs.License, "LICENSE", 0o644}} {
		if err := addToZip(z, e.src, e.name, e.mode, mtime); err != nil {
			return fmt.Errorf("zip: %w", err)
		}
	}
	if err := z.Close(); err != nil {
		return fmt.Errorf("zip: %w", err)
	}
	return nil
}

// writeFile writes path through write, into path.part first, so that a
// failure leaves no partial file under the release name.
func writeFile(path string, write func(io.Writer) error) (err error) {
	part := path + ".part"
	f, err := os.Create(part)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(part)
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.Rename(part, path)
}

func copyFile(src, dst string) error {
	return writeFile(dst, func(w io.Writer) error {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		_, err = io.Copy(w, in)
		return err
	})
}

func addToZip(z *zip.Writer, src, name string, mode os.FileMode, mtime time.Time) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: mtime}
	h.SetMode(mode)
	w, err := z.CreateHeader(h)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if _, err := io.Copy(w, in); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// PackageInfo is the nfpm description of the package of arch a: the binary
// at BinaryPath (0755, root), the README and the LICENSE in DocDir, and
// the License field.
func PackageInfo(info version.Info, a Arch, bin string, docs Docs) *nfpm.Info {
	core, pre, meta := version.Split(info.Version)
	return &nfpm.Info{
		Name:     Name,
		Arch:     a.Go,
		Platform: "linux",
		// The version is already split: nfpm writes core~pre+meta for both
		// formats (and the RPM release 1), which sort as SemVer does.
		Version:         core,
		VersionSchema:   "none",
		Prerelease:      pre,
		VersionMetadata: meta,
		Section:         "admin",
		Priority:        "optional",
		Maintainer:      maintainer,
		Description:     description,
		Homepage:        homepage,
		License:         License,
		MTime:           info.Time,
		Overridables: nfpm.Overridables{
			Contents: files.Contents{
				{
					Source: bin, Destination: BinaryPath,
					FileInfo: &files.ContentFileInfo{Mode: 0o755, Owner: "root", Group: "root", MTime: info.Time},
				},
				{
					Source: docs.Readme, Destination: DocDir + "/README.md",
					FileInfo: &files.ContentFileInfo{Mode: 0o644, Owner: "root", Group: "root", MTime: info.Time},
				},
				{
					Source: docs.License, Destination: DocDir + "/LICENSE",
					FileInfo: &files.ContentFileInfo{Mode: 0o644, Owner: "root", Group: "root", MTime: info.Time},
				},
			},
			Deb: nfpm.Deb{Arch: a.Deb, Compression: "gzip"},
			RPM: nfpm.RPM{
				Arch: a.RPM, Summary: summary, Group: "System Environment/Daemons",
				Compression: "gzip", BuildHost: "nomad-device-zfs-dist", Packager: maintainer,
			},
		},
	}
}

// WritePackage writes the package of format ("deb" or "rpm") to path.
func WritePackage(path, format string, info version.Info, a Arch, bin string, docs Docs) error {
	var p nfpm.Packager
	switch format {
	case "deb":
		p = deb.Default
	case "rpm":
		p = rpm.DefaultRPM
	default:
		return fmt.Errorf("package format %q: want deb or rpm", format)
	}
	if err := writeFile(path, func(w io.Writer) error { return p.Package(PackageInfo(info, a, bin, docs), w) }); err != nil {
		return fmt.Errorf("%s package: %w", format, err)
	}
	return nil
}

// WriteSums writes SHA256SUMS into dir over the files names (in dir), sorted
// by name, in the format `sha256sum -c` checks.
func WriteSums(dir string, names []string) error {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	var b strings.Builder
	for _, n := range sorted {
		sum, err := sha256File(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	if err := os.WriteFile(filepath.Join(dir, SumsName), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("%s: %w", SumsName, err)
	}
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("checksum: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum of %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
