// Command kubelet-node is one harness node for the e2e tests: the kubelet's
// own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) and
// topology manager (pkg/kubelet/cm/topologymanager) admitting the pods bound
// to one Node, watched from the API server.
//
// For each new pod with spec.nodeName == --node-name it runs the kubelet's
// admit handlers in the kubelet's order (the topology manager, whose Admit
// calls the device manager's Allocate per container, which calls the
// plugins' GetPreferredAllocation and Allocate; then the predicate admit
// handler), then GetDeviceRunContainerOptions per container, and records what
// each container got. Admitted pods are set Running, refused ones Failed with
// the kubelet's reason. Deleted pods leave the device manager's active set, so
// their devices come back. The Node's status.capacity and allocatable of the
// device resources follow the device manager's GetCapacity.
//
// With --dra (the default) it also runs the kubelet's DRA manager
// (pkg/kubelet/cm/dra, checkpoint in --dra-state-dir) and plugin manager
// (pkg/kubelet/pluginmanager, watching --plugins-registry-dir with the DRA
// manager's registration handler), as the kubelet wires them: an admitted pod
// with ResourceClaims gets PrepareResources before its containers start
// (state prepare_failed when that fails; POST /pods/prepare retries), each
// container the CDI devices of GetResources, and a terminated pod
// UnprepareResources. See dra.go.
//
// devicemanager.NewManagerImpl serves /var/lib/kubelet/device-plugins/kubelet.sock
// and nothing else, so kubelet-node must run in a mount namespace of its own
// (`unshare --mount --propagation private kubelet-node ...`): it binds
// --plugin-dir there, for itself only.
//
// It is driven over a loopback HTTP port with JSON out (see e2e/README.md)
// and prints one JSON line to stdout once it serves:
//
//	{"addr":"127.0.0.1:PORT","node":"n1","plugin_dir":"/dir","socket":"/dir/kubelet.sock",...}
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kubelet-node: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	nodeName := flag.String("node-name", "", "the Node whose pods this node admits (required)")
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server (default $KUBECONFIG)")
	pluginDir := flag.String("plugin-dir", "", "host directory bound at /var/lib/kubelet/device-plugins: kubelet.sock, the plugins' sockets and the checkpoint (required)")
	listen := flag.String("listen", "127.0.0.1:0", "loopback address for the JSON API")
	policy := flag.String("topology-manager-policy", topologymanager.PolicyNone, "none, best-effort, restricted or single-numa-node (the kubelet's topologyManagerPolicy)")
	scope := flag.String("topology-manager-scope", "container", "container or pod (the kubelet's topologyManagerScope)")
	policyOptions := flag.String("topology-manager-policy-options", "", "key=value,... (the kubelet's topologyManagerPolicyOptions)")
	numaNodes := flag.Int("numa-nodes", 1, "the machine's NUMA nodes (ids 0..N-1), what cadvisor would report to the managers")
	predicates := flag.Bool("predicates", true, "also run the kubelet's predicate admit handler (resources, node affinity, taints, ports) after the topology manager")
	statusInterval := flag.Duration("status-interval", time.Second, "how often the device capacity is written to the Node")
	hostIP := flag.String("host-ip", "127.0.0.1", "status.hostIP of admitted pods")
	admitDelay := flag.Duration("admit-delay", 0, "admit a new pod no sooner than this after it appeared (the kubelet's sync latency)")
	draOn := flag.Bool("dra", true, "run the kubelet's DRA manager and plugin manager for pods with ResourceClaims")
	registryDir := flag.String("plugins-registry-dir", "", "the kubelet's plugins_registry, where DRA plugins create <driver>-reg.sock (default: plugins_registry beside --plugin-dir)")
	pluginsDir := flag.String("plugins-dir", "", "the kubelet's plugins directory, where DRA plugins conventionally serve <driver>/dra.sock; only created (default: plugins beside --plugin-dir)")
	draStateDir := flag.String("dra-state-dir", "", "the DRA manager's checkpoint directory (dra_manager_state) (default: dra-state beside --plugin-dir)")
	klog.InitFlags(flag.CommandLine)
	flag.Parse()
	if *nodeName == "" || *pluginDir == "" {
		fail("--node-name and --plugin-dir are required")
	}
	if *numaNodes < 1 {
		fail("--numa-nodes must be at least 1")
	}
	opts := map[string]string{}
	for _, kv := range strings.Split(*policyOptions, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fail("--topology-manager-policy-options: %q is not key=value", kv)
		}
		opts[k] = v
	}
	dir, err := filepath.Abs(*pluginDir)
	if err != nil {
		fail("%v", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		fail("%v", err)
	}
	var draCfg *draConfig
	if *draOn {
		abs := func(p, def string) string {
			if p == "" {
				p = filepath.Join(filepath.Dir(dir), def)
			}
			a, err := filepath.Abs(p)
			if err != nil {
				fail("%v", err)
			}
			return a
		}
		draCfg = &draConfig{
			registryDir: abs(*registryDir, "plugins_registry"),
			pluginsDir:  abs(*pluginsDir, "plugins"),
			stateDir:    abs(*draStateDir, "dra-state"),
		}
	}
	if err := bindPluginDir(dir); err != nil {
		fail("%v", err)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	cfg.UserAgent = "kubelet-node/" + *nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	n := &node{
		name:       *nodeName,
		hostIP:     *hostIP,
		client:     client,
		recorder:   broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: *nodeName}),
		machine:    machineTopology(*numaNodes),
		policy:     *policy,
		scope:      *scope,
		options:    opts,
		predicates: *predicates,
		admitDelay: *admitDelay,
		dra:        draCfg,
		events:     newEventLog(),
		pods:       map[types.UID]*podRecord{},
		capacity:   map[string]capacityPair{},
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queue := make(chan podEvent, 4096)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", *nodeName).String()
	}))
	podInformer := factory.Core().V1().Pods().Informer()
	_, err = podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { queue <- podEvent{pod: obj.(*v1.Pod), at: time.Now()} },
		UpdateFunc: func(_, obj any) { queue <- podEvent{pod: obj.(*v1.Pod), at: time.Now()} },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				queue <- podEvent{pod: pod, deleted: true, at: time.Now()}
			}
		},
	})
	if err != nil {
		fail("pod informer: %v", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		fail("pod informer did not sync")
	}
	n.synced.Store(true)

	if err := n.start(); err != nil {
		fail("%v", err)
	}
	n.events.record(Event{Kind: "started", Generation: n.gen()})
	go func() {
		for ev := range queue {
			n.handle(ctx, ev)
		}
	}()
	go func() {
		t := time.NewTicker(*statusInterval)
		defer t.Stop()
		for {
			n.syncCapacity(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fail("listen: %v", err)
	}
	helloFields := map[string]string{
		"addr":           ln.Addr().String(),
		"node":           *nodeName,
		"plugin_dir":     dir,
		"socket":         filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)),
		"kubelet_socket": pluginapi.KubeletSocket,
	}
	if draCfg != nil {
		helloFields["plugins_registry_dir"] = draCfg.registryDir
		helloFields["plugins_dir"] = draCfg.pluginsDir
		helloFields["dra_state_dir"] = draCfg.stateDir
	}
	hello, _ := json.Marshal(helloFields)
	fmt.Println(string(hello))
	httpSrv := &http.Server{Handler: n.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail("http: %v", err)
		}
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	_ = httpSrv.Close()
	cancel()
	_ = n.stop()
}
