package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubeletPluginDir is where devicemanager.NewManagerImpl serves kubelet.sock
// and keeps its checkpoint: /var/lib/kubelet/device-plugins. The exported
// constructor takes no other path.
var kubeletPluginDir = filepath.Dir(pluginapi.KubeletSocket)

// bindPluginDir makes hostDir appear at kubeletPluginDir for this process
// only. It refuses to run unless the process already has a mount namespace
// of its own, different from its parent's (started under `unshare --mount
// --propagation private`, which execs it), so the host's mount table is never
// touched. Nothing is created on the host: when
// kubeletPluginDir does not exist, a tmpfs is mounted over its deepest
// existing ancestor below /var (usually /var/lib) to make the mount point.
func bindPluginDir(hostDir string) error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("reading this process's mount namespace: %w", err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return fmt.Errorf("reading the parent's mount namespace: %w", err)
	}
	if self == parent {
		return errors.New("not in a private mount namespace: run under `unshare --mount --propagation private`")
	}
	// Whatever propagation unshare(1) left, nothing mounted here reaches the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	// Hold the source open: the tmpfs below may hide its path.
	src, err := unix.Open(hostDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", hostDir, err)
	}
	defer unix.Close(src)

	if !isDir(kubeletPluginDir) {
		base := filepath.Dir(kubeletPluginDir)
		for !isDir(base) {
			base = filepath.Dir(base)
		}
		if base == "/" || base == "/var" {
			return fmt.Errorf("no mount point for %s: %s is the deepest existing ancestor", kubeletPluginDir, base)
		}
		if err := unix.Mount("kubelet-node", base, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mounting a tmpfs on %s: %w", base, err)
		}
		if err := os.MkdirAll(kubeletPluginDir, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", src), kubeletPluginDir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s on %s: %w", hostDir, kubeletPluginDir, err)
	}
	return nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
