package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// routes is the JSON API documented in e2e/README.md.
func (n *node) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
	// GET /pods[?namespace=NS&name=NAME]: every pod record, in admission order.
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		writeJSON(w, http.StatusOK, n.records(q.Get("namespace"), q.Get("name")))
	})
	// GET /devices: capacity per resource, healthy devices, devices held by active pods.
	mux.HandleFunc("GET /devices", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, n.snapshot())
	})
	// GET /events?since=N&wait=SECONDS: events with seq > N; with wait, blocks
	// up to that long until there is at least one.
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		var wait float64
		if v := r.URL.Query().Get("since"); v != "" {
			if _, err := fmt.Sscan(v, &since); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
		}
		if v := r.URL.Query().Get("wait"); v != "" {
			if _, err := fmt.Sscan(v, &wait); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
		}
		writeJSON(w, http.StatusOK, n.events.since(since, time.Duration(wait*float64(time.Second))))
	})
	// GET /dra/plugins: the DRA plugins the plugin manager registered with
	// the current DRA manager.
	mux.HandleFunc("GET /dra/plugins", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, n.draPlugins())
	})
	// POST /pods/prepare?uid=UID (or namespace=NS&name=NAME): PrepareResources
	// again for a pod in prepare_failed; answers its record after the try.
	mux.HandleFunc("POST /pods/prepare", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rec, err := n.retryPrepare(r.Context(), n.lookupUID(q.Get("uid"), q.Get("namespace"), q.Get("name")))
		writeRecord(w, rec, err)
	})
	// POST /pods/unprepare?uid=UID (or namespace=NS&name=NAME):
	// UnprepareResources again for a released pod whose unprepare failed.
	mux.HandleFunc("POST /pods/unprepare", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rec, err := n.retryUnprepare(r.Context(), n.lookupUID(q.Get("uid"), q.Get("namespace"), q.Get("name")))
		writeRecord(w, rec, err)
	})
	// POST /restart: a kubelet restart (new managers over the same checkpoint).
	mux.HandleFunc("/restart", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			writeErr(w, http.StatusMethodNotAllowed, errors.New("POST only"))
			return
		}
		gen, err := n.restart()
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]uint64{"generation": gen})
	})
	return mux
}

func writeRecord(w http.ResponseWriter, rec podRecord, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, rec)
	case errors.Is(err, errNotFound):
		writeErr(w, http.StatusNotFound, err)
	case errors.Is(err, errConflict):
		writeErr(w, http.StatusConflict, err)
	default:
		writeErr(w, http.StatusInternalServerError, err)
	}
}
