package nomadtest

import (
	"testing"

	"github.com/shoenig/test/must"
)

// TestJobSpecHCL pins what HCL renders: defaults (batch, exec, 32 MiB, no
// reschedule), every option, and scripts that reach the
// args as written: a heredoc for several lines, a quoted string for one
// (HCL's escapes and template sequences escaped).
func TestJobSpecHCL(t *testing.T) {
	cases := []struct {
		name string
		job  JobSpec
		want string
	}{
		{
			name: "defaults",
			job: JobSpec{ID: "checker", Tasks: []TaskSpec{{
				Name: "c", Script: "set -eu\necho done\n", Device: "zfs/dataset/scratch",
			}}},
			want: `job "checker" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "c" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          set -eu
          echo done
          EOT
        ]
      }
      resources {
        cpu    = 100
        memory = 32
        device "zfs/dataset/scratch" {
          count = 1
        }
      }
    }
  }
}
`,
		},
		{
			name: "every option",
			job: JobSpec{
				ID: "keeper", Namespace: "other", Type: "service", Reschedule: true, Parameterized: true,
				Meta: map[string]string{"round": "2", "a": "b"},
				Constraints: []Constraint{
					{Attribute: "${node.unique.id}", Value: "n1"},
					{Attribute: "${meta.nomad_device_zfs.archives}", Operator: "set_contains", Value: "default/keeper/g"},
				},
				Tasks: []TaskSpec{
					{Name: "main", Script: "exit 1"},
					{
						Name: "post", Driver: "raw_exec", Poststop: true, KillTimeout: "2s",
						Artifact: "http://127.0.0.1:1/a", Memory: 64,
						Script: "echo \"${HOME}\" %{x} \\ \t",
						Device: "zfs/dataset", DeviceConstraints: []Constraint{{Attribute: "${device.attr.shared}", Value: "true"}},
					},
				},
			},
			want: `job "keeper" {
  namespace = "other"
  type = "service"
  parameterized {}
  meta {
    a = "b"
    round = "2"
  }
  group "g" {
    constraint {
      attribute = "${node.unique.id}"
      value     = "n1"
    }
    constraint {
      attribute = "${meta.nomad_device_zfs.archives}"
      operator  = "set_contains"
      value     = "default/keeper/g"
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "main" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exit 1"]
      }
      resources {
        cpu    = 100
        memory = 32
      }
    }
    task "post" {
      lifecycle {
        hook = "poststop"
      }
      driver = "raw_exec"
      kill_timeout = "2s"
      artifact {
        source      = "http://127.0.0.1:1/a"
        destination = "local/"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"$${HOME}\" %%{x} \\ \t"]
      }
      resources {
        cpu    = 100
        memory = 64
        device "zfs/dataset" {
          count = 1
          constraint {
            attribute = "${device.attr.shared}"
            value     = "true"
          }
        }
      }
    }
  }
}
`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, tc.job.HCL())
		})
	}
}
