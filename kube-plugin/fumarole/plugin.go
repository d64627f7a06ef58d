// Package fumarole is fumarole's kube-scheduler framework plugin, compiled into kube-scheduler
// (cmd/kube-scheduler) under the name Fumarole. Every decision is the decision core's, linked in
// through its C ABI (fumarole.dev/scheduler-abi/go): this package turns kube-scheduler's
// objects into the core's input and its answers into framework statuses; it decides nothing.
//
// Per scheduling cycle: PreFilter judges the pod on every node in one call and, when few fit (a
// gpu-group-size unit's pod: its planned super-node), narrows the candidates to them, so
// kube-scheduler's sampling of 10 % of the nodes never misses them; Filter and Score read that
// result; PostFilter, when other plugins refused every node fumarole found fit, has the unit
// planned on another super-node; Reserve / Unreserve move the pod's devices in and out of the
// core's ledger; Bind writes the Binding with the device choice in its annotations, one write.
// A pod asking for no device fumarole serves is skipped at PreFilter and bound by the default
// binder.
package fumarole

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	abi "fumarole.dev/scheduler-abi/go"
)

// Name is the plugin's name in KubeSchedulerConfiguration profiles.
const Name = "Fumarole"

// stateKey holds the cycle's verdicts in the CycleState.
const stateKey fwk.StateKey = "fumarole.dev/verdicts"

// Plugin is one profile's instance; the engine behind it is one per process.
type Plugin struct {
	engine    *abi.Engine
	profile   string
	activator fwk.PodActivator
}

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PostFilterPlugin  = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.BindPlugin        = &Plugin{}
	_ fwk.SignPlugin        = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// The engine is started by the first profile that enables the plugin.
var shared struct {
	sync.Mutex
	engine  *abi.Engine
	profile string
}

// refused are the pods PreFilter found no node for, by UID: they are retried when the core's
// devices change (a DeviceTopology event in force) or its ledger gives room back (a
// reservation undone, a plan dropped or lapsed), which no kube-scheduler event says, or says
// before the core's own view has it. This takes the place of registering DeviceTopology as a
// cluster event: kube-scheduler would keep a dynamic informer of every DeviceTopology (about
// 370 MiB and a CPU second more at 5,000 nodes, measured).
var refused struct {
	sync.Mutex
	pods map[string]*v1.Pod
}

// maxRefused bounds refused: past it the record starts afresh (a pod dropped from it is still
// retried on kube-scheduler's own events, or by its flush of unschedulable pods).
const maxRefused = 10000

func noteRefused(pod *v1.Pod) {
	refused.Lock()
	defer refused.Unlock()
	if refused.pods == nil || len(refused.pods) >= maxRefused {
		refused.pods = make(map[string]*v1.Pod)
	}
	refused.pods[string(pod.UID)] = pod
}

func forgetRefused(pod *v1.Pod) {
	refused.Lock()
	defer refused.Unlock()
	delete(refused.pods, string(pod.UID))
}

// takeRefused empties refused, keyed as PodActivator wants them.
func takeRefused() map[string]*v1.Pod {
	refused.Lock()
	defer refused.Unlock()
	out := make(map[string]*v1.Pod, len(refused.pods))
	for _, p := range refused.pods {
		out[p.Namespace+"/"+p.Name] = p
	}
	refused.pods = nil
	return out
}

// retryInterval spaces the checks for device changes and room given back.
const retryInterval = time.Second

// retryWhenRoomMayFree activates the refused pods whenever the core's devices changed or its
// ledger gave room back since the last check; it runs for the scheduler's life.
func retryWhenRoomMayFree(ctx context.Context, engine *abi.Engine, activator fwk.PodActivator) {
	logger := klog.FromContext(ctx)
	lastViews, lastFreed := engine.DeviceViews(), engine.RoomFreed()
	ticker := time.NewTicker(retryInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		views, freed := engine.DeviceViews(), engine.RoomFreed()
		if views == lastViews && freed == lastFreed {
			continue
		}
		lastViews, lastFreed = views, freed
		if pods := takeRefused(); len(pods) > 0 {
			logger.V(4).Info("fumarole: devices changed or room given back; retrying the pods refused", "pods", len(pods))
			activator.Activate(logger, pods)
		}
	}
}

// New is the plugin's factory (app.WithPlugin(Name, New)). The arguments are the profile's
// pluginConfig args (FumaroleArgs), checked by the core: an unknown or malformed one stops
// kube-scheduler at start with an error naming it.
func New(ctx context.Context, args runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	var raw json.RawMessage
	if err := frameworkruntime.DecodeInto(args, &raw); err != nil {
		return nil, fmt.Errorf("%s: reading pluginConfig args: %w", Name, err)
	}
	profile := handle.ProfileName()
	shared.Lock()
	defer shared.Unlock()
	if shared.engine != nil {
		if shared.profile != profile {
			return nil, fmt.Errorf("%s: profile %q enables it, but profile %q started it already: one profile per scheduler may enable %s",
				Name, profile, shared.profile, Name)
		}
		return &Plugin{engine: shared.engine, profile: profile, activator: handle}, nil
	}
	kubeconfig, err := kubeconfigYAML(handle.KubeConfig())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	config, err := engineConfig(kubeconfig, profile, raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	klog.InfoS("fumarole: starting the decision core", "profile", profile)
	engine, err := abi.StartEngine(config)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	if err := engine.WriteChoicesAtPreBind(); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	klog.InfoS("fumarole: decision core ready", "profile", profile)
	shared.engine, shared.profile = engine, profile
	go retryWhenRoomMayFree(ctx, engine, handle)
	return &Plugin{engine: engine, profile: profile, activator: handle}, nil
}

// engineConfig is the core's configuration (EngineConfig in scheduler-abi/src/engine.rs).
func engineConfig(kubeconfig []byte, profile string, args json.RawMessage) ([]byte, error) {
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	return json.Marshal(map[string]interface{}{
		"kubeconfigYaml": string(kubeconfig),
		"kubeScheduler": map[string]interface{}{
			"schedulerNames": []string{profile},
			"args":           args,
		},
	})
}

func (p *Plugin) Name() string { return Name }

// cycle is what PreFilter learnt for the cycle's pod: the core's verdicts and the pod as JSON
// (marshalled once; Reserve, Unreserve and Bind hand it to the core again). Read-only once
// written, so a clone shares it.
type cycle struct {
	verdicts *abi.Verdicts
	pod      []byte
}

func (c *cycle) Clone() fwk.StateData { return c }

// read is the cycle's record, false for a pod PreFilter skipped.
func read(state fwk.CycleState) (*cycle, bool) {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil, false
	}
	c, ok := d.(*cycle)
	return c, ok
}

// PreFilter judges the pod on every node and, when few fit, narrows the candidates to them.
func (p *Plugin) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	body, err := json.Marshal(pod)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("fumarole: encoding pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	v, err := p.engine.Judge(body)
	if err == abi.ErrNotOurs {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err != nil {
		// The pod's request is unusable (a malformed annotation, say): no node changes that.
		// kube-scheduler reports it on the pod as a FailedScheduling Event.
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	state.Write(stateKey, &cycle{verdicts: v, pod: body})
	fits, all := v.FitCount()
	switch {
	case fits == 0:
		// No node fits now. Preemption cannot help: it simulates evictions through PreFilter
		// extensions, which would not change fumarole's ledger.
		noteRefused(pod)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, refusal(v))
	case fits > all/2:
		// Most nodes fit: kube-scheduler's sampling finds them, and Filter answers the
		// others; a set of thousands of names per pod would cost more than it saves.
		return nil, nil
	}
	// Few fit (a unit's super-node): narrow, so the sampling cannot miss them.
	fit, _ := v.Fitting()
	return &fwk.PreFilterResult{NodeNames: sets.New(fit...)}, nil
}

// refusal is why no node fits: the distinct reasons, the first few.
func refusal(v *abi.Verdicts) string {
	reasons := v.Reasons()
	const most = 3
	if len(reasons) > most {
		reasons = append(reasons[:most:most], fmt.Sprintf("and %d more", len(v.Reasons())-most))
	}
	if len(reasons) == 0 {
		return "fumarole: no node fits"
	}
	return "fumarole: " + strings.Join(reasons, "; ")
}

func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter answers from the cycle's verdicts.
func (p *Plugin) Filter(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	c, ok := read(state)
	if !ok {
		return nil
	}
	verdict, ok := c.verdicts.On(nodeInfo.Node().Name)
	switch {
	case !ok:
		return fwk.NewStatus(fwk.Unschedulable, "fumarole: node not in fumarole's view yet")
	case verdict.Code == abi.Fits:
		return nil
	case verdict.Code == abi.Unresolvable:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, verdict.Reason)
	default:
		return fwk.NewStatus(fwk.Unschedulable, verdict.Reason)
	}
}

// PostFilter: no node passed, though fumarole found some fit: other plugins refused them all
// (a taint on every node of the unit's planned super-node, say, which fumarole does not
// judge). The core gives the unit's plan up and plans it on another super-node at the next
// try, which comes at once: the pod is activated, not left for a flush. Informational, as the
// framework asks of such plugins: always Unschedulable.
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	c, ok := read(state)
	if !ok {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	if fits, _ := c.verdicts.FitCount(); fits == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	superNode, err := p.engine.GiveUpPlan(c.pod)
	if err != nil || superNode == "" {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	logger := klog.FromContext(ctx)
	logger.Info("fumarole: other plugins refused every node of the unit's super-node; planning it elsewhere",
		"pod", klog.KObj(pod), "superNode", superNode)
	p.activator.Activate(logger, map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod})
	return nil, fwk.NewStatus(fwk.Unschedulable,
		fmt.Sprintf("fumarole: other plugins refused every node of super-node %s; the unit is planned elsewhere", superNode))
}

// PreScore skips scoring for a pod PreFilter skipped.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if _, ok := read(state); !ok {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the core's score on kube-scheduler's scale (0..100; the profile's weight applies).
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	c, ok := read(state)
	if !ok {
		return 0, nil
	}
	verdict, _ := c.verdicts.On(nodeInfo.Node().Name)
	return int64(math.Max(0, math.Min(float64(fwk.MaxNodeScore), math.Round(verdict.Score)))), nil
}

func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve records the pod's devices on node in the core's ledger, before the next pod is
// judged.
func (p *Plugin) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	c, ok := read(state)
	if !ok {
		return nil
	}
	forgetRefused(pod)
	err := p.engine.Allocate(c.pod, node)
	if err == nil || err == abi.ErrNotOurs {
		return nil
	}
	return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("fumarole: reserving devices on %s: %v", node, err))
}

// Unreserve gives the pod's devices back (a later plugin refused, or the bind failed).
func (p *Plugin) Unreserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, node string) {
	c, ok := read(state)
	if !ok {
		return
	}
	if err := p.engine.Deallocate(c.pod); err != nil && err != abi.ErrNotOurs {
		klog.InfoS("fumarole: undoing a reservation", "pod", klog.KObj(pod), "node", node, "err", err)
	}
}

// Bind creates the pod's Binding with its device choice; a pod of no device of ours is left to
// the default binder (Skip).
func (p *Plugin) Bind(_ context.Context, state fwk.CycleState, _ *v1.Pod, node string) *fwk.Status {
	c, ok := read(state)
	if !ok {
		return fwk.NewStatus(fwk.Skip)
	}
	err := p.engine.Bind(c.pod, node)
	switch {
	case err == nil:
		return nil
	case err == abi.ErrNotOurs:
		return fwk.NewStatus(fwk.Skip)
	default:
		return fwk.AsStatus(fmt.Errorf("fumarole: %w", err))
	}
}

// SignPod keeps a pod that may ask for devices out of kube-scheduler's opportunistic batching
// (a result reused from another pod): fumarole's verdicts depend on the ledger and on the pod's
// unit, not on the pod's spec alone. Other pods sign with nothing of fumarole's.
func (p *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if mayAskForDevices(pod) {
		return nil, fwk.NewStatus(fwk.Unschedulable, "fumarole judges each device pod on its own")
	}
	return nil, nil
}

// mayAskForDevices: the pod requests an extended resource or a ResourceClaim (what the core may
// serve; it decides, this only keeps such pods out of batching).
func mayAskForDevices(pod *v1.Pod) bool {
	if len(pod.Spec.ResourceClaims) > 0 {
		return true
	}
	extended := func(list v1.ResourceList) bool {
		for name := range list {
			if strings.Contains(string(name), "/") {
				return true
			}
		}
		return false
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if extended(cs[i].Resources.Limits) || extended(cs[i].Resources.Requests) {
				return true
			}
		}
	}
	return false
}

// EventsToRegister: the kube-scheduler events that can make a pod fumarole refused fit, each
// pod event with a hint that drops what cannot (a CPU pod finishing, a running pod's status
// changing): pods leaving or changing the devices they hold, the refused pod itself or another
// pending accelerator pod changing (a unit's pods read each other's annotations), nodes
// coming or changing. DeviceTopology changes and room the core's ledger gives back are not
// among them (see refused): the plugin retries those pods itself once the core has them.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete | fwk.Update}, QueueingHintFn: afterPodEvent},
		{Event: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Delete | fwk.Update}, QueueingHintFn: afterPodEvent},
		{Event: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.Update}},
	}, nil
}

// devicesAnnotation holds the devices fumarole chose for a pod (written with its Binding).
const devicesAnnotation = "fumarole.dev/devices"

// afterPodEvent is the queueing hint of another pod's deletion or update for a pod fumarole
// refused: Queue when the other pod may hold or free devices or change a unit's request; else
// QueueSkip. A pod deleted (or finished: kube-scheduler's cache drops terminal pods) that may
// ask for devices or holds fumarole's choice; a scheduled pod whose choice changed or that
// finished; a pending pod asking for devices in the refused pod's namespace (a unit's
// sibling). An object of another type: Queue, with the error.
func afterPodEvent(_ klog.Logger, refused *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	old, _ := oldObj.(*v1.Pod)
	updated, _ := newObj.(*v1.Pod)
	switch {
	case updated == nil && old == nil:
		return fwk.Queue, fmt.Errorf("pod event with %T and %T, not pods", oldObj, newObj)
	case updated == nil: // deleted
		if mayAskForDevices(old) || old.Annotations[devicesAnnotation] != "" {
			return fwk.Queue, nil
		}
	case updated.Spec.NodeName != "":
		changed := old == nil || old.Annotations[devicesAnnotation] != updated.Annotations[devicesAnnotation]
		if changed || (terminal(updated) && (old == nil || !terminal(old))) {
			if mayAskForDevices(updated) || updated.Annotations[devicesAnnotation] != "" || (old != nil && old.Annotations[devicesAnnotation] != "") {
				return fwk.Queue, nil
			}
		}
	default: // a pending pod changed
		if updated.Namespace == refused.Namespace && mayAskForDevices(updated) {
			return fwk.Queue, nil
		}
	}
	return fwk.QueueSkip, nil
}

// terminal: the pod has finished, and its devices are free.
func terminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}
