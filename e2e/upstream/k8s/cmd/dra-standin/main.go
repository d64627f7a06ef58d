// Command dra-standin is a minimal DRA kubelet plugin for the e2e tests, built
// on the upstream helper k8s.io/dynamic-resource-allocation/kubeletplugin, to
// prove kubelet-node's DRA path without fumarole's own plugin.
//
// It registers driver --driver (standin.example.com) through
// --registry-dir/<driver>-reg.sock, serves the DRA gRPC service (v1 and
// v1beta1, as the helper does) on --plugin-data-dir/dra.sock, and prepares
// every allocated device of its driver in a claim to the CDI device
// `<driver>/dev=<device>`. It publishes no ResourceSlices: the tests write
// the claims' allocations themselves.
//
// Every call is appended as one JSON line to --calls-file (and printed to
// stdout):
//
//	{"at":"...","method":"Registered"}
//	{"at":"...","method":"NodePrepareResources","claims":[{"namespace":"default","name":"c","uid":"...",
//	  "devices":[{"request":"gpu","pool":"node-a","device":"dev-0","cdi_device_ids":["standin.example.com/dev=dev-0"]}]}]}
//	{"at":"...","method":"NodeUnprepareResources","claims":[{"namespace":"default","name":"c","uid":"..."}]}
//
// While the file --fail-prepare-file exists, every claim's preparation fails
// (the call is still recorded, with "error").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "dra-standin: "+format+"\n", args...)
	os.Exit(1)
}

// call is one line of --calls-file.
type call struct {
	At     time.Time   `json:"at"`
	Method string      `json:"method"`
	Claims []claimCall `json:"claims,omitempty"`
	Error  string      `json:"error,omitempty"`
}

type claimCall struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	UID       string       `json:"uid"`
	Devices   []deviceCall `json:"devices,omitempty"`
}

type deviceCall struct {
	Request      string   `json:"request"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
}

type standin struct {
	driver   string
	failFile string

	mu    sync.Mutex
	calls *os.File
}

func (s *standin) record(c call) {
	c.At = time.Now().UTC()
	line, _ := json.Marshal(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Println(string(line))
	if s.calls != nil {
		_, _ = s.calls.Write(append(line, '\n'))
	}
}

// PrepareResourceClaims gives each allocated device of this driver the CDI
// device <driver>/dev=<device>.
func (s *standin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	var failErr error
	if s.failFile != "" {
		if _, err := os.Stat(s.failFile); err == nil {
			failErr = fmt.Errorf("dra-standin: failing on purpose (%s exists)", s.failFile)
		}
	}
	out := map[types.UID]kubeletplugin.PrepareResult{}
	rec := call{Method: "NodePrepareResources"}
	for _, claim := range claims {
		cc := claimCall{Namespace: claim.Namespace, Name: claim.Name, UID: string(claim.UID)}
		var devices []kubeletplugin.Device
		if claim.Status.Allocation != nil {
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != s.driver {
					continue
				}
				cdi := []string{fmt.Sprintf("%s/dev=%s", s.driver, r.Device)}
				devices = append(devices, kubeletplugin.Device{
					Requests:     []string{r.Request},
					PoolName:     r.Pool,
					DeviceName:   r.Device,
					CDIDeviceIDs: cdi,
				})
				cc.Devices = append(cc.Devices, deviceCall{Request: r.Request, Pool: r.Pool, Device: r.Device, CDIDeviceIDs: cdi})
			}
		}
		if failErr != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: failErr}
		} else {
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
		}
		rec.Claims = append(rec.Claims, cc)
	}
	if failErr != nil {
		rec.Error = failErr.Error()
	}
	s.record(rec)
	return out, nil
}

// UnprepareResourceClaims has nothing to undo; it records the call.
func (s *standin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	rec := call{Method: "NodeUnprepareResources"}
	for _, c := range claims {
		out[c.UID] = nil
		rec.Claims = append(rec.Claims, claimCall{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)})
	}
	s.record(rec)
	return out, nil
}

func (s *standin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		fail("%s: %v", msg, err)
	}
}

func (s *standin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func main() {
	driver := flag.String("driver", "standin.example.com", "DRA driver name")
	nodeName := flag.String("node-name", "", "the Node the plugin runs on")
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server (default $KUBECONFIG)")
	registryDir := flag.String("registry-dir", "", "the kubelet's plugins_registry directory: <driver>-reg.sock is created there (required)")
	dataDir := flag.String("plugin-data-dir", "", "directory of the DRA service socket dra.sock (required; created if missing)")
	callsFile := flag.String("calls-file", "", "append each call as a JSON line here")
	failFile := flag.String("fail-prepare-file", "", "while this file exists, every claim's preparation fails")
	klog.InitFlags(flag.CommandLine)
	flag.Parse()
	if *registryDir == "" || *dataDir == "" {
		fail("--registry-dir and --plugin-data-dir are required")
	}
	for _, d := range []*string{registryDir, dataDir} {
		abs, err := filepath.Abs(*d)
		if err != nil {
			fail("%v", err)
		}
		*d = abs
	}
	if err := os.MkdirAll(*dataDir, 0o750); err != nil {
		fail("%v", err)
	}
	if err := os.MkdirAll(*registryDir, 0o750); err != nil {
		fail("%v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	cfg.UserAgent = "dra-standin/" + *driver
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	s := &standin{driver: *driver, failFile: *failFile}
	if *callsFile != "" {
		f, err := os.OpenFile(*callsFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fail("%v", err)
		}
		defer f.Close()
		s.calls = f
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(*driver),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.PluginDataDirectoryPath(*dataDir),
	}
	if *nodeName != "" {
		opts = append(opts, kubeletplugin.NodeName(*nodeName))
	}
	helper, err := kubeletplugin.Start(ctx, s, opts...)
	if err != nil {
		fail("start: %v", err)
	}
	// Record the kubelet's NotifyRegistrationStatus once it came.
	go func() {
		for ctx.Err() == nil {
			if st := helper.RegistrationStatus(); st != nil {
				c := call{Method: "Registered"}
				if !st.PluginRegistered {
					c.Method, c.Error = "RegistrationFailed", st.Error
				}
				s.record(c)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	<-ctx.Done()
	helper.Stop()
}
