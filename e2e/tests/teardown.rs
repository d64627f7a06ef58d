//! Dropping a TestCluster leaves nothing behind: no processes, no temp dir,
//! also when the test panics.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fumarole_e2e::TestCluster;

fn alive(pid: u32) -> bool {
    // Reaped children have no /proc entry; a zombie would still show up.
    Path::new(&format!("/proc/{pid}")).exists()
}

fn assert_gone(pids: &[(String, u32)], root: &Path) {
    for (name, pid) in pids {
        assert!(!alive(*pid), "{name} (pid {pid}) still running");
    }
    assert!(!root.exists(), "{} left behind", root.display());
}

#[tokio::test]
async fn drop_stops_every_process_and_removes_the_temp_dir() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.start_kube_scheduler("").await.unwrap();
    let dm_dir = cluster.root().join("device-plugins");
    let dm = cluster.start_kubelet_dm(&dm_dir).await.unwrap();
    let pids = cluster.pids().unwrap();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["etcd", "kube-apiserver", "kube-scheduler"]);
    let root: PathBuf = cluster.root().to_path_buf();
    for (name, pid) in &pids {
        assert!(alive(*pid), "{name} is not running");
    }
    drop(dm);
    assert!(
        !dm_dir.join("kubelet.sock").exists(),
        "kubelet-dm left its socket"
    );
    let hn = cluster.start_harness_node("n1").await.unwrap();
    let (hn_pid, hn_socket) = (hn.pid(), hn.socket().to_path_buf());
    assert!(alive(hn_pid), "kubelet-node is not running");
    assert!(hn_socket.exists(), "{} missing", hn_socket.display());
    drop(hn);
    assert!(!alive(hn_pid), "kubelet-node (pid {hn_pid}) still running");
    assert!(!hn_socket.exists(), "kubelet-node left its socket");
    drop(cluster);
    assert_gone(&pids, &root);
}

#[test]
fn a_panicking_test_still_cleans_up() {
    let (tx, rx) = mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let cluster = TestCluster::start().await.unwrap();
            tx.send((cluster.pids().unwrap(), cluster.root().to_path_buf()))
                .unwrap();
            panic!("deliberate failure with a running cluster");
        })
    })
    .join();
    assert!(outcome.is_err(), "the inner test should have panicked");
    let (pids, root) = rx.recv().unwrap();
    assert_eq!(pids.len(), 2);
    assert_gone(&pids, &root);
}
