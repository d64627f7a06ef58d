// Command kubelet-dm plays the kubelet's side of the device-plugin protocol
// for tests, using the kubelet's own code
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1): the
// Registration server on <socket-dir>/kubelet.sock and the kubelet's gRPC
// client to each registered plugin.
//
// It records every registration, disconnection and ListAndWatch update, and
// is driven over a loopback HTTP port with JSON in and out. The API is
// documented in e2e/README.md. On startup it prints one JSON line to stdout:
//
//	{"addr":"127.0.0.1:PORT","socket":"/dir/kubelet.sock"}
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// Event is one recorded happening, in order. Seq starts at 1.
type Event struct {
	Seq      uint64    `json:"seq"`
	At       time.Time `json:"at"`
	Kind     string    `json:"kind"` // "registered", "disconnected", "list_and_watch"
	Resource string    `json:"resource"`
	// Endpoint is the plugin socket path (registered).
	Endpoint string `json:"endpoint,omitempty"`
	// Options is what GetDevicePluginOptions returned at registration, as
	// the kubelet's device manager asks right after connecting (registered).
	Options *pluginapi.DevicePluginOptions `json:"options,omitempty"`
	// Devices is the full device list of one ListAndWatch response (list_and_watch).
	Devices []*pluginapi.Device `json:"devices,omitempty"`
	// Generation counts kubelet (re)starts; 1 for the first.
	Generation uint64 `json:"generation"`
}

type state struct {
	mu         sync.Mutex
	cond       *sync.Cond
	events     []Event
	plugins    map[string]plugin.DevicePlugin
	devices    map[string][]*pluginapi.Device
	generation uint64
}

func newState() *state {
	s := &state{plugins: map[string]plugin.DevicePlugin{}, devices: map[string][]*pluginapi.Device{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *state) record(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.Seq = uint64(len(s.events)) + 1
	e.At = time.Now().UTC()
	e.Generation = s.generation
	s.events = append(s.events, e)
	s.cond.Broadcast()
}

// CleanupPluginDirectory removes every socket in the directory, like the
// kubelet's device manager does before serving kubelet.sock.
func (s *state) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		st, err := os.Stat(p)
		if err != nil || st.IsDir() || st.Mode()&os.ModeSocket == 0 {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *state) PluginConnected(ctx context.Context, resource string, p plugin.DevicePlugin) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, err := p.API().GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("failed to get device plugin options: %v", err)
	}
	s.mu.Lock()
	s.plugins[resource] = p
	s.mu.Unlock()
	s.record(Event{Kind: "registered", Resource: resource, Endpoint: p.SocketPath(), Options: opts})
	return nil
}

// PluginDisconnected forgets the plugin only when the socket that went away
// is the one connected now (the kubelet keeps endpoints per socket path).
func (s *state) PluginDisconnected(_ klog.Logger, resource, socketPath string) {
	s.mu.Lock()
	if p, ok := s.plugins[resource]; ok && p.SocketPath() == socketPath {
		delete(s.plugins, resource)
	}
	s.mu.Unlock()
	s.record(Event{Kind: "disconnected", Resource: resource, Endpoint: socketPath})
}

func (s *state) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	s.mu.Lock()
	s.devices[resource] = resp.Devices
	s.mu.Unlock()
	s.record(Event{Kind: "list_and_watch", Resource: resource, Devices: resp.Devices})
}

func (s *state) plugin(resource string) (plugin.DevicePlugin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.plugins[resource]
	if !ok {
		return nil, fmt.Errorf("no connected plugin for resource %q", resource)
	}
	return p, nil
}

type kubelet struct {
	st     *state
	socket string
	mu     sync.Mutex
	srv    plugin.Server
}

func (k *kubelet) start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	srv, err := plugin.NewServer(klog.Background(), k.socket, k.st, k.st)
	if err != nil {
		return err
	}
	k.st.mu.Lock()
	k.st.generation++
	k.st.mu.Unlock()
	if err := srv.Start(klog.Background()); err != nil {
		return err
	}
	k.srv = srv
	return nil
}

func (k *kubelet) stop() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.srv == nil {
		return nil
	}
	err := k.srv.Stop(klog.Background())
	k.srv = nil
	return err
}

// restart simulates a kubelet restart: stop serving and disconnect every
// plugin, remove the sockets in the directory, serve kubelet.sock again.
func (k *kubelet) restart() error {
	if err := k.stop(); err != nil {
		return err
	}
	if err := k.st.CleanupPluginDirectory(klog.Background(), filepath.Dir(k.socket)); err != nil {
		return err
	}
	return k.start()
}

type resourceReq struct {
	Resource string `json:"resource"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// call decodes {"resource": R, "request": {...}} into req, looks the plugin up
// and runs f with a 10 s deadline.
func call[Req any, Resp any](k *kubelet, f func(context.Context, pluginapi.DevicePluginClient, *Req) (*Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			writeErr(w, http.StatusMethodNotAllowed, errors.New("POST only"))
			return
		}
		var body struct {
			Resource string `json:"resource"`
			Request  *Req   `json:"request"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		if body.Request == nil {
			body.Request = new(Req)
		}
		p, err := k.st.plugin(body.Resource)
		if err != nil {
			writeErr(w, http.StatusNotFound, err)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		resp, err := f(ctx, p.API(), body.Request)
		if err != nil {
			writeErr(w, http.StatusBadGateway, err)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

func main() {
	socketDir := flag.String("socket-dir", "", "directory for kubelet.sock and the plugin sockets (required)")
	listen := flag.String("listen", "127.0.0.1:0", "loopback address for the JSON control API")
	podResourcesSocket := flag.String("pod-resources-socket", "", "also serve the kubelet's PodResources API (v1, v1alpha1) on this unix socket")
	flag.Parse()
	if *socketDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-dm: --socket-dir is required")
		os.Exit(2)
	}
	dir, err := filepath.Abs(*socketDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dm:", err)
		os.Exit(1)
	}
	k := &kubelet{st: newState(), socket: filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))}
	if err := k.start(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dm: start:", err)
		os.Exit(1)
	}

	mux := http.NewServeMux()
	var pr *podResourcesServer
	if *podResourcesSocket != "" {
		path, err := filepath.Abs(*podResourcesSocket)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubelet-dm:", err)
			os.Exit(1)
		}
		pr = newPodResourcesServer(path)
		if err := pr.start(); err != nil {
			fmt.Fprintln(os.Stderr, "kubelet-dm: pod resources:", err)
			os.Exit(1)
		}
		pr.register(mux)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
	// GET /events?since=N&wait=SECONDS: events with seq > N; with wait, blocks
	// up to that long until there is at least one.
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		var wait float64
		if v := r.URL.Query().Get("since"); v != "" {
			if _, err := fmt.Sscan(v, &since); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
		}
		if v := r.URL.Query().Get("wait"); v != "" {
			if _, err := fmt.Sscan(v, &wait); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
		}
		deadline := time.Now().Add(time.Duration(wait * float64(time.Second)))
		st := k.st
		timer := time.AfterFunc(time.Until(deadline), func() {
			st.mu.Lock()
			st.cond.Broadcast()
			st.mu.Unlock()
		})
		defer timer.Stop()
		st.mu.Lock()
		for uint64(len(st.events)) <= since && time.Now().Before(deadline) {
			st.cond.Wait()
		}
		var out []Event
		if uint64(len(st.events)) > since {
			out = append(out, st.events[since:]...)
		}
		st.mu.Unlock()
		if out == nil {
			out = []Event{}
		}
		writeJSON(w, http.StatusOK, out)
	})
	// GET /state: connected plugins and the latest device list per resource.
	mux.HandleFunc("/state", func(w http.ResponseWriter, _ *http.Request) {
		st := k.st
		st.mu.Lock()
		plugins := map[string]string{}
		for r, p := range st.plugins {
			plugins[r] = p.SocketPath()
		}
		devices := map[string][]*pluginapi.Device{}
		for r, d := range st.devices {
			devices[r] = d
		}
		gen := st.generation
		st.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"plugins": plugins, "devices": devices, "generation": gen, "socket": k.socket})
	})
	mux.HandleFunc("/options", call(k, func(ctx context.Context, c pluginapi.DevicePluginClient, req *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
		return c.GetDevicePluginOptions(ctx, req)
	}))
	mux.HandleFunc("/preferred", call(k, func(ctx context.Context, c pluginapi.DevicePluginClient, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
		return c.GetPreferredAllocation(ctx, req)
	}))
	mux.HandleFunc("/allocate", call(k, func(ctx context.Context, c pluginapi.DevicePluginClient, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		return c.Allocate(ctx, req)
	}))
	mux.HandleFunc("/prestart", call(k, func(ctx context.Context, c pluginapi.DevicePluginClient, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
		return c.PreStartContainer(ctx, req)
	}))
	mux.HandleFunc("/restart", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			writeErr(w, http.StatusMethodNotAllowed, errors.New("POST only"))
			return
		}
		if err := k.restart(); err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		k.st.mu.Lock()
		gen := k.st.generation
		k.st.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]uint64{"generation": gen})
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-dm: listen:", err)
		os.Exit(1)
	}
	helloFields := map[string]string{"addr": ln.Addr().String(), "socket": k.socket}
	if pr != nil {
		helloFields["pod_resources_socket"] = pr.socket
	}
	hello, _ := json.Marshal(helloFields)
	fmt.Println(string(hello))

	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "kubelet-dm: http:", err)
			os.Exit(1)
		}
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	_ = httpSrv.Close()
	_ = k.stop()
	_ = os.Remove(k.socket)
	if pr != nil {
		pr.stop()
		_ = os.Remove(pr.socket)
	}
}
