//! Setup shared by the scheduler-extension e2e tests.

use std::path::Path;
use std::sync::Arc;

use fumarole_e2e::{NodeSpec, TestCluster};
use scheduler_ext::extender::{Service, serve};
use scheduler_ext::score::gpu_aware::GpuAware;
use scheduler_ext::snapshot;
use tokio::net::TcpListener;

/// A cluster with the nodes of the committed snapshot `two-dgx` (all advertising enough
/// `nvidia.com/gpu`, so only the extender tells them apart), and fumarole-scheduler-ext serving
/// that snapshot on a loopback port, which is returned.
pub async fn two_dgx_with_extender() -> (TestCluster, u16) {
    let cluster = TestCluster::start().await.unwrap();
    for (name, gpus) in [("dgx-a", "8"), ("dgx-b", "8"), ("pcie-a", "4")] {
        cluster
            .create_node(
                &NodeSpec::new(name)
                    .capacity("cpu", "64")
                    .capacity("memory", "512Gi")
                    .capacity("nvidia.com/gpu", gpus),
            )
            .await
            .unwrap();
    }
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduler-ext/tests/snapshots/two-dgx");
    let svc = Arc::new(Service::new(
        snapshot::load(&dir).unwrap(),
        GpuAware::default(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(serve(listener, svc));
    (cluster, port)
}
