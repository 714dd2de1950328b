#!/usr/bin/env bash
# gen-proto.sh: generates internal/nomadproto's Go files (*.pb.go,
# *_grpc.pb.go) from its .proto files, one Go package per proto package
# (internal/nomadproto/{base,device,hclspec,structs}pb), with the standard
# protobuf tooling:
#
#   protoc              Debian's protobuf-compiler (bookworm: 3.21.12), with
#                       its well-known types in /usr/include; installed with
#                       apt when missing (as root)
#   protoc-gen-go       google.golang.org/protobuf at the version go.mod
#                       requires (the runtime the generated code links)
#   protoc-gen-go-grpc  pinned below
#
# The generators are built into bin/tools. With --check nothing is written:
# the files are generated into a temporary directory and compared with the
# committed ones (the protoc version line aside), and the script fails,
# naming them, when they differ. `make lint` runs the check; `make proto`
# writes.
set -euo pipefail

GRPC_GEN_VERSION=v1.6.2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
check=false
case "${1:-}" in
	--check) check=true ;;
	"") ;;
	*) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v protoc >/dev/null || [[ ! -f /usr/include/google/protobuf/duration.proto ]]; then
	if [[ "$(id -u)" != 0 ]]; then
		echo "gen-proto.sh: protoc is missing: install Debian's protobuf-compiler (as root: apt-get install protobuf-compiler)" >&2
		exit 1
	fi
	echo "gen-proto.sh: installing protobuf-compiler" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq protobuf-compiler >/dev/null 2>&1 || {
		apt-get update -qq
		apt-get install -y -qq protobuf-compiler >/dev/null
	}
fi

tools="$root/bin/tools"
pb_version=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
GOBIN="$tools" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pb_version"
GOBIN="$tools" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$GRPC_GEN_VERSION"

out="$root/internal"
if $check; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
PATH="$tools:$PATH" protoc -I internal -I /usr/include \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	internal/nomadproto/*/*.proto

if $check; then
	stale=()
	for f in "$out"/nomadproto/*/*.go internal/nomadproto/*/*.pb.go; do
		name=${f#"$out"/}
		name=${name#internal/}
		a="$out/$name" b="internal/$name"
		if [[ ! -f "$a" || ! -f "$b" ]] || ! diff -q <(grep -v '^// .*protoc  *v' "$a") <(grep -v '^// .*protoc  *v' "$b") >/dev/null; then
			stale+=("$b")
		fi
	done
	if ((${#stale[@]})); then
		printf 'gen-proto.sh: out of date with the .proto files (run make proto): %s\n' "$(printf '%s\n' "${stale[@]}" | sort -u | tr '\n' ' ')" >&2
		exit 1
	fi
	echo "gen-proto.sh: internal/nomadproto is up to date"
fi
