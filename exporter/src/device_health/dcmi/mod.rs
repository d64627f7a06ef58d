//! The DCMI source: Ascend NPU health from Huawei's `libdcmi.so`, loaded at run time, polled
//! on one thread of its own.
//!
//! Start at [`start`]. The thread loads the library ([`ffi`]), initialises it, maps each chip
//! `(card, device)` to our device through its physical id (`/dev/davinciN`, the `N` in
//! `Ascend910-N`), then every poll interval reads per chip the health value and error codes,
//! and the RoCE network health, and reports what they mean ([`answers`]). DCMI faults hold
//! exactly as long as the library reports them: a chip is given back on the first poll that
//! finds it healthy again. A missing library is one log line and no DCMI health (device nodes
//! still count); a library without a call we need, a call that fails or an answer out of range
//! is one log line and the last good state of that part; a call that hangs freezes only this
//! thread (the [`watchdog`](crate::device_health::watchdog) says so).
//!
//! The same thread asks the chips once for their super-pod info (Atlas A3, see [`ffi`]) and
//! hands the answer to whoever publishes the node ([`ServerAnswers::super_pod`]); a library
//! without the call, or chips that say it is not supported, give no hardware super-pod.
//! Before that it asks them for their chip info (`dcmi_get_device_chip_info`: chip name, AI
//! cores) and hands the first usable answer on ([`ServerAnswers::chip`]), for the `servertype` and
//! `node.kubernetes.io/npu.chip.name` labels; an older library without the call is one log line
//! and no such labels.

pub mod answers;
pub mod ffi;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fumarole_topology::{Fault, FaultKind, LinkFault, NodeHealth};

use tokio::sync::watch;

use crate::device_health::watchdog::CallWatch;
use crate::device_health::{LogOnce, SourceHandle};
use answers::{ChipInfo, SuperPod};
use ffi::{CallError, Dcmi};

/// What the DCMI thread watches.
pub struct DcmiSetup {
    /// The library: a path, or a name the loader searches for (`libdcmi.so`).
    pub library: PathBuf,
    /// The node's Ascend devices: (davinci index, device id).
    pub devices: Vec<(u32, String)>,
    /// Device pairs joined by HCCS (lowered when a chip reports an HCCS fault code).
    pub hccs_pairs: Vec<(String, String)>,
    /// Error codes that mean an HCCS link fault (`--hccs-fault-codes`).
    pub hccs_codes: BTreeSet<u32>,
    pub poll: Duration,
    pub source: SourceHandle,
    /// Where the answers about the server go.
    pub answers: ServerAnswers,
}

/// Where the DCMI source's answers about the server go, for whoever publishes the node.
#[derive(Default)]
pub struct ServerAnswers {
    /// The hardware's super-pod answer, once the chips have answered (`None`: no one wants
    /// it, the chips are not asked).
    pub super_pod: Option<watch::Sender<Option<SuperPod>>>,
    /// The chips' chip info, once one has answered usably (`None`: not asked). Sent before
    /// the super-pod answer, so a publisher waiting for that one has both.
    pub chip: Option<watch::Sender<Option<ChipInfo>>>,
}

/// One chip and what it last said (each part kept until read again).
struct Chip {
    card: i32,
    chip: i32,
    id: String,
    fault: Option<Fault>,
    network: Option<Fault>,
    hccs: Option<Fault>,
    network_supported: bool,
}

impl Chip {
    /// The chip at `l`, nothing said yet.
    fn at(l: Located) -> Chip {
        Chip {
            card: l.card,
            chip: l.chip,
            id: l.id,
            fault: None,
            network: None,
            hccs: None,
            network_supported: true,
        }
    }
}

/// Starts the DCMI thread; returns what it is calling, for the watchdog.
pub fn start(setup: DcmiSetup) -> Arc<CallWatch> {
    let calls = Arc::new(CallWatch::default());
    let thread_calls = calls.clone();
    let spawned = std::thread::Builder::new()
        .name("fumarole-dcmi".into())
        .spawn(move || run(setup, &thread_calls));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the DCMI thread: no DCMI health");
    }
    calls
}

fn run(setup: DcmiSetup, calls: &CallWatch) {
    let dcmi = {
        let _call = calls.enter("dlopen");
        Dcmi::open(&setup.library)
    };
    let dcmi = match dcmi {
        Ok(d) => d,
        Err(e @ ffi::DcmiError::Load { .. }) => {
            tracing::info!(error = %e, "DCMI library not found: Ascend health from device nodes only");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "DCMI library unusable: Ascend health from device nodes only");
            return;
        }
    };
    for call in dcmi.missing_optional() {
        tracing::info!(
            call,
            "this DCMI library lacks the call: that check is skipped"
        );
    }
    let init = {
        let _call = calls.enter("dcmi_init");
        dcmi.init()
    };
    if let Err(e) = init {
        tracing::warn!(error = %e, "DCMI failed to initialise: Ascend health from device nodes only");
        return;
    }
    let located = {
        let _call = calls.enter("enumerate");
        locate(&dcmi, &setup.devices)
    };
    let mut chips: Vec<Chip> = located.into_iter().map(Chip::at).collect();
    tracing::info!(chips = chips.len(), poll = ?setup.poll, "DCMI health watching");
    let mut logs = LogOnce::default();
    let mut super_pod_asked = setup.answers.super_pod.is_none();
    let mut chip_asked = setup.answers.chip.is_none();
    loop {
        if !chip_asked {
            let _call = calls.enter("dcmi_get_device_chip_info");
            chip_asked = ask_chip_info(&dcmi, &chips, setup.answers.chip.as_ref(), &mut logs);
        }
        if !super_pod_asked {
            let _call = calls.enter("dcmi_get_device_info");
            super_pod_asked =
                ask_super_pod(&dcmi, &chips, setup.answers.super_pod.as_ref(), &mut logs);
        }
        for c in &mut chips {
            poll_chip(&dcmi, c, &setup.hccs_codes, calls, &mut logs);
        }
        setup.source.report(view(&chips, &setup.hccs_pairs));
        std::thread::sleep(setup.poll);
    }
}

/// A chip of the node: where DCMI finds it, and which of our devices it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub card: i32,
    pub chip: i32,
    /// Its physical id (the `N` of `/dev/davinciN`).
    pub phy: u32,
    /// Our device id (`Ascend910-N`).
    pub id: String,
}

/// Every chip of every card that is one of `devices` (davinci index, device id); what cannot
/// be listed or matched is logged and left out.
pub fn locate(dcmi: &Dcmi, devices: &[(u32, String)]) -> Vec<Located> {
    let by_index: BTreeMap<u32, &str> = devices.iter().map(|(i, id)| (*i, id.as_str())).collect();
    let cards = match dcmi.cards() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "DCMI cannot list cards: no chip found");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for card in cards {
        let n = match dcmi.chips_in_card(card) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(card, error = %e, "DCMI cannot count the card's chips: skipped");
                continue;
            }
        };
        for chip in 0..n {
            let phy = dcmi
                .logic_id(card, chip)
                .and_then(|logic| dcmi.phy_id(logic));
            let phy = match phy {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(card, chip, error = %e, "DCMI cannot identify the chip: skipped");
                    continue;
                }
            };
            match by_index.get(&phy) {
                Some(id) => out.push(Located {
                    card,
                    chip,
                    phy,
                    id: (*id).to_string(),
                }),
                None => {
                    tracing::warn!(
                        card,
                        chip,
                        phy,
                        "DCMI chip matches no discovered NPU: skipped"
                    )
                }
            }
        }
    }
    out
}

/// Asks every chip for its super-pod info and sends what they agree on. Returns whether the
/// question is settled (answered, not supported, or no such call); a failed call or chips that
/// disagree are logged once and asked again on the next poll.
fn ask_super_pod(
    dcmi: &Dcmi,
    chips: &[Chip],
    to: Option<&watch::Sender<Option<SuperPod>>>,
    logs: &mut LogOnce,
) -> bool {
    // No chip to ask (none matched, or the cards could not be listed: logged already).
    let Some(to) = to.filter(|_| !chips.is_empty()) else {
        return true;
    };
    let mut answers = Vec::new();
    for c in chips {
        match dcmi.spod_info(c.card, c.chip) {
            None => return true,
            Some(Err(CallError { code, .. })) if code == i64::from(ffi::NOT_SUPPORTED) => {}
            Some(Err(e)) => return failed::<()>(logs, &c.id, &e, "dcmi_get_device_info").is_some(),
            Some(Ok(info)) => answers.push((info.super_pod_id, info.server_index)),
        }
    }
    match answers::super_pod(&answers) {
        Ok(found) => {
            match found.and_then(|p| p.member) {
                Some((id, index)) => {
                    tracing::info!(
                        super_pod = id,
                        server_index = index,
                        "DCMI: this server is in a super-pod"
                    )
                }
                None if found.is_some() => {
                    tracing::info!("DCMI: super-pod capable chips, in no super-pod")
                }
                None => tracing::info!("DCMI: the chips have no super-pod info (not an A3 server)"),
            }
            to.send_replace(found);
            true
        }
        Err(g) => {
            if logs.first("super-pod") {
                tracing::warn!(error = %g, "DCMI super-pod answer unusable: asking again");
            }
            false
        }
    }
}

/// Asks the chips, in order, for their chip info and sends the first usable answer (as
/// Huawei's device plugin takes the first valid chip's). Returns whether the question is
/// settled (answered, or no such call); when no chip answers usably, that is logged once and
/// they are asked again on the next poll.
fn ask_chip_info(
    dcmi: &Dcmi,
    chips: &[Chip],
    to: Option<&watch::Sender<Option<ChipInfo>>>,
    logs: &mut LogOnce,
) -> bool {
    let Some(to) = to.filter(|_| !chips.is_empty()) else {
        return true;
    };
    for c in chips {
        match dcmi.chip_info(c.card, c.chip) {
            None => {
                tracing::info!(
                    "this DCMI library lacks dcmi_get_device_chip_info: no servertype or npu.chip.name labels"
                );
                return true;
            }
            Some(Err(e)) => {
                failed::<()>(logs, &c.id, &e, "dcmi_get_device_chip_info");
            }
            Some(Ok(raw)) => {
                match answers::chip_info(
                    &raw.chip_type,
                    &raw.chip_name,
                    &raw.chip_ver,
                    raw.aicore_cnt,
                ) {
                    Ok(info) => {
                        tracing::info!(device = %c.id, chip_type = %info.chip_type, chip_name = %info.name, ai_cores = info.ai_cores, "DCMI chip info");
                        to.send_replace(Some(info));
                        return true;
                    }
                    Err(bad) => {
                        failed::<()>(logs, &c.id, &bad, "dcmi_get_device_chip_info");
                    }
                }
            }
        }
    }
    if logs.first("chip-info") {
        tracing::warn!(
            "no chip gave usable chip info: no servertype or npu.chip.name labels for now; asking again"
        );
    }
    false
}

/// Logs a failed or garbage answer once per chip and call; returns `None` (keep the last).
fn failed<T>(logs: &mut LogOnce, id: &str, e: &dyn std::fmt::Display, call: &str) -> Option<T> {
    if logs.first(&format!("{id} {call}")) {
        tracing::warn!(device = %id, call, error = %e, "DCMI answer unusable: keeping the last state it gave");
    }
    None
}

fn answered(logs: &mut LogOnce, id: &str, call: &str) {
    if logs.cleared(&format!("{id} {call}")) {
        tracing::info!(device = %id, call, "DCMI answers again");
    }
}

fn poll_chip(
    dcmi: &Dcmi,
    c: &mut Chip,
    hccs_codes: &BTreeSet<u32>,
    calls: &CallWatch,
    logs: &mut LogOnce,
) {
    let codes = {
        let _call = calls.enter("dcmi_get_device_errorcode_v2");
        dcmi.error_codes(c.card, c.chip)
    };
    let codes: Option<Vec<u32>> = match codes {
        None => Some(Vec::new()),
        Some(Ok(codes)) => {
            answered(logs, &c.id, "dcmi_get_device_errorcode_v2");
            Some(codes)
        }
        Some(Err(e)) => failed(logs, &c.id, &e, "dcmi_get_device_errorcode_v2"),
    };
    let health = {
        let _call = calls.enter("dcmi_get_device_health");
        dcmi.health(c.card, c.chip)
    };
    match health {
        Ok(h) => match answers::chip(h, codes.as_deref().unwrap_or_default()) {
            Ok(fault) => {
                answered(logs, &c.id, "dcmi_get_device_health");
                c.fault = fault;
            }
            Err(g) => {
                failed::<()>(logs, &c.id, &g, "dcmi_get_device_health");
            }
        },
        Err(e) => {
            failed::<()>(logs, &c.id, &e, "dcmi_get_device_health");
        }
    }
    if let Some(codes) = &codes {
        c.hccs = answers::hccs(codes, hccs_codes);
    }
    if c.network_supported {
        let net = {
            let _call = calls.enter("dcmi_get_device_network_health");
            dcmi.network_health(c.card, c.chip)
        };
        match net {
            None => c.network_supported = false,
            Some(Err(CallError { code, .. })) if code == i64::from(ffi::NOT_SUPPORTED) => {
                tracing::info!(device = %c.id, "DCMI: network health not supported on this chip: not checked");
                c.network_supported = false;
            }
            Some(Err(e)) => {
                failed::<()>(logs, &c.id, &e, "dcmi_get_device_network_health");
            }
            Some(Ok(r)) => match answers::network(r) {
                Ok(fault) => {
                    answered(logs, &c.id, "dcmi_get_device_network_health");
                    c.network = fault;
                }
                Err(g) => {
                    failed::<()>(logs, &c.id, &g, "dcmi_get_device_network_health");
                }
            },
        }
    }
}

/// The source's view: each chip's faults, and the HCCS pairs of chips with an HCCS fault.
fn view(chips: &[Chip], hccs_pairs: &[(String, String)]) -> NodeHealth {
    let mut h = NodeHealth::default();
    for c in chips {
        for f in [&c.fault, &c.network, &c.hccs].into_iter().flatten() {
            h.add(&c.id, f.clone());
        }
        if c.hccs.is_some() {
            for (a, b) in hccs_pairs.iter().filter(|(a, b)| *a == c.id || *b == c.id) {
                h.add_link(
                    a,
                    b,
                    LinkFault {
                        kind: FaultKind::HccsDown,
                        lanes_up: None,
                    },
                );
            }
        }
    }
    h
}
