//! The scheduler extension killed while it works: a Volcano workload (Volcano Jobs: gang jobs
//! of gpu-group-size units and single pods of 1 to 8 GPUs) flows through the real Volcano
//! scheduler over four harness nodes (the kubelet's own device manager, an agent each, two
//! super-nodes; see `fumarole_e2e::chain`) while the extension is SIGKILLed at random moments:
//!
//! - one replica, killed and started again several times (it takes its own Lease back at once:
//!   same identity);
//! - two replicas behind a stand-in for the chart's Service (the Pod labelled leader, and
//!   ready), the leader killed several times; the standby takes over within the lease
//!   duration and the killed one comes back as standby;
//! - the same two replicas under the real kube-scheduler (the same workload as bare pods);
//! - no extension: kube-scheduler-fumarole (the framework plugin, its core in the scheduler's
//!   process) itself killed and started again, the workload as bare pods.
//!
//! Afterwards: no device was given to two running pods of a node (checked at the harness
//! nodes), no unit ran in two super-nodes, the kubelet refused no pod, and every pod ran,
//! within the run's deadline.
//!
//! vc-scheduler is restarted when it exits, as its Deployment would be: Volcano v1.10 crashes
//! when an extender's `prioritize` fails in the middle of a session (`allocate.go:280`
//! dereferences the nil best node `PrioritizeNodes` leaves after a batch-prioritize error),
//! which a killed extension makes happen. The restarts are counted. Pods admitted while no replica could write their choice (the
//! device plugin waits 30 s, then chooses) are counted, not failed. The kill moments come from
//! a seed (`FUMAROLE_HA_SEED`, printed); `FUMAROLE_HA_PODS` sets the pods (default 96) and
//! `FUMAROLE_HA_KILLS` the kills (default 3); the runs are in docs/testing.md.
//!
//! A plugin's decision core lives inside the scheduler's process, so there is no extension to
//! kill while the scheduler goes on, no replica behind a Service and no Lease of fumarole's: it
//! dies and starts with the scheduler, and several scheduler replicas are the scheduler's own
//! leader election, under which only the leader schedules, so only its core decides. What is
//! left to kill is the scheduler itself: the kube-scheduler plugin's run does that. The same
//! for vc-scheduler-fumarole (Volcano's plugin) is not written yet.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fumarole_e2e::TestCluster;
use fumarole_e2e::chain::{self, Scheduler};
use fumarole_e2e::cluster::{free_port, http_get};
use fumarole_e2e::fumarole::scheduler_ext_bin;
use fumarole_e2e::process::Proc;
use fumarole_e2e::service_front::ServiceFront;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const LEADER_SELECTOR: &str = "fumarole.dev/scheduler-ext-leader=true";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: kill moments from a seed, reproducible.
struct Moments(u64);

impl Moments {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[lo, hi)` milliseconds.
    fn between(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// One replica of the extension: its Pod object's name and its port.
struct Replica {
    name: String,
    port: u16,
    proc: Option<Proc>,
    /// Processes started so far (each logs to a file of its own).
    starts: usize,
}

impl Replica {
    /// Starts (again) the replica's process, with the shipped leader election (a 15 s lease,
    /// renewed within 10 s, tried every 2 s).
    fn start(&mut self, cluster: &TestCluster) {
        let mut args = vec![
            "serve".to_string(),
            format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
            format!("--listen=127.0.0.1:{}", self.port),
            "--ui-listen=off".into(),
        ];
        // FUMAROLE_HA_EXT_ARGS: more flags for every replica (space-separated), to measure a
        // setting under the same kills.
        args.extend(
            std::env::var("FUMAROLE_HA_EXT_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string),
        );
        self.starts += 1;
        self.proc = Some(
            Proc::spawn_with_env(
                &format!("scheduler-ext-{}-{}", self.name, self.starts),
                &scheduler_ext_bin().unwrap(),
                &args,
                &[
                    ("POD_NAME", &self.name),
                    ("POD_NAMESPACE", "default"),
                    (
                        "RUST_LOG",
                        &std::env::var("FUMAROLE_HA_EXT_LOG").unwrap_or_else(|_| "info".into()),
                    ),
                ],
                &cluster.root().join("logs"),
            )
            .unwrap(),
        );
    }

    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    async fn leads(&self) -> bool {
        self.proc.is_some()
            && http_get(self.port, "/leaderz")
                .await
                .is_ok_and(|a| a.lines().next().is_some_and(|l| l.contains(" 200 ")))
    }

    /// The logs of every process of the replica, in order.
    fn log(&self, cluster: &TestCluster) -> String {
        (1..=self.starts)
            .map(|n| {
                let file = format!("logs/scheduler-ext-{}-{n}.log", self.name);
                std::fs::read_to_string(cluster.root().join(file)).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The cluster, nodes, replicas (each with a Pod object to label), the Service stand-in and
/// `scheduler` calling the extension through it.
async fn start(
    names: &[&str],
    scheduler: Scheduler,
) -> (
    TestCluster,
    Vec<fumarole_e2e::HarnessNode>,
    Vec<Replica>,
    ServiceFront,
) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    // The shipped defaults, as the chart runs them: the plugins wait for a choice (30 s)
    // longer than a failover takes (the 15 s lease, then the new term), so a pod bound while
    // no replica leads still gets the scheduler's choice. With a shorter wait the node chooses
    // for it, and a later pod's choice on that node may name the same device (it is then
    // given others, and the difference reported).
    let harness = chain::start_nodes(&cluster, &[]).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut replicas = Vec::new();
    for name in names {
        // The replica's own Pod, as the Deployment would make it (nobody schedules it).
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fumarole-scheduler-ext"}},
            "spec": {"schedulerName": "none", "containers": [{"name": "ext", "image": "example.invalid/ext"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let mut r = Replica {
            name: name.to_string(),
            port: free_port().unwrap(),
            proc: None,
            starts: 0,
        };
        r.start(&cluster);
        replicas.push(r);
    }
    let front = ServiceFront::start(
        pods,
        LEADER_SELECTOR,
        "/readyz",
        replicas.iter().map(|r| (r.name.clone(), r.port)).collect(),
    )
    .await
    .unwrap();
    fumarole_e2e::cluster::eventually(
        "a leader behind the Service",
        Duration::from_secs(60),
        || async { Ok(front.endpoint()) },
    )
    .await
    .unwrap();
    match scheduler {
        Scheduler::Volcano => cluster
            .start_volcano(&fumarole_e2e::fumarole::volcano_conf_with_extender(
                front.port(),
            ))
            .await
            .unwrap(),
        Scheduler::Kube => {
            cluster
                .start_kube_scheduler(&fumarole_e2e::fumarole::kube_scheduler_config(
                    front.port(),
                    &[chain::GPU],
                ))
                .await
                .unwrap();
        }
    }
    (cluster, harness, replicas, front)
}

/// The scheduler's Deployment: starts `process` again whenever it has exited, until `done`;
/// answers how many times it did.
fn supervise(
    cluster: &Arc<TestCluster>,
    process: &'static str,
    done: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let (cluster, done) = (Arc::clone(cluster), Arc::clone(done));
    tokio::spawn(async move {
        let mut restarts = 0;
        while !done.load(Ordering::Relaxed) {
            if cluster.restart_if_exited(process).unwrap() {
                restarts += 1;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        restarts
    })
}

/// Runs the chain while SIGKILLs happen at seeded random moments: each kills the leading
/// replica and starts it again after a pause drawn from `pause_ms`.
async fn run_with_kills(names: &[&str], pause_ms: (u64, u64), scheduler: Scheduler) {
    let seed = env_or("FUMAROLE_HA_SEED", 20261123);
    let kills = env_or("FUMAROLE_HA_KILLS", 3) as usize;
    let target = env_or("FUMAROLE_HA_PODS", 96) as usize;
    eprintln!("seed {seed}, {target} pods, {kills} kills, replicas {names:?}");
    let (cluster, harness, replicas, front) = start(names, scheduler).await;
    let cluster = Arc::new(cluster);
    let replicas = Arc::new(tokio::sync::Mutex::new(replicas));
    let done = Arc::new(AtomicBool::new(false));
    let process = match scheduler {
        Scheduler::Volcano => "vc-scheduler",
        Scheduler::Kube => "kube-scheduler",
    };
    let supervisor = supervise(&cluster, process, &done);
    let killer = {
        let (cluster, replicas, done) = (
            Arc::clone(&cluster),
            Arc::clone(&replicas),
            Arc::clone(&done),
        );
        tokio::spawn(async move {
            let mut moments = Moments(seed);
            let mut log = Vec::new();
            let started = Instant::now();
            for k in 0..kills {
                tokio::time::sleep(moments.between(3_000, 12_000)).await;
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let mut rs = replicas.lock().await;
                let mut victim = None;
                for (i, r) in rs.iter().enumerate() {
                    if r.leads().await {
                        victim = Some(i);
                    }
                }
                // No leader right now (a take-over under way): kill the first live one.
                let i = victim.unwrap_or(0);
                rs[i].kill();
                let at = started.elapsed();
                let pause = moments.between(pause_ms.0, pause_ms.1);
                log.push(format!(
                    "kill {k}: {} at {at:.1?}, back after {pause:.1?}",
                    rs[i].name
                ));
                drop(rs);
                tokio::time::sleep(pause).await;
                replicas.lock().await[i].start(&cluster);
            }
            (log, started.elapsed())
        })
    };
    let diagnostics = {
        let cluster = Arc::clone(&cluster);
        let replicas = Arc::clone(&replicas);
        move || {
            let rs = replicas.try_lock();
            match rs {
                Ok(rs) => rs
                    .iter()
                    .map(|r| {
                        let log = r.log(&cluster);
                        let tail: Vec<&str> = log.lines().rev().take(20).collect();
                        format!(
                            "---- {} ----\n{}",
                            r.name,
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                Err(_) => "replicas busy".into(),
            }
        }
    };
    let findings = chain::run(
        &cluster,
        &harness,
        scheduler,
        target,
        Duration::from_secs(120 + 8 * target as u64),
        diagnostics,
    )
    .await
    .unwrap();
    done.store(true, Ordering::Relaxed);
    let (kill_log, _) = killer.await.unwrap();
    let scheduler_restarts = supervisor.await.unwrap();
    for line in &kill_log {
        eprintln!("{line}");
    }
    eprintln!(
        "after {} kills ({scheduler_restarts} scheduler restarts): {}",
        kill_log.len(),
        findings.summary()
    );
    eprintln!("endpoint at the end: {:?}", front.endpoint());
    assert!(!kill_log.is_empty(), "no kill happened during the run");
    assert!(findings.safe(), "{findings:#?}");
    assert!(findings.mismatches.is_empty(), "{findings:#?}");
    let rs = replicas.lock().await;
    let mut took_over = BTreeMap::new();
    for r in rs.iter() {
        let log = r.log(&cluster);
        took_over.insert(
            r.name.clone(),
            log.matches("took the lease: leading").count(),
        );
    }
    eprintln!("terms begun per replica: {took_over:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_replica_killed_again_and_again_never_gives_a_device_twice() {
    run_with_kills(&["ext-a"], (0, 3_000), Scheduler::Volcano).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_leader_of_two_killed_again_and_again_never_gives_a_device_twice() {
    // Back after the lease expired (15 s): the standby has taken over by then.
    run_with_kills(&["ext-a", "ext-b"], (16_000, 20_000), Scheduler::Volcano).await;
}

/// The same under kube-scheduler (bare pods; a unit's pods are filtered one by one and bound
/// through the extension's `bind`), where waiting reservations lapse: a pod filtered into a
/// super-node its unit's plan has left since is refused at `bind` and tried again.
#[tokio::test(flavor = "multi_thread")]
async fn the_leader_of_two_killed_under_kube_scheduler_never_gives_a_device_twice() {
    run_with_kills(&["ext-a", "ext-b"], (16_000, 20_000), Scheduler::Kube).await;
}

/// kube-scheduler-fumarole (the framework plugin, its core inside the scheduler) SIGKILLed at
/// seeded moments while the same workload flows as bare pods, and started again at once as
/// its Deployment would: each new process builds its core from the cluster, where every bound
/// pod carries its choice (the Binding brought node and devices in one write). No device is
/// given twice, no unit split, every pod admitted with the scheduler's choice.
#[tokio::test(flavor = "multi_thread")]
async fn the_kube_plugin_scheduler_killed_again_and_again_never_gives_a_device_twice() {
    use fumarole_e2e::fumarole::KUBE_PLUGIN as SCHEDULER;
    let seed = env_or("FUMAROLE_HA_SEED", 20261123);
    let kills = env_or("FUMAROLE_HA_KILLS", 3) as usize;
    let target = env_or("FUMAROLE_HA_PODS", 96) as usize;
    eprintln!("seed {seed}, {target} pods, {kills} kills of {SCHEDULER}");
    let cluster = Arc::new(TestCluster::start().await.unwrap());
    cluster.install_fumarole_crds().await.unwrap();
    let harness = chain::start_nodes(&cluster, &[]).await.unwrap();
    fumarole_e2e::fumarole::start_kube_plugin(&cluster, "{}")
        .await
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let supervisor = supervise(&cluster, SCHEDULER, &done);
    let killer = {
        let (cluster, done) = (Arc::clone(&cluster), Arc::clone(&done));
        tokio::spawn(async move {
            let mut moments = Moments(seed);
            let mut log = Vec::new();
            let started = Instant::now();
            for k in 0..kills {
                // Sooner than the extension's kills: the whole run takes about 20 s here.
                tokio::time::sleep(moments.between(1_500, 5_000)).await;
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let pid = cluster
                    .pids()
                    .unwrap()
                    .into_iter()
                    .find_map(|(name, pid)| (name == SCHEDULER).then_some(pid))
                    .unwrap();
                // The process group, as Proc starts it: the scheduler and nothing else.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                log.push(format!("kill {k}: pid {pid} at {:.1?}", started.elapsed()));
            }
            log
        })
    };
    let findings = chain::run(
        &cluster,
        &harness,
        Scheduler::Kube,
        target,
        Duration::from_secs(120 + 8 * target as u64),
        || cluster.log_tail(SCHEDULER, 40).unwrap_or_default(),
    )
    .await
    .unwrap();
    done.store(true, Ordering::Relaxed);
    let kill_log = killer.await.unwrap();
    let restarts = supervisor.await.unwrap();
    for line in &kill_log {
        eprintln!("{line}");
    }
    eprintln!(
        "after {} kills ({restarts} restarts): {}",
        kill_log.len(),
        findings.summary()
    );
    assert!(!kill_log.is_empty(), "no kill happened during the run");
    assert!(
        restarts >= kill_log.len(),
        "{restarts} restarts after {} kills",
        kill_log.len()
    );
    if !findings.clean() {
        // What the last scheduler process said of its plans (a unit split here once in CI,
        // cause not found; issue 37).
        let said = cluster.log_tail(SCHEDULER, 400).unwrap_or_default();
        let fumarole: Vec<&str> = said.lines().filter(|l| l.contains("fumarole")).collect();
        eprintln!(
            "{SCHEDULER}'s fumarole lines, last process:\n{}",
            fumarole.join("\n")
        );
    }
    assert!(findings.clean(), "{findings:#?}");
}
