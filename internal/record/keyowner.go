package record

import (
	"io/fs"
	"syscall"
)

// ownerUID returns the owner of a file, when the platform says.
func ownerUID(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
