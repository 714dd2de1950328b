// Package localagent holds what it takes to run a Nomad agent on this
// machine outside of Nomad, for the tests (internal/testkit/nomadtest) and the
// benchmark alike: the pinned Nomad binary's version and cached path, free
// loopback ports for the agent, and the agent's descendant processes (to
// stop them by PID).
package localagent

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	// ModulePath is the product's module; RepoRoot looks for its go.mod.
	ModulePath = "github.com/nomad-device-zfs/nomad-device-zfs"
	// NomadModule is the module whose main package is the Nomad agent.
	NomadModule = "github.com/hashicorp/nomad"
)

// RepoRoot walks up from the working directory to the directory whose
// go.mod declares ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if mod, err := modulePath(filepath.Join(dir, "go.mod")); err == nil && mod == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

// PinnedVersionOf reads the version of NomadModule that the repository's
// e2e/nomad/go.mod requires.
func PinnedVersionOf(root string) (string, error) {
	path := filepath.Join(root, "e2e", "nomad", "go.mod")
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 && fields[0] == "require" {
			fields = fields[1:]
		}
		if len(fields) >= 2 && fields[0] == NomadModule && strings.HasPrefix(fields[1], "v") {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s requires no %s", path, NomadModule)
}

// CachedBinaryPath is where the binary of a Nomad version is cached.
func CachedBinaryPath(version string) (string, error) {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no XDG_CACHE_HOME and no home directory: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "nomad-device-zfs", "nomad-"+version), nil
}

// CheckExecutable returns nil when path is an executable regular file.
func CheckExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

func modulePath(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`), nil
		}
	}
	return "", fmt.Errorf("%s has no module line", gomod)
}

// FreeLoopbackPorts returns n distinct loopback ports that are free for TCP and
// UDP (serf uses both) at the time of the call.
func FreeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for tries := 0; len(ports) < n && tries < 50; tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			_ = l.Close()
			continue
		}
		closers = append(closers, func() { _ = l.Close(); _ = u.Close() })
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("found only %d free ports", len(ports))
	}
	return ports, nil
}

// ProcStat reads the stat file of dir, a process's /proc/<pid> (or one of
// its threads' task/<tid>), and returns the command name and the fields
// after it: the state first (field 3), then the parent's PID, and so on.
// The name, in parentheses, may hold spaces and parentheses itself: the
// fields count from after the last ')'.
func ProcStat(dir string) (comm string, fields []string, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return "", nil, err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return "", nil, fmt.Errorf("%s/stat: no command name", dir)
	}
	return s[i+1 : j], strings.Fields(s[j+1:]), nil
}

// Descendants lists the PIDs of the processes descended from pid, read from
// /proc, children before grandchildren.
func Descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		_, fields, err := ProcStat(filepath.Join("/proc", e.Name()))
		if err != nil || len(fields) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
