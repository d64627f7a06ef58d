package fumarole

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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
