package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// Pod record states.
const (
	stateAdmitting = "admitting"
	stateAdmitted  = "admitted"
	stateRejected  = "rejected"
	stateReleased  = "released"
)

// podRecord is what happened to one pod (one uid) on this node.
type podRecord struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State: admitting, admitted, rejected, prepare_failed (admitted, but the
	// DRA manager's PrepareResources failed: no container started), or
	// released (admitted, then deleted: its devices went back).
	State    string `json:"state"`
	Admitted bool   `json:"admitted"`
	// Reason and Message of a rejection, as the kubelet writes them on the
	// pod (`UnexpectedAdmissionError`, `TopologyAffinityError`, `OutOf<resource>`, ...),
	// or of a failed PrepareResources (`FailedPrepareDynamicResources`, the
	// kubelet's event).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Deleted: the pod is gone from the API server.
	Deleted bool `json:"deleted"`
	// Generation of the device manager that admitted or rejected it.
	Generation uint64            `json:"generation"`
	Containers []containerRecord `json:"containers"`
	// DRA: what the DRA manager did for the pod's ResourceClaims; absent for
	// pods without any.
	DRA *draRecord `json:"dra,omitempty"`

	pod          *v1.Pod
	forceDeleted bool
}

func (r *podRecord) active() bool {
	return r.State == stateAdmitting || r.State == stateAdmitted || r.State == statePrepareFailed
}

// containerRecord is what the device manager gave one container.
type containerRecord struct {
	Name string `json:"name"`
	Init bool   `json:"init,omitempty"`
	// ID is the container id handed to the topology manager (there is no runtime).
	ID string `json:"id"`
	// Devices: resource -> device ids the manager allocated (GetDevices), sorted.
	Devices map[string][]string `json:"devices"`
	// NUMANodes: resource -> the NUMA nodes of those devices, sorted.
	NUMANodes map[string][]int64 `json:"numa_nodes"`
	// Affinity is the topology manager's hint for the container, when it has one.
	Affinity *affinity `json:"affinity,omitempty"`
	// Options is GetDeviceRunContainerOptions: the Allocate answers merged.
	Options *runOptions `json:"options,omitempty"`
	// Error of GetDeviceRunContainerOptions (e.g. a failed PreStartContainer)
	// or of the DRA manager's GetResources.
	Error string `json:"error,omitempty"`
	// CDIDevices: the DRA manager's GetResources for the container, the CDI
	// device ids of its claims' prepared devices (the container manager hands
	// the runtime these, then the device plugins' options.cdi_devices).
	CDIDevices []string `json:"cdi_devices,omitempty"`
	// Claims: the prepared devices of the container's ResourceClaims
	// (GetContainerClaimInfos).
	Claims []claimDevice `json:"claims,omitempty"`
}

type affinity struct {
	NUMANodes []int `json:"numa_nodes"`
	Preferred bool  `json:"preferred"`
}

// runOptions is devicemanager.DeviceRunContainerOptions with the device-plugin
// proto's field names.
type runOptions struct {
	Envs        map[string]string `json:"envs"`
	Devices     []deviceSpec      `json:"devices"`
	Mounts      []mountSpec       `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdi_devices"`
}

type deviceSpec struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	Permissions   string `json:"permissions"`
}

type mountSpec struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

func toRunOptions(o *devicemanager.DeviceRunContainerOptions) *runOptions {
	out := &runOptions{
		Envs:        map[string]string{},
		Devices:     []deviceSpec{},
		Mounts:      []mountSpec{},
		Annotations: map[string]string{},
		CDIDevices:  []string{},
	}
	if o == nil {
		return out
	}
	for _, e := range o.Envs {
		out.Envs[e.Name] = e.Value
	}
	for _, d := range o.Devices {
		out.Devices = append(out.Devices, deviceSpec{ContainerPath: d.PathInContainer, HostPath: d.PathOnHost, Permissions: d.Permissions})
	}
	for _, m := range o.Mounts {
		out.Mounts = append(out.Mounts, mountSpec{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, a := range o.Annotations {
		out.Annotations[a.Name] = a.Value
	}
	for _, c := range o.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, c.Name)
	}
	return out
}

// managers is one kubelet generation's container-manager parts.
type managers struct {
	dm       *devicemanager.ManagerImpl
	tm       topologymanager.Manager
	handlers []lifecycle.PodAdmitHandler
	gen      uint64
	// dra: the DRA manager and plugin manager; nil with --dra=false.
	dra *draParts
}

// capacityPair is a resource's capacity and allocatable on the node.
type capacityPair struct {
	Capacity    int64 `json:"capacity"`
	Allocatable int64 `json:"allocatable"`
}

// node plays the kubelet for one Node: its pods are admitted by the kubelet's
// own topology manager and device manager (and predicate admit handler).
type node struct {
	name       string
	hostIP     string
	client     kubernetes.Interface
	recorder   record.EventRecorder
	machine    []cadvisorapi.Node
	policy     string
	scope      string
	options    map[string]string
	predicates bool
	admitDelay time.Duration
	// dra: where the DRA parts keep their files; nil with --dra=false.
	dra    *draConfig
	events *eventLog
	synced atomic.Bool

	// opMu serializes everything that drives the managers (admission, release,
	// restart), as the kubelet's pod-admission path is serial.
	opMu       sync.Mutex
	mgrs       *managers
	generation uint64

	// mu guards the records and the capacity; never held while calling the managers.
	mu       sync.Mutex
	pods     map[types.UID]*podRecord
	order    []types.UID
	capacity map[string]capacityPair
}

// machineTopology is what cadvisor would report as the machine's NUMA nodes:
// ids 0..n-1, distance 10 to itself and 20 to the others. Nothing here reads
// cores, caches or memory (no CPU or memory manager runs).
func machineTopology(n int) []cadvisorapi.Node {
	nodes := make([]cadvisorapi.Node, 0, n)
	for i := 0; i < n; i++ {
		d := make([]uint64, n)
		for j := range d {
			d[j] = 20
		}
		d[i] = 10
		nodes = append(nodes, cadvisorapi.Node{Id: i, Distances: d})
	}
	return nodes
}

// sourcesReady is the kubelet's config.SourcesReady: ready once the pod
// informer has synced (the API server is the only pod source).
type sourcesReady struct{ n *node }

func (s sourcesReady) AddSource(string) {}
func (s sourcesReady) AllReady() bool   { return s.n.synced.Load() }

// newManagers builds a topology manager and a device manager as the kubelet's
// container manager does (NewContainerManager), the device manager being a
// hint provider of the topology manager, and the admit handlers in the
// kubelet's order: the topology manager (GetAllocateResourcesPodAdmitHandler),
// then the predicate admit handler.
func (n *node) newManagers() (*managers, error) {
	tm, err := topologymanager.NewManager(klog.Background(), n.machine, n.policy, n.scope, n.options)
	if err != nil {
		return nil, fmt.Errorf("topology manager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(klog.Background(), n.machine, tm)
	if err != nil {
		return nil, fmt.Errorf("device manager: %w", err)
	}
	tm.AddHintProvider(klog.Background(), dm)
	handlers := []lifecycle.PodAdmitHandler{tm}
	if n.predicates {
		handlers = append(handlers, lifecycle.NewPredicateAdmitHandler(n.getNode, lifecycle.NewAdmissionFailureHandlerStub(), dm.UpdatePluginResources))
	}
	return &managers{dm: dm, tm: tm, handlers: handlers}, nil
}

// start builds the managers and starts the device manager, which reads its
// checkpoint and serves kubelet.sock. Containers of the pods still active
// are reported running (as the runtime would after a kubelet restart).
func (n *node) start() error {
	n.opMu.Lock()
	defer n.opMu.Unlock()
	m, err := n.newManagers()
	if err != nil {
		return err
	}
	containers := containermap.NewContainerMap()
	running := sets.New[string]()
	n.mu.Lock()
	for _, uid := range n.order {
		r := n.pods[uid]
		if r.State != stateAdmitted {
			continue
		}
		for _, c := range r.Containers {
			containers.Add(r.UID, c.Name, c.ID)
			running.Insert(c.ID)
		}
	}
	n.generation++
	m.gen = n.generation
	// A started kubelet reports its capacity afresh.
	n.capacity = map[string]capacityPair{}
	n.mu.Unlock()
	// The container manager starts the DRA manager first; the kubelet starts
	// the plugin manager later (initializeRuntimeDependentModules).
	if n.dra != nil {
		if m.dra, err = n.startDRA(m.gen); err != nil {
			return err
		}
	}
	if err := m.dm.Start(klog.Background(), n.activePods, sourcesReady{n}, containers, running); err != nil {
		if m.dra != nil {
			m.dra.stop()
		}
		return fmt.Errorf("starting the device manager: %w", err)
	}
	n.mgrs = m
	return nil
}

// stop stops the device manager: plugins are disconnected and kubelet.sock removed.
func (n *node) stop() error {
	n.opMu.Lock()
	defer n.opMu.Unlock()
	if n.mgrs == nil {
		return nil
	}
	err := n.mgrs.dm.Stop(klog.Background())
	if n.mgrs.dra != nil {
		n.mgrs.dra.stop()
	}
	n.mgrs = nil
	return err
}

// restart is a kubelet restart: a new topology manager and device manager
// over the same directory (the checkpoint carries the allocations over), and
// a new DRA manager over its checkpoint with a new plugin manager, which
// registers the plugins whose sockets are in the registry directory again.
func (n *node) restart() (uint64, error) {
	if err := n.stop(); err != nil {
		return 0, err
	}
	if err := n.start(); err != nil {
		return 0, err
	}
	gen := n.gen()
	n.events.record(Event{Kind: "restarted", Generation: gen})
	return gen, nil
}

func (n *node) gen() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.generation
}

// activePods is the device manager's ActivePodsFunc: the pods being admitted
// or admitted and not yet deleted (the kubelet's GetActivePods).
func (n *node) activePods() []*v1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*v1.Pod
	for _, uid := range n.order {
		if r := n.pods[uid]; r.active() {
			out = append(out, r.pod)
		}
	}
	return out
}

func (n *node) getNode(ctx context.Context, _ bool) (*v1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
}

// podEvent is one informer notification.
type podEvent struct {
	pod     *v1.Pod
	deleted bool
	at      time.Time
}

// handle is the kubelet's pod sync for one notification, in informer order.
func (n *node) handle(ctx context.Context, ev podEvent) {
	pod := ev.pod
	n.mu.Lock()
	rec := n.pods[pod.UID]
	n.mu.Unlock()
	switch {
	case ev.deleted:
		if rec != nil {
			n.release(ctx, rec, "deleted")
			n.mu.Lock()
			rec.Deleted = true
			n.mu.Unlock()
		}
	case pod.DeletionTimestamp != nil:
		if rec != nil {
			n.release(ctx, rec, "terminating")
		}
		// The status manager deletes the pod only once its claims are
		// unprepared (PodCouldHaveRunningContainers); else POST /pods/unprepare.
		if rec == nil || n.draSettled(rec) {
			n.finishDeletion(ctx, pod, rec)
		}
	case rec != nil:
		// Already admitted or rejected; admission happens once per pod.
	case podutil.IsPodPhaseTerminal(pod.Status.Phase):
		// The kubelet does not admit pods that already ended.
	default:
		// The kubelet's sync latency, when asked for: watchers of the node's pods (the
		// device plugins) see the pod before its admission.
		if wait := time.Until(ev.at.Add(n.admitDelay)); wait > 0 {
			time.Sleep(wait)
		}
		n.admit(ctx, pod)
	}
}

// admit runs the kubelet's admit handlers for a new pod, then asks the device
// manager for each container's run options, as the kubelet does when it
// starts the containers.
func (n *node) admit(ctx context.Context, pod *v1.Pod) {
	rec := &podRecord{
		UID:        string(pod.UID),
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		State:      stateAdmitting,
		Containers: []containerRecord{},
		pod:        pod.DeepCopy(),
	}
	n.mu.Lock()
	n.pods[pod.UID] = rec
	n.order = append(n.order, pod.UID)
	var others []*v1.Pod
	for _, uid := range n.order {
		if r := n.pods[uid]; r.State == stateAdmitted {
			others = append(others, r.pod)
		}
	}
	n.mu.Unlock()

	n.opMu.Lock()
	m := n.mgrs
	gen := n.gen()
	handlers := []lifecycle.PodAdmitHandler{stoppedHandler{}}
	if m != nil {
		handlers = m.handlers
	}
	attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation}
	for _, h := range handlers {
		if res := h.Admit(ctx, attrs); !res.Admit {
			// Devices given to containers before the refusal go back, as on the
			// kubelet's next cleanup: the pod is no longer active.
			n.mu.Lock()
			rec.State, rec.Reason, rec.Message, rec.Generation = stateRejected, res.Reason, res.Message, gen
			n.mu.Unlock()
			if m != nil {
				m.dm.UpdateAllocatedDevices(klog.Background())
			}
			n.opMu.Unlock()
			klog.InfoS("Pod admission denied", "pod", klog.KObj(pod), "reason", res.Reason, "message", res.Message)
			n.events.record(Event{Kind: "rejected", Pod: key(pod), UID: string(pod.UID), Reason: res.Reason, Message: res.Message, Generation: gen})
			n.reject(ctx, pod, res.Reason, res.Message)
			return
		}
	}
	// The kubelet's SyncPod prepares the pod's claims before it creates the
	// sandbox; when that fails no container starts.
	if m.dra != nil && usesClaims(pod) {
		if err := n.prepare(ctx, m, rec, pod); err != nil {
			n.mu.Lock()
			rec.State, rec.Admitted, rec.Generation = statePrepareFailed, true, gen
			rec.Reason, rec.Message = failedPrepare, "Failed to prepare dynamic resources: "+err.Error()
			n.mu.Unlock()
			n.opMu.Unlock()
			n.setPending(ctx, pod)
			return
		}
	}
	n.startContainers(ctx, m, rec, pod)
}

// startContainers does what the kubelet does as it starts each container:
// the topology manager's AddContainer, the container manager's GetResources
// (the DRA manager's CDI devices, then the device manager's
// GetDeviceRunContainerOptions); then records the pod admitted and running.
// Called with opMu held; releases it.
func (n *node) startContainers(ctx context.Context, m *managers, rec *podRecord, pod *v1.Pod) {
	gen := m.gen
	var containers []containerRecord
	all := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	for i := range all {
		c := &all[i]
		cr := containerRecord{Name: c.Name, Init: i < len(pod.Spec.InitContainers), ID: fmt.Sprintf("kubelet-node://%s/%s", pod.UID, c.Name)}
		m.tm.AddContainer(klog.Background(), pod, c, cr.ID)
		if err := containerDRA(m, pod, c, &cr); err != nil {
			cr.Error = err.Error()
		} else if opts, err := m.dm.GetDeviceRunContainerOptions(ctx, pod, c); err != nil {
			cr.Error = err.Error()
		} else {
			cr.Options = toRunOptions(opts)
		}
		cr.Devices, cr.NUMANodes = deviceIDs(m.dm.GetDevices(string(pod.UID), c.Name))
		if hint := m.tm.GetAffinity(klog.Background(), string(pod.UID), c.Name); hint.NUMANodeAffinity != nil {
			cr.Affinity = &affinity{NUMANodes: hint.NUMANodeAffinity.GetBits(), Preferred: hint.Preferred}
		}
		containers = append(containers, cr)
	}
	n.mu.Lock()
	if rec.State == stateReleased {
		// Deleted while a POST /pods/prepare ran: release, waiting for opMu,
		// takes these containers out and unprepares the claims.
		rec.Containers = containers
		n.mu.Unlock()
		n.opMu.Unlock()
		return
	}
	rec.State, rec.Admitted, rec.Containers, rec.Generation = stateAdmitted, true, containers, gen
	rec.Reason, rec.Message = "", ""
	n.mu.Unlock()
	n.opMu.Unlock()
	n.events.record(Event{Kind: "admitted", Pod: key(pod), UID: string(pod.UID), Generation: gen})
	n.setRunning(ctx, pod, containers)
}

// stoppedHandler refuses every pod while the device manager is down (a
// failed POST /restart).
type stoppedHandler struct{}

func (stoppedHandler) Admit(context.Context, *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	return lifecycle.PodAdmitResult{Reason: "KubeletNodeStopped", Message: "the device manager is not running"}
}

func deviceIDs(inst devicemanager.ResourceDeviceInstances) (map[string][]string, map[string][]int64) {
	ids := map[string][]string{}
	numa := map[string][]int64{}
	for resource, devs := range inst {
		nodes := sets.New[int64]()
		for id, d := range devs {
			ids[resource] = append(ids[resource], id)
			if d.Topology != nil {
				for _, nn := range d.Topology.Nodes {
					nodes.Insert(nn.ID)
				}
			}
		}
		sort.Strings(ids[resource])
		numa[resource] = sets.List(nodes)
	}
	return ids, numa
}

// release takes an admitted pod out of the active set and has the device
// manager give its devices back (UpdateAllocatedDevices), and the topology
// manager forget its containers; then, for a pod with ResourceClaims, the DRA
// manager's UnprepareResources (SyncTerminatingPod, once the containers stopped).
func (n *node) release(ctx context.Context, rec *podRecord, why string) {
	n.mu.Lock()
	was := rec.active()
	if was {
		rec.State = stateReleased
	}
	n.mu.Unlock()
	if !was {
		return
	}
	n.opMu.Lock()
	if m := n.mgrs; m != nil {
		for _, c := range rec.Containers {
			_ = m.tm.RemoveContainer(klog.Background(), c.ID)
		}
		m.dm.UpdateAllocatedDevices(klog.Background())
	}
	n.opMu.Unlock()
	n.events.record(Event{Kind: "released", Pod: rec.Namespace + "/" + rec.Name, UID: rec.UID, Reason: why, Generation: n.gen()})
	n.mu.Lock()
	prepared := rec.DRA != nil
	n.mu.Unlock()
	if prepared {
		n.unprepare(ctx, rec)
	}
}

// finishDeletion deletes a terminating pod for good (grace period 0, uid
// precondition), as the kubelet's status manager does once its containers
// are gone: here there are none to stop.
func (n *node) finishDeletion(ctx context.Context, pod *v1.Pod, rec *podRecord) {
	if rec != nil {
		n.mu.Lock()
		done := rec.forceDeleted
		rec.forceDeleted = true
		n.mu.Unlock()
		if done {
			return
		}
	}
	zero := int64(0)
	uid := pod.UID
	err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.ErrorS(err, "Deleting terminated pod", "pod", klog.KObj(pod))
	}
}

// reject records the refusal on the pod as the kubelet's rejectPod does: an
// event, and phase Failed with the reason.
func (n *node) reject(ctx context.Context, pod *v1.Pod, reason, message string) {
	n.recorder.Event(pod, v1.EventTypeWarning, reason, message)
	n.patchStatus(ctx, pod, map[string]any{
		"phase":   v1.PodFailed,
		"reason":  reason,
		"message": "Pod was rejected: " + message,
	})
}

// setRunning writes the status a kubelet would once the containers run:
// phase Running, every condition true, each container running and ready
// (init containers terminated with exit code 0, sidecars running). A
// container whose run options failed is waiting with
// CreateContainerConfigError, and the pod stays Pending.
func (n *node) setRunning(ctx context.Context, pod *v1.Pod, containers []containerRecord) {
	now := metav1.Now()
	failed := ""
	var initStatuses, statuses []v1.ContainerStatus
	specs := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	for i, c := range containers {
		spec := specs[i]
		st := v1.ContainerStatus{Name: c.Name, Image: spec.Image, ImageID: spec.Image, ContainerID: c.ID}
		switch {
		case c.Error != "":
			failed = c.Error
			st.State.Waiting = &v1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: c.Error}
		case c.Init && !podutil.IsRestartableInitContainer(&spec):
			st.State.Terminated = &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: c.ID}
			st.Ready = true
		default:
			st.State.Running = &v1.ContainerStateRunning{StartedAt: now}
			st.Ready, st.Started = true, ptrTo(true)
		}
		if c.Init {
			initStatuses = append(initStatuses, st)
		} else {
			statuses = append(statuses, st)
		}
	}
	phase, ready := v1.PodRunning, v1.ConditionTrue
	if failed != "" {
		phase, ready = v1.PodPending, v1.ConditionFalse
	}
	cond := func(t v1.PodConditionType, s v1.ConditionStatus) v1.PodCondition {
		return v1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
	}
	status := map[string]any{
		"phase":   phase,
		"hostIP":  n.hostIP,
		"hostIPs": []v1.HostIP{{IP: n.hostIP}},
		"conditions": []v1.PodCondition{
			cond(v1.PodReadyToStartContainers, v1.ConditionTrue),
			cond(v1.PodInitialized, v1.ConditionTrue),
			cond(v1.ContainersReady, ready),
			cond(v1.PodReady, ready),
			cond(v1.PodScheduled, v1.ConditionTrue),
		},
		"startTime":         now,
		"containerStatuses": statuses,
	}
	if len(initStatuses) > 0 {
		status["initContainerStatuses"] = initStatuses
	}
	n.patchStatus(ctx, pod, status)
}

// setPending writes what a kubelet shows for a pod whose sync failed before
// its sandbox was created (here: PrepareResources): phase Pending, not ready,
// each container waiting in ContainerCreating.
func (n *node) setPending(ctx context.Context, pod *v1.Pod) {
	now := metav1.Now()
	var initStatuses, statuses []v1.ContainerStatus
	waiting := func(c v1.Container) v1.ContainerStatus {
		return v1.ContainerStatus{Name: c.Name, Image: c.Image, State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	}
	for _, c := range pod.Spec.InitContainers {
		initStatuses = append(initStatuses, waiting(c))
	}
	for _, c := range pod.Spec.Containers {
		statuses = append(statuses, waiting(c))
	}
	cond := func(t v1.PodConditionType, s v1.ConditionStatus) v1.PodCondition {
		return v1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
	}
	initialized := v1.ConditionTrue
	if len(initStatuses) > 0 {
		initialized = v1.ConditionFalse
	}
	status := map[string]any{
		"phase":   v1.PodPending,
		"hostIP":  n.hostIP,
		"hostIPs": []v1.HostIP{{IP: n.hostIP}},
		"conditions": []v1.PodCondition{
			cond(v1.PodReadyToStartContainers, v1.ConditionFalse),
			cond(v1.PodInitialized, initialized),
			cond(v1.ContainersReady, v1.ConditionFalse),
			cond(v1.PodReady, v1.ConditionFalse),
			cond(v1.PodScheduled, v1.ConditionTrue),
		},
		"startTime":         now,
		"containerStatuses": statuses,
	}
	if len(initStatuses) > 0 {
		status["initContainerStatuses"] = initStatuses
	}
	n.patchStatus(ctx, pod, status)
}

func ptrTo[T any](v T) *T { return &v }

func (n *node) patchStatus(ctx context.Context, pod *v1.Pod, status map[string]any) {
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		klog.ErrorS(err, "Encoding pod status", "pod", klog.KObj(pod))
		return
	}
	_, err = n.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		klog.ErrorS(err, "Updating pod status", "pod", klog.KObj(pod))
	}
}

func key(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

// syncCapacity is the device-plugin part of the kubelet's node status
// (nodestatus.MachineInfo): the device manager's GetCapacity goes into the
// Node's status.capacity and status.allocatable, a removed resource to 0.
// Only those keys are patched; cpu, memory, pods and the rest stay as they are.
func (n *node) syncCapacity(ctx context.Context) {
	n.opMu.Lock()
	m := n.mgrs
	n.opMu.Unlock()
	if m == nil {
		return
	}
	capacity, allocatable, removed := m.dm.GetCapacity(klog.Background())
	gen := m.gen
	n.mu.Lock()
	if n.generation != gen {
		// Restarted meanwhile: this answer is the old manager's.
		n.mu.Unlock()
		return
	}
	want := map[string]capacityPair{}
	for r, q := range capacity {
		p := want[string(r)]
		p.Capacity = q.Value()
		want[string(r)] = p
	}
	for r, q := range allocatable {
		p := want[string(r)]
		p.Allocatable = q.Value()
		want[string(r)] = p
	}
	for _, r := range removed {
		want[r] = capacityPair{}
	}
	var changed []string
	for r, p := range want {
		if old, ok := n.capacity[r]; !ok || old != p {
			n.capacity[r] = p
			changed = append(changed, r)
		}
	}
	current := make(map[string]capacityPair, len(n.capacity))
	for r, p := range n.capacity {
		current[r] = p
	}
	n.mu.Unlock()
	sort.Strings(changed)
	for _, r := range changed {
		p := current[r]
		n.events.record(Event{Kind: "capacity", Resource: r, Capacity: ptrTo(p.Capacity), Allocatable: ptrTo(p.Allocatable), Generation: gen})
	}
	if len(current) == 0 {
		return
	}
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			klog.ErrorS(err, "Reading the node")
		}
		return
	}
	capPatch, allocPatch := map[string]string{}, map[string]string{}
	for r, p := range current {
		name := v1.ResourceName(r)
		if q, ok := node.Status.Capacity[name]; !ok || q.Value() != p.Capacity {
			capPatch[r] = fmt.Sprint(p.Capacity)
		}
		if q, ok := node.Status.Allocatable[name]; !ok || q.Value() != p.Allocatable {
			allocPatch[r] = fmt.Sprint(p.Allocatable)
		}
	}
	if len(capPatch) == 0 && len(allocPatch) == 0 {
		return
	}
	body, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": capPatch, "allocatable": allocPatch}})
	if _, err := n.client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		klog.ErrorS(err, "Updating the node's device capacity")
	}
}

// snapshot is GET /devices.
func (n *node) snapshot() map[string]any {
	n.opMu.Lock()
	m := n.mgrs
	n.opMu.Unlock()
	healthy := map[string][]*pluginapi.Device{}
	if m != nil {
		for r, devs := range m.dm.GetAllocatableDevices(klog.Background()) {
			list := make([]*pluginapi.Device, 0, len(devs))
			for _, d := range devs {
				list = append(list, d)
			}
			sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
			healthy[r] = list
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	inUse := map[string][]string{}
	for _, uid := range n.order {
		r := n.pods[uid]
		if !r.active() {
			continue
		}
		for _, c := range r.Containers {
			for res, ids := range c.Devices {
				inUse[res] = append(inUse[res], ids...)
			}
		}
	}
	for res := range inUse {
		sort.Strings(inUse[res])
		inUse[res] = slices.Compact(inUse[res])
	}
	capacity := map[string]capacityPair{}
	for r, p := range n.capacity {
		capacity[r] = p
	}
	return map[string]any{
		"resources":  capacity,
		"healthy":    healthy,
		"in_use":     inUse,
		"generation": n.generation,
		"serving":    m != nil,
	}
}

// records is GET /pods, in admission order, optionally one namespace/name.
func (n *node) records(namespace, name string) []podRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := []podRecord{}
	for _, uid := range n.order {
		r := n.pods[uid]
		if (namespace != "" && r.Namespace != namespace) || (name != "" && r.Name != name) {
			continue
		}
		c := *r
		if r.DRA != nil {
			d := *r.DRA
			d.Claims = slices.Clone(r.DRA.Claims)
			c.DRA = &d
		}
		out = append(out, c)
	}
	return out
}
