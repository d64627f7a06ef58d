// Command vc-scheduler is Volcano's scheduler (the version go.mod pins) with fumarole's plugin
// compiled in: the same flags and configuration file as upstream's vc-scheduler, plus the
// plugin names gpu-aware, gpu-podaffinity and Huawei's volcano-npu_* (see package fumarole).
package main

import "fumarole.dev/volcano-plugin/scheduler"

func main() { scheduler.Main() }
