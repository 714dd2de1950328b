package release

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rpmutils "github.com/sassoftware/go-rpmutils"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/dist/version"
)

var testInfo = version.Info{
	Version: "0.4.0-rc.1+3.g1a2b3c4",
	Commit:  "1a2b3c4",
	Time:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
}

func TestFileNames(t *testing.T) {
	must.Eq(t, Names{
		Zip: "nomad-device-zfs_0.3.0_linux_amd64.zip",
		Deb: "nomad-device-zfs_0.3.0_amd64.deb",
		RPM: "nomad-device-zfs_0.3.0_x86_64.rpm",
	}, FileNames("0.3.0", Arches[0]))
	must.Eq(t, Names{
		Zip: "nomad-device-zfs_0.0.0-dev+g1a2b3c4_linux_arm64.zip",
		Deb: "nomad-device-zfs_0.0.0-dev+g1a2b3c4_arm64.deb",
		RPM: "nomad-device-zfs_0.0.0-dev+g1a2b3c4_aarch64.rpm",
	}, FileNames("0.0.0-dev+g1a2b3c4", Arches[1]))
}

// fixture writes a stand-in binary, README and LICENSE and returns their
// paths and the binary's and README's contents (the LICENSE holds
// licenseData).
func fixture(t *testing.T) (bin string, docs Docs, binData, readmeData []byte) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, Name)
	docs = Docs{Readme: filepath.Join(dir, "README.md"), License: filepath.Join(dir, "LICENSE")}
	binData, readmeData = []byte("#!/bin/sh\necho stand-in\n"), []byte("# nomad-device-zfs\n")
	must.NoError(t, os.WriteFile(bin, binData, 0o755))
	must.NoError(t, os.WriteFile(docs.Readme, readmeData, 0o644))
	must.NoError(t, os.WriteFile(docs.License, licenseData, 0o644))
	return bin, docs, binData, readmeData
}

// licenseData is the stand-in LICENSE's text.
var licenseData = []byte("Mozilla Public License Version 2.0\n")

func TestWriteZip(t *testing.T) {
	bin, docs, binData, readmeData := fixture(t)
	path := filepath.Join(t.TempDir(), "a.zip")
	must.NoError(t, WriteZip(path, testInfo.Time, bin, docs))

	z, err := zip.OpenReader(path)
	must.NoError(t, err)
	t.Cleanup(func() { _ = z.Close() })
	must.SliceLen(t, 3, z.File)
	want := []struct {
		name string
		mode os.FileMode
		data []byte
	}{{Name, 0o755, binData}, {"README.md", 0o644, readmeData}, {"LICENSE", 0o644, licenseData}}
	for i, w := range want {
		f := z.File[i]
		must.EqOp(t, w.name, f.Name)
		must.EqOp(t, w.mode, f.Mode())
		must.True(t, f.Modified.Equal(testInfo.Time), must.Sprintf("%s modified %v", f.Name, f.Modified))
		r, err := f.Open()
		must.NoError(t, err)
		got, err := io.ReadAll(r)
		must.NoError(t, err)
		must.Eq(t, w.data, got)
	}
}

func TestWriteDeb(t *testing.T) {
	bin, docs, binData, readmeData := fixture(t)
	for _, a := range Arches {
		t.Run(a.Deb, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "p.deb")
			must.NoError(t, WritePackage(path, "deb", testInfo, a, bin, docs))

			members := readAr(t, path)
			must.EqOp(t, "2.0\n", string(members["debian-binary"]))
			control := readTarGz(t, members["control.tar.gz"])
			fields := string(control["./control"].data)
			for _, f := range []string{
				"Package: nomad-device-zfs\n",
				"Version: 0.4.0~rc.1+3.g1a2b3c4\n",
				"Architecture: " + a.Deb + "\n",
				"Description: " + summary + "\n",
				" The plugin binary is installed as " + BinaryPath,
			} {
				must.StrContains(t, fields, f)
			}
			data := readTarGz(t, members["data.tar.gz"])
			b, ok := data["."+BinaryPath]
			must.True(t, ok, must.Sprintf("no %s in the data of the .deb", BinaryPath))
			must.EqOp(t, int64(0o755), b.mode)
			must.Eq(t, binData, b.data)
			must.Eq(t, readmeData, data["."+DocDir+"/README.md"].data)
			must.Eq(t, licenseData, data["."+DocDir+"/LICENSE"].data)
		})
	}
}

func TestWriteRPM(t *testing.T) {
	bin, docs, binData, _ := fixture(t)
	for _, a := range Arches {
		t.Run(a.RPM, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "p.rpm")
			must.NoError(t, WritePackage(path, "rpm", testInfo, a, bin, docs))

			raw, err := os.ReadFile(path)
			must.NoError(t, err)
			must.Eq(t, []byte{0xed, 0xab, 0xee, 0xdb}, raw[:4], must.Sprint("RPM lead magic"))

			f, err := os.Open(path)
			must.NoError(t, err)
			t.Cleanup(func() { _ = f.Close() })
			r, err := rpmutils.ReadRpm(f)
			must.NoError(t, err)
			nevra, err := r.Header.GetNEVRA()
			must.NoError(t, err)
			must.EqOp(t, Name, nevra.Name)
			must.EqOp(t, "0.4.0~rc.1+3.g1a2b3c4", nevra.Version)
			must.EqOp(t, "1", nevra.Release)
			must.EqOp(t, a.RPM, nevra.Arch)
			license, err := r.Header.GetString(rpmutils.LICENSE)
			must.NoError(t, err)
			must.EqOp(t, License, license)

			files, err := r.Header.GetFiles()
			must.NoError(t, err)
			var found bool
			for _, fi := range files {
				if fi.Name() == BinaryPath {
					found = true
					must.EqOp(t, os.FileMode(0o755), os.FileMode(fi.Mode()).Perm())
					must.EqOp(t, int64(len(binData)), fi.Size())
					must.EqOp(t, "root", fi.UserName())
				}
			}
			must.True(t, found, must.Sprintf("no %s in the .rpm's files", BinaryPath))
		})
	}
}

func TestWritePackageRefusesUnknownFormat(t *testing.T) {
	bin, docs, _, _ := fixture(t)
	err := WritePackage(filepath.Join(t.TempDir(), "p"), "apk", testInfo, Arches[0], bin, docs)
	must.ErrorContains(t, err, `package format "apk"`)
}

func TestWriteSums(t *testing.T) {
	dir := t.TempDir()
	contents := map[string]string{"b.deb": "bee", "a.zip": "ay", "c.rpm": ""}
	for n, c := range contents {
		must.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644))
	}
	must.NoError(t, WriteSums(dir, []string{"c.rpm", "b.deb", "a.zip"}))
	got, err := os.ReadFile(filepath.Join(dir, SumsName))
	must.NoError(t, err)
	var want strings.Builder
	for _, n := range []string{"a.zip", "b.deb", "c.rpm"} {
		sum := sha256.Sum256([]byte(contents[n]))
		fmt.Fprintf(&want, "%s  %s\n", hex.EncodeToString(sum[:]), n)
	}
	must.EqOp(t, want.String(), string(got))

	err = WriteSums(dir, []string{"missing.zip"})
	must.ErrorContains(t, err, "missing.zip")
}

// TestRun builds a small stand-in of the repository (the same module path,
// a cmd/nomad-device-zfs that prints internal/version's Version and Commit)
// for both architectures, so that the cross-compilation and -ldflags are
// those of a real run without the plugin's build time.
func TestRun(t *testing.T) {
	repo := t.TempDir()
	writeFile := func(rel, content string) {
		t.Helper()
		p := filepath.Join(repo, rel)
		must.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	writeFile("go.mod", "module "+Module+"\n\ngo 1.22\n")
	writeFile("README.md", "# stand-in\n")
	writeFile("LICENSE", "Mozilla Public License Version 2.0\n")
	writeFile("internal/version/v.go", "package version\n\nvar Version, Commit = \"unset\", \"\"\n")
	writeFile("cmd/nomad-device-zfs/main.go", `package main

import (
	"fmt"

	"`+Module+`/internal/version"
)

func main() { fmt.Println(version.Version, version.Commit) }
`)
	out := filepath.Join(t.TempDir(), "out")
	must.NoError(t, os.MkdirAll(out, 0o755))
	stale := filepath.Join(out, Name+"_0.0.1_linux_amd64.zip")
	must.NoError(t, os.WriteFile(stale, nil, 0o644))
	other := filepath.Join(out, "keep.txt")
	must.NoError(t, os.WriteFile(other, nil, 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	made, err := Run(ctx, Config{Repo: repo, Out: out, Info: testInfo})
	must.NoError(t, err)

	var want []string
	for _, a := range Arches {
		n := FileNames(testInfo.Version, a)
		want = append(want, n.Zip, n.Deb, n.RPM)
	}
	must.Eq(t, append(want, SumsName), made)
	_, err = os.Stat(stale)
	must.True(t, os.IsNotExist(err), must.Sprint("a release file of an earlier run is left"))
	_, err = os.Stat(other)
	must.NoError(t, err)

	// Every file is in SHA256SUMS with its sum, and nothing else.
	sums, err := os.ReadFile(filepath.Join(out, SumsName))
	must.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(sums), "\n"), "\n")
	must.SliceLen(t, len(want), lines)
	for _, l := range lines {
		sum, name, ok := strings.Cut(l, "  ")
		must.True(t, ok, must.Sprintf("line %q", l))
		data, err := os.ReadFile(filepath.Join(out, name))
		must.NoError(t, err)
		s := sha256.Sum256(data)
		must.EqOp(t, hex.EncodeToString(s[:]), sum)
	}

	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, a := range Arches {
		z, err := zip.OpenReader(filepath.Join(out, FileNames(testInfo.Version, a).Zip))
		must.NoError(t, err)
		t.Cleanup(func() { _ = z.Close() })
		must.EqOp(t, Name, z.File[0].Name)
		rc, err := z.File[0].Open()
		must.NoError(t, err)
		data, err := io.ReadAll(rc)
		must.NoError(t, err)
		e, err := elf.NewFile(bytes.NewReader(data))
		must.NoError(t, err)
		must.EqOp(t, machines[a.Go], e.Machine, must.Sprintf("%s's binary", a.Go))
		// The version and commit are stamped in.
		must.True(t, bytes.Contains(data, []byte(testInfo.Version)), must.Sprint("version not in the binary"))
		if a.Go == "amd64" && hostIsAMD64(t) {
			bin := filepath.Join(t.TempDir(), Name)
			must.NoError(t, os.WriteFile(bin, data, 0o755))
			got, err := exec.Command(bin).Output()
			must.NoError(t, err)
			must.EqOp(t, testInfo.Version+" "+testInfo.Commit+"\n", string(got))
		}
	}
}

func TestRunRefusesUnsafeVersion(t *testing.T) {
	for _, v := range []string{"", "1.0 -X x=y", "1.0\"", "../1.0"} {
		_, err := Run(context.Background(), Config{Repo: t.TempDir(), Out: t.TempDir(), Info: version.Info{Version: v, Commit: "1a2b3c4"}})
		must.ErrorContains(t, err, strconv.Quote(v))
	}
}

func hostIsAMD64(t *testing.T) bool {
	t.Helper()
	self, err := os.Executable()
	must.NoError(t, err)
	e, err := elf.Open(self)
	if err != nil {
		return false
	}
	defer e.Close()
	return e.Machine == elf.EM_X86_64
}

// readAr reads the members of the ar archive at path (a .deb).
func readAr(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	must.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	r := bufio.NewReader(f)
	magic := make([]byte, 8)
	_, err = io.ReadFull(r, magic)
	must.NoError(t, err)
	must.EqOp(t, "!<arch>\n", string(magic))
	members := map[string][]byte{}
	for {
		hdr := make([]byte, 60)
		if _, err := io.ReadFull(r, hdr); err == io.EOF {
			return members
		} else {
			must.NoError(t, err)
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		must.NoError(t, err)
		data := make([]byte, size)
		_, err = io.ReadFull(r, data)
		must.NoError(t, err)
		members[name] = data
		if size%2 == 1 {
			_, err = r.ReadByte()
			must.NoError(t, err)
		}
	}
}

type tarEntry struct {
	mode int64
	data []byte
}

func readTarGz(t *testing.T, b []byte) map[string]tarEntry {
	t.Helper()
	must.NotNil(t, b)
	gz, err := gzip.NewReader(bytes.NewReader(b))
	must.NoError(t, err)
	tr := tar.NewReader(gz)
	entries := map[string]tarEntry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		must.NoError(t, err)
		data, err := io.ReadAll(tr)
		must.NoError(t, err)
		entries[h.Name] = tarEntry{mode: h.Mode, data: data}
	}
}
