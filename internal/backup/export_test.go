package backup

// ReleasesWaiting is how many archive passes wait for a pass under way.
func (k *Keeper) ReleasesWaiting() int32 { return k.releasesWaiting.Load() }
