package abi

import (
	"reflect"
	"sort"
	"testing"
)

// The core's answer: the generation, the names when the caller's table is another, the distinct
// reasons, then per node in that order a code, a score and a reason by index.
func TestVerdictsAreReadWithTheirReasonsAndTheNodeOrder(t *testing.T) {
	first := "G\t7\nN\tcpu-0\nN\tdgx-a\nN\tpcie-a\n" +
		"R\tnode publishes no DeviceTopology\nR\tneeds 4 nvidia.com/gpu, 3 free\n"
	codes, scores, reasons := []uint8{3, 0, 2}, []float64{0, 150.5, 0}, []int32{0, -1, 1}
	v, table := readVerdicts(first, nil, codes, scores, reasons)
	if table.generation != 7 || len(table.index) != 3 {
		t.Fatalf("table = %+v", table)
	}
	want := map[string]Verdict{
		"dgx-a":  {Code: Fits, Score: 150.5},
		"pcie-a": {Code: Unschedulable, Reason: "needs 4 nvidia.com/gpu, 3 free"},
		"cpu-0":  {Code: Unresolvable, Reason: "node publishes no DeviceTopology"},
	}
	check := func(v *Verdicts) {
		t.Helper()
		for name, w := range want {
			if got, ok := v.On(name); !ok || !reflect.DeepEqual(got, w) {
				t.Fatalf("%s: got %+v (%v), want %+v", name, got, ok, w)
			}
		}
		if _, ok := v.On("elsewhere"); ok {
			t.Fatal("a node the core does not know has no verdict")
		}
	}
	check(v)
	if node, score, ok := v.Best(); !ok || node != "dgx-a" || score != 150.5 {
		t.Fatalf("best = %s %v %v, want dgx-a 150.5 (the only feasible node)", node, score, ok)
	}
	if fit, all := v.Fitting(); !reflect.DeepEqual(fit, []string{"dgx-a"}) || all != 3 {
		t.Fatalf("fitting = %v of %d, want [dgx-a] of 3", fit, all)
	}
	if n, all := v.FitCount(); n != 1 || all != 3 {
		t.Fatalf("fit count = %d of %d, want 1 of 3", n, all)
	}
	if !v.AnyFitsAbove(150) || v.AnyFitsAbove(150.5) {
		t.Fatal("only dgx-a fits, at 150.5")
	}
	// The same generation again, without names: the known table is kept and used.
	again, kept := readVerdicts("G\t7\nR\tnode publishes no DeviceTopology\n"+
		"R\tneeds 4 nvidia.com/gpu, 3 free\n", table, codes, scores, reasons)
	if kept != table {
		t.Fatal("a known generation must keep its table")
	}
	check(again)
	// Another generation: a new table from the names sent.
	_, next := readVerdicts("G\t8\nN\tdgx-a\nN\tdgx-b\n", table, []uint8{0, 0}, []float64{1, 1}, []int32{-1, -1})
	if next == table || next.generation != 8 || next.index["dgx-b"] != 1 || len(next.index) != 2 {
		t.Fatalf("next = %+v", next)
	}
	none, _ := readVerdicts("G\t9\nN\tpcie-a\n", next, []uint8{2}, []float64{5}, []int32{-1})
	if _, _, ok := none.Best(); ok {
		t.Fatal("no feasible node, no best")
	}
	tie, _ := readVerdicts("G\t10\nN\tb\nN\ta\n", nil, []uint8{0, 0}, []float64{5, 5}, []int32{-1, -1})
	if node, _, _ := tie.Best(); node != "a" {
		t.Fatalf("a tie goes to the first name, got %s", node)
	}
	fit, _ := tie.Fitting()
	sort.Strings(fit)
	if !reflect.DeepEqual(fit, []string{"a", "b"}) {
		t.Fatalf("fitting = %v", fit)
	}
}
