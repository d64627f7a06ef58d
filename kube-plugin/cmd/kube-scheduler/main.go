// kube-scheduler-fumarole: upstream kube-scheduler (the version go.mod pins) with fumarole's
// framework plugin compiled in under the name Fumarole. A profile enables it in its
// KubeSchedulerConfiguration (deploy/kube-plugin/ has one); without that it is upstream's
// scheduler unchanged.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"fumarole.dev/kube-plugin/fumarole"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(fumarole.Name, fumarole.New))
	os.Exit(cli.Run(command))
}
