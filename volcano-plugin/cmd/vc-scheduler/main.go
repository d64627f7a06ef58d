// Command vc-scheduler is Volcano's scheduler (the version go.mod pins) with fumarole's plugin
// compiled in: the same flags and configuration file as upstream's vc-scheduler, plus the
// plugin names gpu-aware, gpu-podaffinity and Huawei's volcano-npu_* (see package fumarole).
package main

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

func main() {
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
	klog.Infof("fumarole plugin registered as %v", fumarole.Register(opts.SchedulerConf))

	klog.StartFlushDaemon(*logFlushFreq)
	defer klog.Flush()
	if err := app.Run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
}
