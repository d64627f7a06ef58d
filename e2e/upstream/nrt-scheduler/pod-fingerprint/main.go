// pod-fingerprint prints podfingerprint's signature of the pods named on stdin, one
// `namespace/name` a line, so the e2e tests can hold the agent's nodeTopologyPodsFingerprint
// against the library NodeResourceTopologyMatch and node-feature-discovery use.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/k8stopologyawareschedwg/podfingerprint"
)

func main() {
	fp := podfingerprint.NewFingerprint(0)
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		namespace, name, ok := strings.Cut(line, "/")
		if !ok {
			fmt.Fprintf(os.Stderr, "pod-fingerprint: %q is not namespace/name\n", line)
			os.Exit(2)
		}
		_ = fp.Add(namespace, name)
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "pod-fingerprint: reading stdin: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(fp.Sign())
}
