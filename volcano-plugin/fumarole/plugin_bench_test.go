package fumarole

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	abi "fumarole.dev/scheduler-abi/go"
	"volcano.sh/volcano/pkg/scheduler/api"
)

// snapshotOf writes a snapshot directory of n copies of the two-dgx snapshot's first
// DeviceTopology (an 8-GPU DGX H100), named node-00000.., for an engine without an API server.
func snapshotOf(b *testing.B, n int) string {
	text, err := os.ReadFile("../../scheduler-ext/tests/snapshots/two-dgx/devicetopologies.yaml")
	if err != nil {
		b.Fatal(err)
	}
	items := strings.Split(string(text), "\n- apiVersion: ")
	if len(items) < 2 {
		b.Fatal("no DeviceTopology in the two-dgx snapshot")
	}
	one := "- apiVersion: " + items[1]
	var out strings.Builder
	out.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := 0; i < n; i++ {
		out.WriteString(strings.Replace(one, "name: dgx-a", fmt.Sprintf("name: node-%05d", i), 1))
		out.WriteString("\n")
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "devicetopologies.yaml"), []byte(out.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkTaskAt5000Nodes is what the plugin adds to one task at 5,000 nodes: PrePredicate
// (the pod to JSON, one call into the core, its answer read into a map), a Predicate per node
// and one BatchNodeOrder. Link the release library for figures (test.sh --release).
func BenchmarkTaskAt5000Nodes(b *testing.B) {
	const n = 5000
	engine, err := abi.EngineOverSnapshot(snapshotOf(b, n), []byte(`{"volcano":{"plugins":[{"name":"gpu-aware"}]}}`))
	if err != nil {
		b.Fatal(err)
	}
	p := &plugin{name: GPUAware, engine: engine}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "two", Namespace: "default", UID: "uid-two"},
		Spec: v1.PodSpec{SchedulerName: "volcano", Containers: []v1.Container{{
			Name: "c",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("2"),
			}},
		}}},
	}
	task := &api.TaskInfo{UID: "uid-two", Namespace: "default", Name: "two", Pod: pod}
	nodes := make([]*api.NodeInfo, n)
	for i := range nodes {
		nodes[i] = &api.NodeInfo{Name: fmt.Sprintf("node-%05d", i)}
	}
	if err := p.prePredicate(task); err != nil {
		b.Fatal(err)
	}
	if err := p.predicate(task, nodes[0]); err != nil {
		b.Fatalf("an empty DGX must take a 2-GPU task: %v", err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.forgetVerdicts()
		if err := p.prePredicate(task); err != nil {
			b.Fatal(err)
		}
		for _, node := range nodes {
			_ = p.predicate(task, node)
		}
		if _, err := p.nodeOrder(task, nodes); err != nil {
			b.Fatal(err)
		}
	}
}
