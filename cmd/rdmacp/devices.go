package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// Device lists: `cp -d mlx5_0,mlx5_1` spreads one session's data QPs
// over the devices, rail i on device i (to the target's address i, when
// it listens on several): see initiator/devices.go. `serve -d a,b` opens
// the devices and binds each --listen address on the one that owns it;
// without -d, an address another device owns opens that device (with
// -d naming one, such an address is an error, as before).

// deviceNames is -d split at commas: [""] when not given (the provider
// picks).
func deviceNames(c *cli.Context) []string {
	var names []string
	for _, n := range strings.Split(c.String("device"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return []string{""}
	}
	return names
}

// checkDeviceList refuses a -d list a session can't use: one device
// twice, or a list for a transport of one device.
func checkDeviceList(c *cli.Context, provider string) error {
	names := deviceNames(c)
	if len(names) < 2 {
		return nil
	}
	if provider == iwarp.Name {
		return usagef("-d %s: %s has one device (%s); spread a session over several addresses with --bind (and the target's --listen) instead", c.String("device"), iwarp.Name, iwarp.DeviceName)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return usagef("-d %s: device %s listed twice", c.String("device"), n)
		}
		seen[n] = true
	}
	return nil
}

// openMore opens the devices of -d after the first (which dev is), with
// dev's provider and the same port and GID choice.
func openMore(c *cli.Context, dev verbs.Device) ([]verbs.Device, error) {
	if err := checkDeviceList(c, dev.Provider()); err != nil {
		return nil, err
	}
	names := deviceNames(c)[1:]
	if len(names) == 0 {
		return nil, nil
	}
	p, err := registry().Lookup(dev.Provider())
	if err != nil {
		return nil, err
	}
	var more []verbs.Device
	for _, n := range names {
		d, err := p.Open(c.Context, verbs.DeviceConfig{Name: n, Port: c.Int("ib-port"), GIDIndex: c.Int("gid-index")})
		if err != nil {
			for _, o := range more {
				o.Close()
			}
			return nil, fmt.Errorf("%w: -d %s: %w", errTransport, n, err)
		}
		more = append(more, d)
	}
	return more, nil
}

// serveDevices is where serve listens: each address on the first of
// devs that owns it (a device refuses, as invalid, an address another
// device owns); when none does and -d was not given, on another active
// device of the same provider, which it opens. It returns the listeners,
// each tagged with its device (target.OnDevice), and every device
// opened, devs first; on error it has closed what it opened.
func serveDevices(ctx context.Context, c *cli.Context, devs []verbs.Device, addrs []string) ([]verbs.Listener, []verbs.Device, error) {
	var lns []verbs.Listener
	fail := func(err error) ([]verbs.Listener, []verbs.Device, error) {
		for _, l := range lns {
			l.Close()
		}
		for _, d := range devs[1:] {
			d.Close()
		}
		return nil, nil, err
	}
	for _, a := range addrs {
		ln, d, err := listenOn(ctx, devs, a)
		if err != nil && errors.Is(err, verbs.ErrInvalid) && c.String("device") == "" {
			more := otherDevices(ctx, c, devs)
			devs = append(devs, more...)
			if len(more) > 0 {
				ln, d, err = listenOn(ctx, more, a)
			}
		}
		if err != nil {
			return fail(listenError(a, err))
		}
		lns = append(lns, target.OnDevice(d, ln))
	}
	return lns, unused(devs, lns), nil
}

// listenOn listens on addr with the first of devs that takes it.
func listenOn(ctx context.Context, devs []verbs.Device, addr string) (verbs.Listener, verbs.Device, error) {
	err := fmt.Errorf("no device for %s: %w", addr, verbs.ErrInvalid)
	for _, d := range devs {
		var ln verbs.Listener
		if ln, err = d.Listen(ctx, addr); err == nil {
			return ln, d, nil
		}
		if !errors.Is(err, verbs.ErrInvalid) {
			return nil, nil, err
		}
	}
	return nil, nil, err
}

// otherDevices opens the active devices of devs[0]'s provider that devs
// do not hold.
func otherDevices(ctx context.Context, c *cli.Context, devs []verbs.Device) []verbs.Device {
	p, err := registry().Lookup(devs[0].Provider())
	if err != nil {
		return nil
	}
	infos, err := p.Devices(ctx)
	if err != nil {
		return nil
	}
	open := map[string]bool{}
	for _, d := range devs {
		open[d.Name()] = true
	}
	var more []verbs.Device
	for _, in := range infos {
		if !in.Active || open[in.Name] {
			continue
		}
		d, err := p.Open(ctx, verbs.DeviceConfig{Name: in.Name, Port: c.Int("ib-port"), GIDIndex: c.Int("gid-index")})
		if err != nil {
			continue // not one that owns the address, as far as we can tell
		}
		more = append(more, d)
	}
	return more
}

// unused closes the devices of devs after the first that no listener
// of lns is on, and returns the others.
func unused(devs []verbs.Device, lns []verbs.Listener) []verbs.Device {
	on := map[verbs.Device]bool{}
	for _, ln := range lns {
		on[target.DeviceOf(ln)] = true
	}
	keep := devs[:1]
	for _, d := range devs[1:] {
		if on[d] {
			keep = append(keep, d)
		} else {
			d.Close()
		}
	}
	return keep
}

func closeAll(devs []verbs.Device) {
	for _, d := range devs {
		d.Close()
	}
}

func deviceNamesOf(devs []verbs.Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.Name()
	}
	return out
}
