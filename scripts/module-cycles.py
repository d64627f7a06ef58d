#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a loop.

For every crate of the workspace (each directory with a Cargo.toml and a src/), each
non-test source file is a module (src/a/b.rs and src/a/b/mod.rs are `a::b`). A module
depends on another when its code (outside `#[cfg(test)]` blocks and comments) names it through
`crate::`, `super::` or `self::` paths, including grouped `use crate::{a, b::c}` imports. A
dependency on `a::b` is a dependency on the module file that defines it (`a::b` if that file
exists, else `a`). Parents are not counted as depending on the children they only declare
(`mod x;`). Any strongly connected set of two or more modules is a loop and is printed.

Usage: scripts/module-cycles.py [CRATE_DIR ...]   (default: every crate of the workspace)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crates():
    for name in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, name)
        if os.path.isfile(os.path.join(d, "Cargo.toml")) and os.path.isdir(os.path.join(d, "src")):
            yield d


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main") or rel == ["tests"]:
                rel = rel[:-1]
            if rel and rel[-1] == "tests":
                continue  # test modules in files of their own
            out[tuple(rel)] = os.path.join(dirpath, f)
    return out


def strip(text):
    """Drops comments and #[cfg(test)] items (a module block or a single item)."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text[i:])
        if not m:
            out.append(text[i:])
            break
        start = i + m.start()
        out.append(text[i:start])
        j = text.find("{", start)
        semi = text.find(";", start)
        if semi != -1 and (j == -1 or semi < j):
            i = semi + 1  # `#[cfg(test)] mod tests;`
            continue
        depth = 0
        for k in range(j, len(text)):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    i = k + 1
                    break
        else:
            break
    return "".join(out)


def expand(prefix, body):
    """Paths named by `prefix::{body}` (nested groups flattened)."""
    paths, depth, cur = [], 0, ""
    for ch in body + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            cur = cur.strip()
            if cur:
                m = re.match(r"([\w:]*?)::\{(.*)\}$", cur, re.S)
                if m:
                    paths += expand(prefix + [p for p in m.group(1).split("::") if p], m.group(2))
                else:
                    paths.append(prefix + [p for p in cur.split(" as ")[0].split("::") if p])
            cur = ""
        else:
            cur += ch
    return paths


def references(mod, text):
    refs = []
    for m in re.finditer(r"\b(crate|super|self)::\{", text):
        depth, k = 0, m.end() - 1
        for k in range(m.end() - 1, len(text)):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
        for p in expand([], text[m.end():k]):
            refs.append((m.group(1), p))
    for m in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", text):
        refs.append((m.group(1), [p for p in m.group(2).split("::") if p]))
    out = set()
    for kind, path in refs:
        base = list(mod)
        if kind == "super":
            base = base[:-1]
            while path and path[0] == "super":
                base, path = base[:-1], path[1:]
        elif kind == "crate":
            base = []
        out.add(tuple(base + path))
    return out


def resolve(path, mods):
    for n in range(len(path), 0, -1):
        if path[:n] in mods:
            return path[:n]
    return None


def cycles(graph):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main(dirs):
    bad = 0
    for d in dirs:
        mods = modules(os.path.join(d, "src"))
        graph = {}
        for mod, path in mods.items():
            with open(path, encoding="utf-8") as f:
                text = strip(f.read())
            deps = set()
            for ref in references(mod, text):
                target = resolve(ref, mods)
                # A module naming its own children (or itself) is not an import loop.
                if target is not None and target[: len(mod)] != mod:
                    deps.add(target)
            graph[mod] = deps
        name = os.path.basename(d)
        found = cycles(graph)
        for scc in found:
            bad += 1
            print(f"{name}: import loop among " + ", ".join("::".join(m) or "<root>" for m in scc))
        if not found:
            print(f"{name}: {len(mods)} modules, {sum(len(v) for v in graph.values())} imports, no loop")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(crates())))
