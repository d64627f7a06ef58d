package main

// The kubelet's PodResources API (v1, and v1alpha1 beside it as the kubelet
// does), served with the kubelet's own server implementation
// (k8s.io/kubernetes/pkg/kubelet/apis/podresources) and the kubelet's gRPC
// setup (rate limiter, registration). What it reports is set over the JSON
// API: kubelet-dm implements the providers the kubelet's pod manager and
// container manager would.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesapiv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

// PodResourcesContainer is one container's exclusive resources, in the
// PodResources proto's field names.
type PodResourcesContainer struct {
	Name    string                              `json:"name"`
	CpuIds  []int64                             `json:"cpu_ids,omitempty"`
	Devices []*podresourcesapi.ContainerDevices `json:"devices,omitempty"`
	Memory  []*podresourcesapi.ContainerMemory  `json:"memory,omitempty"`
	// DynamicResources are the container's DRA claims and the devices
	// allocated to them, as the kubelet's DRA manager reports them.
	DynamicResources []*podresourcesapi.DynamicResource `json:"dynamic_resources,omitempty"`
	// RestartPolicy of an init container: "Always" makes it a sidecar, the
	// only kind of init container the kubelet reports.
	RestartPolicy string `json:"restart_policy,omitempty"`
}

// PodResourcesPod is one pod admitted by the node.
type PodResourcesPod struct {
	Name           string                  `json:"name"`
	Namespace      string                  `json:"namespace"`
	UID            string                  `json:"uid"`
	Containers     []PodResourcesContainer `json:"containers"`
	InitContainers []PodResourcesContainer `json:"init_containers,omitempty"`
}

// PodResourcesAllocatable is what GetAllocatableResources answers.
type PodResourcesAllocatable struct {
	CpuIds  []int64                             `json:"cpu_ids,omitempty"`
	Devices []*podresourcesapi.ContainerDevices `json:"devices,omitempty"`
	Memory  []*podresourcesapi.ContainerMemory  `json:"memory,omitempty"`
}

// PodResourcesState is the body of POST /podresources (a bare array is the
// pods alone).
type PodResourcesState struct {
	Pods        []PodResourcesPod       `json:"pods"`
	Allocatable PodResourcesAllocatable `json:"allocatable"`
}

type containerKey struct{ uid, container string }

// podResourcesProviders implements every provider of
// podresources.PodResourcesProviders from the state last set.
type podResourcesProviders struct {
	mu          sync.Mutex
	pods        []*v1.Pod
	containers  map[containerKey]PodResourcesContainer
	allocatable PodResourcesAllocatable
	state       PodResourcesState
}

func (p *podResourcesProviders) set(st PodResourcesState) error {
	pods := make([]*v1.Pod, 0, len(st.Pods))
	containers := map[containerKey]PodResourcesContainer{}
	for _, sp := range st.Pods {
		if sp.Name == "" || sp.UID == "" {
			return fmt.Errorf("pod %s/%s: name and uid are required", sp.Namespace, sp.Name)
		}
		pod := &v1.Pod{}
		pod.Name, pod.Namespace, pod.UID = sp.Name, sp.Namespace, types.UID(sp.UID)
		for _, c := range sp.InitContainers {
			ic := v1.Container{Name: c.Name}
			if c.RestartPolicy != "" {
				rp := v1.ContainerRestartPolicy(c.RestartPolicy)
				ic.RestartPolicy = &rp
			}
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ic)
			containers[containerKey{sp.UID, c.Name}] = c
		}
		for _, c := range sp.Containers {
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: c.Name})
			containers[containerKey{sp.UID, c.Name}] = c
		}
		pods = append(pods, pod)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods, p.containers, p.allocatable, p.state = pods, containers, st.Allocatable, st
	return nil
}

func (p *podResourcesProviders) container(uid, name string) PodResourcesContainer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.containers[containerKey{uid, name}]
}

// PodsProvider. Every pod set is active: kubelet-dm has no terminated pods.
func (p *podResourcesProviders) GetActivePods() []*v1.Pod { return p.GetPods() }

func (p *podResourcesProviders) GetPods() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*v1.Pod(nil), p.pods...)
}

func (p *podResourcesProviders) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range p.pods {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// DevicesProvider.
func (p *podResourcesProviders) UpdateAllocatedDevices(klog.Logger) {}

func (p *podResourcesProviders) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return p.container(podUID, containerName).Devices
}

func (p *podResourcesProviders) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocatable.Devices
}

// CPUsProvider.
func (p *podResourcesProviders) GetCPUs(pod *v1.Pod, container *v1.Container) []int64 {
	return p.container(string(pod.UID), container.Name).CpuIds
}

// GetPodCPUs: pod-level exclusive CPUs (pod-level resources) are not modelled.
func (p *podResourcesProviders) GetPodCPUs(string) []int64 { return nil }

func (p *podResourcesProviders) GetAllocatableCPUs() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocatable.CpuIds
}

// MemoryProvider.
func (p *podResourcesProviders) GetMemory(_ klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.ContainerMemory {
	return p.container(string(pod.UID), container.Name).Memory
}

// GetPodMemory: pod-level memory pinning is not modelled.
func (p *podResourcesProviders) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory {
	return nil
}

func (p *podResourcesProviders) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocatable.Memory
}

// DynamicResourcesProvider: the claims set for the container.
func (p *podResourcesProviders) GetDynamicResources(_ klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return p.container(string(pod.UID), container.Name).DynamicResources
}

// podResourcesServer serves the PodResources API on a unix socket, as the
// kubelet's server.ListenAndServePodResources does, but can be stopped and
// started again.
type podResourcesServer struct {
	socket    string
	providers *podResourcesProviders
	api       podresourcesapi.PodResourcesListerServer
	mu        sync.Mutex
	grpc      *grpc.Server
}

func newPodResourcesServer(socket string) *podResourcesServer {
	p := &podResourcesProviders{containers: map[containerKey]PodResourcesContainer{}}
	return &podResourcesServer{
		socket:    socket,
		providers: p,
		api: podresources.NewV1PodResourcesServer(context.Background(), podresources.PodResourcesProviders{
			Pods: p, Devices: p, Cpus: p, Memory: p, DynamicResources: p,
		}),
	}
}

func (s *podResourcesServer) serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grpc != nil
}

// start serves the socket (unlinking what is there first, like the kubelet's
// listener). No-op when already serving.
func (s *podResourcesServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc != nil {
		return nil
	}
	providers := podresources.PodResourcesProviders{
		Pods: s.providers, Devices: s.providers, Cpus: s.providers, Memory: s.providers, DynamicResources: s.providers,
	}
	srv := grpc.NewServer(apisgrpc.WithRateLimiter(context.Background(), "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesapiv1alpha1.RegisterPodResourcesListerServer(srv, podresources.NewV1alpha1PodResourcesServer(providers))
	podresourcesapi.RegisterPodResourcesListerServer(srv, s.api)
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.socket), 0o750); err != nil {
		return err
	}
	ln, err := net.Listen("unix", s.socket)
	if err != nil {
		return err
	}
	// Like the kubelet's socket, it outlives the server: stop leaves a dead
	// socket file behind, as a crashed kubelet does.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	go func() { _ = srv.Serve(ln) }()
	s.grpc = srv
	return nil
}

// stop stops serving; the socket file stays (connections to it are refused).
func (s *podResourcesServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc != nil {
		s.grpc.Stop()
		s.grpc = nil
	}
}

func (s *podResourcesServer) register(mux *http.ServeMux) {
	// POST: set the pods and allocatable resources; GET: what is set, and
	// what the kubelet's List answers for it.
	mux.HandleFunc("/podresources", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			var raw json.RawMessage
			if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
			var st PodResourcesState
			var err error
			if len(raw) > 0 && raw[0] == '[' {
				err = json.Unmarshal(raw, &st.Pods)
			} else {
				err = json.Unmarshal(raw, &st)
			}
			if err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
			if err := s.providers.set(st); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
			fallthrough
		case http.MethodGet:
			list, err := s.api.List(r.Context(), &podresourcesapi.ListPodResourcesRequest{})
			if err != nil {
				writeErr(w, http.StatusInternalServerError, err)
				return
			}
			s.providers.mu.Lock()
			st := s.providers.state
			s.providers.mu.Unlock()
			if st.Pods == nil {
				st.Pods = []PodResourcesPod{}
			}
			if list.PodResources == nil {
				list.PodResources = []*podresourcesapi.PodResources{}
			}
			writeJSON(w, http.StatusOK, map[string]any{
				"state": st, "list": list, "serving": s.serving(), "socket": s.socket,
			})
		default:
			writeErr(w, http.StatusMethodNotAllowed, errors.New("GET or POST"))
		}
	})
	control := func(f func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				writeErr(w, http.StatusMethodNotAllowed, errors.New("POST only"))
				return
			}
			if err := f(); err != nil {
				writeErr(w, http.StatusInternalServerError, err)
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"serving": s.serving(), "socket": s.socket})
		}
	}
	mux.HandleFunc("/podresources/stop", control(func() error { s.stop(); return nil }))
	mux.HandleFunc("/podresources/start", control(s.start))
}
