// Package nomadbuild exists so that `go build github.com/hashicorp/nomad` can run
// from this module with a pinned version. It holds no code.
package nomadbuild
