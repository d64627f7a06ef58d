// Command vc-scheduler is vc-scheduler-fumarole built against Volcano v1.14 (see go.mod): the
// same code as ../cmd/vc-scheduler.
package main

import "fumarole.dev/volcano-plugin/scheduler"

func main() { scheduler.Main() }
