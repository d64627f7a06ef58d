//! Accelerator nodes the project ships, as small declarative specs that [`Fixture::materialize`]
//! writes out as a sysfs / procfs / `/dev` tree, which discovery then reads like any host.
//!
//! The trees hold what hwloc and discovery read: CPU topology files, NUMA node files, PCI
//! functions (`vendor`, `device`, `class`, a 256-byte `config` with bridge bus ranges,
//! `numa_node`, `local_cpus`), `/sys/bus/pci/devices` links, the NVIDIA driver's `/proc`
//! entries, device nodes (plain files), and, where a vendor library is needed, recorded
//! answers ([`crate::discover::RECORDED_NVML_FILE`]) or an override file
//! ([`crate::discover::OVERRIDE_FILE`]). Ascend fixtures also carry the DCMI answers their
//! chips would give, as the state file of the DCMI stand-in library ([`DCMI_STANDIN_FILE`]):
//! all healthy; `atlas-a3-16`'s chips (two per card) answer the super-pod query with
//! super-pod [`A3_SUPER_POD`], the other fixtures' chips do not (not A3 hardware). Each
//! Ascend fixture's chips answer `dcmi_get_device_chip_info` with its [`ChipAnswer`]
//! (docs/labels.md says where each value comes from).
//!
//! | name            | node                                                              |
//! |-----------------|-------------------------------------------------------------------|
//! | `dgx-h100`      | 2 sockets, 8 H100 SXM behind 4 PCIe switches, NVSwitch: NV18 pairs |
//! | `atlas-800t-a2` | 4 Kunpeng sockets, 8 Ascend 910B, full HCCS mesh                  |
//! | `atlas-800-910` | 4 Kunpeng sockets, 8 Ascend 910 in HCCS groups 0-3 and 4-7        |
//! | `atlas-a3-16`   | 4 Kunpeng sockets, 16 Ascend 910B in HCCS halves 0-7 and 8-15     |
//! | `metax-c500-8`  | 2 sockets, 8 MetaX GPUs on 4 switches, link zones 0-3 and 4-7     |
//! | `pcie-4gpu`     | 1 socket, 4 L40S on 2 PCIe switches, no NVLink, no NVML           |
//! | `cpu-only`      | 2 sockets, no accelerator (a BMC VGA and a NIC only)              |

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use crate::discover::nvml::{ComputeCapability, NvlinkLane, NvmlGpu, NvmlReport, RemoteKind};
use crate::discover::{OVERRIDE_FILE, RECORDED_NVML_FILE};

/// Where an Ascend fixture's DCMI answers go under its root: the state file the DCMI stand-in
/// (`standins/dcmi`) answers from (`FUMAROLE_DCMI_STANDIN`).
pub const DCMI_STANDIN_FILE: &str = "/fumarole/dcmi-standin.json";

/// `atlas-a3-16`'s place in its super-pod, as its chips answer DCMI: (super-pod id, server
/// index). Made-up numbers of a made-up cluster.
pub const A3_SUPER_POD: (u32, u32) = (7, 3);

/// What an Ascend fixture's chips answer to `dcmi_get_device_chip_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChipAnswer {
    pub chip_type: &'static str,
    pub name: &'static str,
    pub version: &'static str,
    pub ai_cores: u32,
}

/// `atlas-800-910`'s chips: Ascend 910 (A), 32 AI cores (Huawei's `servertype` example
/// `Ascend910-32`, the `910A` chip-name example in its device plugin).
pub const ATLAS_800_910_CHIP: ChipAnswer = ChipAnswer {
    chip_type: "Ascend",
    name: "910A",
    version: "V1",
    ai_cores: 32,
};
/// `atlas-800t-a2`'s chips: Ascend 910B3, 20 AI cores (`servertype` `Ascend910B-20`).
pub const ATLAS_800T_A2_CHIP: ChipAnswer = ChipAnswer {
    chip_type: "Ascend",
    name: "910B3",
    version: "V1",
    ai_cores: 20,
};
/// `atlas-a3-16`'s chips: an A3 (Ascend 910_93xx) chip, whose DCMI chip name is `Ascend910`
/// (the 93xx is the separate `npu_name` of the v2 call), 24 AI cores (`Ascend910A3-24`).
pub const ATLAS_A3_CHIP: ChipAnswer = ChipAnswer {
    chip_type: "Ascend",
    name: "Ascend910",
    version: "V1",
    ai_cores: 24,
};

/// A bundled node.
#[derive(Clone, Debug)]
pub struct Fixture {
    pub name: &'static str,
    pub description: &'static str,
    spec: NodeSpec,
}

/// Names of all bundled fixtures.
pub const NAMES: &[&str] = &[
    "dgx-h100",
    "atlas-800t-a2",
    "atlas-800-910",
    "atlas-a3-16",
    "metax-c500-8",
    "pcie-4gpu",
    "cpu-only",
];

/// The fixture called `name`.
pub fn get(name: &str) -> Option<Fixture> {
    Some(match name {
        "dgx-h100" => dgx_h100(),
        "atlas-800t-a2" => atlas(
            "atlas-800t-a2",
            "Huawei Atlas 800T A2: 4 Kunpeng 920 sockets, 8 NUMA nodes, 8 Ascend 910B, full HCCS mesh",
            0xd802,
            ATLAS_800T_A2_CHIP,
        ),
        "atlas-800-910" => atlas(
            "atlas-800-910",
            "Huawei Atlas 800 (9000): 4 Kunpeng 920 sockets, 8 NUMA nodes, 8 Ascend 910 in HCCS groups 0-3 / 4-7",
            0xd801,
            ATLAS_800_910_CHIP,
        ),
        "atlas-a3-16" => {
            let mut f = atlas_with(
                "atlas-a3-16",
                "Huawei Atlas A3-class node: 4 Kunpeng 920 sockets, 8 NUMA nodes, 16 Ascend 910B in HCCS halves 0-7 / 8-15",
                0xd802,
                16,
                ATLAS_A3_CHIP,
            );
            f.spec.dcmi = Some(DcmiSpec {
                per_card: 2,
                super_pod: Some(A3_SUPER_POD),
                chip: ATLAS_A3_CHIP,
            });
            f
        }
        "metax-c500-8" => metax_c500_8(),
        "pcie-4gpu" => pcie_4gpu(),
        "cpu-only" => cpu_only(),
        _ => return None,
    })
}

#[derive(Clone, Debug)]
struct NodeSpec {
    hostname: &'static str,
    sockets: u32,
    cores_per_socket: u32,
    threads_per_core: u32,
    numa_per_socket: u32,
    memory_gib_per_numa: u64,
    /// Host bridges: (root bus, NUMA node, tree below).
    host_bridges: Vec<(u8, u32, Vec<Pci>)>,
    /// Recorded NVML answers: NVIDIA GPUs get this many NVSwitch lanes each.
    nvml_switch_lanes: Option<u32>,
    /// Override file lines to write, given the accelerator bus ids in PCI order.
    overrides: Option<fn(&[String]) -> String>,
    /// Node-wide device nodes (control devices).
    extra_dev: &'static [&'static str],
    /// Ascend: the chips' DCMI answers.
    dcmi: Option<DcmiSpec>,
}

/// What an Ascend fixture's chips answer DCMI.
#[derive(Clone, Copy, Debug)]
struct DcmiSpec {
    /// Chips per card.
    per_card: u32,
    /// The super-pod the chips answer (A3): (super-pod id, server index).
    super_pod: Option<(u32, u32)>,
    chip: ChipAnswer,
}

#[derive(Clone, Debug)]
enum Pci {
    Bridge(u16, u16, Vec<Pci>),
    Function(Function),
}

#[derive(Clone, Debug)]
struct Function {
    vendor: u16,
    device: u16,
    class: u32,
    kind: FnKind,
}

#[derive(Clone, Copy, Debug)]
enum FnKind {
    Plain,
    /// NVIDIA GPU with the driver's /proc entry and /dev/nvidiaN.
    NvidiaGpu(&'static str),
    /// Ascend NPU with /dev/davinciN.
    Ascend,
    /// DRM GPU with /dev/dri/cardN and renderD(128+N).
    Drm,
}

fn f(vendor: u16, device: u16, class: u32, kind: FnKind) -> Pci {
    Pci::Function(Function {
        vendor,
        device,
        class,
        kind,
    })
}

/// A root port or switch port (vendor-neutral ids: the tree shape is what matters).
fn bridge(children: Vec<Pci>) -> Pci {
    Pci::Bridge(0x8086, 0x352a, children)
}

/// A PCIe switch: upstream port with one downstream port per child.
fn switch(children: Vec<Pci>) -> Pci {
    Pci::Bridge(
        0x1000,
        0xc030,
        children
            .into_iter()
            .map(|c| Pci::Bridge(0x1000, 0xc030, vec![c]))
            .collect(),
    )
}

const H100: (u16, u16, u32) = (0x10de, 0x2330, 0x030200);
const NVSWITCH: (u16, u16, u32) = (0x10de, 0x22a3, 0x068000);
const CX7: (u16, u16, u32) = (0x15b3, 0x1021, 0x020700);
const ASPEED: (u16, u16, u32) = (0x1a03, 0x2000, 0x030000);
const INTEL_NIC: (u16, u16, u32) = (0x8086, 0x1521, 0x020000);
const L40S: (u16, u16, u32) = (0x10de, 0x26b9, 0x030200);
/// MetaX's PCI vendor id is 0x9999; the device id here is illustrative.
const METAX_GPU: (u16, u16, u32) = (0x9999, 0x4000, 0x038000);

fn plain(ids: (u16, u16, u32)) -> Pci {
    f(ids.0, ids.1, ids.2, FnKind::Plain)
}

fn dgx_h100() -> Fixture {
    let gpu = || {
        f(
            H100.0,
            H100.1,
            H100.2,
            FnKind::NvidiaGpu("NVIDIA H100 80GB HBM3"),
        )
    };
    let sw = || bridge(vec![switch(vec![gpu(), gpu(), plain(CX7)])]);
    Fixture {
        name: "dgx-h100",
        description: "NVIDIA DGX H100: 2 sockets x 56 cores x 2 threads, 2 NUMA nodes, 8 H100 SXM behind 4 PCIe switches, 4 NVSwitches, every GPU pair NVLink x18",
        spec: NodeSpec {
            hostname: "dgx-h100",
            sockets: 2,
            cores_per_socket: 56,
            threads_per_core: 2,
            numa_per_socket: 1,
            memory_gib_per_numa: 1024,
            host_bridges: vec![
                (0x00, 0, vec![plain(ASPEED)]),
                (0x10, 0, vec![sw()]),
                (0x30, 0, vec![sw()]),
                (0x90, 1, vec![sw()]),
                (0xb0, 1, vec![sw()]),
                (
                    0xd0,
                    1,
                    vec![bridge((0..4).map(|_| plain(NVSWITCH)).collect())],
                ),
            ],
            nvml_switch_lanes: Some(18),
            overrides: None,
            dcmi: None,
            extra_dev: &["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"],
        },
    }
}

fn atlas(name: &'static str, description: &'static str, device: u16, chip: ChipAnswer) -> Fixture {
    atlas_with(name, description, device, 8, chip)
}

/// `npus` Ascend NPUs (8 or 16), each behind its own root port: 8 sit on the first NUMA node
/// of each socket (two each), 16 on every NUMA node (two each).
fn atlas_with(
    name: &'static str,
    description: &'static str,
    device: u16,
    npus: u8,
    chip: ChipAnswer,
) -> Fixture {
    let npu = || bridge(vec![f(0x19e5, device, 0x120000, FnKind::Ascend)]);
    let spacing = 0x100 / u16::from(npus);
    let host_bridges = (0..npus)
        .map(|i| {
            let numa = if npus <= 8 {
                u32::from(i / 2) * 2
            } else {
                u32::from(i / 2)
            };
            let bus = u8::try_from(1 + u16::from(i) * spacing).unwrap_or(u8::MAX);
            (bus, numa, vec![npu()])
        })
        .chain(std::iter::once((0x00, 0, vec![plain(ASPEED)])))
        .collect();
    Fixture {
        name,
        description,
        spec: NodeSpec {
            hostname: name,
            sockets: 4,
            cores_per_socket: 48,
            threads_per_core: 1,
            numa_per_socket: 2,
            memory_gib_per_numa: 128,
            host_bridges,
            nvml_switch_lanes: None,
            overrides: None,
            extra_dev: &["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"],
            dcmi: Some(DcmiSpec {
                per_card: 1,
                super_pod: None,
                chip,
            }),
        },
    }
}

/// The DCMI stand-in's state for `npus` healthy chips as `spec` says: `per_card` to a card
/// (logic id = physical id = davinci index), each answering the chip-info query with `chip`
/// and the super-pod query with `super_pod` when given.
fn dcmi_answers(npus: u32, spec: DcmiSpec) -> String {
    let DcmiSpec {
        per_card,
        super_pod,
        chip: answer,
    } = spec;
    let per_card = per_card.max(1);
    let chips: Vec<serde_json::Value> = (0..npus)
        .map(|i| {
            let mut chip = serde_json::json!({
                "card": i / per_card, "device": i % per_card, "logicId": i, "phyId": i,
                "health": 0, "errorCodes": [], "network": 0,
                "chipInfo": {
                    "chipType": answer.chip_type, "chipName": answer.name,
                    "chipVer": answer.version, "aicoreCnt": answer.ai_cores,
                },
            });
            if let Some((id, index)) = super_pod {
                chip["superPod"] = serde_json::json!({
                    "sdid": i, "superPodId": id, "serverIndex": index,
                });
            }
            chip
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({ "chips": chips })).unwrap_or_default()
}

fn metax_c500_8() -> Fixture {
    let gpu = || f(METAX_GPU.0, METAX_GPU.1, METAX_GPU.2, FnKind::Drm);
    let sw = || bridge(vec![switch(vec![gpu(), gpu()])]);
    fn overrides(bus_ids: &[String]) -> String {
        let zone = |ids: &[String]| {
            format!(
                "[{}]",
                ids.iter()
                    .map(|b| format!("\"{b}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "# MetaXLink zones of this board (metax-c500-8 fixture)\nsuperNode: metax-sn-a\nmodels:\n  \"9999:4000\": MetaX C500\nlinkZones:\n  class: metaxLink\n  zones:\n    - {}\n    - {}\n",
            zone(&bus_ids[0..4]),
            zone(&bus_ids[4..8])
        )
    }
    Fixture {
        name: "metax-c500-8",
        description: "8 MetaX C500 GPUs: 2 sockets x 32 cores x 2 threads, 4 PCIe switches, MetaXLink zones 0-3 and 4-7 from an override file, super-node metax-sn-a",
        spec: NodeSpec {
            hostname: "metax-c500-8",
            sockets: 2,
            cores_per_socket: 32,
            threads_per_core: 2,
            numa_per_socket: 1,
            memory_gib_per_numa: 512,
            host_bridges: vec![
                (0x00, 0, vec![plain(ASPEED)]),
                (0x10, 0, vec![sw()]),
                (0x30, 0, vec![sw()]),
                (0x90, 1, vec![sw()]),
                (0xb0, 1, vec![sw()]),
            ],
            nvml_switch_lanes: None,
            overrides: Some(overrides),
            dcmi: None,
            extra_dev: &["/dev/mxcd"],
        },
    }
}

fn pcie_4gpu() -> Fixture {
    let gpu = || f(L40S.0, L40S.1, L40S.2, FnKind::NvidiaGpu("NVIDIA L40S"));
    Fixture {
        name: "pcie-4gpu",
        description: "1 socket x 32 cores x 2 threads, 4 NVIDIA L40S on 2 PCIe switches (one host bridge), no NVLink, no NVML library",
        spec: NodeSpec {
            hostname: "pcie-4gpu",
            sockets: 1,
            cores_per_socket: 32,
            threads_per_core: 2,
            numa_per_socket: 1,
            memory_gib_per_numa: 512,
            host_bridges: vec![
                (0x00, 0, vec![plain(ASPEED), plain(INTEL_NIC)]),
                (
                    0x40,
                    0,
                    vec![
                        bridge(vec![switch(vec![gpu(), gpu()])]),
                        bridge(vec![switch(vec![gpu(), gpu()])]),
                    ],
                ),
            ],
            nvml_switch_lanes: None,
            overrides: None,
            dcmi: None,
            extra_dev: &["/dev/nvidiactl", "/dev/nvidia-uvm"],
        },
    }
}

fn cpu_only() -> Fixture {
    Fixture {
        name: "cpu-only",
        description: "2 sockets x 16 cores x 2 threads, 2 NUMA nodes, no accelerator: a BMC VGA (ASPEED) and a NIC that must not be counted",
        spec: NodeSpec {
            hostname: "cpu-only",
            sockets: 2,
            cores_per_socket: 16,
            threads_per_core: 2,
            numa_per_socket: 1,
            memory_gib_per_numa: 128,
            host_bridges: vec![(0x00, 0, vec![plain(ASPEED), plain(INTEL_NIC)])],
            nvml_switch_lanes: None,
            overrides: None,
            dcmi: None,
            extra_dev: &[],
        },
    }
}

/// Collects the files of a tree before writing them.
#[derive(Default)]
struct Files {
    files: BTreeMap<String, Vec<u8>>,
    links: Vec<(String, String)>,
}

impl Files {
    fn text(&mut self, path: impl Into<String>, content: impl Into<String>) {
        self.files.insert(path.into(), content.into().into_bytes());
    }
}

/// Linux `cpumap` mask format: 32-bit hex words, most significant first.
fn mask(cpus: impl IntoIterator<Item = u32>, total: u32) -> String {
    let words = total.div_ceil(32).max(1) as usize;
    let mut w = vec![0u32; words];
    for c in cpus {
        if let Some(word) = w.get_mut((c / 32) as usize) {
            *word |= 1 << (c % 32);
        }
    }
    w.iter()
        .rev()
        .map(|x| format!("{x:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn list(cpus: &[u32]) -> String {
    cpus.iter()
        .copied()
        .collect::<fumarole_topology::CpuSet>()
        .to_string()
}

impl Fixture {
    /// Writes the node's tree under `dir` (which should be empty).
    pub fn materialize(&self, dir: &Path) -> io::Result<()> {
        let s = &self.spec;
        let mut out = Files::default();
        let cores = s.sockets * s.cores_per_socket;
        let total = cores * s.threads_per_core;
        let numa_count = s.sockets * s.numa_per_socket;
        let cores_per_numa = s.cores_per_socket / s.numa_per_socket;
        // Linux numbering: every core's first thread, socket by socket, then the second threads.
        let cpu = |t: u32, socket: u32, core: u32| t * cores + socket * s.cores_per_socket + core;
        let numa_of = |socket: u32, core: u32| socket * s.numa_per_socket + core / cores_per_numa;

        out.text(
            "/sys/devices/system/cpu/online",
            format!("0-{}\n", total - 1),
        );
        out.text(
            "/sys/devices/system/cpu/possible",
            format!("0-{}\n", total - 1),
        );
        out.text(
            "/sys/devices/system/cpu/present",
            format!("0-{}\n", total - 1),
        );
        let mut numa_cpus: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut cpuinfo = String::new();
        for socket in 0..s.sockets {
            let package: Vec<u32> = (0..s.threads_per_core)
                .flat_map(|t| (0..s.cores_per_socket).map(move |c| (t, c)))
                .map(|(t, c)| cpu(t, socket, c))
                .collect();
            for core in 0..s.cores_per_socket {
                let threads: Vec<u32> = (0..s.threads_per_core)
                    .map(|t| cpu(t, socket, core))
                    .collect();
                for &id in &threads {
                    let base = format!("/sys/devices/system/cpu/cpu{id}");
                    out.text(format!("{base}/online"), "1\n");
                    out.text(
                        format!("{base}/topology/physical_package_id"),
                        format!("{socket}\n"),
                    );
                    out.text(format!("{base}/topology/core_id"), format!("{core}\n"));
                    out.text(format!("{base}/topology/die_id"), "0\n");
                    // Newer kernels call these core_cpus / package_cpus, older ones
                    // thread_siblings / core_siblings; hwloc reads either, so write both.
                    for (names, set) in [
                        (["core_cpus", "thread_siblings"], &threads),
                        (["package_cpus", "core_siblings"], &package),
                    ] {
                        for name in names {
                            out.text(
                                format!("{base}/topology/{name}"),
                                format!("{}\n", mask(set.iter().copied(), total)),
                            );
                            out.text(
                                format!("{base}/topology/{name}_list"),
                                format!("{}\n", list(set)),
                            );
                        }
                    }
                    numa_cpus.entry(numa_of(socket, core)).or_default().push(id);
                }
            }
        }
        for id in 0..total {
            cpuinfo.push_str(&format!(
                "processor\t: {id}\nmodel name\t: fumarole fixture CPU\n\n"
            ));
        }
        out.text("/proc/cpuinfo", cpuinfo);
        let kib_per_numa = s.memory_gib_per_numa * 1024 * 1024;
        out.text(
            "/proc/meminfo",
            format!(
                "MemTotal:       {} kB\n",
                kib_per_numa * u64::from(numa_count)
            ),
        );
        out.text("/proc/sys/kernel/hostname", format!("{}\n", s.hostname));
        out.text(
            "/sys/devices/system/node/online",
            format!("0-{}\n", numa_count - 1),
        );
        out.text(
            "/sys/devices/system/node/possible",
            format!("0-{}\n", numa_count - 1),
        );
        for cpus in numa_cpus.values_mut() {
            cpus.sort_unstable();
        }
        for n in 0..numa_count {
            let cpus = numa_cpus.get(&n).cloned().unwrap_or_default();
            let base = format!("/sys/devices/system/node/node{n}");
            out.text(
                format!("{base}/cpumap"),
                format!("{}\n", mask(cpus.iter().copied(), total)),
            );
            out.text(format!("{base}/cpulist"), format!("{}\n", list(&cpus)));
            out.text(
                format!("{base}/meminfo"),
                format!("Node {n} MemTotal:       {kib_per_numa} kB\n"),
            );
            let row: Vec<String> = (0..numa_count)
                .map(|m| {
                    let d = if m == n {
                        10
                    } else if m / s.numa_per_socket == n / s.numa_per_socket {
                        12
                    } else {
                        20
                    };
                    d.to_string()
                })
                .collect();
            out.text(format!("{base}/distance"), format!("{}\n", row.join(" ")));
        }

        // PCI functions, depth first; accelerators collected in bus order per vendor.
        let mut placed = Placement {
            out: &mut out,
            total,
            numa_cpus,
            accelerators: Vec::new(),
        };
        for (root_bus, numa, tree) in &s.host_bridges {
            let mut next_bus = *root_bus;
            let sys = format!("/sys/devices/pci0000:{root_bus:02x}");
            placed.bus(&sys, *root_bus, &mut next_bus, *numa, tree);
        }
        let mut accelerators = std::mem::take(&mut placed.accelerators);
        accelerators.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));

        let mut nvidia_minor = 0u32;
        let mut ascend_minor = 0u32;
        let mut drm_minor = 0u32;
        let mut nvml = NvmlReport {
            driver_version: Some("550.90.07".into()),
            // The CUDA version driver 550.90.07 supports: 12.4.
            cuda_driver_version: Some(12_040),
            gpus: Vec::new(),
        };
        for Placed {
            bus_id,
            kind,
            sysfs,
        } in &accelerators
        {
            match kind {
                FnKind::NvidiaGpu(model) => {
                    let minor = nvidia_minor;
                    nvidia_minor += 1;
                    let uuid = format!(
                        "GPU-{:08x}-0000-4000-8000-{:012x}",
                        fxhash(self.name),
                        minor
                    );
                    out.text(
                        format!("/proc/driver/nvidia/gpus/{bus_id}/information"),
                        format!("Model: \t\t {model}\nIRQ:   \t\t {}\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus_id}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n", 100 + minor),
                    );
                    out.text(format!("/dev/nvidia{minor}"), "");
                    if let Some(lanes) = s.nvml_switch_lanes {
                        nvml.gpus.push(NvmlGpu {
                            pci_bus_id: format!("0000{}", bus_id.to_ascii_uppercase()),
                            index: minor,
                            uuid,
                            name: (*model).into(),
                            serial: Some(format!(
                                "{:013}",
                                1_650_000_000_000u64 + u64::from(minor)
                            )),
                            minor: Some(minor),
                            nvlinks: (0..lanes)
                                .map(|l| NvlinkLane {
                                    remote_pci_bus_id: format!(
                                        "00000000:{:02X}:00.0",
                                        0xd2 + l % 4
                                    ),
                                    remote: RemoteKind::Switch,
                                })
                                .collect(),
                            fabric: None,
                            // What NVML reports for an H100 80GB HBM3: 81559 MiB.
                            memory_bytes: Some(81_559 << 20),
                            // Hopper; H100 SXM supports MIG.
                            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
                            mig_capable: Some(true),
                            mig: Vec::new(),
                        });
                    }
                }
                FnKind::Ascend => {
                    out.text(format!("/dev/davinci{ascend_minor}"), "");
                    ascend_minor += 1;
                }
                FnKind::Drm => {
                    let card = drm_minor;
                    drm_minor += 1;
                    out.text(
                        format!("{sysfs}/drm/card{card}/dev"),
                        format!("226:{card}\n"),
                    );
                    out.text(
                        format!("{sysfs}/drm/renderD{}/dev", 128 + card),
                        format!("226:{}\n", 128 + card),
                    );
                    out.text(format!("/dev/dri/card{card}"), "");
                    out.text(format!("/dev/dri/renderD{}", 128 + card), "");
                }
                FnKind::Plain => {}
            }
        }
        if !nvml.gpus.is_empty() {
            let json = serde_json::to_string_pretty(&nvml).map_err(io::Error::other)?;
            out.text(RECORDED_NVML_FILE, json);
        }
        if let Some(spec) = s.dcmi.filter(|_| ascend_minor > 0) {
            out.text(DCMI_STANDIN_FILE, dcmi_answers(ascend_minor, spec));
        }
        if let Some(overrides) = s.overrides {
            let ids: Vec<String> = accelerators.iter().map(|a| a.bus_id.clone()).collect();
            out.text(OVERRIDE_FILE, overrides(&ids));
        }
        for dev in s.extra_dev {
            out.text(*dev, "");
        }

        for (path, content) in &out.files {
            let full = dir.join(path.trim_start_matches('/'));
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(full, content)?;
        }
        for (link, target) in &out.links {
            let full = dir.join(link.trim_start_matches('/'));
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(target, full)?;
        }
        Ok(())
    }
}

struct Placement<'a> {
    out: &'a mut Files,
    total: u32,
    numa_cpus: BTreeMap<u32, Vec<u32>>,
    accelerators: Vec<Placed>,
}

/// An accelerator placed in the tree.
struct Placed {
    bus_id: String,
    kind: FnKind,
    /// Its directory under `/sys/devices`.
    sysfs: String,
}

impl Placement<'_> {
    /// Places `children` on bus `bus` under sysfs directory `dir`; `next_bus` is the last bus
    /// number used so far, so a bridge's subordinate bus is `next_bus` after its subtree.
    fn bus(&mut self, dir: &str, bus: u8, next_bus: &mut u8, numa: u32, children: &[Pci]) {
        for (slot, child) in children.iter().enumerate() {
            let bdf = format!("0000:{bus:02x}:{slot:02x}.0");
            let path = format!("{dir}/{bdf}");
            let (vendor, device, class) = match child {
                Pci::Bridge(v, d, _) => (*v, *d, 0x060400),
                Pci::Function(func) => (func.vendor, func.device, func.class),
            };
            let mut config = vec![0u8; 256];
            config[0..2].copy_from_slice(&vendor.to_le_bytes());
            config[2..4].copy_from_slice(&device.to_le_bytes());
            config[0x09..0x0c].copy_from_slice(&class.to_le_bytes()[0..3]);
            if let Pci::Bridge(_, _, below) = child {
                *next_bus = next_bus.saturating_add(1);
                let secondary = *next_bus;
                self.bus(&path, secondary, next_bus, numa, below);
                config[0x0e] = 1;
                config[0x18] = bus;
                config[0x19] = secondary;
                config[0x1a] = *next_bus;
            }
            let cpus = self.numa_cpus.get(&numa).cloned().unwrap_or_default();
            self.out
                .text(format!("{path}/vendor"), format!("0x{vendor:04x}\n"));
            self.out
                .text(format!("{path}/device"), format!("0x{device:04x}\n"));
            self.out
                .text(format!("{path}/class"), format!("0x{class:06x}\n"));
            self.out.files.insert(format!("{path}/config"), config);
            self.out
                .text(format!("{path}/numa_node"), format!("{numa}\n"));
            self.out.text(
                format!("{path}/local_cpus"),
                format!("{}\n", mask(cpus.iter().copied(), self.total)),
            );
            self.out.text(
                format!("{path}/local_cpulist"),
                format!("{}\n", list(&cpus)),
            );
            let rel = path.trim_start_matches("/sys/devices/");
            self.out.links.push((
                format!("/sys/bus/pci/devices/{bdf}"),
                format!("../../../devices/{rel}"),
            ));
            if let Pci::Function(func) = child
                && !matches!(func.kind, FnKind::Plain)
            {
                self.accelerators.push(Placed {
                    bus_id: bdf,
                    kind: func.kind,
                    sysfs: path.clone(),
                });
            }
        }
    }
}

/// A small stable hash for fixture uuids.
fn fxhash(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_materializes() {
        for name in NAMES {
            let fixture = get(name).unwrap();
            let dir = tempfile::tempdir().unwrap();
            fixture.materialize(dir.path()).unwrap();
            assert!(
                dir.path()
                    .join("sys/devices/system/cpu/cpu0/topology/core_id")
                    .is_file(),
                "{name}"
            );
        }
        assert!(get("no-such-node").is_none());
    }

    #[test]
    fn masks_use_kernel_word_order() {
        assert_eq!(mask([0, 1, 33], 64), "00000002,00000003");
        assert_eq!(mask([], 8), "00000000");
    }
}
