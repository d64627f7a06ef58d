//go:build tools

// Package tools pins the upstream Volcano main packages that
// build-upstream.sh builds straight from the module cache.
package tools

import (
	_ "volcano.sh/volcano/cmd/controller-manager"
	_ "volcano.sh/volcano/cmd/scheduler"
)
