package abi

import (
	"strconv"
	"strings"
)

// The verdict codes of fumarole_task_evaluate.
const (
	Fits          = 0
	Unschedulable = 2 // not now: another placement could free the room
	Unresolvable  = 3 // not on this node whatever happens
)

// Verdicts are a task's verdicts on every node of the core's view.
type Verdicts struct {
	// The node order the verdicts follow, and per node: code, score and reason (an index
	// into reasons, -1 for none).
	table   *nodeTable
	codes   []uint8
	scores  []float64
	reason  []int32
	reasons []string
}

// nodeTable is the core's node order (one generation of it): node name -> position.
type nodeTable struct {
	generation uint64
	index      map[string]int32
}

// Verdict is one node's answer.
type Verdict struct {
	Code   int
	Score  float64
	Reason string
}

// On is the verdict for node, false when the core's view lacks it.
func (v *Verdicts) On(node string) (Verdict, bool) {
	i, ok := v.table.index[node]
	if !ok || int(i) >= len(v.codes) {
		return Verdict{}, false
	}
	out := Verdict{Code: int(v.codes[i]), Score: v.scores[i]}
	if r := v.reason[i]; r >= 0 && int(r) < len(v.reasons) {
		out.Reason = v.reasons[r]
	}
	return out, true
}

// AnyFitsAbove: some node fits with a score above score (an array scan, no name lookup).
func (v *Verdicts) AnyFitsAbove(score float64) bool {
	for i, s := range v.scores {
		if v.codes[i] == Fits && s > score {
			return true
		}
	}
	return false
}

// Best is the feasible node with the highest score (the first name on a tie), false when none
// is feasible.
func (v *Verdicts) Best() (string, float64, bool) {
	node, top, found := "", 0.0, false
	for name, i := range v.table.index {
		if int(i) >= len(v.codes) || v.codes[i] != Fits {
			continue
		}
		if s := v.scores[i]; !found || s > top || (s == top && name < node) {
			node, top, found = name, s, true
		}
	}
	return node, top, found
}

// FitCount is how many nodes fit, and how many the view has (an array scan, no names).
func (v *Verdicts) FitCount() (int, int) {
	n := 0
	for _, c := range v.codes {
		if c == Fits {
			n++
		}
	}
	return n, len(v.codes)
}

// Fitting are the nodes that fit, and how many nodes the view has.
func (v *Verdicts) Fitting() ([]string, int) {
	var fit []string
	for name, i := range v.table.index {
		if int(i) < len(v.codes) && v.codes[i] == Fits {
			fit = append(fit, name)
		}
	}
	return fit, len(v.codes)
}

// Reasons are the distinct reasons nodes were refused for, in the core's order.
func (v *Verdicts) Reasons() []string { return v.reasons }

// readVerdicts reads the core's answer (fumarole_task_evaluate_arrays): the header lines
// "G<TAB>generation", the node names ("N<TAB>name") when the generation is not known's, and the
// distinct reasons ("R<TAB>text"); then per node, in that order, its code, score and reason
// index, already in arrays. It answers the verdicts and the node table they follow (known, or
// the one the names make).
func readVerdicts(header string, known *nodeTable, codes []uint8, scores []float64, reasons []int32) (*Verdicts, *nodeTable) {
	v := &Verdicts{table: known, codes: codes, scores: scores, reason: reasons}
	var names []string
	for _, line := range strings.Split(strings.TrimSuffix(header, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "G\t"):
			g, _ := strconv.ParseUint(line[2:], 10, 64)
			if known == nil || known.generation != g {
				v.table = &nodeTable{generation: g}
			}
		case strings.HasPrefix(line, "N\t"):
			names = append(names, line[2:])
		case strings.HasPrefix(line, "R\t"):
			v.reasons = append(v.reasons, line[2:])
		}
	}
	if v.table == nil {
		v.table = &nodeTable{}
	}
	if v.table != known && v.table.index == nil {
		v.table.index = make(map[string]int32, len(names))
		for i, name := range names {
			v.table.index[name] = int32(i)
		}
	}
	return v, v.table
}
