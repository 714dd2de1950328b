plugin "nomad-device-zfs" {
  config {
    parent_dataset = "tank/nomad"
    class "scratch" {
      slots = 2
      quota = "10Q"
    }
  }
}
