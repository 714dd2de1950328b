# The minimal ACL policy of nomad-device-zfs: read the node and its
# allocations, and the jobs of every namespace (Nomad leaves allocations of
# namespaces the token cannot read out of the node's allocation list, and the
# plugin would then keep their datasets forever).
#
#   nomad acl policy apply -description "nomad-device-zfs" zfs-plugin zfs-plugin.policy.hcl
#   nomad acl token create -name nomad-device-zfs -policy zfs-plugin -type client
node {
  policy = "read"
}

namespace "*" {
  capabilities = ["read-job"]
}
