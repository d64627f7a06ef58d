package fumarole

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
)

// Huawei's plugin name carries its version, so the names to register come from the file.
func TestNPUNamesComeFromTheSchedulerConfiguration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "volcano-scheduler.conf")
	text := `actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
  - name: volcano-npu_v7.3.0_linux-x86_64
- plugins:
  - name: predicates
configurations:
  - name: init-params
    arguments: {"grace-over-time":"900","super-pod-size":"48","reserve-nodes":"2"}
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got := npuNames(path)
	if want := []string{"volcano-npu_v7.3.0_linux-x86_64"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("npuNames = %v, want %v", got, want)
	}
	if got := npuNames(filepath.Join(t.TempDir(), "missing")); got != nil {
		t.Fatalf("a missing file gives no names, got %v", got)
	}
}

// The allocate action's predicate error cache is off in the session's copy of the
// configurations; the user's own list is left as written, other arguments kept.
func TestThePredicateErrorCacheIsOffOnlyInTheSessionsCopy(t *testing.T) {
	user := []conf.Configuration{
		{Name: "init-params", Arguments: map[string]interface{}{"super-pod-size": "48"}},
		{Name: "allocate", Arguments: map[string]interface{}{"other": "kept"}},
	}
	ssn := &framework.Session{Configurations: user}
	withoutPredicateErrorCache(ssn)
	args := framework.GetArgOfActionFromConf(ssn.Configurations, "allocate")
	enabled := true
	args.GetBool(&enabled, conf.EnablePredicateErrCacheKey)
	if enabled || args["other"] != "kept" {
		t.Fatalf("session allocate arguments = %v", args)
	}
	if _, touched := user[1].Arguments[conf.EnablePredicateErrCacheKey]; touched {
		t.Fatalf("the user's configuration was changed: %v", user[1].Arguments)
	}

	ssn = &framework.Session{}
	withoutPredicateErrorCache(ssn)
	args = framework.GetArgOfActionFromConf(ssn.Configurations, "allocate")
	enabled = true
	args.GetBool(&enabled, conf.EnablePredicateErrCacheKey)
	if enabled {
		t.Fatalf("without an allocate entry one is added: %v", ssn.Configurations)
	}
}

// YAML's nested maps (map[interface{}]interface{}) reach the core as JSON objects.
func TestArgumentsAsYAMLGivesThemReachTheCoreAsJSON(t *testing.T) {
	args := map[string]interface{}{
		"weight": 1,
		"nested": map[interface{}]interface{}{"a": []interface{}{map[interface{}]interface{}{1: "x"}}},
	}
	out, err := json.Marshal(jsonable(args))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"nested":{"a":[{"1":"x"}]},"weight":1}`; string(out) != want {
		t.Fatalf("got %s, want %s", out, want)
	}
}

// The core's answer: the generation, the names when the caller's table is another, the distinct
// reasons, then a line per node in that order naming a reason by index.
func TestVerdictsAreReadWithTheirReasonsAndTheNodeOrder(t *testing.T) {
	first := "G\t7\nN\tcpu-0\nN\tdgx-a\nN\tpcie-a\n" +
		"R\tnode publishes no DeviceTopology\nR\tneeds 4 nvidia.com/gpu, 3 free\n" +
		"3\t0\t0\n0\t150.5\t\n2\t0\t1\nbroken line\n"
	j, table := parseVerdicts(first, nil)
	if table.generation != 7 || len(table.index) != 3 {
		t.Fatalf("table = %+v", table)
	}
	want := map[string]verdict{
		"dgx-a":  {code: 0, score: 150.5},
		"pcie-a": {code: 2, reason: "needs 4 nvidia.com/gpu, 3 free"},
		"cpu-0":  {code: 3, reason: "node publishes no DeviceTopology"},
	}
	check := func(j *judged) {
		t.Helper()
		for name, w := range want {
			if got, ok := j.on(name); !ok || !reflect.DeepEqual(got, w) {
				t.Fatalf("%s: got %+v (%v), want %+v", name, got, ok, w)
			}
		}
		if _, ok := j.on("elsewhere"); ok {
			t.Fatal("a node the core does not know has no verdict")
		}
	}
	check(j)
	if node, score, ok := j.best(); !ok || node != "dgx-a" || score != 150.5 {
		t.Fatalf("best = %s %v %v, want dgx-a 150.5 (the only feasible node)", node, score, ok)
	}
	// The same generation again, without names: the known table is kept and used.
	again, kept := parseVerdicts("G\t7\nR\tnode publishes no DeviceTopology\n"+
		"R\tneeds 4 nvidia.com/gpu, 3 free\n3\t0\t0\n0\t150.5\t\n2\t0\t1\n", table)
	if kept != table {
		t.Fatal("a known generation must keep its table")
	}
	check(again)
	// Another generation: a new table from the names sent.
	_, next := parseVerdicts("G\t8\nN\tdgx-a\n0\t1\t\n", table)
	if next == table || next.generation != 8 || next.index["dgx-a"] != 0 || len(next.index) != 1 {
		t.Fatalf("next = %+v", next)
	}
	none, _ := parseVerdicts("G\t9\nN\tpcie-a\n2\t5\t\n", next)
	if _, _, ok := none.best(); ok {
		t.Fatal("no feasible node, no best")
	}
}
