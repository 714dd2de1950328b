plugin "nomad-device-zfs" {
  config {
    parent_dataset = "tank/one"
    class "a" {
      slots = 1
      quota = "1G"
    }
  }
}
plugin "nomad-device-zfs" {
  config {
    parent_dataset = "tank/two"
    class "b" {
      slots = 2
      quota = "2G"
    }
  }
}
