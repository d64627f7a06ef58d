package main

// The kubelet's Dynamic Resource Allocation for the harness node: the DRA
// manager (pkg/kubelet/cm/dra) as the container manager builds and starts it,
// and the kubelet's plugin manager (pkg/kubelet/pluginmanager) watching a
// plugins_registry directory with the DRA manager's registration handler, as
// kubelet.go wires them. Pods with ResourceClaims get PrepareResources before
// their containers "start" (kuberuntime's SyncPod), GetResources per container
// (the container manager's GetResources), and UnprepareResources once they
// terminate (SyncTerminatingPod).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	plugincache "k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// statePrepareFailed: admitted, but PrepareResources failed, so no container
// started (the kubelet's SyncPod returns before creating the sandbox).
const statePrepareFailed = "prepare_failed"

// draConfig is where the DRA parts keep their files.
type draConfig struct {
	// registryDir is the kubelet's plugins_registry: plugins create
	// <driver>-reg.sock there.
	registryDir string
	// stateDir holds the DRA manager's checkpoint (dra_manager_state) and
	// health state (the kubelet uses its root directory).
	stateDir string
	// pluginsDir is the kubelet's plugins directory, where DRA plugins
	// conventionally put their service socket (<pluginsDir>/<driver>/dra.sock).
	// kubelet-node only creates it.
	pluginsDir string
}

// draRecord is what the DRA manager did for one pod's ResourceClaims.
type draRecord struct {
	// Claims: the names of the pod's ResourceClaims (resourceclaim.Name), in
	// spec order, as far as they could be resolved.
	Claims []string `json:"claims"`
	// Prepared: PrepareResources succeeded.
	Prepared bool `json:"prepared"`
	// PrepareAttempts counts the PrepareResources calls.
	PrepareAttempts int `json:"prepare_attempts"`
	// PrepareError of the last failed PrepareResources (cleared on success).
	PrepareError string `json:"prepare_error,omitempty"`
	// Unprepared: UnprepareResources succeeded after the pod went.
	Unprepared bool `json:"unprepared"`
	// UnprepareError of the last failed UnprepareResources (cleared on success).
	UnprepareError string `json:"unprepare_error,omitempty"`
}

// claimDevice is one prepared device of a container's ResourceClaim, from the
// DRA manager's claim info (GetContainerClaimInfos).
type claimDevice struct {
	Claim        string   `json:"claim"`
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	Requests     []string `json:"requests"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      string   `json:"share_id,omitempty"`
}

// draPlugin is one DRA plugin registered through the plugin manager.
type draPlugin struct {
	Driver   string    `json:"driver"`
	Endpoint string    `json:"endpoint"`
	Services []string  `json:"services"`
	At       time.Time `json:"registered_at"`
}

// draParts is one kubelet generation's DRA manager and plugin manager.
type draParts struct {
	manager *dra.Manager
	cancel  context.CancelFunc
	stopCh  chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	plugins []draPlugin
}

func (d *draParts) registered() []draPlugin {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.plugins)
	if out == nil {
		out = []draPlugin{}
	}
	return out
}

// recordingHandler is the DRA manager's plugin-registration handler
// (Manager.GetWatcherHandler, the DRAPluginManager) as the plugin manager
// calls it, with every call passed through unchanged and its outcome recorded.
type recordingHandler struct {
	inner plugincache.PluginHandler
	parts *draParts
	n     *node
	gen   uint64
}

func (h *recordingHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	err := h.inner.ValidatePlugin(ctx, name, endpoint, versions)
	if err != nil {
		h.n.events.record(Event{Kind: "dra_plugin_rejected", Driver: name, Endpoint: endpoint, Services: versions, Message: err.Error(), Generation: h.gen})
	}
	return err
}

func (h *recordingHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	err := h.inner.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	if err != nil {
		h.n.events.record(Event{Kind: "dra_plugin_rejected", Driver: name, Endpoint: endpoint, Services: versions, Message: err.Error(), Generation: h.gen})
		return err
	}
	h.parts.mu.Lock()
	h.parts.plugins = append(h.parts.plugins, draPlugin{Driver: name, Endpoint: endpoint, Services: slices.Clone(versions), At: time.Now().UTC()})
	h.parts.mu.Unlock()
	h.n.events.record(Event{Kind: "dra_plugin_registered", Driver: name, Endpoint: endpoint, Services: versions, Generation: h.gen})
	return nil
}

func (h *recordingHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.inner.DeRegisterPlugin(ctx, name, endpoint)
	h.parts.mu.Lock()
	h.parts.plugins = slices.DeleteFunc(h.parts.plugins, func(p draPlugin) bool { return p.Driver == name && p.Endpoint == endpoint })
	h.parts.mu.Unlock()
	h.n.events.record(Event{Kind: "dra_plugin_deregistered", Driver: name, Endpoint: endpoint, Generation: h.gen})
}

// startDRA builds and starts the DRA manager over its checkpoint (the
// container manager's NewContainerManager and Start), then a plugin manager
// on the registry directory with the DRA manager's handler for type
// DRAPlugin (Kubelet.initializeRuntimeDependentModules).
func (n *node) startDRA(gen uint64) (*draParts, error) {
	cfg := n.dra
	for _, d := range []string{cfg.stateDir, cfg.registryDir, cfg.pluginsDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	logger := klog.Background()
	mgr, err := dra.NewManager(logger, n.client, cfg.stateDir)
	if err != nil {
		return nil, fmt.Errorf("DRA manager: %w", err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	getNode := func(ctx context.Context) (*v1.Node, error) { return n.getNode(ctx, false) }
	if err := mgr.Start(ctx, n.activePods, getNode, sourcesReady{n}); err != nil {
		cancel()
		return nil, fmt.Errorf("starting the DRA manager: %w", err)
	}
	parts := &draParts{manager: mgr, cancel: cancel, stopCh: make(chan struct{}), done: make(chan struct{})}
	pm := pluginmanager.NewPluginManager(cfg.registryDir, n.recorder)
	pm.AddHandler(pluginwatcherapi.DRAPlugin, &recordingHandler{inner: mgr.GetWatcherHandler(), parts: parts, n: n, gen: gen})
	go func() {
		defer close(parts.done)
		pm.Run(ctx, sourcesReady{n}, parts.stopCh)
	}()
	// Resource health updates (ResourceHealthStatus) name the pods whose
	// devices changed health; the kubelet would sync their status.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-mgr.Updates():
				for _, uid := range u.PodUIDs {
					n.events.record(Event{Kind: "dra_health_update", UID: uid, Pod: n.podKey(types.UID(uid)), Generation: gen})
				}
			}
		}
	}()
	return parts, nil
}

// stop stops the plugin manager (its watcher and reconciler) and the DRA
// manager (connections to the plugins closed); the checkpoint stays.
func (d *draParts) stop() {
	close(d.stopCh)
	<-d.done
	d.cancel()
	d.manager.Stop()
}

func (n *node) podKey(uid types.UID) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if r := n.pods[uid]; r != nil {
		return r.Namespace + "/" + r.Name
	}
	return ""
}

// usesClaims: the pod has ResourceClaims (or a claim for extended resources
// backed by DRA), so the kubelet's PrepareDynamicResources has work to do.
func usesClaims(pod *v1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

func claimNames(pod *v1.Pod) []string {
	names := []string{}
	for i := range pod.Spec.ResourceClaims {
		if name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i]); err == nil && name != nil {
			names = append(names, *name)
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		names = append(names, s.ResourceClaimName)
	}
	return names
}

// prepare is the kubelet's PrepareDynamicResources for a pod whose
// containers are about to start. Called with opMu held.
func (n *node) prepare(ctx context.Context, m *managers, rec *podRecord, pod *v1.Pod) error {
	n.mu.Lock()
	if rec.DRA == nil {
		rec.DRA = &draRecord{}
	}
	rec.DRA.Claims = claimNames(pod)
	rec.DRA.PrepareAttempts++
	n.mu.Unlock()
	var err error
	if m == nil || m.dra == nil {
		err = errors.New("the DRA manager is not running")
	} else {
		err = m.dra.manager.PrepareResources(ctx, pod)
	}
	n.mu.Lock()
	if err != nil {
		rec.DRA.Prepared, rec.DRA.PrepareError = false, err.Error()
	} else {
		rec.DRA.Prepared, rec.DRA.PrepareError = true, ""
	}
	claims := slices.Clone(rec.DRA.Claims)
	n.mu.Unlock()
	gen := n.gen()
	if err != nil {
		klog.ErrorS(err, "Failed to prepare dynamic resources", "pod", klog.KObj(pod))
		n.events.record(Event{Kind: "prepare_failed", Pod: key(pod), UID: string(pod.UID), Claims: claims, Reason: failedPrepare, Message: err.Error(), Generation: gen})
		n.recorder.Eventf(pod, v1.EventTypeWarning, failedPrepare, "Failed to prepare dynamic resources: %v", err)
		return err
	}
	n.events.record(Event{Kind: "prepared", Pod: key(pod), UID: string(pod.UID), Claims: claims, Generation: gen})
	return nil
}

// failedPrepare is the kubelet's event reason (events.FailedPrepareDynamicResources).
const failedPrepare = "FailedPrepareDynamicResources"

// unprepare is the kubelet's UnprepareDynamicResources once a pod's
// containers have stopped (SyncTerminatingPod). Returns whether the pod's
// claims are now unprepared.
func (n *node) unprepare(ctx context.Context, rec *podRecord) bool {
	n.opMu.Lock()
	m := n.mgrs
	n.mu.Lock()
	pod := rec.pod
	n.mu.Unlock()
	var err error
	if m == nil || m.dra == nil {
		err = errors.New("the DRA manager is not running")
	} else {
		err = m.dra.manager.UnprepareResources(ctx, pod)
	}
	n.opMu.Unlock()
	n.mu.Lock()
	if err != nil {
		rec.DRA.Unprepared, rec.DRA.UnprepareError = false, err.Error()
	} else {
		rec.DRA.Unprepared, rec.DRA.UnprepareError = true, ""
	}
	claims := slices.Clone(rec.DRA.Claims)
	n.mu.Unlock()
	gen := n.gen()
	if err != nil {
		klog.ErrorS(err, "Failed to unprepare dynamic resources", "pod", klog.KObj(pod))
		n.events.record(Event{Kind: "unprepare_failed", Pod: key(pod), UID: string(pod.UID), Claims: claims, Message: err.Error(), Generation: gen})
		return false
	}
	n.events.record(Event{Kind: "unprepared", Pod: key(pod), UID: string(pod.UID), Claims: claims, Generation: gen})
	return true
}

// draSettled: nothing of the pod is left to unprepare (the kubelet's
// PodMightNeedToUnprepareResources is false), so it may be deleted for good.
func (n *node) draSettled(rec *podRecord) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return rec.DRA == nil || rec.DRA.Unprepared
}

// containerDRA fills in what the DRA manager gives a container: the CDI
// devices of GetResources (what the container manager's GetResources hands
// the runtime before the device plugins' CDI devices) and the prepared
// devices of its claims.
func containerDRA(m *managers, pod *v1.Pod, c *v1.Container, cr *containerRecord) error {
	if m.dra == nil {
		return nil
	}
	info, err := m.dra.manager.GetResources(pod, c)
	if err != nil {
		return err
	}
	for _, d := range info.CDIDevices {
		cr.CDIDevices = append(cr.CDIDevices, d.Name)
	}
	infos, err := m.dra.manager.GetContainerClaimInfos(pod, c)
	if err != nil {
		return err
	}
	for _, ci := range infos {
		drivers := make([]string, 0, len(ci.DriverState))
		for d := range ci.DriverState {
			drivers = append(drivers, d)
		}
		sort.Strings(drivers)
		for _, driver := range drivers {
			for _, d := range ci.DriverState[driver].Devices {
				cd := claimDevice{Claim: ci.ClaimName, Driver: driver, Pool: d.PoolName, Device: d.DeviceName,
					Requests: nonNil(d.RequestNames), CDIDeviceIDs: nonNil(d.CDIDeviceIDs)}
				if d.ShareID != nil {
					cd.ShareID = string(*d.ShareID)
				}
				cr.Claims = append(cr.Claims, cd)
			}
		}
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

// errNotFound and errConflict map to HTTP 404 and 409.
var (
	errNotFound = errors.New("no such pod record")
	errConflict = errors.New("conflict")
)

// retryPrepare is the kubelet's next sync of a pod whose PrepareResources
// failed: the pod is read again from the API server (a claim may have been
// allocated or reserved for it since), PrepareResources again, and on success
// its containers start as on admission.
func (n *node) retryPrepare(ctx context.Context, uid types.UID) (podRecord, error) {
	n.mu.Lock()
	rec := n.pods[uid]
	n.mu.Unlock()
	if rec == nil {
		return podRecord{}, errNotFound
	}
	n.opMu.Lock()
	n.mu.Lock()
	state, old := rec.State, rec.pod
	n.mu.Unlock()
	if state != statePrepareFailed {
		n.opMu.Unlock()
		return n.copyRecord(rec), fmt.Errorf("%w: pod %s/%s is %s, not %s", errConflict, rec.Namespace, rec.Name, state, statePrepareFailed)
	}
	pod, err := n.client.CoreV1().Pods(old.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && pod.UID != old.UID):
		n.opMu.Unlock()
		return n.copyRecord(rec), fmt.Errorf("%w: pod %s/%s (%s) is gone from the API server", errConflict, old.Namespace, old.Name, old.UID)
	case err != nil:
		n.opMu.Unlock()
		return n.copyRecord(rec), err
	}
	n.mu.Lock()
	rec.pod = pod.DeepCopy()
	n.mu.Unlock()
	m := n.mgrs
	if err := n.prepare(ctx, m, rec, pod); err != nil {
		n.mu.Lock()
		rec.Message = "Failed to prepare dynamic resources: " + err.Error()
		n.mu.Unlock()
		n.opMu.Unlock()
		return n.copyRecord(rec), nil
	}
	n.startContainers(ctx, m, rec, pod)
	return n.copyRecord(rec), nil
}

// retryUnprepare is the kubelet's next try of UnprepareResources for a pod
// that went while it failed; a terminating pod is then deleted for good.
func (n *node) retryUnprepare(ctx context.Context, uid types.UID) (podRecord, error) {
	n.mu.Lock()
	rec := n.pods[uid]
	var ok bool
	var forced bool
	if rec != nil {
		ok = rec.State == stateReleased && rec.DRA != nil && !rec.DRA.Unprepared
		forced = rec.forceDeleted
	}
	n.mu.Unlock()
	if rec == nil {
		return podRecord{}, errNotFound
	}
	if !ok {
		return n.copyRecord(rec), fmt.Errorf("%w: pod %s/%s has nothing left to unprepare (only released pods whose UnprepareResources failed have)", errConflict, rec.Namespace, rec.Name)
	}
	if n.unprepare(ctx, rec) && !forced {
		n.mu.Lock()
		pod, deleted := rec.pod, rec.Deleted
		n.mu.Unlock()
		if !deleted {
			n.finishDeletion(ctx, pod, rec)
		}
	}
	return n.copyRecord(rec), nil
}

func (n *node) copyRecord(rec *podRecord) podRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := *rec
	if rec.DRA != nil {
		d := *rec.DRA
		d.Claims = slices.Clone(rec.DRA.Claims)
		out.DRA = &d
	}
	return out
}

// lookupUID finds a pod record by ?uid=, or by ?namespace=&name= (the newest).
func (n *node) lookupUID(uid, namespace, name string) types.UID {
	n.mu.Lock()
	defer n.mu.Unlock()
	if uid != "" {
		return types.UID(uid)
	}
	for i := len(n.order) - 1; i >= 0; i-- {
		if r := n.pods[n.order[i]]; r.Namespace == namespace && r.Name == name {
			return n.order[i]
		}
	}
	return ""
}

// draPlugins is GET /dra/plugins: the DRA plugins registered with the
// current generation's plugin manager, in registration order.
func (n *node) draPlugins() map[string]any {
	n.opMu.Lock()
	m := n.mgrs
	n.opMu.Unlock()
	out := map[string]any{
		"enabled":      n.dra != nil,
		"plugins":      []draPlugin{},
		"generation":   n.gen(),
		"serving":      m != nil && m.dra != nil,
		"registry_dir": "",
		"state_dir":    "",
	}
	if n.dra != nil {
		out["registry_dir"] = n.dra.registryDir
		out["state_dir"] = n.dra.stateDir
		out["plugins_dir"] = n.dra.pluginsDir
	}
	if m != nil && m.dra != nil {
		out["plugins"] = m.dra.registered()
	}
	return out
}
