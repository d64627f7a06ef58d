package fumarole

// The cgo binding of fumarole's decision core (scheduler-abi, a Rust static library). The
// library is found through CGO_LDFLAGS (volcano-plugin/build.sh sets -L).

/*
#cgo CFLAGS: -I${SRCDIR}/../../scheduler-abi/include
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
	// The core's node order as last learnt: kept across tasks and sessions until the core's
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

// Evaluate judges the pod (JSON) on every node, in the core's node order; the node names come
// only when knownGeneration is not that order's generation (see fumarole_task_evaluate).
func (e *Engine) Evaluate(pod []byte, knownGeneration uint64) (string, error) {
	var out *C.char
	code := C.fumarole_task_evaluate(e.ptr, bytesPtr(pod), C.size_t(len(pod)), C.uint64_t(knownGeneration), &out)
	return answer(code, take(out))
}

// Allocate records the pod's (JSON) devices on node.
func (e *Engine) Allocate(pod []byte, node string) error {
	var out *C.char
	n := []byte(node)
	code := C.fumarole_task_allocate(e.ptr, bytesPtr(pod), C.size_t(len(pod)), bytesPtr(n), C.size_t(len(n)), &out)
	_, err := answer(code, take(out))
	return err
}

// WriteChoicesAtPreBind: the scheduler calls PreBind before each bind, so allocations no
// longer write device choices themselves.
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
