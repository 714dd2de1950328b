plugin "nomad-device-zfs" {
  config {
    parent_dataset = 
