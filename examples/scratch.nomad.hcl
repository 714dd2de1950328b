# A batch job that asks for one scratch dataset from nomad-device-zfs (see
# examples/agent.hcl), writes a file into it, and shows what it got.
#
#   nomad job run examples/scratch.nomad.hcl
#   nomad alloc logs <alloc-id>
#
# The exec driver runs the task as nobody in a chroot; Nomad bind-mounts the
# dataset the plugin reserved at /zfs/scratch and sets ZFS_SCRATCH_DATASET,
# ZFS_SCRATCH_PATH and ZFS_SCRATCH_HOST_PATH. When the allocation is over the
# plugin takes the slot back: with on_release = "archive" (the default) the
# dataset, files included, moves to <parent_dataset>/.archive under a name
# that says which allocation used it, and a fresh dataset takes its place.
job "scratch-demo" {
  type = "batch"

  group "scratch" {
    # A demo: fail at once rather than retry.
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "write" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          set -eu
          echo "dataset:   $ZFS_SCRATCH_DATASET"
          echo "task path: $ZFS_SCRATCH_PATH"
          echo "host path: $ZFS_SCRATCH_HOST_PATH"
          echo "running as $(id)"
          echo "hello from Nomad alloc $NOMAD_ALLOC_ID (job $NOMAD_JOB_NAME) at $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
            > "$ZFS_SCRATCH_PATH/hello.txt"
          # 4 MiB of random data, so that the dataset's "used" visibly grows
          # in the device stats (compression cannot shrink it).
          dd if=/dev/urandom of="$ZFS_SCRATCH_PATH/random.bin" bs=1024 count=4096 2>/dev/null
          sync
          echo
          echo "== ls -l $ZFS_SCRATCH_PATH"
          ls -l "$ZFS_SCRATCH_PATH"
          echo
          echo "== df -h $ZFS_SCRATCH_PATH"
          df -h "$ZFS_SCRATCH_PATH"
          echo
          echo "== cat $ZFS_SCRATCH_PATH/hello.txt"
          cat "$ZFS_SCRATCH_PATH/hello.txt"
          # Keep the dataset for up to 60 s, so that it can be seen from the
          # host and in `nomad node status -stats` while it is in use; a file
          # named "done" in it (touched from the host) ends the wait early.
          i=0
          while [ "$i" -lt 60 ] && [ ! -e "$ZFS_SCRATCH_PATH/done" ]; do
            sleep 1
            i=$((i + 1))
          done
          echo
          echo "done after $i s"
          EOT
        ]
      }

      resources {
        cpu    = 100
        memory = 64

        device "zfs/dataset/scratch" {
          count = 1
        }
      }
    }
  }
}
