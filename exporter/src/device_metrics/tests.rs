#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;

use super::*;
use crate::kubelet::{AllocationSource, Allocations, ContainerAllocation, PodAllocation};

fn gpu(index: u32, uuid: &str, values: &[(Figure, f64)]) -> DeviceSample {
    DeviceSample {
        index,
        id: uuid.into(),
        uuid: uuid.into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x1b + index),
        mig_uuids: vec![],
        values: values.iter().copied().collect(),
        links: BTreeMap::new(),
    }
}

fn pod(name: &str, ids: &[&str]) -> PodAllocation {
    PodAllocation {
        uid: None,
        name: name.into(),
        namespace: "team".into(),
        containers: vec![ContainerAllocation {
            name: "main".into(),
            devices: BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                ids.iter().map(|s| s.to_string()).collect(),
            )]),
            ..Default::default()
        }],
    }
}

/// The registries' text, as `/metrics` writes it.
fn scrape(names: &[Names], setup: impl FnOnce(&DeviceMetrics)) -> String {
    let mut registry = Registry::with_prefix("fumarole");
    let mut unprefixed = Registry::default();
    let args = DeviceMetricsArgs {
        device_metrics_interval: Duration::from_secs(10),
        device_metric_names: names.to_vec(),
        device_usage_window: Duration::from_secs(600),
    };
    let metrics = DeviceMetrics::register(&mut registry, &mut unprefixed, "node-1", &args);
    setup(&metrics);
    let mut out = String::new();
    encode_registry(&mut out, &registry).unwrap();
    encode_registry(&mut out, &unprefixed).unwrap();
    encode_eof(&mut out).unwrap();
    out
}

fn sample_of(out: &str, prefix: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

fn two_gpus() -> Snapshot {
    let mut held = gpu(
        0,
        "GPU-0",
        &[
            (Figure::Utilization, 0.73),
            (Figure::MemoryUsed, 2.0 * MIB),
            (Figure::Energy, 12.5),
            (Figure::SmClock, 1.98e9),
        ],
    );
    held.mig_uuids = vec!["MIG-a".into()];
    held.links = BTreeMap::from([
        (
            0,
            BTreeMap::from([
                (Figure::NvlinkTransmit, 1024.0),
                (Figure::NvlinkReceive, 2048.0),
            ]),
        ),
        (3, BTreeMap::from([(Figure::NvlinkTransmit, 4096.0)])),
    ]);
    Snapshot {
        library: Library::Nvml,
        taken: SystemTime::now() - Duration::from_secs(3),
        driver_version: "550.90.07".into(),
        // GPU 1 gave no utilisation: its figure is left out, not 0.
        devices: vec![held, gpu(1, "GPU-1", &[(Figure::MemoryUsed, 0.0)])],
    }
}

#[test]
fn fumarole_names_carry_the_device_its_holders_and_the_age() {
    let out = scrape(&[Names::Fumarole], |m| {
        m.store(two_gpus());
        m.set_allocations(&Allocations {
            source: AllocationSource::PodResources,
            pods: vec![
                pod("whole", &["GPU-0"]),
                pod("sliced", &["GPU-0::2"]),
                pod("mig", &["MIG-a"]),
                pod("other", &["GPU-9"]),
            ],
        });
    });
    let util = sample_of(&out, "fumarole_device_utilization_ratio{");
    assert_eq!(util.len(), 3, "{out}");
    for holder in ["whole", "sliced", "mig"] {
        assert!(
            util.contains(&format!(
                "fumarole_device_utilization_ratio{{device=\"nvidia-0\",uuid=\"GPU-0\",model=\"NVIDIA H100 80GB HBM3\",node=\"node-1\",namespace=\"team\",pod=\"{holder}\",container=\"main\"}} 0.73"
            )),
            "{out}"
        );
    }
    // GPU 1 is held by nobody: empty pod labels.
    assert!(out.contains("fumarole_device_memory_used_bytes{device=\"nvidia-1\",uuid=\"GPU-1\",model=\"NVIDIA H100 80GB HBM3\",node=\"node-1\",namespace=\"\",pod=\"\",container=\"\"} 0.0"), "{out}");
    assert!(
        out.contains("# TYPE fumarole_device_energy_joules counter"),
        "{out}"
    );
    assert!(
        out.contains("fumarole_device_energy_joules_total{device=\"nvidia-0\""),
        "{out}"
    );
    // Per-link figures carry the link before the holder's labels; none under dcgm's names.
    assert!(out.contains("fumarole_device_nvlink_transmit_bytes_total{device=\"nvidia-0\",uuid=\"GPU-0\",model=\"NVIDIA H100 80GB HBM3\",node=\"node-1\",link=\"3\",namespace=\"team\",pod=\"whole\",container=\"main\"} 4096.0"), "{out}");
    assert_eq!(
        sample_of(&out, "fumarole_device_nvlink_receive_bytes_total{").len(),
        3,
        "{out}"
    );
    let age = sample_of(
        &out,
        "fumarole_device_metrics_age_seconds{library=\"nvml\"} ",
    );
    let age: f64 = age[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!((3.0..60.0).contains(&age), "{out}");
    assert!(!out.contains("DCGM_"), "{out}");
}

#[test]
fn dcgm_names_keep_dcgm_exporters_units_labels_and_counters_without_total() {
    let out = scrape(&[Names::Dcgm], |m| {
        m.store(two_gpus());
        m.set_allocations(&Allocations {
            source: AllocationSource::PodResources,
            pods: vec![pod("whole", &["GPU-0"])],
        });
    });
    assert!(out.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:1B:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"550.90.07\",namespace=\"team\",pod=\"whole\",container=\"main\"} 73.0"), "{out}");
    // MiB, MHz, mJ.
    assert!(
        out.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\"") && out.contains("} 2.0\n"),
        "{out}"
    );
    assert!(
        sample_of(&out, "DCGM_FI_DEV_SM_CLOCK{")[0].ends_with(" 1980.0"),
        "{out}"
    );
    assert!(
        out.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown"),
        "{out}"
    );
    assert!(
        sample_of(&out, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{")[0].ends_with(" 12500.0"),
        "{out}"
    );
    assert!(!out.contains("fumarole_device_utilization"), "{out}");
    // The figures' age is written whatever names they are under.
    assert!(
        out.contains("fumarole_device_metrics_age_seconds{library=\"nvml\"} "),
        "{out}"
    );
}

#[test]
fn nothing_is_written_before_the_first_reading_and_failures_are_counted_by_figure() {
    let out = scrape(&[Names::Fumarole, Names::Dcgm], |m| {
        m.failed(Figure::Power);
        m.failed(Figure::Power);
    });
    assert!(!out.contains("fumarole_device_utilization"), "{out}");
    assert!(
        !out.contains("fumarole_device_metrics_age_seconds"),
        "{out}"
    );
    assert!(
        out.contains("fumarole_device_metric_errors_total{figure=\"device_power_watts\"} 2"),
        "{out}"
    );
}

#[test]
fn the_checkpoint_leaves_the_last_holders_in_place() {
    let out = scrape(&[Names::Fumarole], |m| {
        m.store(two_gpus());
        m.set_allocations(&Allocations {
            source: AllocationSource::PodResources,
            pods: vec![pod("whole", &["GPU-0"])],
        });
        m.set_allocations(&Allocations {
            source: AllocationSource::CpuManagerState,
            pods: vec![],
        });
    });
    assert!(out.contains("pod=\"whole\""), "{out}");
}

#[test]
fn every_figure_has_one_spec_and_exporter_names_are_distinct() {
    let mut names = std::collections::BTreeSet::new();
    for s in SPECS {
        assert!(names.insert(s.name), "{}", s.name);
        if let Some(dcgm) = &s.dcgm {
            assert!(dcgm.name.starts_with("DCGM_FI_DEV_"), "{}", dcgm.name);
            assert!(names.insert(dcgm.name), "{}", dcgm.name);
        }
        if let Some(npu) = &s.npu {
            assert!(npu.name.starts_with("npu_chip_info_"), "{}", npu.name);
            assert!(names.insert(npu.name), "{}", npu.name);
        }
    }
    assert_eq!(SPECS.len(), 29);
}

/// `docs/reference/dcgm-exporter.md`, written from dcgm-exporter's public counter lists: name
/// -> (type, unit).
fn dcgm_reference() -> BTreeMap<String, (String, String)> {
    let text = include_str!("../../../docs/reference/dcgm-exporter.md");
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix("`DCGM_")?.strip_suffix('`')?;
            Some((
                format!("DCGM_{name}"),
                (cells[2].to_string(), cells[3].to_string()),
            ))
        })
        .collect()
}

#[test]
fn dcgm_names_follow_the_reference() {
    let reference = dcgm_reference();
    assert!(reference.len() >= 25, "{reference:?}");
    let per_unit = |unit: &str| match unit {
        "MiB" => 1.0 / MIB,
        "%" => 100.0,
        "mJ" => 1000.0,
        "MHz" => 1e-6,
        "KB/s" => 1.0 / 1024.0,
        _ => 1.0,
    };
    for spec in SPECS {
        let Some(field) = &spec.dcgm else { continue };
        let Some((kind, unit)) = reference.get(field.name) else {
            panic!("{} is not in the reference", field.name)
        };
        assert_eq!(field.counter, kind == "counter", "{}", field.name);
        assert_eq!(field.factor, per_unit(unit), "{} in {unit}", field.name);
    }
    let written: Vec<&str> = SPECS
        .iter()
        .filter_map(|s| s.dcgm.as_ref().map(|d| d.name))
        .collect();
    let text = include_str!("../../../docs/reference/dcgm-exporter.md");
    in_fumarole_column_says_written(text, "| `DCGM_", &written);
    // The labels, in dcgm-exporter's order.
    let out = scrape(&[Names::Dcgm], |m| m.store(two_gpus()));
    assert_eq!(
        label_keys(&sample_of(&out, "DCGM_FI_DEV_GPU_UTIL{")[0]),
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION",
            "namespace",
            "pod",
            "container"
        ]
    );
}

/// A reference's table rows (those starting with `row`): the last column, `in fumarole`, says
/// yes exactly for the names `written`.
fn in_fumarole_column_says_written(text: &str, row: &str, written: &[&str]) {
    for line in text.lines().filter(|l| l.starts_with(row)) {
        let name = line.split('`').nth(1).unwrap();
        let yes = line
            .trim_end_matches('|')
            .trim()
            .rsplit('|')
            .next()
            .unwrap()
            .trim()
            .starts_with("yes");
        assert_eq!(yes, written.contains(&name), "{line}");
    }
}

/// The label names of one sample line, in order.
fn label_keys(line: &str) -> Vec<&str> {
    line.split(['{', ','])
        .skip(1)
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .collect()
}

/// Two Ascend NPUs as the DCMI sampler reads them; NPU 1 gave no power.
fn two_npus() -> Snapshot {
    let npu = |index: u32, values: &[(Figure, f64)]| DeviceSample {
        index,
        id: format!("Ascend910-{index}"),
        model: "Ascend910B3".into(),
        values: values.iter().copied().collect(),
        ..Default::default()
    };
    Snapshot {
        library: Library::Dcmi,
        taken: SystemTime::now() - Duration::from_secs(2),
        driver_version: String::new(),
        devices: vec![
            npu(
                0,
                &[
                    (Figure::Utilization, 0.4),
                    (Figure::MemoryUsed, 1024.0 * MIB),
                    (Figure::MemoryTotal, 65536.0 * MIB),
                    (Figure::Power, 180.5),
                    (Figure::Temperature, 55.0),
                    (Figure::AiCoreClock, 1.8e9),
                    (Figure::Healthy, 1.0),
                ],
            ),
            npu(1, &[(Figure::Utilization, 0.0), (Figure::Healthy, 0.0)]),
        ],
    }
}

#[test]
fn npu_exporter_names_keep_its_units_and_labels_and_cover_only_npus() {
    let out = scrape(&[Names::NpuExporter], |m| {
        m.store(two_gpus());
        m.store(two_npus());
        m.set_allocations(&Allocations {
            source: AllocationSource::PodResources,
            pods: vec![pod("train", &["Ascend910-0"])],
        });
    });
    assert!(
        out.contains("# TYPE npu_chip_info_utilization gauge"),
        "{out}"
    );
    assert!(out.contains("npu_chip_info_utilization{id=\"0\",model_name=\"Ascend910B3\",namespace=\"team\",pod_name=\"train\",container_name=\"main\"} 40.0"), "{out}");
    assert!(out.contains("npu_chip_info_utilization{id=\"1\",model_name=\"Ascend910B3\",namespace=\"\",pod_name=\"\",container_name=\"\"} 0.0"), "{out}");
    // MB, W, C, MHz, 1/0.
    for (name, value) in [
        ("npu_chip_info_hbm_used_memory", "1024.0"),
        ("npu_chip_info_hbm_total_memory", "65536.0"),
        ("npu_chip_info_power", "180.5"),
        ("npu_chip_info_temperature", "55.0"),
        ("npu_chip_info_aicore_current_freq", "1800.0"),
    ] {
        let got = sample_of(&out, &format!("{name}{{id=\"0\""));
        assert!(got[0].ends_with(&format!(" {value}")), "{name}: {out}");
    }
    // NPU 1 gave no power: left out, not 0.
    assert_eq!(sample_of(&out, "npu_chip_info_power{").len(), 1, "{out}");
    assert_eq!(
        sample_of(&out, "npu_chip_info_health_status{id=\"1\"")[0]
            .rsplit(' ')
            .next(),
        Some("0.0")
    );
    // The GPUs are not npu-exporter's; each library's figures have their age.
    assert!(!out.contains("GPU-0") && !out.contains("DCGM_"), "{out}");
    assert!(
        out.contains("fumarole_device_metrics_age_seconds{library=\"dcmi\"} "),
        "{out}"
    );
    assert!(
        out.contains("fumarole_device_metrics_age_seconds{library=\"nvml\"} "),
        "{out}"
    );
    // Under fumarole's names both vendors' devices, each named by its library.
    let out = scrape(&[Names::Fumarole], |m| {
        m.store(two_gpus());
        m.store(two_npus());
    });
    assert!(
        out.contains(
            "fumarole_device_aicore_clock_hertz{device=\"ascend-0\",uuid=\"\",model=\"Ascend910B3\""
        ),
        "{out}"
    );
    assert_eq!(
        sample_of(&out, "fumarole_device_utilization_ratio{").len(),
        3,
        "{out}"
    );
}

#[test]
fn each_librarys_reading_keeps_the_others_pods() {
    let (registry, unprefixed) = (&mut Registry::default(), &mut Registry::default());
    let args = DeviceMetricsArgs {
        device_metrics_interval: Duration::from_secs(10),
        device_metric_names: vec![Names::Fumarole],
        device_usage_window: Duration::from_secs(600),
    };
    let m = DeviceMetrics::register(registry, unprefixed, "node-1", &args);
    m.set_allocations(&Allocations {
        source: AllocationSource::PodResources,
        pods: vec![pod("infer", &["GPU-0"]), pod("train", &["Ascend910-0"])],
    });
    let pods = m.pods();
    m.store(two_gpus());
    m.store(two_npus());
    // A second GPU reading does not drop the NPU's pod (nor its readings).
    m.store(two_gpus());
    let now = pods.borrow().clone();
    let by_pod: BTreeMap<&str, u32> = now
        .iter()
        .map(|p| (p.pod.as_str(), p.utilization_percent))
        .collect();
    assert_eq!(
        by_pod,
        BTreeMap::from([("infer", 70), ("train", 40)]),
        "{now:?}"
    );
}

/// `docs/reference/npu-exporter.md`, written from npu-exporter's public source and docs: name
/// -> unit.
fn npu_reference() -> BTreeMap<String, String> {
    let text = include_str!("../../../docs/reference/npu-exporter.md");
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            name.starts_with("npu_chip_info_")
                .then(|| (name.to_string(), cells[3].to_string()))
        })
        .collect()
}

#[test]
fn npu_exporter_names_follow_the_reference() {
    let reference = npu_reference();
    assert!(reference.len() >= 10, "{reference:?}");
    let per_unit = |unit: &str| match unit {
        "MB" => 1.0 / MIB,
        "%" => 100.0,
        "MHz" => 1e-6,
        _ => 1.0,
    };
    for spec in SPECS {
        let Some(field) = &spec.npu else { continue };
        let Some(unit) = reference.get(field.name) else {
            panic!("{} is not in the reference", field.name)
        };
        assert_eq!(field.factor, per_unit(unit), "{} in {unit}", field.name);
    }
    let written: Vec<&str> = SPECS
        .iter()
        .filter_map(|s| s.npu.as_ref().map(|d| d.name))
        .collect();
    let text = include_str!("../../../docs/reference/npu-exporter.md");
    in_fumarole_column_says_written(text, "| `npu_chip_info_", &written);
    let out = scrape(&[Names::NpuExporter], |m| m.store(two_npus()));
    assert_eq!(
        label_keys(&sample_of(&out, "npu_chip_info_utilization{")[0]),
        [
            "id",
            "model_name",
            "namespace",
            "pod_name",
            "container_name"
        ]
    );
}

#[test]
fn dra_claims_hold_devices_by_their_pool_names() {
    let claimed = |pod: &str, driver: &str, device: &str| PodAllocation {
        uid: None,
        name: pod.into(),
        namespace: "team".into(),
        containers: vec![ContainerAllocation {
            name: "main".into(),
            claimed: vec![crate::kubelet::ClaimedDevice {
                driver: driver.into(),
                pool: "node-1".into(),
                device: device.into(),
            }],
            ..Default::default()
        }],
    };
    let out = scrape(&[Names::Fumarole, Names::NpuExporter], |m| {
        m.store(two_gpus());
        m.store(two_npus());
        m.set_allocations(&Allocations {
            source: AllocationSource::PodResources,
            pods: vec![
                // A MIG partition of GPU 0, the whole of NPU 1, a vNPU of NPU 0; another
                // driver's "nvidia-1" and a name that only starts like GPU 0's are not ours.
                claimed("sliced", "gpu.fumarole.dev", "nvidia-0-3g-40gb-4"),
                claimed("npu", "npu.fumarole.dev", "huawei-1"),
                claimed("vnpu", "npu.fumarole.dev", "huawei-0-vir04-1"),
                claimed("theirs", "gpu.nvidia.com", "nvidia-1"),
                claimed("lookalike", "gpu.fumarole.dev", "nvidia-01"),
            ],
        });
    });
    assert!(
        out.contains("fumarole_device_utilization_ratio{device=\"nvidia-0\",uuid=\"GPU-0\",model=\"NVIDIA H100 80GB HBM3\",node=\"node-1\",namespace=\"team\",pod=\"sliced\",container=\"main\"} 0.73"),
        "{out}"
    );
    assert!(
        out.contains("npu_chip_info_utilization{id=\"1\",model_name=\"Ascend910B3\",namespace=\"team\",pod_name=\"npu\",container_name=\"main\"} 0.0"),
        "{out}"
    );
    assert!(
        out.contains("npu_chip_info_utilization{id=\"0\",model_name=\"Ascend910B3\",namespace=\"team\",pod_name=\"vnpu\",container_name=\"main\"} 40.0"),
        "{out}"
    );
    assert!(
        !out.contains("theirs") && !out.contains("lookalike"),
        "{out}"
    );
}
