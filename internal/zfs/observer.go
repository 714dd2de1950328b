package zfs

import (
	"context"
	"errors"
	"path/filepath"
	"time"
)

// Observer is told of every zfs or zpool process a Runner ran, for
// metrics. CommandDone is called on the runner's goroutine once the
// process has exited: it must be quick and must not block.
type Observer interface {
	// CommandDone reports one process: command is "zfs" or "zpool" (the
	// base name of what ran), subcommand its first argument ("get",
	// "set", …), err what the runner returns (nil, or an *Error), took
	// how long it ran.
	CommandDone(command, subcommand string, err error, took time.Duration)
}

// Outcome names the kind of a runner's error, for metrics: "ok" for nil,
// then "not_exist", "busy", "unavailable", "no_space", "invalid",
// "timeout" (the command's context ended) and "error" for anything else.
// The set is fixed, so it can label a metric.
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotExist):
		return "not_exist"
	case errors.Is(err, ErrBusy):
		return "busy"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrNoSpace):
		return "no_space"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	}
	return "error"
}

// observe reports one process to the runner's Observer, if any.
func (r *Runner) observe(bin string, args []string, err error, took time.Duration) {
	if r.Observer == nil {
		return
	}
	sub := ""
	if len(args) > 0 {
		sub = args[0]
	}
	r.Observer.CommandDone(filepath.Base(bin), sub, err, took)
}
