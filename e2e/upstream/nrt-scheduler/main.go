// nrt-scheduler: upstream kube-scheduler with the scheduler-plugins NodeResourceTopologyMatch
// plugin compiled in, so the e2e tests can check that a real NRT consumer reads what the
// agent publishes. Nothing else is registered: the test's profile names this plugin only.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"

	// Registers the plugin's args types (NodeResourceTopologyMatchArgs) with the config scheme.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New),
	)
	os.Exit(cli.Run(command))
}
