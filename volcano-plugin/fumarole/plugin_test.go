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
