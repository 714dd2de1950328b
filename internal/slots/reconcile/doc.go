// Package reconcile is the pure half of the slot engine's reconcile: the
// configuration it works to (Config, Class), the two names of a slot and
// their roles (Pair), and the plan that brings ZFS to the configuration
// (MakePlan), each a pure function of the configuration and one read of
// ZFS. It runs no command; package slots carries the plan out.
package reconcile
