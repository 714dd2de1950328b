# The plugin block of the wire's golden test (internal/config/golden_test.go,
# e2e/wire_test.go): every field of the schema, some left to their
# defaults, both ways of writing properties, several classes of each kind.
# agent-setconfig.msgpack beside it is what a real Nomad agent sent to
# SetConfig for this block. The files named must exist wherever the test
# validates them: /etc/passwd stands in for the token and TLS files.
plugin "nomad-device-zfs" {
  config {
    parent_dataset  = "tank/nomad"
    stats_period    = "5s"
    reserve_timeout = "45s"
    archive_quota   = "200GiB"
    key_dir         = "/var/lib/nomad-device-zfs/keys"
    backup_dir      = "/mnt/zfs-backups"

    nomad {
      address         = "https://127.0.0.1:4646"
      token_file      = "/etc/passwd"
      ca_file         = "/etc/passwd"
      cert_file       = "/etc/passwd"
      key_file        = "/etc/passwd"
      tls_server_name = "client.global.nomad"
      node_id         = "0b1c2d3e-0000-4000-8000-000000000001"
    }

    telemetry {
      prometheus_address = "127.0.0.1:9464"
    }

    class "scratch" {
      slots      = 2
      quota      = "64MiB"
      mount_path = "/data/scratch"
      read_only  = false
      owner      = "1000:1000"
      mode       = "0750"
      restore    = "required"
      keep       = 3
      max_age    = "168h"
      backup_interval = "5m"
      max_restore_lag = "15m"
      properties = {
        compression = "on"
        atime       = "off"
      }
    }

    class "tmp" {
      slots      = "1"
      quota      = "1G"
      on_release = "destroy"
      properties {
        recordsize = "128K"
      }
    }

    class "models" {
      shared  = true
      dataset = "tank/models"
      slots   = 4
    }

    class "golden" {
      slots  = 1
      quota  = "1GiB"
      source = "tank/golden@v1"
    }

    class "secret" {
      slots      = 1
      quota      = "1GiB"
      encryption = true
      restore    = "best-effort"
    }
  }
}
