//go:build volcano_v1_14

package fumarole

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/klog/v2"

	abi "fumarole.dev/scheduler-abi/go"
	"volcano.sh/volcano/pkg/scheduler/cache"
	"volcano.sh/volcano/pkg/scheduler/framework"
)

// Volcano v1.14 binds through PreBinders (cache.PreBinder): the plugin registers as one, and
// the core writes each task's device choice before its bind, so the pod is bound with it
// rather than the choice following the bind.
func registerPreBinder(ssn *framework.Session, p *plugin) {
	if err := p.engine.WriteChoicesAtPreBind(); err != nil {
		klog.Errorf("fumarole: choices stay written at allocation: %v", err)
		return
	}
	ssn.RegisterBinder(p.name, p)
	preBindNoteOnce.Do(func() {
		klog.Infof("fumarole: device choices are written at PreBind, before each bind")
	})
}

// writeBoundChoices: nothing to do at the session's close, PreBind writes each choice.
func writeBoundChoices(*framework.Session, *plugin) {}

// PreBind writes the task's device choice on its pod; an error keeps Volcano from binding it.
func (p *plugin) PreBind(_ context.Context, bindCtx *cache.BindContext) error {
	task := bindCtx.TaskInfo
	pod, err := json.Marshal(task.Pod)
	if err == nil {
		err = p.engine.PreBind(pod, task.NodeName)
	}
	if err == nil || err == abi.ErrNotOurs {
		return nil
	}
	return fmt.Errorf("fumarole: %s/%s on %s: %v", task.Namespace, task.Name, task.NodeName, err)
}

// PreBindRollBack: the bind (or a later PreBinder) failed; the devices go back and the choice
// comes off the pod.
func (p *plugin) PreBindRollBack(_ context.Context, bindCtx *cache.BindContext) {
	task := bindCtx.TaskInfo
	pod, err := json.Marshal(task.Pod)
	if err == nil {
		err = p.engine.Deallocate(pod)
	}
	if err != nil && err != abi.ErrNotOurs {
		klog.Warningf("fumarole: undoing %s/%s after a failed bind: %v", task.Namespace, task.Name, err)
	}
}
