package abi

import (
	"testing"
)

// Judge through the library over the two-dgx snapshot: the arrays come back in the core's node
// order with their reasons, the node order is learnt once, and refusals are errors.
func TestJudgeReadsTheCoresArrays(t *testing.T) {
	e, err := EngineOverSnapshot("../../scheduler-ext/tests/snapshots/two-dgx", []byte(`{"volcano":{"plugins":[{"name":"gpu-aware"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	pod := []byte(`{"metadata":{"name":"four","namespace":"default","uid":"uid-four"},
		"spec":{"schedulerName":"volcano","containers":[{"name":"c",
		"resources":{"limits":{"nvidia.com/gpu":"4"}}}]}}`)
	v, err := e.Judge(pod)
	if err != nil {
		t.Fatal(err)
	}
	// dgx-a has exactly 4 free GPUs (the best fit), dgx-b 6, pcie-a 3; cpu-0 has none.
	a, okA := v.On("dgx-a")
	b, okB := v.On("dgx-b")
	if !okA || !okB || a.Code != Fits || b.Code != Fits || a.Score <= b.Score {
		t.Fatalf("dgx-a %+v, dgx-b %+v: both fit, the exact fit scores higher", a, b)
	}
	if p, _ := v.On("pcie-a"); p.Code != Unschedulable || p.Reason != "needs 4 nvidia.com/gpu, 3 free" {
		t.Fatalf("pcie-a %+v", p)
	}
	if c, _ := v.On("cpu-0"); c.Code != Unresolvable || c.Reason == "" {
		t.Fatalf("cpu-0 %+v", c)
	}
	if fits, all := v.FitCount(); fits != 2 || all != 4 {
		t.Fatalf("fit count %d of %d, want 2 of 4", fits, all)
	}
	table := e.nodes.Load()
	again, err := e.Judge(pod)
	if err != nil || e.nodes.Load() != table {
		t.Fatalf("the node order is kept while the core's is unchanged (%v)", err)
	}
	if b2, _ := again.On("dgx-b"); b2 != b {
		t.Fatalf("judged again: %+v, was %+v", b2, b)
	}
	if _, err := e.Judge([]byte(`{"metadata":{"name":"cpu","namespace":"default"},"spec":{"containers":[{"name":"c"}]}}`)); err != ErrNotOurs {
		t.Fatalf("a pod without devices: %v, want ErrNotOurs", err)
	}
	if _, err := e.Judge([]byte(`{not json`)); err == nil || err == ErrNotOurs {
		t.Fatalf("malformed pod: %v, want an error", err)
	}
}
