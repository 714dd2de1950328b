package zfs

// Usage is the space a dataset uses, from the properties of one read:
// used, available, referenced, refquota (its quota) and compressratio.
// A property the read did not ask for, or that does not parse, is zero.
type Usage struct {
	Used, Available, Referenced, Quota uint64
	CompressRatio                      float64
}

// Usage returns d's usage, from the properties read (see Usage).
func (d Dataset) Usage() Usage {
	var u Usage
	u.Used, _ = d.Bytes("used")
	u.Available, _ = d.Bytes("available")
	u.Referenced, _ = d.Bytes("referenced")
	u.Quota, _ = d.Bytes("refquota")
	if v, ok := d.Value("compressratio"); ok {
		u.CompressRatio, _ = ParseRatio(v)
	}
	return u
}
