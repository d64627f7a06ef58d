// The cgo binding of fumarole's decision core (the scheduler-abi crate's static library), shared
// by the scheduler plugins that link it: volcano-plugin and kube-plugin. No Kubernetes or
// scheduler dependency, so each plugin's module pins its own.
module fumarole.dev/scheduler-abi/go

go 1.22.0
