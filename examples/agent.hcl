# Sample plugin block for the Nomad client agent.
#
# 1. Put the nomad-device-zfs binary in the client's plugin_dir
#    (`plugin_dir = "/opt/nomad/plugins"` in the agent configuration, or
#    `nomad agent -plugin-dir DIR`).
# 2. Create the parent dataset; the plugin never creates it:
#        zfs create tank/nomad
# 3. Add this block to the client's agent configuration (any file passed
#    with -config) and restart the agent.
#
# For each class the plugin keeps `slots` datasets
# <parent_dataset>/<class>/<0..slots-1>, each with the class quota, and
# offers them as the device instances <class>-0, <class>-1, ... of the device
# `zfs/dataset/<class>`. A job asks for one with
#
#     resources {
#       device "zfs/dataset/scratch" { count = 1 }
#     }
#
# and its task finds the dataset bind-mounted at mount_path, with these
# environment variables (NAME is the class name in upper case, '-' as '_'):
#     ZFS_NAME_DATASET    the dataset, such as tank/nomad/scratch/0 (or 0.alt)
#     ZFS_NAME_PATH       where the task sees it (mount_path)
#     ZFS_NAME_HOST_PATH  its mountpoint on the host
#
# Nomad's device API has no "release" call: the plugin follows the node's
# allocations through the Nomad HTTP API (see the nomad block) and, once the
# allocation holding a dataset has ended, takes the slot back as on_release
# says, putting a fresh dataset in its place.
#
# State lives in ZFS user properties on the datasets
# (nomad-device-zfs:managed, nomad-device-zfs:state, and the owner in
# nomad-device-zfs:owner: alloc=…&group=…&job=…&name=…&node=…&ns=…&task=…, URL-query
# encoded); the plugin touches only datasets it marked as its own.

plugin "nomad-device-zfs" {
  config {
    # Required. An existing dataset under which the plugin creates
    # <class>/<index> datasets. scripts/demo.sh replaces this value.
    parent_dataset = "tank/nomad"

    # How often the plugin reconciles the datasets with this configuration
    # and reports device health to Nomad. Default "30s".
    fingerprint_period = "30s"

    # How often the plugin reads space figures (used, available,
    # referenced, compressratio) from ZFS for `nomad node status -stats`.
    # Nomad asks every second; cached figures are served in between.
    # Default "10s".
    stats_period = "10s"

    # How long Reserve waits for a slot that is still being released (its
    # previous allocation's dataset on its way to the archive), or for a
    # read of the node's allocations that proves who asks for a dataset a
    # tenant may have written, before it fails the task start with the
    # reason (Nomad's restart policy then retries). Default "2m".
    reserve_timeout = "2m"

    # Optional: how the plugin reaches the Nomad HTTP API to follow this
    # node's allocations. Empty fields fall back to the agent's NOMAD_ADDR,
    # NOMAD_TOKEN, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and
    # NOMAD_TLS_SERVER_NAME (plugins inherit the agent's environment), then
    # to the local agent at http://127.0.0.1:4646. With ACLs, the token needs
    # node read and read-job on EVERY namespace (examples/acl): slots used by
    # jobs of a namespace it cannot see get an unknown owner and are kept,
    # unhealthy, until it can.
    # nomad {
    #   address         = "https://127.0.0.1:4646"
    #   token_file      = "/etc/nomad.d/nomad-device-zfs.token"
    #   ca_file         = "/etc/nomad.d/tls/ca.pem"
    #   cert_file       = "/etc/nomad.d/tls/client.pem"
    #   key_file        = "/etc/nomad.d/tls/client-key.pem"
    #   tls_server_name = "client.global.nomad"
    #   node_id         = ""  # learned from the local agent when empty
    # }

    # Optional: serve Prometheus metrics (slots by state, Reserve and
    # release durations and outcomes, zfs commands, Nomad API read
    # failures, pool free bytes, per-slot used bytes) at
    # http://<address>/metrics. Off when absent. See docs/operations.md.
    # telemetry {
    #   prometheus_address = "127.0.0.1:9715"
    # }

    # One block per class of dataset; the label is the class name (lower
    # case letters, digits and '-', starting with a letter).
    class "scratch" {
      # Required. Number of datasets (device instances) of this class.
      slots = 2

      # Required. ZFS quota of each dataset: a size such as "512M", "10G".
      # Exposed as the device attribute `quota` (in binary units, such as
      # 64 MiB), which a job's device block can constrain:
      #   device "zfs/dataset/scratch" {
      #     count = 1
      #     constraint {
      #       attribute = "${device.attr.quota}"
      #       operator  = ">="
      #       value     = "5 GiB"
      #     }
      #   }
      quota = "64M"

      # Where tasks see the dataset. Default "/zfs/<class>". A task given
      # several instances of the class sees them at <mount_path>/0, /1, ...
      mount_path = "/zfs/scratch"

      # Mount the dataset read-only in tasks. Default false.
      read_only = false

      # Owner ("uid:gid" or "user:group") and octal mode of each dataset's
      # root directory. The default lets tasks of the exec driver, which
      # run as nobody, write. Defaults "65534:65534" and "0770".
      owner = "65534:65534"
      mode  = "0770"

      # What happens to a dataset once the allocation that held it has
      # ended: "archive" (default) moves it, data included, to
      # <parent_dataset>/.archive/<class>-<n>.<namespace>.<job>.<group>.<task>.<alloc>.<time>
      # (unmounted; `zfs mount` it to look inside, `zfs destroy` it when done);
      # "destroy" deletes it. Either way a fresh dataset takes the slot.
      on_release = "archive"

      # Extra ZFS properties for new datasets. mountpoint, canmount, quota
      # and refquota are the plugin's and may not be set here.
      properties = {
        compression = "on"
        atime       = "off"
      }
    }

    # More kinds of class (docs/configuration.md):
    #
    # One dataset the operator fills, held by up to 16 tasks at once,
    # read-only; the plugin never writes, renames or destroys it:
    #   class "models" {
    #     shared     = true
    #     dataset    = "tank/models"
    #     slots      = 16
    #     mount_path = "/models"
    #   }
    #
    # Each fresh dataset a zfs clone of a golden snapshot (outside
    # parent_dataset, in its pool); such a class destroys at release:
    #   class "ci" {
    #     slots  = 8
    #     quota  = "20GiB"
    #     source = "tank/golden/ci@v42"
    #   }
    #
    # Each dataset encrypted with its own key in key_dir (a top-level
    # setting, default /var/lib/nomad-device-zfs/keys), removed after the
    # dataset; OpenZFS only:
    #   class "secret" {
    #     slots      = 4
    #     quota      = "10GiB"
    #     encryption = true
    #   }
  }
}
