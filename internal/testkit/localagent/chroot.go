package localagent

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// lddTimeout bounds one ldd run.
const lddTimeout = 10 * time.Second

// ChrootEnv returns a client `chroot_env` block for the exec driver that
// holds only the given programs, the shared objects ldd lists for them
// (the dynamic loader included), /etc/ld.so.cache when the machine has
// one, and the given plain files. Each entry sits under the path asked
// for and is linked from its real file (symlinks resolved), so "/bin/sh"
// works on a merged-/usr system too (where /bin/sh is /usr/bin/dash).
//
// The exec driver's default chroot links (or copies) all of /usr, /etc and
// the rest into every task's directory: on a developer machine that is
// 150,000 files and about 10 s per task, and over a minute per task in the
// emulated OpenZFS VM. Tests and the benchmark wait for that, not for the
// plugin, so they give their tasks only what their scripts run.
//
// It fails, naming the path, when a program or file does not exist, when
// ldd cannot read a program, or when two paths asked for are one file
// (Nomad's chroot_env is keyed by the host file, so it would keep one).
func ChrootEnv(ctx context.Context, programs []string, files []string) (string, error) {
	want := map[string]bool{}
	for _, f := range files {
		want[f] = true
	}
	for _, p := range programs {
		want[p] = true
		libs, err := lddPaths(ctx, p)
		if err != nil {
			return "", err
		}
		for _, l := range libs {
			want[l] = true
		}
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		want["/etc/ld.so.cache"] = true
	}
	// Nomad's chroot_env maps each host file to one path: the block's
	// keys are the sources.
	bySrc := map[string]string{}
	var b strings.Builder
	b.WriteString("  chroot_env {\n")
	for _, dst := range slices.Sorted(maps.Keys(want)) {
		src, err := filepath.EvalSymlinks(dst)
		if err != nil {
			return "", fmt.Errorf("chroot_env entry %s: %w", dst, err)
		}
		if other, ok := bySrc[src]; ok {
			return "", fmt.Errorf("chroot_env entries %s and %s are the same file %s; Nomad maps a host file to one path only", other, dst, src)
		}
		bySrc[src] = dst
		fmt.Fprintf(&b, "    %q = %q\n", src, dst)
	}
	b.WriteString("  }\n")
	return b.String(), nil
}

// lddPaths returns the absolute paths in ldd's answer for program: the
// shared objects it loads and the dynamic loader.
func lddPaths(ctx context.Context, program string) ([]string, error) {
	if _, err := os.Stat(program); err != nil {
		return nil, fmt.Errorf("chroot_env program %s: %w", program, err)
	}
	lctx, cancel := context.WithTimeout(ctx, lddTimeout)
	defer cancel()
	out, err := exec.CommandContext(lctx, "ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	return parseLdd(string(out)), nil
}

// parseLdd picks the absolute paths out of ldd's lines, which come as
// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)",
// "/lib64/ld-linux-x86-64.so.2 (0x…)" or "linux-vdso.so.1 (0x…)" (no file).
func parseLdd(out string) []string {
	var paths []string
	for _, l := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "/") {
				paths = append(paths, f)
			}
		}
	}
	return paths
}
