// Command helm-render renders a Helm chart directory to stdout with Helm's own Go
// library, like `helm template`, so the e2e tests can apply the chart's manifests to
// their control plane without a helm binary or a helm install.
//
//	helm-render --chart DIR [--release NAME] [--namespace NS]
//	            [--values FILE]... [--set key=value]... [--include-crds]
//
// Values are merged as `helm template` does: the chart's values.yaml, then each
// --values file in order, then each --set. The output is a multi-document YAML stream,
// each document preceded by `---` and `# Source: <path>`, CRDs first (with
// --include-crds), then the templates, sorted by path. Errors go to stderr, exit code 1.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

const usage = "usage: helm-render --chart DIR [--release NAME] [--namespace NS] [--values FILE]... [--set key=value]... [--include-crds]"

func main() {
	flag.CommandLine.Init("helm-render", flag.ContinueOnError)
	flag.Usage = func() { fmt.Fprintln(os.Stderr, usage); flag.PrintDefaults() }
	chartDir := flag.String("chart", "", "chart directory (required)")
	release := flag.String("release", "fumarole", "release name")
	namespace := flag.String("namespace", "fumarole-system", "release namespace")
	includeCRDs := flag.Bool("include-crds", false, "print the chart's crds/ first")
	var valueFiles, sets repeated
	flag.Var(&valueFiles, "values", "values file (repeatable, later files win)")
	flag.Var(&sets, "set", "key=value, as helm --set (repeatable, applied after --values)")
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		os.Exit(1) // the flag package has printed the error and usage
	}
	if *chartDir == "" || flag.NArg() > 0 {
		fail(errors.New(usage))
	}
	if err := run(*chartDir, *release, *namespace, valueFiles, sets, *includeCRDs); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "helm-render:", err)
	os.Exit(1)
}

func run(chartDir, release, namespace string, valueFiles, sets []string, includeCRDs bool) error {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return err
	}

	vals := map[string]interface{}{}
	for _, f := range valueFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		cur := map[string]interface{}{}
		if err := yaml.Unmarshal(data, &cur); err != nil {
			return fmt.Errorf("failed to parse %s: %w", f, err)
		}
		vals = mergeMaps(vals, cur)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return fmt.Errorf("failed parsing --set %q: %w", s, err)
		}
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, vals); err != nil {
		return err
	}

	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	renderVals, err := chartutil.ToRenderValues(chrt, vals, opts, caps)
	if err != nil {
		return err
	}
	rendered, err := engine.Render(chrt, renderVals)
	if err != nil {
		return err
	}

	out := bufio.NewWriter(os.Stdout)
	if includeCRDs {
		crds := chrt.CRDObjects()
		sort.Slice(crds, func(i, j int) bool { return crds[i].Filename < crds[j].Filename })
		for _, crd := range crds {
			writeDocs(out, crd.Filename, string(crd.File.Data))
		}
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		base := path.Base(name)
		if base != "NOTES.txt" && !strings.HasPrefix(base, "_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		writeDocs(out, name, rendered[name])
	}
	return out.Flush()
}

// docSep splits a YAML stream into documents, as Helm's releaseutil.SplitManifests does.
var docSep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// writeDocs prints each document of text that holds more than whitespace and comments.
func writeDocs(out *bufio.Writer, source, text string) {
	for _, doc := range docSep.Split(strings.TrimSpace(text), -1) {
		doc = strings.TrimSpace(doc)
		if !onlyComments(doc) {
			fmt.Fprintf(out, "---\n# Source: %s\n%s\n", source, doc)
		}
	}
}

func onlyComments(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// mergeMaps deep-merges b over a, as `helm template` merges its --values files.
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]interface{}); ok {
			if am, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}
