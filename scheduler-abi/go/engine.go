// Package abi is the cgo binding of fumarole's decision core (scheduler-abi, a Rust static
// library), for the scheduler plugins compiled into Volcano and kube-scheduler. The library is
// found through CGO_LDFLAGS (the plugins' build.sh set -L). Objects go in as JSON; a task's
// verdicts on every node come back in one call and are read into arrays ([Verdicts]).
package abi

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -lfumarole_scheduler_abi -ldl -lm -lpthread
#include <stdlib.h>
#include "fumarole_scheduler.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The status codes of the C ABI.
const (
	codeOK      = C.FUMAROLE_OK
	codeNotOurs = C.FUMAROLE_NOT_OURS
	codeError   = C.FUMAROLE_ERROR
	codePanic   = C.FUMAROLE_PANIC
)

// ErrNotOurs: the task asks for no device fumarole serves.
var ErrNotOurs = errors.New("the task asks for no device fumarole serves")

// Engine is fumarole's decision core, started once per scheduler process.
type Engine struct {
	ptr *C.fumarole_engine
	// The core's node order as last learnt: kept across tasks and cycles until the core's
	// nodes change, so a task costs slices, not a map of every node.
	nodes atomic.Pointer[nodeTable]
}

// StartEngine starts the core from its JSON configuration (watches and first view).
func StartEngine(config []byte) (*Engine, error) {
	var cerr *C.char
	p := C.fumarole_engine_start(bytesPtr(config), C.size_t(len(config)), &cerr)
	if p == nil {
		return nil, fmt.Errorf("starting fumarole: %s", take(cerr))
	}
	return &Engine{ptr: p}, nil
}

// EngineOverSnapshot is an engine over a directory of YAML objects, without an API server.
func EngineOverSnapshot(dir string, conf []byte) (*Engine, error) {
	var cerr *C.char
	d := []byte(dir)
	p := C.fumarole_engine_over_snapshot(bytesPtr(d), C.size_t(len(d)), bytesPtr(conf), C.size_t(len(conf)), &cerr)
	if p == nil {
		return nil, fmt.Errorf("fumarole over snapshot %s: %s", dir, take(cerr))
	}
	return &Engine{ptr: p}, nil
}

// Notes are the configuration's arguments fumarole does not implement, one line each.
func (e *Engine) Notes() string {
	var out *C.char
	C.fumarole_engine_notes(e.ptr, &out)
	return take(out)
}

// Judge judges the pod (JSON) on every node in one call and reads the answer: ErrNotOurs when
// the pod asks for no device fumarole serves, an error when its request is unusable.
func (e *Engine) Judge(pod []byte) (*Verdicts, error) {
	var known uint64
	table := e.nodes.Load()
	if table != nil {
		known = table.generation
	}
	var out *C.char
	var arrays C.fumarole_verdicts
	code := C.fumarole_task_evaluate_arrays(e.ptr, bytesPtr(pod), C.size_t(len(pod)), C.uint64_t(known), &out, &arrays)
	defer C.fumarole_verdicts_free(&arrays)
	header, err := answer(code, take(out))
	if err != nil {
		return nil, err
	}
	// Copied into Go memory: the verdicts outlive this call, the library's arrays do not.
	var codes []uint8
	var scores []float64
	var reasons []int32
	if n := int(arrays.len); n > 0 {
		codes = append(codes, unsafe.Slice((*uint8)(unsafe.Pointer(arrays.codes)), n)...)
		scores = append(scores, unsafe.Slice((*float64)(unsafe.Pointer(arrays.scores)), n)...)
		reasons = append(reasons, unsafe.Slice((*int32)(unsafe.Pointer(arrays.reasons)), n)...)
	}
	v, learnt := readVerdicts(header, table, codes, scores, reasons)
	if learnt != table {
		e.nodes.Store(learnt)
	}
	return v, nil
}

// Allocate records the pod's (JSON) devices on node.
func (e *Engine) Allocate(pod []byte, node string) error {
	var out *C.char
	n := []byte(node)
	code := C.fumarole_task_allocate(e.ptr, bytesPtr(pod), C.size_t(len(pod)), bytesPtr(n), C.size_t(len(n)), &out)
	_, err := answer(code, take(out))
	return err
}

// WriteChoicesAtPreBind: the scheduler says when each pod is bound (PreBind or Bind before the
// bind, WriteChoice as it binds), so allocations no longer write device choices themselves.
func (e *Engine) WriteChoicesAtPreBind() error {
	var out *C.char
	code := C.fumarole_engine_write_choices_at_prebind(e.ptr, &out)
	_, err := answer(code, take(out))
	return err
}

// PreBind writes the pod's (JSON) device choice on it before it is bound to node; an error
// means the pod must not be bound now.
func (e *Engine) PreBind(pod []byte, node string) error {
	var out *C.char
	n := []byte(node)
	code := C.fumarole_task_prebind(e.ptr, bytesPtr(pod), C.size_t(len(pod)), bytesPtr(n), C.size_t(len(n)), &out)
	_, err := answer(code, take(out))
	return err
}

// WriteChoice writes the pod's (JSON) device choice on it in the background as the scheduler
// binds it to node (for a scheduler with no hook that waits before its bind).
func (e *Engine) WriteChoice(pod []byte, node string) error {
	var out *C.char
	n := []byte(node)
	code := C.fumarole_task_write_choice(e.ptr, bytesPtr(pod), C.size_t(len(pod)), bytesPtr(n), C.size_t(len(n)), &out)
	_, err := answer(code, take(out))
	return err
}

// Bind binds the pod (JSON) to node with its device choice in the Binding (kube-scheduler's
// Bind); ErrNotOurs: the scheduler's default binder binds it.
func (e *Engine) Bind(pod []byte, node string) error {
	var out *C.char
	n := []byte(node)
	code := C.fumarole_task_bind(e.ptr, bytesPtr(pod), C.size_t(len(pod)), bytesPtr(n), C.size_t(len(n)), &out)
	_, err := answer(code, take(out))
	return err
}

// GiveUpPlan: the scheduler's other filters refused every node fumarole found fit for the pod
// (JSON). The core gives its unit's plan up and plans the unit elsewhere at the next try;
// the super-node given up, or "" when there was nothing to give up.
func (e *Engine) GiveUpPlan(pod []byte) (string, error) {
	var out *C.char
	code := C.fumarole_task_give_up_plan(e.ptr, bytesPtr(pod), C.size_t(len(pod)), &out)
	return answer(code, take(out))
}

// DeviceViews counts the core's views that took in a DeviceTopology change (only grows): when
// it moves, pods refused for want of devices may fit.
func (e *Engine) DeviceViews() uint64 {
	return uint64(C.fumarole_engine_device_views(e.ptr))
}

// RoomFreed counts the times the core's ledger gave room back (a reservation undone, a plan
// dropped or lapsed; only grows): when it moves, pods refused for want of room may fit.
func (e *Engine) RoomFreed() uint64 {
	return uint64(C.fumarole_engine_room_freed(e.ptr))
}

// Deallocate releases the pod's (JSON) devices.
func (e *Engine) Deallocate(pod []byte) error {
	var out *C.char
	code := C.fumarole_task_deallocate(e.ptr, bytesPtr(pod), C.size_t(len(pod)), &out)
	_, err := answer(code, take(out))
	return err
}

func answer(code C.int, text string) (string, error) {
	switch code {
	case codeOK:
		return text, nil
	case codeNotOurs:
		return "", ErrNotOurs
	case codePanic:
		return "", fmt.Errorf("fumarole: %s", text)
	default:
		return "", errors.New(text)
	}
}

// take copies a string the library returned into Go and frees it.
func take(s *C.char) string {
	if s == nil {
		return ""
	}
	defer C.fumarole_string_free(s)
	return C.GoString(s)
}

// bytesPtr is b's first byte for C (Go memory, read during the call only), or NULL.
func bytesPtr(b []byte) *C.uint8_t {
	if len(b) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0]))
}
