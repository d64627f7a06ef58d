//go:build !volcano_v1_14

package fumarole

import "volcano.sh/volcano/pkg/scheduler/framework"

// Volcano v1.10 has no PreBind: device choices are written at allocation, in the background
// (they may reach the pod after its bind; the device plugin waits for them).
func registerPreBinder(*framework.Session, *plugin) {}
