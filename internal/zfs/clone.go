package zfs

import "context"

// Clone runs `zfs clone -o k=v ... snapshot name`, with the properties in
// sorted order: a dataset that starts with the snapshot's contents and
// shares its blocks (one command, the cost of a create). The clone depends
// on the snapshot until it is destroyed: zfs refuses to destroy a snapshot
// that has clones. It does not create missing parents.
func (c *Client) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	if err := checkSnapshot(snapshot); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	args := []string{"clone"}
	for _, k := range sortedKeys(props) {
		if err := checkProp(k); err != nil {
			return err
		}
		args = append(args, "-o", k+"="+props[k])
	}
	args = append(args, snapshot, name)
	_, err := c.Runner.ZFSCmd(ctx, args...)
	return err
}
