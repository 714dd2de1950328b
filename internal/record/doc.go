// Package record is what the plugin writes on ZFS and how it names things:
// the user properties (props.go), a slot dataset's recorded state and every
// change of it (state.go, transitions.go), the owner encoding (owner.go),
// the names of slots, devices and archives (names.go, archive_name.go) and
// the key files of encrypted datasets (keys.go).
//
// All durable state lives in ZFS user properties on the datasets
// themselves, never in a side file, so the plugin can be killed at any
// point and start again from what ZFS says. docs/release-lifecycle.md
// ("What ZFS records", "Transitions") describes the same record for
// operators; a test holds the two together.
//
// The package reads and names; it runs no zfs command. The slots engine
// (package slots), retention, backup and the operator CLI import it.
package record
