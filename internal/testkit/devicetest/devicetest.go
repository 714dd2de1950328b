// Package devicetest drives the plugin as a Nomad client does, for tests:
// over real gRPC, with a client built from the project's own protocol files
// (internal/nomadproto), either to the built binary launched through
// go-plugin (Launch) or to a plugin value in the test's process (Serve).
// Configuration is encoded as the agent encodes it, with the schema the
// plugin returns over the wire. Helpers fail the test on what a test does
// not expect, and clean up when it ends.
package devicetest

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
)

// callTimeout bounds one unary call of a test.
const callTimeout = 5 * time.Minute

// Client is a device plugin as Nomad's agent sees it.
type Client struct {
	nomadplugin.Conn
	t testing.TB
}

// Serve serves p in the test's process, over real gRPC on an in-memory
// connection, until the test ends.
func Serve(t testing.TB, p nomadplugin.DevicePlugin) *Client {
	t.Helper()
	conn, stop, err := nomadplugin.Connect(p)
	if err != nil {
		t.Fatalf("serving the plugin in process: %v", err)
	}
	t.Cleanup(stop)
	return &Client{Conn: conn, t: t}
}

// ctx is a context for one unary call.
func (c *Client) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	c.t.Cleanup(cancel)
	return ctx
}

// Info asks PluginInfo.
func (c *Client) Info() (*basepb.PluginInfoResponse, error) {
	return c.Base.PluginInfo(c.ctx(), &basepb.PluginInfoRequest{})
}

// Encode is what the agent would send to SetConfig for the HCL config
// block, with the schema the plugin returns from ConfigSchema (which must
// answer). The error is the agent's: the block does not fit the schema.
func (c *Client) Encode(block string) ([]byte, error) {
	c.t.Helper()
	res, err := c.Base.ConfigSchema(c.ctx(), &basepb.ConfigSchemaRequest{})
	if err != nil {
		c.t.Fatalf("ConfigSchema: %v", err)
	}
	return pluginhost.EncodeConfig(res.GetSpec(), block)
}

// SetConfig encodes block as the agent does (the test fails if it does
// not fit the schema) and sends it; the error is the plugin's answer.
func (c *Client) SetConfig(block string) error {
	c.t.Helper()
	b, err := c.Encode(block)
	if err != nil {
		c.t.Fatalf("encoding the config: %v", err)
	}
	_, err = c.Base.SetConfig(c.ctx(), &basepb.SetConfigRequest{MsgpackConfig: b, PluginApiVersion: nomadplugin.DeviceAPIVersion})
	return err
}

// Reserve asks for the instances ids.
func (c *Client) Reserve(ids ...string) (*devicepb.ContainerReservation, error) {
	res, err := c.Device.Reserve(c.ctx(), &devicepb.ReserveRequest{DeviceIds: ids})
	if err != nil {
		return nil, err
	}
	return res.GetContainerRes(), nil
}

// Stream is an open Fingerprint or Stats stream: its messages arrive on C,
// which is closed when the stream ends; Err then says why (nil for a clean
// end).
type Stream[T any] struct {
	C   <-chan T
	mu  sync.Mutex
	err error
}

// Err is why the stream ended (nil while it runs, or for a clean end).
func (s *Stream[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// recv starts reading a server stream into a Stream until it ends or ctx
// (the stream's) is done; a message nobody reads by then is dropped.
func recv[T any](ctx context.Context, recvOne func() (T, error)) *Stream[T] {
	ch := make(chan T)
	s := &Stream[T]{C: ch}
	go func() {
		defer close(ch)
		for {
			m, err := recvOne()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.mu.Lock()
					s.err = err
					s.mu.Unlock()
				}
				return
			}
			select {
			case ch <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return s
}

// Fingerprint opens the fingerprint stream until ctx is done. An error
// opening it is returned (a stream that fails at once shows its error on
// the first receive, as in Nomad's agent).
func (c *Client) Fingerprint(ctx context.Context) (*Stream[*devicepb.FingerprintResponse], error) {
	st, err := c.Device.Fingerprint(ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		return nil, err
	}
	return recv(ctx, st.Recv), nil
}

// Stats opens the stats stream at interval until ctx is done.
func (c *Client) Stats(ctx context.Context, interval time.Duration) (*Stream[*devicepb.StatsResponse], error) {
	st, err := c.Device.Stats(ctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(interval)})
	if err != nil {
		return nil, err
	}
	return recv(ctx, st.Recv), nil
}

// Next returns the stream's next message within the time given; it fails
// the test when the stream ends or is silent that long.
func Next[T any](t testing.TB, s *Stream[T], within time.Duration) T {
	t.Helper()
	var zero T
	select {
	case m, ok := <-s.C:
		if !ok {
			t.Fatalf("the stream ended: %v", s.Err())
		}
		return m
	case <-time.After(within):
		t.Fatalf("no message within %s", within)
	}
	return zero
}

// Group returns the device group named name; it fails the test without one.
func Group(t testing.TB, groups []*devicepb.DeviceGroup, name string) *devicepb.DeviceGroup {
	t.Helper()
	for _, g := range groups {
		if g.GetDeviceName() == name {
			return g
		}
	}
	t.Fatalf("no device group %q", name)
	return nil
}
