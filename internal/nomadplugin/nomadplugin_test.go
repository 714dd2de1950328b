package nomadplugin

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
)

// named answers PluginInfo and leaves every other call unimplemented.
type named struct {
	basepb.UnimplementedBasePluginServer
	devicepb.UnimplementedDevicePluginServer
}

func (named) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	return &basepb.PluginInfoResponse{Type: basepb.PluginType_DEVICE, Name: "named"}, nil
}

// TestConnect: a plugin served in process answers over real gRPC, a call
// it does not implement is gRPC's Unimplemented, and stop ends both ends
// (twice is fine).
func TestConnect(t *testing.T) {
	conn, stop, err := Connect(named{})
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := conn.Base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	must.NoError(t, err)
	must.Eq(t, "named", info.GetName())
	_, err = conn.Device.Reserve(ctx, &devicepb.ReserveRequest{})
	must.Eq(t, codes.Unimplemented, status.Code(err))
	stop()
	stop()
	_, err = conn.Base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	must.Error(t, err)
}

func TestLaunched(t *testing.T) {
	t.Setenv(MagicCookieKey, "")
	must.False(t, Launched())
	t.Setenv(MagicCookieKey, MagicCookieValue)
	must.True(t, Launched())
}
