package channel

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// OpenPort opens the virtio-serial port called name (its device is
// /dev/vportNpM; the name is in /sys/class/virtio-ports/vportNpM/name).
func OpenPort(name string) (io.ReadWriteCloser, error) {
	dev, err := FindPort("/sys/class/virtio-ports", name)
	if err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join("/dev", dev), os.O_RDWR, 0)
}

// FindPort returns the device name of the port called name under sysDir.
func FindPort(sysDir, name string) (string, error) {
	ents, err := os.ReadDir(sysDir)
	if err != nil {
		return "", fmt.Errorf("virtio-serial port %q: %w", name, err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("virtio-serial port %q: not found under %s", name, sysDir)
}
