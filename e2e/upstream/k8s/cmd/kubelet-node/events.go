package main

import (
	"sync"
	"time"
)

// Event is one recorded happening, in order. Seq starts at 1.
type Event struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
	// Kind: started, capacity, admitted, rejected, released, restarted; with
	// DRA also prepared, prepare_failed, unprepared, unprepare_failed,
	// dra_plugin_registered, dra_plugin_rejected, dra_plugin_deregistered,
	// dra_health_update.
	Kind string `json:"kind"`
	// Resource, Capacity and Allocatable: what the device manager's GetCapacity
	// reports for one resource (capacity).
	Resource    string `json:"resource,omitempty"`
	Capacity    *int64 `json:"capacity,omitempty"`
	Allocatable *int64 `json:"allocatable,omitempty"`
	// Pod is namespace/name, UID its uid (admitted, rejected, released).
	Pod string `json:"pod,omitempty"`
	UID string `json:"uid,omitempty"`
	// Reason and Message of a rejection, or why a pod was released; Message
	// is also the error of prepare_failed, unprepare_failed and dra_plugin_rejected.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Claims: the pod's ResourceClaim names (prepared, prepare_failed,
	// unprepared, unprepare_failed).
	Claims []string `json:"claims,omitempty"`
	// Driver, Endpoint and Services of a DRA plugin (dra_plugin_*): its
	// driver name, service socket and the gRPC services it advertised.
	Driver   string   `json:"driver,omitempty"`
	Endpoint string   `json:"endpoint,omitempty"`
	Services []string `json:"services,omitempty"`
	// Generation counts device-manager starts; 1 for the first.
	Generation uint64 `json:"generation"`
}

// eventLog is an append-only list of events that readers can wait on.
type eventLog struct {
	mu     sync.Mutex
	cond   *sync.Cond
	events []Event
}

func newEventLog() *eventLog {
	l := &eventLog{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *eventLog) record(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq = uint64(len(l.events)) + 1
	e.At = time.Now().UTC()
	l.events = append(l.events, e)
	l.cond.Broadcast()
}

// since returns the events with seq > since, waiting up to wait for one.
func (l *eventLog) since(since uint64, wait time.Duration) []Event {
	deadline := time.Now().Add(wait)
	timer := time.AfterFunc(wait, func() {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	defer timer.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for uint64(len(l.events)) <= since && time.Now().Before(deadline) {
		l.cond.Wait()
	}
	out := []Event{}
	if uint64(len(l.events)) > since {
		out = append(out, l.events[since:]...)
	}
	return out
}
