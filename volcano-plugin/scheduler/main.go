// Package scheduler is the body of vc-scheduler-fumarole's main: Volcano's scheduler (the
// version the building module pins) with fumarole's plugin compiled in. It is a library so that
// each Volcano version's main module (cmd/vc-scheduler for the default, v1.14/ for v1.14) builds
// the same code against its own Volcano.
package scheduler

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	_ "go.uber.org/automaxprocs"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	cliflag "k8s.io/component-base/cli/flag"
	componentbaseoptions "k8s.io/component-base/config/options"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/cmd/scheduler/app"
	"volcano.sh/volcano/cmd/scheduler/app/options"
	commonutil "volcano.sh/volcano/pkg/util"
	"volcano.sh/volcano/pkg/version"

	// Volcano's own actions and plugins, as upstream's binary has them.
	_ "volcano.sh/volcano/pkg/scheduler/actions"
	_ "volcano.sh/volcano/pkg/scheduler/plugins"

	"fumarole.dev/volcano-plugin/fumarole"
)

// Main parses upstream vc-scheduler's flags, registers fumarole's plugin and runs the
// scheduler until it stops; it exits the process on failure.
func Main() {
	klog.InitFlags(nil)
	fs := pflag.CommandLine
	opts := options.NewServerOption()
	opts.AddFlags(fs)
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	commonutil.LeaderElectionDefault(&opts.LeaderElection)
	opts.LeaderElection.ResourceName = commonutil.GenerateComponentName(opts.SchedulerNames)
	componentbaseoptions.BindLeaderElectionFlags(&opts.LeaderElection, fs)
	opts.RegisterOptions()
	logFlushFreq := fs.Duration("log-flush-frequency", 5*time.Second, "Maximum number of seconds between log flushes")
	cliflag.InitFlags()

	if opts.PrintVersion {
		version.PrintVersionAndExit()
		return
	}
	if err := opts.CheckOptionOrDie(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	if opts.CaCertFile != "" && opts.CertFile != "" && opts.KeyFile != "" {
		if err := opts.ParseCAFiles(nil); err != nil {
			klog.Fatalf("Failed to parse CA file: %v", err)
		}
	}

	fumarole.Configure(fumarole.Options{
		KubeConfig:     opts.KubeClientOptions.KubeConfig,
		Master:         opts.KubeClientOptions.Master,
		SchedulerNames: opts.SchedulerNames,
	})
	klog.Infof("fumarole plugin registered as %v (Volcano %s)", fumarole.Register(opts.SchedulerConf), version.Version)

	klog.StartFlushDaemon(*logFlushFreq)
	defer klog.Flush()
	if err := app.Run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
}
