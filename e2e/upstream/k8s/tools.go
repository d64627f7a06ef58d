//go:build tools

// Package tools pins the upstream main packages that build-upstream.sh builds
// straight from the module cache: k8s.io/kubernetes/cmd/kube-apiserver and
// k8s.io/kubernetes/cmd/kube-scheduler.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
