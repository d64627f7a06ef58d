package fumarole

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

func TestOnlyPodsThatMayAskForDevicesStayOutOfBatching(t *testing.T) {
	with := func(r v1.ResourceList) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{Limits: r}}}}}
	}
	if mayAskForDevices(with(v1.ResourceList{"cpu": resource.MustParse("1"), "memory": resource.MustParse("1Gi")})) {
		t.Fatal("a CPU and memory pod asks for no device")
	}
	if !mayAskForDevices(with(v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")})) {
		t.Fatal("a GPU pod may")
	}
	claims := &v1.Pod{Spec: v1.PodSpec{ResourceClaims: []v1.PodResourceClaim{{Name: "gpu"}}}}
	if !mayAskForDevices(claims) {
		t.Fatal("a pod with a ResourceClaim may")
	}
	init := &v1.Pod{Spec: v1.PodSpec{InitContainers: []v1.Container{{Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{"huawei.com/Ascend910": resource.MustParse("1")}}}}}}
	if !mayAskForDevices(init) {
		t.Fatal("an init container's device counts too")
	}
}

// The core gets the scheduler's own client configuration as a kubeconfig: server, CA and
// credentials, files kept as files.
func TestTheSchedulersClientConfigurationBecomesAKubeconfig(t *testing.T) {
	text, err := kubeconfigYAML(&rest.Config{
		Host:            "https://10.0.0.1:6443",
		BearerTokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
		TLSClientConfig: rest.TLSClientConfig{CAFile: "/ca.crt"},
	})
	if err != nil {
		t.Fatal(err)
	}
	back, err := clientcmd.Load(text)
	if err != nil {
		t.Fatal(err)
	}
	cluster := back.Clusters[back.Contexts[back.CurrentContext].Cluster]
	user := back.AuthInfos[back.Contexts[back.CurrentContext].AuthInfo]
	if cluster.Server != "https://10.0.0.1:6443" || cluster.CertificateAuthority != "/ca.crt" ||
		user.TokenFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Fatalf("got %s", text)
	}
	if _, err := kubeconfigYAML(&rest.Config{}); err == nil {
		t.Fatal("no server is an error")
	}
}

func TestTheEngineConfigurationNamesTheProfileAndPassesTheArgsAsWritten(t *testing.T) {
	out, err := engineConfig([]byte("kubeconfig"), "gpu-scheduler", json.RawMessage(`{"lossWeight":0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kubeScheduler":{"args":{"lossWeight":0.5},"schedulerNames":["gpu-scheduler"]},"kubeconfigYaml":"kubeconfig"}`
	if string(out) != want {
		t.Fatalf("got %s, want %s", out, want)
	}
	none, _ := engineConfig(nil, "p", nil)
	if !strings.Contains(string(none), `"args":null`) {
		t.Fatalf("no args: %s", none)
	}
}

// Pod events wake a refused pod only when they can change what fumarole sees: devices freed,
// a choice changed, a sibling accelerator pod changed. A CPU pod leaving or a running pod's
// status changing does not.
func TestPodEventsQueueTheRefusedPodOnlyWhenDevicesMayChange(t *testing.T) {
	limits := func(r v1.ResourceList) v1.PodSpec {
		return v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{Limits: r}}}}
	}
	gpu := limits(v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")})
	cpu := limits(v1.ResourceList{"cpu": resource.MustParse("1")})
	pod := func(ns string, spec v1.PodSpec, node string, phase v1.PodPhase, devices string) *v1.Pod {
		p := &v1.Pod{Spec: spec, Status: v1.PodStatus{Phase: phase}}
		p.Namespace = ns
		p.Spec.NodeName = node
		if devices != "" {
			p.Annotations = map[string]string{devicesAnnotation: devices}
		}
		return p
	}
	refused := pod("train", gpu, "", v1.PodPending, "")
	for _, c := range []struct {
		what     string
		old, new *v1.Pod
		want     fwk.QueueingHint
	}{
		{"a GPU pod deleted", pod("a", gpu, "n1", v1.PodRunning, "gpu0"), nil, fwk.Queue},
		{"a CPU pod deleted", pod("a", cpu, "n1", v1.PodRunning, ""), nil, fwk.QueueSkip},
		{"a CPU pod holding fumarole's choice deleted", pod("a", cpu, "n1", v1.PodRunning, "gpu0"), nil, fwk.Queue},
		{"a GPU pod finished", pod("a", gpu, "n1", v1.PodRunning, "gpu0"), pod("a", gpu, "n1", v1.PodSucceeded, "gpu0"), fwk.Queue},
		{"a CPU pod finished", pod("a", cpu, "n1", v1.PodRunning, ""), pod("a", cpu, "n1", v1.PodFailed, ""), fwk.QueueSkip},
		{"a running GPU pod's status changed", pod("a", gpu, "n1", v1.PodRunning, "gpu0"), pod("a", gpu, "n1", v1.PodRunning, "gpu0"), fwk.QueueSkip},
		{"a bound pod's choice withdrawn", pod("a", gpu, "n1", v1.PodRunning, "gpu0"), pod("a", gpu, "n1", v1.PodRunning, ""), fwk.Queue},
		{"a pending GPU pod of the namespace changed", pod("train", gpu, "", v1.PodPending, ""), pod("train", gpu, "", v1.PodPending, ""), fwk.Queue},
		{"a pending GPU pod of another namespace changed", pod("web", gpu, "", v1.PodPending, ""), pod("web", gpu, "", v1.PodPending, ""), fwk.QueueSkip},
		{"a pending CPU pod of the namespace changed", pod("train", cpu, "", v1.PodPending, ""), pod("train", cpu, "", v1.PodPending, ""), fwk.QueueSkip},
	} {
		var oldObj, newObj interface{}
		oldObj = c.old
		if c.new != nil {
			newObj = c.new
		}
		got, err := afterPodEvent(klog.Background(), refused, oldObj, newObj)
		if err != nil || got != c.want {
			t.Errorf("%s: %v (%v), want %v", c.what, got, err, c.want)
		}
	}
	if got, err := afterPodEvent(klog.Background(), refused, "x", nil); got != fwk.Queue || err == nil {
		t.Errorf("a non-pod: %v (%v), want Queue with an error", got, err)
	}
}
