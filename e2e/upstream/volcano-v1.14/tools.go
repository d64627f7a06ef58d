//go:build tools

// Package tools pins the Volcano v1.14 main package that build-upstream.sh builds from the
// module cache for the e2e runs against vc-scheduler-fumarole-v1.14.1.
package tools

import _ "volcano.sh/volcano/cmd/controller-manager"
