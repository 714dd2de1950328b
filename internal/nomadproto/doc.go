// Package nomadproto is Nomad's device-plugin protocol as this project
// reads it off the wire: the base service (PluginInfo, ConfigSchema,
// SetConfig), the device service (Fingerprint and Stats streams, Reserve)
// and the messages they carry (the config schema, attributes, statistics).
// It holds no code: each proto package is a Go package of its own below
// it, as Nomad splits them:
//
//	basepb     hashicorp.nomad.plugins.base.proto       the base service
//	devicepb   hashicorp.nomad.plugins.device           the device service
//	hclspecpb  hashicorp.nomad.plugins.shared.hclspec   the config schema
//	structspb  hashicorp.nomad.plugins.shared.structs   attributes, statistics
//
// basepb imports hclspecpb and devicepb imports structspb; the shared two
// import nothing of the project's.
//
// The .proto files, one in each of those directories, are the project's
// own text, written from the wire format of Nomad's device API v0.1.0
// (go-plugin protocol version 2): what must match Nomad is the service and
// method names, the proto package names (they are part of each method's
// path) and every field's number and type. Message names are kept as Nomad
// spells them so that a reader can set the two side by side; nothing else
// of Nomad's is used. The Go files named *.pb.go are generated from them
// with protoc and the standard Go generators: run `make proto` after an
// edit (scripts/gen-proto.sh pins the tools); `make lint` fails when they
// are out of date.
package nomadproto
