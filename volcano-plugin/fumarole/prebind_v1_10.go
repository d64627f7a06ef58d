//go:build !volcano_v1_14

package fumarole

import (
	"k8s.io/klog/v2"

	abi "fumarole.dev/scheduler-abi/go"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/framework"
)

// Volcano v1.10 has no PreBind, and a gang's allocations may be discarded in the session that
// made them: a choice written at allocation could still be on the pod when a later session
// binds it with another (the device plugin would read the stale one). So allocations only
// commit to the ledger, and the session's close writes the choices of the tasks it bound, in
// the background (they may reach the pod after its bind; the device plugin waits for them).
func registerPreBinder(_ *framework.Session, p *plugin) {
	if err := p.engine.WriteChoicesAtPreBind(); err != nil {
		klog.Errorf("fumarole: choices stay written at allocation: %v", err)
	}
}

// writeBoundChoices writes the device choice of every task this session allocated and Volcano
// is binding (status Binding: its statement was committed; a discarded one is Pending again).
func writeBoundChoices(ssn *framework.Session, p *plugin) {
	p.allocations.Range(func(uid, value any) bool {
		a := value.(allocation)
		job, ok := ssn.Jobs[a.job]
		if !ok {
			return true
		}
		task, ok := job.Tasks[uid.(api.TaskID)]
		if !ok || task.Status != api.Binding {
			return true
		}
		if err := p.engine.WriteChoice(a.pod, a.node); err != nil && err != abi.ErrNotOurs {
			klog.Errorf("fumarole: writing the devices of %s/%s on %s: %v", task.Namespace, task.Name, a.node, err)
		}
		return true
	})
}
