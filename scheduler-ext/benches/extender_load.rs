//! Load benchmark of the kube-scheduler extender API over a large cluster view.
//!
//! Writes a synthetic snapshot (default 5,000 DGX-like nodes of 8 NVIDIA GPUs, every GPU pair
//! on NVLink, two NUMA nodes, 18 nodes per super-node, node `i` with `i % 9` GPUs allocated in
//! a fixed pseudo-random pattern), starts the real `fumarole-scheduler-ext serve` on it, and
//! drives it over loopback with `C` keep-alive HTTP/1.1 connections: each connection loops
//! "POST filter, then POST prioritize with the `NodeNames` filter kept" (one pod, as
//! kube-scheduler does), pods asking 1, 2, 4 and 8 `nvidia.com/gpu` in rotation. Only the HTTP
//! contract is used (`ExtenderArgs` in, `ExtenderFilterResult` / `HostPriorityList` out).
//!
//! Reports, per scenario: pods/s; filter, prioritize and whole-pod latency p50/p90/p99/max;
//! errors (any transport failure, non-200, unparsable answer, non-empty `Error`, or a
//! prioritize list that does not match the names sent: the run fails when there is one); the
//! CPU the server, this load tool and everything else on the machine used (a run other
//! processes disturbed says so); the server's RSS (VmRSS, VmHWM).
//!
//! ```text
//! cargo bench -p fumarole-scheduler-ext --bench extender_load                  # both scenarios
//! cargo bench -p fumarole-scheduler-ext --bench extender_load -- --names 500   # one scenario
//! ```
//!
//! Flags: `--nodes N` (5000), `--connections C` (4), `--seconds D` (20, plus `--warmup W`,
//! default 2, not counted), `--names M` (node names per request, 0 = all; without it both
//! scenarios run: all nodes, then 500), `--client-threads T` (1: tokio threads of the load
//! tool), `--shuffle SEED` (list the nodes in an order shuffled with that seed rather than by
//! name; every request keeps it, as kube-scheduler keeps its own), `--filter-threads F` (list
//! them as kube-scheduler's parallel filter on F threads finds them: by-name chunks merged
//! node by node). Run without cargo's `--bench` flag (`cargo test --benches`) it does a 1-second smoke
//! run over 200 nodes. The server is killed when the bench ends, fails or panics (Ctrl-C
//! reaches it too, as one process group); only a bench killed by a signal leaves it running.
//! `FUMAROLE_EXT_SERVER=/path/to/fumarole-scheduler-ext` runs another build of the server (a
//! copy of an earlier commit's) under the same load tool, to compare the two back to back.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use fumarole_topology::crd::{
    DeviceAllocation, DeviceStatus, DeviceTopology, DeviceTopologyStatus,
};
use fumarole_topology::shapes;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// Nodes per super-node (an NVL72-like rack of 18 trays).
const SUPER_NODE_SIZE: usize = 18;
const GPUS: u32 = 8;
/// `nvidia.com/gpu` per pod, in rotation.
const POD_SIZES: [usize; 4] = [1, 2, 4, 8];
/// Node names per request in the second default scenario: kube-scheduler's adaptive
/// `percentageOfNodesToScore` at 5,000 nodes is max(5, 50 - 5000/125) % = 10 %.
const DEFAULT_NAMES: usize = 500;
/// Distinct name windows pre-serialized per scenario, at most.
const MAX_WINDOWS: usize = 64;
const FILTER: &str = "/kube-scheduler/filter";
const PRIORITIZE: &str = "/kube-scheduler/prioritize";

// --- options ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Opts {
    nodes: usize,
    connections: usize,
    seconds: f64,
    warmup: f64,
    /// `None`: both default scenarios. `Some(0)`: all nodes per request.
    names: Option<usize>,
    client_threads: usize,
    /// Lists the nodes in an order shuffled with this seed instead of by name (`None`).
    shuffle: Option<u64>,
    /// Lists the nodes as kube-scheduler's filter running on this many threads finds them.
    filter_threads: Option<usize>,
}

impl Opts {
    fn parse() -> Result<Self> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        // `cargo bench` passes `--bench`; `cargo test --benches` does not: smoke run.
        let bench = args.iter().any(|a| a == "--bench");
        let mut o = Opts {
            nodes: if bench { 5000 } else { 200 },
            connections: 4,
            seconds: if bench { 20.0 } else { 1.0 },
            warmup: if bench { 2.0 } else { 0.2 },
            names: None,
            client_threads: 1,
            shuffle: None,
            filter_threads: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let mut value = || -> Result<String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| anyhow!("{flag} needs a value")),
                }
            };
            match flag {
                "--bench" => {}
                "--nodes" => o.nodes = value()?.parse().context("--nodes")?,
                "--connections" => o.connections = value()?.parse().context("--connections")?,
                "--seconds" => o.seconds = value()?.parse().context("--seconds")?,
                "--warmup" => o.warmup = value()?.parse().context("--warmup")?,
                "--names" => o.names = Some(value()?.parse().context("--names")?),
                "--client-threads" => {
                    o.client_threads = value()?.parse().context("--client-threads")?;
                }
                "--shuffle" => o.shuffle = Some(value()?.parse().context("--shuffle")?),
                "--filter-threads" => {
                    o.filter_threads = Some(value()?.parse().context("--filter-threads")?);
                }
                other => bail!(
                    "unknown argument {other:?} (flags: --nodes N --connections C --seconds D \
                     --warmup W --names M --client-threads T --shuffle SEED --filter-threads F)"
                ),
            }
        }
        if o.shuffle.is_some() && o.filter_threads.is_some() {
            bail!("--shuffle and --filter-threads each choose the order: give one");
        }
        if o.filter_threads == Some(0) {
            bail!("--filter-threads must be at least 1");
        }
        if o.nodes == 0 || o.connections == 0 || o.client_threads == 0 {
            bail!("--nodes, --connections and --client-threads must be at least 1");
        }
        if !(o.seconds > 0.0 && o.warmup >= 0.0) {
            bail!("--seconds must be > 0 and --warmup >= 0");
        }
        Ok(o)
    }

    /// Names per request of each scenario to run (0 = all nodes).
    fn scenarios(&self) -> Vec<usize> {
        match self.names {
            Some(m) => vec![m],
            None if self.nodes <= DEFAULT_NAMES => vec![0],
            None => vec![0, DEFAULT_NAMES],
        }
    }
}

// --- the synthetic snapshot -------------------------------------------------------------------

fn node_name(i: usize) -> String {
    format!("gpu-{i:05}")
}

fn super_node(i: usize) -> String {
    format!("nvl-rack-{:04}", i / SUPER_NODE_SIZE)
}

fn gpu_id(i: usize, d: u32) -> String {
    format!("GPU-{i:08x}-0000-4000-8000-{d:012x}")
}

/// The `i % 9` allocated GPUs of node `i`: the first ones of a shuffle seeded by `i`.
fn allocated(i: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..GPUS).collect();
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
    for j in (1..order.len()).rev() {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        order.swap(j, (r % (j as u64 + 1)) as usize);
    }
    order.truncate(i % 9);
    order.sort_unstable();
    order
}

/// A `dgx-h100` node as the agent publishes it ([`shapes::device_topology`], the shape the
/// fixture tests check against discovery), with per-node GPU ids and `allocated(i)` in use.
fn topology(i: usize) -> DeviceTopology {
    let name = node_name(i);
    let mut t = shapes::device_topology(&name, "dgx-h100", &shapes::dgx_h100(), &super_node(i));
    for d in &mut t.spec.devices {
        d.id = gpu_id(i, d.index);
        d.uuid = Some(d.id.clone());
    }
    let busy = allocated(i);
    t.status = Some(DeviceTopologyStatus {
        healthy_count: GPUS,
        devices: (0..GPUS)
            .map(|d| {
                let allocation = busy.contains(&d).then(|| DeviceAllocation {
                    namespace: "training".into(),
                    pod: format!("{name}-job-{}", busy.len()),
                    container: "main".into(),
                });
                (
                    gpu_id(i, d),
                    DeviceStatus {
                        health: "Healthy".into(),
                        reason: None,
                        allocation,
                        shares: Vec::new(),
                    },
                )
            })
            .collect(),
        colocation: None,
        pods: Vec::new(),
    });
    t
}

fn node(i: usize) -> Node {
    let name = node_name(i);
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.clone()),
        ("fumarole.dev/super-node".to_string(), super_node(i)),
        (
            "fumarole.dev/accelerator-count".to_string(),
            GPUS.to_string(),
        ),
        (
            "fumarole.dev/accelerator-vendor".to_string(),
            "nvidia".into(),
        ),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// One multi-document YAML file of `objects`.
fn write_documents<T: serde::Serialize>(path: &Path, objects: &[T]) -> Result<()> {
    let mut text = String::new();
    for o in objects {
        text.push_str("---\n");
        text.push_str(&serde_norway::to_string(o)?);
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes `devicetopologies.yaml` and `nodes.yaml` of `n` nodes into `dir`.
fn write_snapshot(dir: &Path, n: usize) -> Result<()> {
    let topologies: Vec<DeviceTopology> = (0..n).map(topology).collect();
    write_documents(&dir.join("devicetopologies.yaml"), &topologies)?;
    let nodes: Vec<Node> = (0..n).map(node).collect();
    write_documents(&dir.join("nodes.yaml"), &nodes)?;
    Ok(())
}

// --- the server -------------------------------------------------------------------------------

/// The server process; killed when dropped (also on errors and panics).
struct Server {
    child: Child,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(snapshot: &Path, log: PathBuf) -> Result<(Self, SocketAddr)> {
        // A free port: bind port 0, note it, release it for the server.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let stderr = std::fs::File::create(&log)?;
        let server = std::env::var_os("FUMAROLE_EXT_SERVER")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_fumarole-scheduler-ext").into());
        let child = Command::new(server)
            .arg("serve")
            .arg("--cluster-snapshot")
            .arg(snapshot)
            .arg("--listen")
            .arg(addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting fumarole-scheduler-ext")?;
        Ok((Server { child, log }, addr))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the server's stderr.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until `GET /healthz` answers 200.
    async fn wait_healthy(&mut self, addr: SocketAddr, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "server exited with {status} before serving:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(mut conn) = connect(addr).await {
                let req = hyper::Request::get("/healthz")
                    .header(hyper::header::HOST, addr.to_string())
                    .body(Full::new(Bytes::new()))?;
                if let Ok(resp) = conn.send_request(req).await
                    && resp.status() == hyper::StatusCode::OK
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("server not healthy after {timeout:?}:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `(VmRSS, VmHWM)` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// utime + stime of a process (`self` or a pid), in seconds.
fn cpu_seconds(pid: &str, ticks_per_s: f64) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("unreadable /proc/{pid}/stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        Ok(f.get(i)
            .ok_or_else(|| anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / ticks_per_s)
}

/// Busy time of the whole machine (user, nice, system, irq, softirq, steal), in seconds.
fn machine_busy_seconds(ticks_per_s: f64) -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow!("no cpu line in /proc/stat"))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<f64>())
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal ...
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum();
    Ok(busy / ticks_per_s)
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// --- the load ---------------------------------------------------------------------------------

/// Pre-serialized request material of one scenario.
struct Plan {
    addr: SocketAddr,
    /// `[size][window]` filter bodies.
    filter: Vec<Vec<Bytes>>,
    /// `{"Pod":<pod>,"NodeNames":` per size; the prioritize body is this, the names, `}`.
    prioritize_prefix: Vec<Vec<u8>>,
}

impl Plan {
    /// `shuffle`: the seed of the order the nodes are listed in (`None`: by name, as
    /// kube-scheduler lists them in a single-zone cluster); every request keeps that order.
    /// `filter_threads`: list them instead as kube-scheduler's filter on that many threads
    /// finds them ([`parallel_filter_order`]).
    fn new(
        addr: SocketAddr,
        nodes: usize,
        names: usize,
        shuffle: Option<u64>,
        filter_threads: Option<usize>,
    ) -> Result<Self> {
        let per_request = if names == 0 { nodes } else { names.min(nodes) };
        let mut all: Vec<String> = (0..nodes).map(node_name).collect();
        if let Some(seed) = shuffle {
            shuffle_with(&mut all, seed);
        }
        if let Some(threads) = filter_threads {
            all = parallel_filter_order(&all, threads, 7);
        }
        let windows = (nodes / gcd(nodes, per_request)).min(MAX_WINDOWS);
        let windows: Vec<String> = (0..windows)
            .map(|w| {
                let start = w * per_request % nodes;
                let names: Vec<&String> = (0..per_request)
                    .map(|k| &all[(start + k) % nodes])
                    .collect();
                serde_json::to_string(&names)
            })
            .collect::<Result<_, _>>()?;
        let mut filter = Vec::new();
        let mut prioritize_prefix = Vec::new();
        for &size in &POD_SIZES {
            let pod = serde_json::to_string(&pod(size))?;
            filter.push(
                windows
                    .iter()
                    .map(|w| Bytes::from(format!(r#"{{"Pod":{pod},"NodeNames":{w}}}"#)))
                    .collect(),
            );
            prioritize_prefix.push(format!(r#"{{"Pod":{pod},"NodeNames":"#).into_bytes());
        }
        Ok(Plan {
            addr,
            filter,
            prioritize_prefix,
        })
    }

    /// Filter body and size index of the `j`-th pod.
    fn pod(&self, j: usize) -> (usize, Bytes) {
        let s = j % POD_SIZES.len();
        let windows = &self.filter[s];
        (s, windows[(j / POD_SIZES.len()) % windows.len()].clone())
    }
}

/// Fisher-Yates with splitmix64: the same order for the same seed, without a crate for it.
fn shuffle_with<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// `names` as kube-scheduler's filter finds them with `threads` threads at work: it cuts its
/// node list into chunks of `min(√n, n/16 + 1)` (its `chunkSizeFor`, 16 goroutines), each
/// thread filters one chunk after another, and a node joins the answer when its filter
/// finishes, so the threads' chunks come out merged node by node (here in an order drawn with
/// `seed`).
fn parallel_filter_order(names: &[String], threads: usize, seed: u64) -> Vec<String> {
    let n = names.len();
    let chunk = ((n as f64).sqrt() as usize).min(n / 16 + 1).max(1);
    let mut chunks = names.chunks(chunk);
    let mut working: Vec<std::slice::Iter<'_, String>> =
        chunks.by_ref().take(threads).map(|c| c.iter()).collect();
    let mut draws: Vec<usize> = (0..n * 2).collect();
    shuffle_with(&mut draws, seed);
    let mut draws = draws.into_iter().cycle();
    let mut out = Vec::with_capacity(n);
    while !working.is_empty() {
        let t = draws.next().unwrap_or(0) % working.len();
        match working[t].next() {
            Some(name) => out.push(name.clone()),
            None => match chunks.next() {
                Some(c) => working[t] = c.iter(),
                None => {
                    drop(working.swap_remove(t));
                }
            },
        }
    }
    out
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// A pending pod as kube-scheduler sends it, asking `gpus` GPUs.
fn pod(gpus: usize) -> serde_json::Value {
    let name = format!("bench-gpu{gpus}-0");
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "training",
            "uid": format!("00000000-0000-4000-8000-{gpus:012}"),
            "labels": {"app": "bench", "job-name": format!("bench-gpu{gpus}")},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{
                "name": "main",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "resources": {
                    "limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": gpus.to_string()},
                    "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": gpus.to_string()},
                },
            }],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Pending"},
    })
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// POSTs `body` to `path`; the status and the whole answer.
async fn post(
    conn: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    body: Bytes,
) -> Result<(hyper::StatusCode, Bytes)> {
    conn.ready().await?;
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    let resp = conn.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// The part of `ExtenderFilterResult` the load needs; names borrowed from the answer (the
/// load tool shares the machine with the server, so what it spends the server cannot).
#[derive(Deserialize)]
struct FilterAnswer<'a> {
    #[serde(rename = "NodeNames", default, borrow)]
    node_names: Option<Vec<Name<'a>>>,
    #[serde(rename = "Error", default)]
    error: Option<String>,
}

/// A name borrowed from the answer unless it has escapes (serde borrows a `Cow` only as a
/// field of its own, not inside a `Vec`).
#[derive(Deserialize, Serialize)]
#[serde(transparent)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// What a filter answer kept: the names, and the JSON array they came in, which the
/// prioritize request carries on as it is.
struct Kept<'a> {
    names: Vec<Name<'a>>,
    json: Cow<'a, [u8]>,
}

/// How a filter answer without an error starts and ends when the service writes it.
const NAMES_FIRST: &[u8] = br#"{"NodeNames":"#;
const NO_ERROR_LAST: &[u8] = br#","Error":""}"#;

/// Reads a filter answer; `Ok(Err(_))` carries its non-empty `Error`. An answer laid out as
/// the service writes it (`NodeNames` first, an empty `Error` last, names without escapes) is
/// read by a scan of its names, the rest of it unread; any other answer is parsed whole.
fn read_filter_answer(body: &[u8]) -> Result<Result<Kept<'_>, String>> {
    if let Some(rest) = body.strip_prefix(NAMES_FIRST)
        && body.ends_with(NO_ERROR_LAST)
        && let Some((names, len)) = plain_strings(rest)
    {
        let names = names.into_iter().map(|n| Name(Cow::Borrowed(n))).collect();
        let json = Cow::Borrowed(&rest[..len]);
        return Ok(Ok(Kept { names, json }));
    }
    let answer: FilterAnswer = parse(body)?;
    if let Some(e) = answer.error.filter(|e| !e.is_empty()) {
        return Ok(Err(e));
    }
    let names = answer.node_names.unwrap_or_default();
    let json = Cow::Owned(serde_json::to_vec(&names)?);
    Ok(Ok(Kept { names, json }))
}

/// The strings of the JSON array of strings that starts `s`, and the array's length in bytes;
/// `None` unless it is written without spaces and its strings need no unescaping.
fn plain_strings(s: &[u8]) -> Option<(Vec<&str>, usize)> {
    let mut names = Vec::new();
    if s.starts_with(b"[]") {
        return Some((names, 2));
    }
    let mut i = s.starts_with(b"[").then_some(1)?;
    loop {
        if s.get(i) != Some(&b'"') {
            return None;
        }
        let end = i + 1 + memchr::memchr2(b'"', b'\\', s.get(i + 1..)?)?;
        if s.get(end) != Some(&b'"') {
            return None;
        }
        let name = std::str::from_utf8(s.get(i + 1..end)?).ok()?;
        // JSON strings cannot hold raw control characters; serde says what is wrong.
        if name.bytes().any(|b| b < 0x20) {
            return None;
        }
        names.push(name);
        match s.get(end + 1)? {
            b',' => i = end + 2,
            b']' => return Some((names, end + 2)),
            _ => return None,
        }
    }
}

/// Whether `body` is the `HostPriorityList` of `names` in their order, written as the service
/// writes it (`{"Host":"<name>","Score":<0..=10>}`, no spaces). `false` leaves the answer to
/// serde and [`check_priorities`], which accept any order and layout.
fn priorities_in_order(body: &[u8], names: &[Name<'_>]) -> bool {
    let scan = || -> Option<()> {
        let mut rest = body.strip_prefix(b"[")?;
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                rest = rest.strip_prefix(b",")?;
            }
            rest = rest.strip_prefix(br#"{"Host":""#)?;
            rest = rest.strip_prefix(name.0.as_bytes())?;
            rest = rest.strip_prefix(br#"","Score":"#)?;
            rest = match rest {
                [b'1', b'0', r @ ..] => r,
                [b'0'..=b'9', r @ ..] => r,
                _ => return None,
            };
            rest = rest.strip_prefix(b"}")?;
        }
        (rest == b"]").then_some(())
    };
    scan().is_some()
}

/// One entry of `HostPriorityList`.
#[derive(Deserialize)]
struct HostPriority<'a> {
    #[serde(rename = "Host", borrow)]
    host: Cow<'a, str>,
    #[serde(rename = "Score")]
    score: i64,
}

#[derive(Default)]
struct Stats {
    /// Latencies in ns, of pods started after the warm-up.
    filter: Vec<u64>,
    prioritize: Vec<u64>,
    pod: Vec<u64>,
    /// Pods filter left no node for (no prioritize call; counted as pods).
    no_fit: usize,
    errors: usize,
    first_errors: Vec<String>,
    /// Nodes filter kept, summed over measured pods (to show how much prioritize gets).
    kept: usize,
    /// Request and answer body bytes of the measured pods.
    bytes: usize,
}

impl Stats {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(what);
        }
    }

    fn merge(&mut self, o: Stats) {
        self.filter.extend(o.filter);
        self.prioritize.extend(o.prioritize);
        self.pod.extend(o.pod);
        self.no_fit += o.no_fit;
        self.errors += o.errors;
        self.kept += o.kept;
        self.bytes += o.bytes;
        for e in o.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(e);
            }
        }
    }
}

/// An answer body checked as UTF-8 once and parsed as text (as bytes, each name is checked on
/// its own).
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T> {
    Ok(serde_json::from_str(std::str::from_utf8(body)?)?)
}

fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]);
    s.trim().to_string()
}

/// One connection's loop: pods `first`, `first + step`, ... until `end`.
async fn worker(
    plan: Arc<Plan>,
    first: usize,
    step: usize,
    measure_from: Instant,
    end: Instant,
) -> Result<Stats> {
    let addr = plan.addr;
    let mut conn = connect(addr).await?;
    let mut st = Stats::default();
    let mut j = first;
    let mut reconnects = 0;
    while Instant::now() < end {
        let (size, body) = plan.pod(j);
        let mut bytes = body.len();
        j += step;
        let start = Instant::now();
        let measured = start >= measure_from;
        // filter
        let answer = match post(&mut conn, addr, FILTER, body).await {
            Ok(a) => a,
            Err(e) => {
                st.error(format!("filter: {e:#}"));
                reconnects += 1;
                if reconnects > 10 {
                    bail!("too many connection failures: {:?}", st.first_errors);
                }
                conn = connect(addr).await?;
                continue;
            }
        };
        let filter_ns = start.elapsed().as_nanos() as u64;
        bytes += answer.1.len();
        let (status, filter_body) = answer;
        let kept = match (status, &filter_body) {
            (hyper::StatusCode::OK, b) => match read_filter_answer(b) {
                Ok(Ok(kept)) => kept,
                Ok(Err(e)) => {
                    st.error(format!("filter: Error {e:?}"));
                    continue;
                }
                Err(e) => {
                    st.error(format!("filter: unparsable answer ({e}): {}", snippet(b)));
                    continue;
                }
            },
            (status, b) => {
                st.error(format!("filter: {status}: {}", snippet(b)));
                continue;
            }
        };
        if kept.names.is_empty() {
            // kube-scheduler does not prioritize a pod no node can hold.
            if measured {
                st.filter.push(filter_ns);
                st.pod.push(filter_ns);
                st.no_fit += 1;
                st.bytes += bytes;
            }
            continue;
        }
        // prioritize, with the nodes filter kept
        let prefix = &plan.prioritize_prefix[size];
        let mut body = Vec::with_capacity(prefix.len() + kept.json.len() + 1);
        body.extend_from_slice(prefix);
        body.extend_from_slice(&kept.json);
        body.push(b'}');
        bytes += body.len();
        let t = Instant::now();
        let answer = match post(&mut conn, addr, PRIORITIZE, Bytes::from(body)).await {
            Ok(a) => a,
            Err(e) => {
                st.error(format!("prioritize: {e:#}"));
                reconnects += 1;
                if reconnects > 10 {
                    bail!("too many connection failures: {:?}", st.first_errors);
                }
                conn = connect(addr).await?;
                continue;
            }
        };
        let prioritize_ns = t.elapsed().as_nanos() as u64;
        let pod_ns = start.elapsed().as_nanos() as u64;
        bytes += answer.1.len();
        match answer {
            (hyper::StatusCode::OK, b) if priorities_in_order(&b, &kept.names) => {}
            (hyper::StatusCode::OK, b) => match parse::<Vec<HostPriority>>(&b) {
                Ok(list) => {
                    if let Err(e) = check_priorities(&list, &kept.names) {
                        st.error(format!("prioritize: {e}"));
                        continue;
                    }
                }
                Err(e) => {
                    st.error(format!(
                        "prioritize: unparsable answer ({e}): {}",
                        snippet(&b)
                    ));
                    continue;
                }
            },
            (status, b) => {
                st.error(format!("prioritize: {status}: {}", snippet(&b)));
                continue;
            }
        }
        if measured {
            st.filter.push(filter_ns);
            st.prioritize.push(prioritize_ns);
            st.pod.push(pod_ns);
            st.kept += kept.names.len();
            st.bytes += bytes;
        }
    }
    Ok(st)
}

/// A `HostPriorityList` kube-scheduler accepts for `names`: every host one of the names, at
/// most once (in any order; missing ones count 0), every score in 0..=10
/// (`MaxExtenderPriority`).
fn check_priorities(list: &[HostPriority<'_>], names: &[Name<'_>]) -> Result<()> {
    if let Some(h) = list.iter().find(|h| !(0..=10).contains(&h.score)) {
        bail!("{} scored {}, outside 0..=10", h.host, h.score);
    }
    // Fast path: the names, in order.
    if list.len() == names.len() && list.iter().zip(names).all(|(h, n)| h.host == n.0) {
        return Ok(());
    }
    let mut left: std::collections::HashSet<&str> = names.iter().map(|n| n.0.as_ref()).collect();
    for h in list {
        if !left.remove(h.host.as_ref()) {
            bail!("{} is not one of the names sent, or appears twice", h.host);
        }
    }
    Ok(())
}

/// The answer readers' scans against what they must make of answers written otherwise than
/// the service writes them (escapes, spaces, other orders, scores out of range): every run
/// checks them first, since a scan that read wrongly would hide a wrong answer.
fn check_answer_readers() -> Result<()> {
    /// The names read, and the JSON array prioritize is sent.
    type ReadFilter = (Vec<String>, String);
    let names = |k: &Kept| k.names.iter().map(|n| n.0.to_string()).collect::<Vec<_>>();
    let filter = |body: &str| match read_filter_answer(body.as_bytes()) {
        Ok(Ok(k)) => Ok((names(&k), String::from_utf8_lossy(&k.json).into_owned())),
        Ok(Err(e)) => Err(format!("Error {e}")),
        Err(e) => Err(format!("{e:#}")),
    };
    let both = |list: &[&str]| {
        (
            list.iter().map(|n| n.to_string()).collect(),
            serde_json::to_string(list).unwrap_or_default(),
        )
    };
    let cases: [(&str, Result<ReadFilter, String>); 6] = [
        (
            r#"{"NodeNames":["a","b"],"FailedNodes":{"c":"x"},"Error":""}"#,
            Ok(both(&["a", "b"])),
        ),
        (r#"{"NodeNames":[],"Error":""}"#, Ok(both(&[]))),
        (
            r#"{"NodeNames":["a\"b","c"],"Error":""}"#,
            Ok(both(&["a\"b", "c"])),
        ),
        (r#"{"NodeNames": ["a"], "Error": ""}"#, Ok(both(&["a"]))),
        (
            r#"{"NodeNames":null,"Error":"no view"}"#,
            Err("Error no view".into()),
        ),
        (r#"{"Error":"","NodeNames":["a"]}"#, Ok(both(&["a"]))),
    ];
    for (body, want) in cases {
        let got = filter(body);
        if got != want {
            bail!("filter answer {body}: read as {got:?}, not {want:?}");
        }
    }
    if plain_strings(b"[\"a\x01\"]").is_some() || plain_strings(b"[\"a\",]").is_some() {
        bail!("the names scan took a string it must leave to serde");
    }
    let kept = [Name(Cow::Borrowed("a")), Name(Cow::Borrowed("b"))];
    for (body, in_order) in [
        (r#"[{"Host":"a","Score":10},{"Host":"b","Score":0}]"#, true),
        (r#"[{"Host":"b","Score":1},{"Host":"a","Score":2}]"#, false),
        (
            r#"[{"Host":"a","Score":100},{"Host":"b","Score":0}]"#,
            false,
        ),
        (r#"[{"Host":"a","Score":05},{"Host":"b","Score":0}]"#, false),
        (r#"[{"Host":"a","Score":1}]"#, false),
        (
            r#"[{"Host":"a","Score":1},{"Host":"b","Score":1},{"Host":"c","Score":1}]"#,
            false,
        ),
    ] {
        if priorities_in_order(body.as_bytes(), &kept) != in_order {
            bail!("prioritize answer {body}: the scan did not say {in_order}");
        }
    }
    Ok(())
}

/// p50, p90, p99, max of sorted `v`, in ms.
fn percentiles(v: &mut [u64]) -> [f64; 4] {
    if v.is_empty() {
        return [f64::NAN; 4];
    }
    v.sort_unstable();
    let at = |p: f64| {
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / 1e6
    };
    [at(0.50), at(0.90), at(0.99), v[v.len() - 1] as f64 / 1e6]
}

/// One scenario's figures.
struct Outcome {
    label: String,
    pods_per_s: f64,
    filter: [f64; 4],
    prioritize: [f64; 4],
    pod: [f64; 4],
    server_cores: f64,
    client_cores: f64,
    other_cores: f64,
    /// Server CPU time per pod, ms.
    server_cpu_ms_per_pod: f64,
    rss_kib: u64,
    hwm_kib: u64,
}

async fn scenario(
    opts: &Opts,
    server: &Server,
    addr: SocketAddr,
    names: usize,
    ticks: f64,
) -> Result<Outcome> {
    let per_request = if names == 0 { opts.nodes } else { names };
    let mut label = if names == 0 {
        format!("all {} nodes per request", opts.nodes)
    } else {
        format!("{per_request} of {} nodes per request", opts.nodes)
    };
    if let Some(seed) = opts.shuffle {
        label.push_str(&format!(", shuffled (seed {seed})"));
    }
    if let Some(threads) = opts.filter_threads {
        label.push_str(&format!(", in a {threads}-thread filter's order"));
    }
    println!(
        "\n## {label}: {} connections, {} s (+{} s warm-up)",
        opts.connections, opts.seconds, opts.warmup
    );
    let plan = Arc::new(Plan::new(
        addr,
        opts.nodes,
        names,
        opts.shuffle,
        opts.filter_threads,
    )?);
    let pid = server.pid().to_string();
    let begin = Instant::now();
    let measure_from = begin + Duration::from_secs_f64(opts.warmup);
    let end = measure_from + Duration::from_secs_f64(opts.seconds);
    let workers: Vec<_> = (0..opts.connections)
        .map(|c| {
            tokio::spawn(worker(
                Arc::clone(&plan),
                c,
                opts.connections,
                measure_from,
                end,
            ))
        })
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = (
        cpu_seconds(&pid, ticks)?,
        cpu_seconds("self", ticks)?,
        machine_busy_seconds(ticks)?,
    );
    let t0 = Instant::now();
    let mut st = Stats::default();
    for w in workers {
        st.merge(w.await??);
    }
    let wall = t0.elapsed().as_secs_f64();
    let server_cpu = cpu_seconds(&pid, ticks)? - cpu0.0;
    let client_cpu = cpu_seconds("self", ticks)? - cpu0.1;
    let machine_cpu = machine_busy_seconds(ticks)? - cpu0.2;
    let (rss_kib, hwm_kib) = rss_kib(server.pid())?;
    let pods = st.pod.len();
    let out = Outcome {
        label,
        pods_per_s: pods as f64 / wall,
        filter: percentiles(&mut st.filter),
        prioritize: percentiles(&mut st.prioritize),
        pod: percentiles(&mut st.pod),
        server_cores: server_cpu / wall,
        client_cores: client_cpu / wall,
        other_cores: (machine_cpu - server_cpu - client_cpu).max(0.0) / wall,
        server_cpu_ms_per_pod: server_cpu * 1e3 / pods.max(1) as f64,
        rss_kib,
        hwm_kib,
    };
    let prioritized = pods - st.no_fit;
    println!(
        "pods: {pods} in {wall:.1} s = {:.0} pods/s ({} with no feasible node, not prioritized; \
         filter kept {:.0} nodes per pod on average; {:.0} KiB of JSON bodies per pod, both \
         ways)",
        out.pods_per_s,
        st.no_fit,
        st.kept as f64 / prioritized.max(1) as f64,
        st.bytes as f64 / 1024.0 / pods.max(1) as f64
    );
    println!("errors: {}", st.errors);
    println!("\n| latency, ms | p50 | p90 | p99 | max |\n|---|---|---|---|---|");
    for (name, p) in [
        ("filter", out.filter),
        ("prioritize", out.prioritize),
        ("pod (filter + prioritize)", out.pod),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p[0], p[1], p[2], p[3]
        );
    }
    println!(
        "\nCPU over the measured window, in cores: server {:.2} ({:.2} ms per pod), load tool \
         {:.2}, other processes and kernel {:.2}",
        out.server_cores, out.server_cpu_ms_per_pod, out.client_cores, out.other_cores
    );
    if out.other_cores > 0.1 {
        println!(
            "WARNING: other processes used {:.2} cores during the run; the figures are disturbed",
            out.other_cores
        );
    }
    println!(
        "server memory: RSS {:.1} MiB now, peak (VmHWM) {:.1} MiB",
        mib(out.rss_kib),
        mib(out.hwm_kib)
    );
    std::io::stdout().flush()?;
    if st.errors > 0 {
        bail!(
            "{}: {} errors, first: {:#?}\nserver log:\n{}",
            out.label,
            st.errors,
            st.first_errors,
            server.log_tail()
        );
    }
    if pods == 0 {
        bail!("{}: no pod completed in the measured window", out.label);
    }
    Ok(out)
}

async fn run(opts: Opts) -> Result<()> {
    check_answer_readers()?;
    let ticks = clock_ticks();
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("snapshot");
    std::fs::create_dir(&snapshot)?;
    let t = Instant::now();
    write_snapshot(&snapshot, opts.nodes)?;
    let size: u64 = std::fs::read_dir(&snapshot)?
        .map(|e| Ok(e?.metadata()?.len()))
        .sum::<Result<u64>>()?;
    println!(
        "# extender load: {} nodes x {GPUS} GPUs ({} super-nodes), snapshot {:.1} MiB written in \
         {:.1} s",
        opts.nodes,
        opts.nodes.div_ceil(SUPER_NODE_SIZE),
        size as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let (mut server, addr) = Server::start(&snapshot, dir.path().join("server.log"))?;
    server.wait_healthy(addr, Duration::from_secs(600)).await?;
    let (rss, hwm) = rss_kib(server.pid())?;
    println!(
        "server pid {} on {addr}: view loaded and serving after {:.1} s; RSS {:.1} MiB, peak \
         {:.1} MiB",
        server.pid(),
        t.elapsed().as_secs_f64(),
        mib(rss),
        mib(hwm)
    );
    let mut outcomes = Vec::new();
    for names in opts.scenarios() {
        outcomes.push(scenario(&opts, &server, addr, names, ticks).await?);
    }
    let mut table = String::from(
        "\n## Summary\n\n| scenario | pods/s | filter p50 / p99 ms | prioritize p50 / p99 ms | \
         pod p99 ms | server CPU (per pod) | load-tool CPU | other CPU | server RSS / peak MiB \
         |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in &outcomes {
        writeln!(
            table,
            "| {} | {:.0} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} cores ({:.2} ms) | \
             {:.2} cores | {:.2} cores | {:.0} / {:.0} |",
            o.label,
            o.pods_per_s,
            o.filter[0],
            o.filter[2],
            o.prioritize[0],
            o.prioritize[2],
            o.pod[2],
            o.server_cores,
            o.server_cpu_ms_per_pod,
            o.client_cores,
            o.other_cores,
            mib(o.rss_kib),
            mib(o.hwm_kib)
        )?;
    }
    println!("{table}");
    println!(
        "target: >= 2000 pods/s, p99 < 5 ms per call, memory < 200 MiB (load tool and server \
         share this machine's {} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for o in &outcomes {
        let p99 = o.filter[2].max(o.prioritize[2]);
        println!(
            "  {}: {:.0} pods/s {}, worst per-call p99 {:.2} ms {}, peak RSS {:.0} MiB {}",
            o.label,
            o.pods_per_s,
            verdict(o.pods_per_s >= 2000.0),
            p99,
            verdict(p99 < 5.0),
            mib(o.hwm_kib),
            verdict(mib(o.hwm_kib) < 200.0)
        );
    }
    drop(server);
    Ok(())
}

fn verdict(met: bool) -> &'static str {
    if met { "(met)" } else { "(MISSED)" }
}

fn main() -> Result<()> {
    let opts = Opts::parse()?;
    let rt = if opts.client_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.client_threads)
            .enable_all()
            .build()?
    };
    rt.block_on(run(opts))
}
