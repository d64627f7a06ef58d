// Package fumarole is fumarole's Volcano plugin. It answers to the names users already list in
// volcano-scheduler-configmap (MetaX's gpu-aware and gpu-podaffinity, Huawei's versioned
// volcano-npu_* name) and asks fumarole's decision core, linked in through its C ABI, for every
// decision: this package turns Volcano's objects into the core's input and its answers into
// Volcano's; it decides nothing.
//
// Per scheduling session: PrePredicate judges a task on every node in one call, Predicate and
// BatchNodeOrder answer from that result, and Volcano's allocations and their undoing go into
// the core's ledger as they happen, so the next task is judged with them.
package fumarole

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v2"
	"k8s.io/klog/v2"

	abi "fumarole.dev/scheduler-abi/go"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
)

// The names Volcano's configuration lists fumarole under.
const (
	GPUAware       = "gpu-aware"
	GPUPodAffinity = "gpu-podaffinity"
	// NPUPrefix starts Huawei's plugin name, which carries its version
	// (volcano-npu_v7.3.0_linux-x86_64).
	NPUPrefix = "volcano-npu"
)

// Options are the scheduler's own flags the core needs.
type Options struct {
	KubeConfig     string
	Master         string
	SchedulerNames []string
}

var options Options

// Configure passes the scheduler's flags on; main calls it before the scheduler starts.
func Configure(o Options) { options = o }

// Register makes the plugin known to Volcano under fumarole's names and under every Huawei NPU
// name the scheduler configuration file lists; it returns the names.
func Register(schedulerConfPath string) []string {
	names := []string{GPUAware, GPUPodAffinity}
	names = append(names, npuNames(schedulerConfPath)...)
	for _, name := range names {
		name := name
		framework.RegisterPluginBuilder(name, func(arguments framework.Arguments) framework.Plugin {
			return &plugin{name: name}
		})
	}
	return names
}

func ours(name string) bool {
	return name == GPUAware || name == GPUPodAffinity || strings.HasPrefix(name, NPUPrefix)
}

// npuNames are the volcano-npu_* plugin names in the configuration file (none when it cannot
// be read: Volcano reports that itself).
func npuNames(path string) []string {
	if path == "" {
		return nil
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var c conf.SchedulerConfiguration
	if err := yaml.Unmarshal(text, &c); err != nil {
		return nil
	}
	var names []string
	for _, tier := range c.Tiers {
		for _, p := range tier.Plugins {
			if strings.HasPrefix(p.Name, NPUPrefix) {
				names = append(names, p.Name)
			}
		}
	}
	return names
}

// The engine is one per process: Volcano builds a new plugin object every session.
var shared struct {
	sync.Mutex
	engine  *abi.Engine
	config  []byte
	changed bool
	tried   time.Time
	err     error
}

// retryAfter spaces the tries to start an engine that failed.
const retryAfter = 10 * time.Second

func engineFor(config []byte) (*abi.Engine, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.engine != nil {
		if !bytes.Equal(config, shared.config) && !shared.changed {
			shared.changed = true
			klog.Warningf("fumarole: the plugins' arguments changed; the ones fumarole started with stay in force until the scheduler restarts")
		}
		return shared.engine, nil
	}
	if shared.err != nil && time.Since(shared.tried) < retryAfter {
		return nil, shared.err
	}
	shared.tried = time.Now()
	klog.Infof("fumarole: starting the decision core")
	engine, err := abi.StartEngine(config)
	if err != nil {
		shared.err = err
		klog.Errorf("fumarole: %v (trying again in %v; until then tasks are not placed)", err, retryAfter)
		return nil, err
	}
	for _, note := range strings.Split(engine.Notes(), "\n") {
		if note != "" {
			klog.Warningf("fumarole: %s", note)
		}
	}
	klog.Infof("fumarole: decision core ready")
	shared.engine, shared.config, shared.err = engine, config, nil
	return engine, nil
}

// engineConfig is the core's configuration (EngineConfig in scheduler-abi/src/engine.rs): the
// scheduler's flags, fumarole's plugins in the tiers with their arguments as written, and the
// top-level configurations.
func engineConfig(ssn *framework.Session) ([]byte, error) {
	type entry struct {
		Name      string                 `json:"name"`
		Arguments map[string]interface{} `json:"arguments,omitempty"`
	}
	var plugins, configurations []entry
	for _, tier := range ssn.Tiers {
		for _, p := range tier.Plugins {
			if ours(p.Name) {
				plugins = append(plugins, entry{p.Name, jsonable(p.Arguments)})
			}
		}
	}
	for _, c := range ssn.Configurations {
		configurations = append(configurations, entry{c.Name, jsonable(c.Arguments)})
	}
	return json.Marshal(map[string]interface{}{
		"kubeconfig": options.KubeConfig,
		"master":     options.Master,
		"volcano": map[string]interface{}{
			"plugins":        plugins,
			"configurations": configurations,
			"schedulerNames": options.SchedulerNames,
		},
	})
}

// jsonable turns YAML's map[interface{}]interface{} values into JSON-encodable maps.
func jsonable(m map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(m))
	for k, v := range m {
		out[k] = jsonValue(v)
	}
	return out
}

func jsonValue(v interface{}) interface{} {
	switch t := v.(type) {
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, v := range t {
			m[fmt.Sprint(k)] = jsonValue(v)
		}
		return m
	case map[string]interface{}:
		return jsonable(t)
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, v := range t {
			l[i] = jsonValue(v)
		}
		return l
	default:
		return v
	}
}

// plugin is one session's instance under one of fumarole's names.
type plugin struct {
	name   string
	engine *abi.Engine
	// task UID -> *judged, from PrePredicate; emptied whenever an allocation changes the ledger.
	judged sync.Map
	// task UID -> allocation: this session's allocations not undone (Volcano v1.10 writes the
	// choices of those it bound at the session's close).
	allocations sync.Map
}

// allocation is a task Volcano allocated in this session: its job, node and pod as sent to the
// core.
type allocation struct {
	job  api.JobID
	node string
	pod  []byte
}

// judged is a task's verdict on every node (nil verdicts when notOurs or err).
type judged struct {
	notOurs  bool
	err      error
	verdicts *abi.Verdicts
}

func (p *plugin) Name() string { return p.name }

// OnSessionOpen: of fumarole's names in the tiers, the first does the work (the seeds list
// gpu-podaffinity and gpu-aware together); the others register nothing, so no task is judged
// twice.
func (p *plugin) OnSessionOpen(ssn *framework.Session) {
	if first := firstOurs(ssn); first != p.name {
		return
	}
	config, err := engineConfig(ssn)
	if err == nil {
		p.engine, err = engineFor(config)
	}
	if err != nil {
		// Without the core no device choice can be made: tasks wait rather than land blind.
		notReady := fmt.Errorf("fumarole is not ready: %v", err)
		ssn.AddPrePredicateFn(p.name, func(*api.TaskInfo) error { return notReady })
		return
	}
	withoutPredicateErrorCache(ssn)
	ssn.AddPrePredicateFn(p.name, p.prePredicate)
	ssn.AddPredicateFn(p.name, p.predicate)
	ssn.AddBatchNodeOrderFn(p.name, p.nodeOrder)
	ssn.AddEventHandler(&framework.EventHandler{
		AllocateFunc:   p.allocated,
		DeallocateFunc: p.deallocated,
	})
	registerPreBinder(ssn, p)
}

func (p *plugin) OnSessionClose(ssn *framework.Session) {
	if p.engine != nil {
		writeBoundChoices(ssn, p)
	}
}

var cacheNoteOnce, preBindNoteOnce sync.Once

// withoutPredicateErrorCache turns off the allocate action's predicate error cache for this
// session (the action reads its arguments after the plugins open). The cache takes a node that
// failed one pod of a task role as failed for every later pod of that role, but a gpu-group-size
// pod's nodes depend on its unit: the second unit of a job would find every node outside the
// first unit's super-node failed and the gang would never start. The user's configuration file
// is left as written; only this session's copy changes.
func withoutPredicateErrorCache(ssn *framework.Session) {
	configurations := make([]conf.Configuration, 0, len(ssn.Configurations)+1)
	found := false
	for _, c := range ssn.Configurations {
		if c.Name == "allocate" && !found {
			found = true
			arguments := make(map[string]interface{}, len(c.Arguments)+1)
			for k, v := range c.Arguments {
				arguments[k] = v
			}
			arguments[conf.EnablePredicateErrCacheKey] = false
			c = conf.Configuration{Name: c.Name, Arguments: arguments}
		}
		configurations = append(configurations, c)
	}
	if !found {
		configurations = append(configurations, conf.Configuration{
			Name:      "allocate",
			Arguments: map[string]interface{}{conf.EnablePredicateErrCacheKey: false},
		})
	}
	ssn.Configurations = configurations
	cacheNoteOnce.Do(func() {
		klog.Infof("fumarole: the allocate action's predicate error cache is off in every session (a gpu-group-size pod's nodes depend on its unit, not only its task role)")
	})
}

func firstOurs(ssn *framework.Session) string {
	for _, tier := range ssn.Tiers {
		for _, p := range tier.Plugins {
			if ours(p.Name) {
				return p.Name
			}
		}
	}
	return ""
}

func (p *plugin) prePredicate(task *api.TaskInfo) error {
	return p.judge(task).err
}

// judge returns the task's verdicts, judging it now when this session has none.
func (p *plugin) judge(task *api.TaskInfo) *judged {
	if j, ok := p.judged.Load(task.UID); ok {
		return j.(*judged)
	}
	j := p.evaluate(task)
	p.judged.Store(task.UID, j)
	return j
}

func (p *plugin) evaluate(task *api.TaskInfo) *judged {
	pod, err := json.Marshal(task.Pod)
	if err != nil {
		return &judged{err: fmt.Errorf("fumarole: encoding pod %s/%s: %v", task.Namespace, task.Name, err)}
	}
	verdicts, err := p.engine.Judge(pod)
	if err == abi.ErrNotOurs {
		return &judged{notOurs: true}
	}
	if err != nil {
		logRefusal(task, err)
		return &judged{err: err}
	}
	return &judged{verdicts: verdicts}
}

// refusals holds the last error logged per task: Volcano reports a PrePredicate error on the
// pod but logs it only at -v=3, and a task that cannot be judged fails again every session, so
// each task's error is logged when it first appears or changes, not every second.
var refusals struct {
	sync.Mutex
	last map[api.TaskID]string
}

// maxRefusals bounds refusals: past it the record starts afresh (a task may then be logged
// once more).
const maxRefusals = 10000

func logRefusal(task *api.TaskInfo, err error) {
	message := err.Error()
	refusals.Lock()
	defer refusals.Unlock()
	if refusals.last[task.UID] == message {
		return
	}
	if refusals.last == nil || len(refusals.last) >= maxRefusals {
		refusals.last = make(map[api.TaskID]string)
	}
	refusals.last[task.UID] = message
	klog.Errorf("fumarole: cannot judge task %s/%s: %v", task.Namespace, task.Name, err)
}

func (p *plugin) predicate(task *api.TaskInfo, node *api.NodeInfo) error {
	j := p.judge(task)
	switch {
	case j.err != nil:
		return j.err
	case j.notOurs:
		return nil
	}
	v, ok := j.verdicts.On(node.Name)
	if !ok {
		return api.NewFitErrWithStatus(task, node, &api.Status{
			Code: api.Unschedulable, Reason: "node not in fumarole's view yet", Plugin: p.name,
		})
	}
	switch v.Code {
	case abi.Fits:
		return nil
	case abi.Unresolvable:
		return api.NewFitErrWithStatus(task, node, &api.Status{
			Code: api.UnschedulableAndUnresolvable, Reason: v.Reason, Plugin: p.name,
		})
	default:
		return api.NewFitErrWithStatus(task, node, &api.Status{
			Code: api.Unschedulable, Reason: v.Reason, Plugin: p.name,
		})
	}
}

func (p *plugin) nodeOrder(task *api.TaskInfo, nodes []*api.NodeInfo) (map[string]float64, error) {
	j := p.judge(task)
	if j.err != nil || j.notOurs {
		return nil, nil
	}
	scores := make(map[string]float64, len(nodes))
	for _, n := range nodes {
		v, _ := j.verdicts.On(n.Name)
		scores[n.Name] = v.Score
	}
	return scores, nil
}

// allocated: Volcano put the task on task.NodeName in this session; the core records its
// devices now. The choice is written once Volcano binds the task (PreBind on v1.14, the
// session's close on v1.10), never for an allocation the session undoes.
func (p *plugin) allocated(event *framework.Event) {
	task := event.Task
	if klog.V(2).Enabled() {
		p.noteDisagreement(task)
	}
	p.forgetVerdicts()
	pod, err := json.Marshal(task.Pod)
	if err == nil {
		err = p.engine.Allocate(pod, task.NodeName)
	}
	if err == nil {
		p.allocations.Store(task.UID, allocation{job: task.Job, node: task.NodeName, pod: pod})
	}
	if err != nil && err != abi.ErrNotOurs {
		klog.Warningf("fumarole: allocating %s/%s to %s: %v", task.Namespace, task.Name, task.NodeName, err)
	}
}

// deallocated: Volcano undid the task's allocation; its devices go back to the free pool.
func (p *plugin) deallocated(event *framework.Event) {
	task := event.Task
	p.forgetVerdicts()
	p.allocations.Delete(task.UID)
	pod, err := json.Marshal(task.Pod)
	if err == nil {
		err = p.engine.Deallocate(pod)
	}
	if err != nil && err != abi.ErrNotOurs {
		klog.Warningf("fumarole: undoing %s/%s: %v", task.Namespace, task.Name, err)
	}
}

// noteDisagreement logs a task Volcano put on another node than the one fumarole scored
// highest (the other plugins' scores outweighed fumarole's), or with no verdict of this session:
// what to read when a placement surprises.
func (p *plugin) noteDisagreement(task *api.TaskInfo) {
	v, ok := p.judged.Load(task.UID)
	if !ok {
		klog.Infof("fumarole: Volcano put %s/%s on %s with no verdict of fumarole's in this session", task.Namespace, task.Name, task.NodeName)
		return
	}
	j := v.(*judged)
	if j.err != nil || j.notOurs {
		return
	}
	chosen, _ := j.verdicts.On(task.NodeName)
	// The scores first (an array), the names (a map) only when some node scored higher.
	if !j.verdicts.AnyFitsAbove(chosen.Score) {
		return
	}
	if best, top, found := j.verdicts.Best(); found && best != task.NodeName {
		klog.Infof("fumarole: Volcano put %s/%s on %s (fumarole: code %d, score %.2f); fumarole scored %s highest (%.2f)",
			task.Namespace, task.Name, task.NodeName, chosen.Code, chosen.Score, best, top)
	}
}

// forgetVerdicts: the ledger changed, so every task is judged again when next asked about.
func (p *plugin) forgetVerdicts() {
	p.judged.Range(func(k, _ interface{}) bool {
		p.judged.Delete(k)
		return true
	})
}
