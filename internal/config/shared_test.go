package config

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
)

func TestConfig_SharedClass(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "models" {
    shared     = true
    dataset    = "tank/models"
    slots      = 16
    mount_path = "/models"
  }
  class "rw" {
    shared              = true
    dataset             = "other/cache"
    slots               = 2
    read_only           = false
    allow_shared_writes = true
  }
  class "scratch" {
    slots = 1
    quota = "1G"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, []shared.Class{
		{Name: "models", Dataset: "tank/models", Slots: 16, MountPath: "/models", ReadOnly: true},
		{Name: "rw", Dataset: "other/cache", Slots: 2, MountPath: "/zfs/rw", ReadOnly: false},
	}, s.Shared)
	// Shared classes are not the slot manager's, and keep no archives.
	must.SliceLen(t, 1, s.Slots.Classes)
	must.Eq(t, "scratch", s.Slots.Classes[0].Name)
	must.MapNotContainsKey(t, s.Retention.Classes, "models")
}

func TestConfig_SharedClassInvalid(t *testing.T) {
	block := func(body string) string {
		return `config {
  parent_dataset = "tank/nomad"
  class "models" {
    shared = true
    slots  = 2
    ` + body + `
  }
}`
	}
	cases := []struct{ name, body, wantErr string }{
		{"no dataset", ``, `class "models": dataset is required for a shared class`},
		{"bad dataset", `dataset = "tank//x"`, `class "models": dataset = "tank//x"`},
		{"the parent", `dataset = "tank/nomad"`, `is inside parent_dataset "tank/nomad"`},
		{"inside the parent", `dataset = "tank/nomad/scratch/0"`, `is inside parent_dataset`},
		{"holds the parent", `dataset = "tank"`, `holds parent_dataset "tank/nomad"`},
		{"writes without allowing", "dataset = \"tank/m\"\n read_only = false", `class "models": read_only = false: tasks holding a shared dataset at once`},
		{"allow with read_only", "dataset = \"tank/m\"\n allow_shared_writes = true", `class "models": allow_shared_writes = true with read_only = true`},
		{"quota", "dataset = \"tank/m\"\n quota = \"1G\"", `class "models": quota: not for a shared class`},
		{"properties", "dataset = \"tank/m\"\n properties { compression = \"lz4\" }", `class "models": properties: not for a shared class`},
		{"on_release", "dataset = \"tank/m\"\n on_release = \"destroy\"", `class "models": on_release: not for a shared class`},
		{"restore", "dataset = \"tank/m\"\n restore = \"required\"", `class "models": restore: not for a shared class`},
		{"keep", "dataset = \"tank/m\"\n keep = 2", `class "models": keep: not for a shared class`},
		{"source", "dataset = \"tank/m\"\n source = \"tank/g@1\"", `class "models": source: not for a shared class`},
		{"owner", "dataset = \"tank/m\"\n owner = \"0:0\"", `class "models": owner/mode: not for a shared class`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode(t, block(tc.body))
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
	// And the shared-only fields on an exclusive class.
	for _, f := range []string{`dataset = "tank/m"`, `allow_shared_writes = true`} {
		_, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "scratch" {
    slots = 1
    quota = "1G"
    `+f+`
  }
}`)
		must.ErrorContains(t, err, "only for a shared class (shared = true)")
	}
}

func TestConfig_Source(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "ci" {
    slots  = 2
    quota  = "1G"
    source = "tank/golden/ci@v42"
  }
}`)
	must.NoError(t, err)
	c := s.Slots.Classes[0]
	must.Eq(t, "tank/golden/ci@v42", c.Source)
	must.Eq(t, "destroy", c.OnRelease, must.Sprint("a class with a source does not archive"))

	block := func(body string) string {
		return `config {
  parent_dataset = "tank/nomad"
  class "ci" {
    slots = 2
    quota = "1G"
    ` + body + `
  }
}`
	}
	for _, tc := range []struct{ name, body, wantErr string }{
		{"not a snapshot", `source = "tank/golden/ci"`, `class "ci": source = "tank/golden/ci": not a snapshot name`},
		{"empty snapshot", `source = "tank/golden/ci@"`, `not a snapshot name`},
		{"bad dataset", `source = "tank//g@v1"`, `class "ci": source = "tank//g@v1"`},
		{"inside the parent", `source = "tank/nomad/ci/0@v1"`, `is inside parent_dataset "tank/nomad"`},
		{"another pool", `source = "other/golden@v1"`, `is in pool "other", and parent_dataset "tank/nomad" in pool "tank"`},
		{"archive", "source = \"tank/g@v1\"\n on_release = \"archive\"", `class "ci": on_release = "archive": a class with a source does not archive`},
		{"restore", "source = \"tank/g@v1\"\n restore = \"required\"", `class "ci": restore = "required": a restore brings back an archive`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode(t, block(tc.body))
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestConfig_Encryption(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "secret" {
    slots      = 2
    quota      = "1G"
    encryption = true
  }
  class "plain" {
    slots = 1
    quota = "1G"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, DefaultKeyDir, s.Slots.KeyDir)
	must.True(t, s.Slots.Classes[1].Encrypted)
	must.False(t, s.Slots.Classes[0].Encrypted)
	must.True(t, s.Encrypted)

	// key_dir stays known without an encrypted class: keys of datasets
	// made while one was encrypted are removed with them.
	s, err = decode(t, `config {
  parent_dataset = "tank/nomad"
  key_dir = "/srv/keys"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, "/srv/keys", s.Slots.KeyDir)
	must.False(t, s.Encrypted)

	for _, tc := range []struct{ name, block, wantErr string }{
		{"relative key_dir", `config {
  parent_dataset = "tank/nomad"
  key_dir = "keys"
  class "a" {
    slots = 1
    quota = "1G"
    encryption = true
  }
}`, `key_dir = "keys": must be an absolute, clean path`},
		{"with a source", `config {
  parent_dataset = "tank/nomad"
  class "a" {
    slots = 1
    quota = "1G"
    encryption = true
    source = "tank/g@v1"
  }
}`, `class "a": encryption: not with source = "tank/g@v1"`},
		{"shared", `config {
  parent_dataset = "tank/nomad"
  class "a" {
    shared = true
    dataset = "tank/m"
    slots = 1
    encryption = true
  }
}`, `class "a": encryption: not for a shared class`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode(t, tc.block)
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}
