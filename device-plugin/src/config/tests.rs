#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Unit tests of the device-plugin configuration: parsing, validation and resolution.

use super::*;
use fumarole_topology::{CpuSet, Health, PciId};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Some(Path::new("/etc/fumarole/dp.yaml")))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

fn device(vendor: Vendor, pci: (u16, u16), index: u32, model: &str) -> Device {
    Device {
        id: format!("dev-{index}"),
        index,
        vendor,
        kind: DeviceKind::Gpu,
        model: model.into(),
        pci_bus_id: format!("0000:{:02x}:00.0", index + 1),
        pci_path: Vec::new(),
        pci_id: PciId {
            vendor: pci.0,
            device: pci.1,
            class: 0x0302,
        },
        numa_node: None,
        local_cpus: CpuSet::default(),
        dev_nodes: Vec::new(),
        health: Health::Healthy,
        uuid: None,
        serial: None,
        memory_bytes: None,
        mig: Vec::new(),
    }
}

#[test]
fn parses_the_documented_example() {
    let c = parse(
        r#"
resources:
  - match: {vendor: nvidia, model: "NVIDIA A100*"}
    sharing:
      timeSlicing:
        renameByDefault: true
        resources:
          - {name: nvidia.com/gpu, replicas: 4}
    replicaAllocation: packed
  - match: {vendor: nvidia}
    resourceName: nvidia.com/gpu
    env: NVIDIA_VISIBLE_DEVICES
    envValue: uuid
    sharedDeviceNodes: [/dev/nvidiactl, /dev/nvidia-uvm]
  - match: {pciVendor: "0x1e52", pciDevice: 0x401e}
    resourceName: example.com/npu
    env: EXAMPLE_VISIBLE_DEVICES
    envValue: busId
    deviceNodes: ["/dev/accel/accel{index}"]
    cdi: true
  - match: {vendor: amd}
    enabled: false
"#,
    )
    .unwrap();
    assert_eq!(c.resources.len(), 4);
    assert_eq!(
        c.resources[0]
            .sharing
            .as_ref()
            .map(|s| (s.replicas, s.allocation)),
        Some((4, ReplicaAllocation::Packed))
    );
    let c = Config {
        resources: c.resources[1..].to_vec(),
        ..c
    };
    let r = &c.resources[1];
    assert_eq!(r.matcher.pci_vendor, Some(0x1e52));
    assert_eq!(r.matcher.pci_device, Some(0x401e));
    assert_eq!(r.env_value, Some(EnvValue::BusId));
    assert_eq!(r.cdi, Some(true));
    assert!(r.enabled);
    assert!(!c.resources[2].enabled);
    assert_eq!(
        c.resources[0].matcher.to_string(),
        "{vendor: nvidia}".to_string()
    );
    // Empty file, empty list: defaults.
    assert!(parse("").unwrap().resources.is_empty());
    assert!(parse("resources: []").unwrap().resources.is_empty());
}

#[test]
fn errors_name_the_file_the_entry_and_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: gpu\n",
            "/etc/fumarole/dp.yaml: resources[0].resourceName: \"gpu\" is not domain-qualified",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n  - match: {vendor: metax}\n    resourceName: kubernetes.io/gpu\n",
            "resources[1].resourceName: \"kubernetes.io/gpu\": the kubernetes.io domain is reserved",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: requests.example.com/gpu\n",
            "resources[0].resourceName",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: Example.com/gpu\n",
            "not a lower-case DNS subdomain",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: example.com/-gpu\n",
            "must be 1-63 letters",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    env: 1GPU\n",
            "resources[0].env: \"1GPU\" is not an environment variable name",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    env: MY-GPUS\n",
            "resources[0].env",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    envValue: minor\n",
            "resources[0].envValue: unknown value \"minor\": one of uuid, index, id, busId",
        ),
        (
            "resources:\n  - match: {vendor: nvdia}\n",
            "resources[0].match.vendor: unknown vendor \"nvdia\"",
        ),
        (
            "resources:\n  - match: {pciVendor: \"0xzz\"}\n",
            "resources[0].match.pciVendor: \"0xzz\" is not a 16-bit hex PCI id",
        ),
        (
            "resources:\n  - match: {pciVendor: 0x10de0}\n",
            "resources[0].match.pciVendor",
        ),
        (
            "resources:\n  - match: {pciDevice: \"0x2330\"}\n",
            "resources[0].match.pciDevice: needs match.pciVendor",
        ),
        (
            "resources:\n  - match: {vendor: nvidia, pciVendor: \"0x1002\"}\n",
            "could never match",
        ),
        (
            "resources:\n  - match: {kind: fpga}\n",
            "resources[0].match.kind: unknown kind",
        ),
        ("resources:\n  - match: {}\n", "resources[0].match: empty"),
        (
            "resources:\n  - resourceName: example.com/x\n",
            "resources[0].match: missing",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n  - match: {vendor: nvidia}\n    env: X\n",
            "resources[1].match: the same match as resources[0], which wins",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    resourceName: example.com/x\n    env: A\n  - match: {vendor: metax}\n    resourceName: example.com/x\n    env: B\n",
            "resources[1].resourceName: example.com/x is also resources[0]'s, with other settings",
        ),
        (
            "resources:\n  - match: {vendor: amd}\n    enabled: false\n    env: X\n",
            "resources[0].env: set on an entry with enabled: false",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    deviceNodes: [\"dev/nvidia{index}\"]\n",
            "resources[0].deviceNodes[0]: \"dev/nvidia{index}\" is not an absolute path",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    deviceNodes: [/dev/x, \"/dev/nvidia{minor}\"]\n",
            "resources[0].deviceNodes[1]: \"/dev/nvidia{minor}\": unknown placeholder {minor}",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    deviceNodes: [\"/dev/nvidia{index\"]\n",
            "unclosed",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    sharedDeviceNodes: [\"/dev/ctl{index}\"]\n",
            "resources[0].sharedDeviceNodes[0]: \"/dev/ctl{index}\": placeholders ({index}) only apply to deviceNodes",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    sharedDeviceNodes: [/dev/../etc/passwd]\n",
            "must not contain",
        ),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.contains(want), "{text}\n got: {got}\nwant: {want}");
        assert!(got.starts_with("/etc/fumarole/dp.yaml: "), "{got}");
    }
}

#[test]
fn unknown_keys_and_bad_yaml_are_errors_not_panics() {
    for text in [
        "resources:\n  - match: {vendor: nvidia}\n    resouceName: example.com/x\n",
        "resources:\n  - match: {vendor: nvidia, serial: x}\n",
        "resource: []\n",
        "resources: {a: 1}\n",
        "resources:\n  - match: {vendor: [nvidia]}\n",
        "resources:\n  - match: {pciVendor: -1}\n",
        "resources:\n  - match: {vendor: nvidia}\n    cdi: maybe\n",
        "[unclosed",
        "\t- x",
    ] {
        let e = err(text);
        assert!(e.starts_with("/etc/fumarole/dp.yaml: "), "{text}: {e}");
    }
    let e = err("resources:\n  - match: {vendor: nvidia}\n    resouceName: example.com/x\n");
    assert!(e.contains("resouceName"), "{e}");
    let e = Config::load(Path::new("/nonexistent/dp.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/dp.yaml: "), "{e}");
}

#[test]
fn resource_names_follow_kubernetes() {
    for ok in [
        "nvidia.com/gpu",
        "huawei.com/Ascend910",
        "example.com/npu_2.x",
        "a/b",
    ] {
        assert_eq!(check_resource_name(ok), Ok(()), "{ok}");
    }
    for bad in [
        "gpu",
        "/gpu",
        "example.com/",
        "kubernetes.io/gpu",
        "foo.kubernetes.io/gpu",
        "requests.example.com/gpu",
        "example..com/gpu",
        "example.com/a/b",
        "example.com/gpu-",
        &format!("example.com/{}", "x".repeat(64)),
    ] {
        assert!(check_resource_name(bad).is_err(), "{bad}");
    }
}

#[test]
fn first_matching_entry_wins() {
    let c = parse(
        r#"
resources:
  - match: {vendor: nvidia, model: "NVIDIA H100*"}
    resourceName: example.com/h100
  - match: {pciVendor: "0x10de"}
    resourceName: example.com/nvidia
  - match: {kind: gpu}
    resourceName: example.com/gpu
"#,
    )
    .unwrap();
    let h100 = device(Vendor::Nvidia, (0x10de, 0x2330), 0, "NVIDIA H100 80GB HBM3");
    let l40s = device(Vendor::Nvidia, (0x10de, 0x26b9), 1, "NVIDIA L40S");
    let metax = device(Vendor::Metax, (0x9999, 0x4000), 0, "MetaX C500");
    let mut npu = device(Vendor::Huawei, (0x19e5, 0xd801), 0, "Ascend910");
    npu.kind = DeviceKind::Npu;
    assert_eq!(c.rule_for(&h100).map(|(i, _)| i), Some(0));
    assert_eq!(c.rule_for(&l40s).map(|(i, _)| i), Some(1));
    assert_eq!(c.rule_for(&metax).map(|(i, _)| i), Some(2));
    assert_eq!(c.rule_for(&npu).map(|(i, _)| i), None);
}

#[test]
fn model_globs() {
    assert!(glob("NVIDIA H100*", "NVIDIA H100 80GB HBM3"));
    assert!(glob("*H100*", "NVIDIA H100 PCIe"));
    assert!(glob("*PCIe", "NVIDIA H100 PCIe"));
    assert!(glob("NVIDIA L40S", "NVIDIA L40S"));
    assert!(!glob("NVIDIA L40", "NVIDIA L40S"));
    assert!(!glob("*A100*", "NVIDIA H100 PCIe"));
    assert!(glob("*", ""));
    assert!(!glob("a*a", "a"));
    assert!(glob("a*b*c", "aXbYc"));
}

#[test]
fn device_node_templates_expand() {
    let c = parse(
            "resources:\n  - match: {vendor: other}\n    deviceNodes: [\"/dev/accel/accel{index}\", \"/dev/x/{busId}\", \"/dev/y/{id}\"]\n",
        )
        .unwrap();
    let d = device(Vendor::Other, (0x1e52, 0x401e), 3, "x");
    assert_eq!(
        c.resources[0].device_nodes_for(&d).unwrap(),
        ["/dev/accel/accel3", "/dev/x/0000:04:00.0", "/dev/y/dev-3"]
    );
}

#[test]
fn served_by_chooses_device_plugin_dra_or_both() {
    let c = parse(
        r#"
resources:
  - match: {vendor: huawei}
    servedBy: dra
  - match: {vendor: nvidia}
    servedBy: both
    cdi: true
  - match: {vendor: metax}
    servedBy: devicePlugin
  - match: {vendor: amd}
    enabled: false
"#,
    )
    .unwrap();
    let served = |vendor| c.served_by(&device(vendor, (0, 0), 0, "m"));
    assert_eq!(served(Vendor::Huawei), Some(ServedBy::Dra));
    assert_eq!(served(Vendor::Nvidia), Some(ServedBy::Both));
    assert_eq!(served(Vendor::Metax), Some(ServedBy::DevicePlugin));
    assert_eq!(served(Vendor::Amd), None, "disabled");
    assert_eq!(
        served(Vendor::Intel),
        Some(ServedBy::DevicePlugin),
        "no entry: the default"
    );
    assert!(ServedBy::Both.dra() && ServedBy::Both.device_plugin());
    assert!(ServedBy::Dra.dra() && !ServedBy::Dra.device_plugin());
    assert!(!ServedBy::DevicePlugin.dra() && ServedBy::DevicePlugin.device_plugin());
    assert_eq!(Config::default().resources.len(), 0);

    for (text, want) in [
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: DRA\n",
            "/etc/fumarole/dp.yaml: resources[0].servedBy: unknown value \"DRA\": one of devicePlugin, dra, both",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    cdi: false\n",
            "/etc/fumarole/dp.yaml: resources[0].cdi: set on an entry with servedBy: dra",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    enabled: false\n    servedBy: both\n",
            "/etc/fumarole/dp.yaml: resources[0].servedBy: set on an entry with enabled: false",
        ),
    ] {
        let got = err(text);
        assert!(got.starts_with(want), "{text}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn dra_partitions_need_dra_and_no_shares() {
    let c = parse(
        "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draPartitions: true\n",
    )
    .unwrap();
    assert!(c.resources[0].dra_partitions);
    for (text, want) in [
        (
            "resources:\n  - match: {vendor: nvidia}\n    draPartitions: true\n",
            "/etc/fumarole/dp.yaml: resources[0].draPartitions: needs servedBy: dra",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draShares: 2\n    draPartitions: true\n",
            "/etc/fumarole/dp.yaml: resources[0].draPartitions: set with draShares",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draPartitions: maybe\n",
            "/etc/fumarole/dp.yaml",
        ),
    ] {
        let got = err(text);
        assert!(got.starts_with(want), "{text}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn dra_shares_need_dra_and_a_sensible_count() {
    let c = parse("resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draShares: 4\n")
        .unwrap();
    assert_eq!(c.resources[0].dra_shares, Some(4));
    assert_eq!(
        parse("resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n")
            .unwrap()
            .resources[0]
            .dra_shares,
        None
    );
    for (text, want) in [
        (
            "resources:\n  - match: {vendor: nvidia}\n    draShares: 4\n",
            "/etc/fumarole/dp.yaml: resources[0].draShares: needs servedBy: dra",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: both\n    draShares: 4\n",
            "/etc/fumarole/dp.yaml: resources[0].draShares: needs servedBy: dra",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draShares: 1\n",
            "/etc/fumarole/dp.yaml: resources[0].draShares: 1 claims per device: from 2 to 64",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draShares: 65\n",
            "/etc/fumarole/dp.yaml: resources[0].draShares: 65 claims per device: from 2 to 64",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draShares: -2\n",
            "/etc/fumarole/dp.yaml",
        ),
        (
            "resources:\n  - match: {vendor: nvidia}\n    enabled: false\n    draShares: 2\n",
            "/etc/fumarole/dp.yaml: resources[0].draShares: set on an entry with enabled: false",
        ),
    ] {
        let got = err(text);
        assert!(got.starts_with(want), "{text}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn sharing_is_nvidias_block_checked_against_the_entry() {
    const ENTRY: &str = "resources:\n  - match: {vendor: nvidia}\n";
    let sliced = "    sharing:\n      timeSlicing:\n        resources:\n          - name: nvidia.com/gpu\n            replicas: 4\n";
    let c = parse(&format!("{ENTRY}{sliced}")).unwrap();
    assert_eq!(
        c.resources[0].sharing,
        Some(Sharing {
            replicas: 4,
            mps_root: None,
            one_each: false,
            rename_by_default: false,
            allocation: ReplicaAllocation::Distributed,
        })
    );
    // MPS: one replica per container unless said otherwise, NVIDIA's daemon root by default.
    let mps = "    sharing:\n      mps:\n        renameByDefault: true\n        resources:\n          - {name: nvidia.com/gpu, replicas: 8}\n";
    let c = parse(&format!("{ENTRY}{mps}    replicaAllocation: packed\n")).unwrap();
    assert_eq!(
        c.resources[0].sharing,
        Some(Sharing {
            replicas: 8,
            mps_root: Some(DEFAULT_MPS_ROOT.into()),
            one_each: true,
            rename_by_default: true,
            allocation: ReplicaAllocation::Packed,
        })
    );
    let c = parse(&format!("{ENTRY}{mps}    mpsRoot: /var/lib/mps\n")).unwrap();
    assert_eq!(
        c.resources[0].sharing.as_ref().unwrap().mps_root.as_deref(),
        Some("/var/lib/mps")
    );
    // An empty block shares nothing.
    assert_eq!(
        parse(&format!("{ENTRY}    sharing: {{}}\n"))
            .unwrap()
            .resources[0]
            .sharing,
        None
    );
    for (text, want) in [
        (
            format!("{ENTRY}{sliced}    servedBy: dra\n"),
            "resources[0].sharing: needs servedBy: devicePlugin",
        ),
        (
            format!("{ENTRY}{sliced}    servedBy: both\n"),
            "resources[0].sharing: needs servedBy: devicePlugin",
        ),
        (
            format!("{ENTRY}{sliced}    resourceName: example.com/gpu\n"),
            "resources[0].resourceName: example.com/gpu with sharing",
        ),
        (
            format!(
                "{ENTRY}    sharing:\n      timeSlicing:\n        resources:\n          - {{name: nvidia.com/gpu, replicas: 1}}\n"
            ),
            "resources[0].sharing: sharing.timeSlicing: nvidia.com/gpu: number of replicas must be >= 2, got 1",
        ),
        (
            format!(
                "{ENTRY}{sliced}      mps:\n        resources:\n          - {{name: nvidia.com/gpu, replicas: 2}}\n"
            ),
            "resources[0].sharing: sharing: timeSlicing and mps are both set",
        ),
        (
            format!(
                "{ENTRY}    sharing:\n      mps:\n        resources:\n          - {{name: nvidia.com/gpu, replicas: 49}}\n"
            ),
            "resources[0].sharing: sharing.mps: nvidia.com/gpu: at most 48 replicas per GPU, got 49",
        ),
        (
            format!("{ENTRY}{sliced}    replicaAllocation: spread\n"),
            "resources[0].replicaAllocation: unknown value \"spread\": one of distributed, packed",
        ),
        (
            format!("{ENTRY}    replicaAllocation: packed\n"),
            "resources[0].replicaAllocation: needs sharing",
        ),
        (
            format!("{ENTRY}{sliced}    mpsRoot: /run/mps\n"),
            "resources[0].mpsRoot: needs sharing.mps",
        ),
        (
            format!("{ENTRY}{mps}    mpsRoot: run/mps\n"),
            "resources[0].mpsRoot: \"run/mps\" is not an absolute path",
        ),
        (
            format!("{ENTRY}    enabled: false\n{sliced}"),
            "resources[0].sharing: set on an entry with enabled: false",
        ),
        (
            format!(
                "{ENTRY}    sharing:\n      timeSlicing:\n        resources:\n          - {{name: nvidia.com/gpu, replicas: 2, devices: [0]}}\n"
            ),
            "devices must be \"all\"",
        ),
        (
            format!("{ENTRY}    sharing:\n      timeslicing: {{}}\n"),
            "unknown field `timeslicing`",
        ),
    ] {
        let got = err(&text);
        assert!(got.contains(want), "{text}\n got: {got}\nwant: {want}");
        assert!(got.starts_with("/etc/fumarole/dp.yaml"), "{got}");
    }
}
