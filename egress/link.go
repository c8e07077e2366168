package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// MaxFrame is the largest frame the guest may send: an Ethernet frame of
// the NIC's MTU with a VLAN tag, rounded up. A longer length means a
// hostile or broken guest, and ends the link.
const MaxFrame = 1600

// MTU is the guest NIC's MTU.
const MTU = 1500

// readFrames reads the guest's frames from r (each after its 4-byte
// big-endian length) and hands them to ep, until r ends or fails.
func readFrames(r io.Reader, ep *channel.Endpoint) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 14 || n > MaxFrame {
			return fmt.Errorf("egress: a frame of %d bytes: want 14 to %d", n, MaxFrame)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return err
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
		ep.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

// writeFrames writes the stack's frames to w, each after its length,
// until ctx ends or w fails.
func writeFrames(ctx context.Context, w net.Conn, ep *channel.Endpoint) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var hdr [4]byte
	for {
		pkt := ep.Read()
		if pkt == nil {
			// Nothing queued: flush what is buffered, then wait.
			if err := bw.Flush(); err != nil {
				return err
			}
			if pkt = ep.ReadContext(ctx); pkt == nil {
				return ctx.Err()
			}
		}
		v := pkt.ToView()
		pkt.DecRef()
		binary.BigEndian.PutUint32(hdr[:], uint32(v.Size()))
		_, err := bw.Write(hdr[:])
		if err == nil {
			_, err = bw.Write(v.AsSlice())
		}
		v.Release()
		if err != nil {
			return err
		}
	}
}
