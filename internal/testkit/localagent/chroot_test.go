package localagent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// TestParseLdd reads ldd's answer for /usr/bin/id, saved on Debian 12.
func TestParseLdd(t *testing.T) {
	b, err := os.ReadFile("testdata/ldd-id.txt")
	must.NoError(t, err)
	got := parseLdd(string(b))
	must.Eq(t, []string{
		"/lib/x86_64-linux-gnu/libselinux.so.1",
		"/lib/x86_64-linux-gnu/libc.so.6",
		"/lib/x86_64-linux-gnu/libpcre2-8.so.0",
		"/lib64/ld-linux-x86-64.so.2",
	}, got)
	must.SliceEmpty(t, parseLdd("\tstatically linked\n"))
}

// TestChrootEnv builds a directory from the block's entries, as the exec
// driver does, and runs the programs in it with chroot(2): the block must
// hold everything they need.
func TestChrootEnv(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "chroot(2) needs root")
	}
	block, err := ChrootEnv(context.Background(), []string{"/bin/sh", "/usr/bin/id"}, []string{"/etc/passwd"})
	must.NoError(t, err)
	must.StrHasPrefix(t, "  chroot_env {\n", block)

	root := t.TempDir()
	entries := 0
	for _, l := range strings.Split(block, "\n") {
		src, dst, ok := strings.Cut(strings.TrimSpace(l), " = ")
		if !ok {
			continue
		}
		src, err1 := strconv.Unquote(src)
		dst, err2 := strconv.Unquote(dst)
		must.NoError(t, err1)
		must.NoError(t, err2)
		b, err := os.ReadFile(src)
		must.NoError(t, err)
		must.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(dst)), 0o755))
		must.NoError(t, os.WriteFile(filepath.Join(root, dst), b, 0o755))
		entries++
	}
	must.Greater(t, 3, entries, must.Sprint(block))
	out, err := exec.Command("chroot", root, "/bin/sh", "-c", "/usr/bin/id -un 65534 && echo ok").CombinedOutput()
	must.NoError(t, err, must.Sprintf("%s\n%s", out, block))
	must.EqOp(t, "nobody\nok\n", string(out))

	_, err = ChrootEnv(context.Background(), []string{"/no/such/program"}, nil)
	must.ErrorContains(t, err, "/no/such/program")
	_, err = ChrootEnv(context.Background(), nil, []string{"/no/such/file"})
	must.ErrorContains(t, err, "/no/such/file")
	_, err = ChrootEnv(context.Background(), nil, []string{"/etc/passwd", filepath.Join(t.TempDir(), "link")})
	must.ErrorContains(t, err, "link") // a missing file
	link := filepath.Join(t.TempDir(), "passwd")
	must.NoError(t, os.Symlink("/etc/passwd", link))
	_, err = ChrootEnv(context.Background(), nil, []string{"/etc/passwd", link})
	must.ErrorContains(t, err, "are the same file /etc/passwd")
}
