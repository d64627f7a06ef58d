//! The NVML source: NVIDIA device health from the driver's management library, loaded at run
//! time through `nvml-wrapper` like discovery's, on one thread of its own.
//!
//! Start at [`NvmlSession`]: it owns the library for the agent's whole life. Discovery asks it
//! first ([`NvmlSession`] is an [`NvmlProbe`]: the thread loads the library and reads the
//! uuids and NVLink lanes, and discovery waits for that at most the init timeout); then
//! [`NvmlSession::start_health`] hands the thread the discovered devices and it watches them:
//! - **events**: `nvmlEventSetWait` for critical XIDs ([`xid`] decides which mark the device)
//!   and double-bit ECC errors, registered per GPU;
//! - **a periodic check** of what events cannot tell: retired pages pending, row remapping
//!   pending or failed (`nvmlDeviceGetRemappedRows`), each NVLink lane's state
//!   (`nvmlDeviceGetNvLinkState`, [`lanes`]), and whether the GPU answers at all
//!   (`NVML_ERROR_GPU_IS_LOST`: fell off the bus).
//!
//! Faults and their end follow [`crate::device_health::recovery`]. A call that fails, answers
//! garbage or is missing from an old library is logged once and leaves that part of the last
//! good state in force; a call that hangs freezes the thread and is reported by the
//! [`watchdog`](crate::device_health::watchdog), never blocking anyone else.

pub mod lanes;
pub mod xid;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use fumarole_topology::{Fault, FaultKind, NodeHealth};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError as E;

use crate::device_health::recovery::{Check, Recovery};
use crate::device_health::watchdog::CallWatch;
use crate::device_health::{LogOnce, SourceHandle};
use crate::discover::nvml::{
    NVLINK_MAX_LANES, NvmlError, NvmlProbe, NvmlReport, normalize_bus_id, open_library,
    read_report, remote_kind,
};
use lanes::{GpuLanes, LaneState};
use xid::XidClass;

/// What the health thread needs once discovery is done.
pub struct HealthSetup {
    /// The node's NVIDIA devices: (PCI bus id, device id).
    pub devices: Vec<(String, String)>,
    /// XIDs that do not mark a device ([`xid::ignored_set`]).
    pub ignored_xids: BTreeSet<u64>,
    /// How long a device stays out after its last critical event ([`Recovery`]).
    pub quiet: Duration,
    /// How often the periodic check runs.
    pub poll: Duration,
    pub source: SourceHandle,
    /// Where each GPU's last XID goes.
    pub last_xids: xid::LastXids,
}

enum Phase {
    NotStarted,
    Starting,
    Answered(Option<NvmlReport>),
    GaveUp,
}

struct Inner {
    lib_path: Option<PathBuf>,
    init_timeout: Duration,
    phase: Mutex<Phase>,
    answered: Condvar,
    setup: Mutex<Option<mpsc::Sender<HealthSetup>>>,
    calls: Arc<CallWatch>,
}

/// The NVML library for the agent's life: discovery's answers and the health thread.
#[derive(Clone)]
pub struct NvmlSession {
    inner: Arc<Inner>,
}

impl NvmlSession {
    /// A session on the library at `lib_path` (default: `libnvidia-ml.so.1` from the loader's
    /// path). Nothing is loaded until discovery asks.
    pub fn new(lib_path: Option<PathBuf>, init_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                lib_path,
                init_timeout,
                phase: Mutex::new(Phase::NotStarted),
                answered: Condvar::new(),
                setup: Mutex::new(None),
                calls: Arc::new(CallWatch::default()),
            }),
        }
    }

    /// What the health thread is calling now (for [`crate::device_health::watchdog::spawn`]).
    pub fn calls(&self) -> Arc<CallWatch> {
        self.inner.calls.clone()
    }

    /// Starts watching the devices of `setup`. Does nothing when discovery never asked for
    /// NVML (a node without NVIDIA devices) or the library is not there.
    pub fn start_health(&self, setup: HealthSetup) {
        let sender = self
            .inner
            .setup
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match sender {
            Some(tx) => {
                if tx.send(setup).is_err() {
                    tracing::debug!("NVML thread gone: no NVML health");
                }
            }
            None => tracing::debug!("NVML not in use: no NVML health"),
        }
    }

    fn start_thread(&self) {
        let (tx, rx) = mpsc::channel();
        *self
            .inner
            .setup
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(tx);
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("fumarole-nvml".into())
            .spawn(move || run(inner, rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the NVML thread: no NVML");
            self.inner.answer(None);
        }
    }
}

impl Inner {
    fn answer(&self, report: Option<NvmlReport>) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::Starting | Phase::NotStarted) {
            *phase = Phase::Answered(report);
        }
        self.answered.notify_all();
    }
}

impl NvmlProbe for NvmlSession {
    /// The first answer the library gave, for the agent's whole life (device ids must not
    /// change under the kubelet); `None` when the library is absent or did not answer within
    /// the init timeout.
    fn probe(&self) -> Result<Option<NvmlReport>, NvmlError> {
        let mut phase = self
            .inner
            .phase
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::NotStarted) {
            *phase = Phase::Starting;
            drop(phase);
            self.start_thread();
            phase = self
                .inner
                .phase
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
        }
        let (mut phase, _) = self
            .inner
            .answered
            .wait_timeout_while(phase, self.inner.init_timeout, |p| {
                matches!(p, Phase::Starting)
            })
            .unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::Starting) {
            tracing::warn!(timeout = ?self.inner.init_timeout, "NVML did not answer in time: NVIDIA devices are discovered without it");
            *phase = Phase::GaveUp;
        }
        Ok(match &*phase {
            Phase::Answered(r) => r.clone(),
            _ => None,
        })
    }
}

/// The thread: load, answer discovery, wait for the setup, watch.
fn run(inner: Arc<Inner>, setups: mpsc::Receiver<HealthSetup>) {
    let opened = {
        let _call = inner.calls.enter("nvmlInit_v2");
        open_library(inner.lib_path.as_deref())
    };
    let nvml = match opened {
        Ok(Some(nvml)) => nvml,
        Ok(None) => {
            inner.answer(None);
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "NVML failed to initialise: no NVML answers or health");
            inner.answer(None);
            return;
        }
    };
    let report = {
        let _call = inner.calls.enter("discovery");
        read_report(&nvml)
    };
    match report {
        Ok(r) => inner.answer(Some(r)),
        Err(e) => {
            tracing::warn!(error = %e, "NVML failed answering discovery: NVIDIA links come from the PCI tree only");
            inner.answer(None);
        }
    }
    let Ok(setup) = setups.recv() else {
        return;
    };
    Monitor::new(&nvml, setup, inner.calls.clone()).run();
}

/// What the periodic check last read of one GPU (each part kept until read again).
#[derive(Default)]
struct LastRead {
    retired_pending: Option<bool>,
    remap: Option<(bool, bool)>,
}

struct Gpu<'n> {
    id: String,
    device: nvml_wrapper::Device<'n>,
    lanes: GpuLanes,
    last: LastRead,
}

struct Monitor<'n> {
    nvml: &'n Nvml,
    gpus: Vec<Gpu<'n>>,
    events: Option<nvml_wrapper::EventSet<'n>>,
    ignored: BTreeSet<u64>,
    last_xids: xid::LastXids,
    poll: Duration,
    recovery: Recovery,
    source: SourceHandle,
    calls: Arc<CallWatch>,
    logs: LogOnce,
}

/// The event types watched: critical XIDs and double-bit ECC errors.
fn wanted_events() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR
}

impl<'n> Monitor<'n> {
    fn new(nvml: &'n Nvml, setup: HealthSetup, calls: Arc<CallWatch>) -> Self {
        let mut m = Monitor {
            nvml,
            gpus: Vec::new(),
            events: None,
            ignored: setup.ignored_xids,
            last_xids: setup.last_xids,
            poll: setup.poll,
            recovery: Recovery::new(setup.quiet),
            source: setup.source,
            calls,
            logs: LogOnce::default(),
        };
        m.find_gpus(&setup.devices);
        m.register_events();
        if m.events.is_some() {
            m.last_xids.watching();
        }
        tracing::info!(gpus = m.gpus.len(), events = m.events.is_some(), poll = ?m.poll, "NVML health watching");
        m
    }

    /// Matches the discovered devices with NVML's by PCI bus id and learns their lanes.
    fn find_gpus(&mut self, devices: &[(String, String)]) {
        let wanted: BTreeMap<String, &str> = devices
            .iter()
            .map(|(bus, id)| (normalize_bus_id(bus), id.as_str()))
            .collect();
        let count = {
            let _call = self.calls.enter("nvmlDeviceGetCount_v2");
            self.nvml.device_count()
        };
        let count = match count {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "NVML cannot count GPUs: no NVML health");
                return;
            }
        };
        let mut found = BTreeSet::new();
        for index in 0..count.min(64) {
            let _call = self.calls.enter("nvmlDeviceGetHandleByIndex_v2");
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let Ok(pci) = device.pci_info() else {
                continue;
            };
            let bus = normalize_bus_id(&pci.bus_id);
            let Some(id) = wanted.get(&bus) else {
                continue;
            };
            drop(_call);
            let lanes = self.learn_lanes(&device, id, &bus);
            found.insert(bus.clone());
            self.gpus.push(Gpu {
                id: (*id).to_string(),
                device,
                lanes,
                last: LastRead::default(),
            });
        }
        for (bus, id) in &wanted {
            if !found.contains(bus) {
                tracing::warn!(device = %id, bus, "NVML does not know this GPU: its health comes from device nodes only");
            }
        }
    }

    /// The lanes NVML reports for `device` (enabled or disabled) and their far ends.
    fn learn_lanes(&self, device: &nvml_wrapper::Device<'n>, id: &str, bus: &str) -> GpuLanes {
        let _call = self.calls.enter("nvmlDeviceGetNvLinkState");
        let mut lanes = Vec::new();
        for lane in 0..NVLINK_MAX_LANES {
            let link = device.link_wrapper_for(lane);
            let Ok(up) = link.is_active() else {
                continue;
            };
            let remote_bus = link.remote_pci_info().ok().map(|p| p.bus_id);
            lanes.push(LaneState {
                lane,
                remote_bus,
                remote: remote_kind(self.nvml, device, lane),
                up,
            });
        }
        GpuLanes {
            id: id.to_string(),
            bus_id: bus.to_string(),
            lanes,
        }
    }

    /// One event set with every GPU's XID and ECC events.
    fn register_events(&mut self) {
        let set = {
            let _call = self.calls.enter("nvmlEventSetCreate");
            self.nvml.create_event_set()
        };
        let set = match set {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "NVML event set unavailable: faults are found by the periodic check only");
                return;
            }
        };
        let Ok(register) = self.nvml.lib().nvmlDeviceRegisterEvents.as_ref() else {
            tracing::warn!(
                "NVML lacks nvmlDeviceRegisterEvents: faults are found by the periodic check only"
            );
            return;
        };
        let mut any = false;
        for g in &self.gpus {
            let _call = self.calls.enter("nvmlDeviceRegisterEvents");
            let supported = g
                .device
                .supported_event_types()
                .unwrap_or_else(|_| wanted_events());
            let types = supported & wanted_events();
            if types.is_empty() {
                tracing::info!(device = %g.id, "GPU supports neither XID nor ECC events: periodic check only");
                continue;
            }
            // Called directly: nvml-wrapper's `register_events` frees the whole set when one
            // GPU refuses, which would lose the GPUs registered before it.
            // SAFETY: the device handle and the event set both belong to this live `nvml`,
            // and the function pointer was resolved from the loaded library.
            let ret = unsafe { register(g.device.handle(), types.bits(), set.handle()) };
            if ret == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS {
                any = true;
            } else {
                tracing::warn!(device = %g.id, error = %E::from(ret), "GPU refused event registration: periodic check only");
            }
        }
        if any {
            self.events = Some(set);
        }
    }

    fn run(mut self) {
        let mut next_check = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next_check {
                self.check_all(now);
                self.publish();
                next_check = now + self.poll;
            }
            let wait = next_check.saturating_duration_since(Instant::now());
            match self.wait_event(wait) {
                Woke::Event => self.publish(),
                Woke::Timeout => {}
                Woke::GpuLost => {
                    // Which GPU: the check will say (at most every 200 ms while one is lost).
                    std::thread::sleep(wait.min(Duration::from_millis(200)));
                    next_check = Instant::now();
                }
            }
        }
    }

    /// Waits up to `wait` for one event and records it.
    fn wait_event(&mut self, wait: Duration) -> Woke {
        let Some(set) = &self.events else {
            std::thread::sleep(wait);
            return Woke::Timeout;
        };
        let ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX).max(1);
        let got = {
            let _call = self.calls.enter("nvmlEventSetWait_v2");
            set.wait(ms)
        };
        match got {
            Ok(event) => {
                self.logs.cleared("nvmlEventSetWait_v2");
                // SAFETY: the handle is only compared, never dereferenced here.
                let handle = unsafe { event.device.handle() };
                let data = match event.event_data {
                    Some(XidError::Value(v)) => Some(v),
                    Some(XidError::Unknown) => Some(xid::UNKNOWN_XID),
                    None => None,
                };
                self.record_event(handle, event.event_type, data);
                Woke::Event
            }
            Err(E::Timeout) => Woke::Timeout,
            Err(E::GpuLost) => Woke::GpuLost,
            Err(e) => {
                if self.logs.first("nvmlEventSetWait_v2") {
                    tracing::warn!(error = %e, "NVML event wait failed: faults are found by the periodic check until it works again");
                }
                // Never spin on a library that fails at once.
                std::thread::sleep(wait.min(Duration::from_millis(200)));
                Woke::Timeout
            }
        }
    }

    fn record_event(
        &mut self,
        handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
        types: EventTypes,
        data: Option<u64>,
    ) {
        let now = Instant::now();
        let ids = self.ids_of(handle);
        let mut faults = Vec::new();
        if types.contains(EventTypes::CRITICAL_XID_ERROR) {
            let xid = data.unwrap_or(xid::UNKNOWN_XID);
            for id in &ids {
                self.last_xids.record(id, xid);
            }
            match xid::classify(xid, &self.ignored) {
                XidClass::Ignored => {
                    tracing::info!(xid, "XID is the application's fault: device stays in use");
                }
                XidClass::Critical(text) => faults.push(Fault::new(FaultKind::Xid, text)),
            }
        }
        if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            faults.push(Fault::new(
                FaultKind::Ecc,
                "uncorrectable (double-bit) ECC error",
            ));
        }
        if faults.is_empty() {
            return;
        }
        for id in ids {
            for f in &faults {
                self.recovery.event(&id, f.clone(), now);
            }
        }
    }

    /// The ids of the GPUs an event names by `handle`; every GPU when it names none we know
    /// (NVIDIA's plugin does the same: an event naming no known GPU marks them all).
    fn ids_of(&self, handle: nvml_wrapper_sys::bindings::nvmlDevice_t) -> Vec<String> {
        // SAFETY (for `handle()`): handles are only compared.
        let target: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| unsafe { g.device.handle() } == handle)
            .map(|g| g.id.clone())
            .collect();
        if !target.is_empty() {
            return target;
        }
        tracing::warn!("NVML event names no known GPU: it counts for every GPU");
        self.gpus.iter().map(|g| g.id.clone()).collect()
    }

    /// The periodic check of every GPU.
    fn check_all(&mut self, now: Instant) {
        for i in 0..self.gpus.len() {
            let check = self.check_one(i);
            let id = self.gpus[i].id.clone();
            self.recovery.check(&id, check, now);
        }
    }

    /// Reads one GPU; each part that cannot be read keeps its last value.
    fn check_one(&mut self, i: usize) -> Check {
        let calls = self.calls.clone();
        let mut answered = false;
        let mut lost = false;
        let id = self.gpus[i].id.clone();

        let pending = {
            let _call = calls.enter("nvmlDeviceGetRetiredPagesPendingStatus");
            self.gpus[i].device.are_pages_pending_retired()
        };
        match self.read(&id, "nvmlDeviceGetRetiredPagesPendingStatus", pending) {
            Read::Value(v) => {
                answered = true;
                self.gpus[i].last.retired_pending = Some(v);
            }
            Read::Lost => lost = true,
            Read::NotThere => answered = true,
            Read::Failed => {}
        }

        let remap = {
            let _call = calls.enter("nvmlDeviceGetRemappedRows");
            remapped_rows(self.nvml, &self.gpus[i].device).map(|r| (r.pending, r.failed))
        };
        match self.read(&id, "nvmlDeviceGetRemappedRows", remap) {
            Read::Value(v) => {
                answered = true;
                self.gpus[i].last.remap = Some(v);
            }
            Read::Lost => lost = true,
            Read::NotThere => answered = true,
            Read::Failed => {}
        }

        for l in 0..self.gpus[i].lanes.lanes.len() {
            let lane = self.gpus[i].lanes.lanes[l].lane;
            let state = {
                let _call = calls.enter("nvmlDeviceGetNvLinkState");
                self.gpus[i].device.link_wrapper_for(lane).is_active()
            };
            match self.read(&id, "nvmlDeviceGetNvLinkState", state) {
                Read::Value(up) => {
                    answered = true;
                    self.gpus[i].lanes.lanes[l].up = up;
                }
                Read::Lost => lost = true,
                Read::NotThere | Read::Failed => {}
            }
        }

        if lost {
            return Check::Answered(vec![Fault::new(
                FaultKind::FellOffBus,
                "the GPU does not answer NVML (GPU is lost: fallen off the bus)",
            )]);
        }
        if !answered {
            return Check::Unknown;
        }
        let last = &self.gpus[i].last;
        let mut conditions = Vec::new();
        if last.retired_pending == Some(true) {
            conditions.push(Fault::new(
                FaultKind::Ecc,
                "retired pages pending: the GPU needs a reset",
            ));
        }
        match last.remap {
            Some((_, true)) => conditions.push(Fault::new(
                FaultKind::RowRemap,
                "row remapping failed: the GPU needs service",
            )),
            Some((true, false)) => conditions.push(Fault::new(
                FaultKind::RowRemap,
                "row remapping pending: the GPU needs a reset",
            )),
            _ => {}
        }
        Check::Answered(conditions)
    }

    /// Sorts out one answer: a value, "the GPU is lost", "this library or GPU has no such
    /// call" (logged once), or a failure (logged once; the last value stays).
    fn read<T>(&mut self, id: &str, call: &str, result: Result<T, E>) -> Read<T> {
        let key = format!("{id} {call}");
        match result {
            Ok(v) => {
                if self.logs.cleared(&key) {
                    tracing::info!(device = %id, call, "NVML answers again");
                }
                Read::Value(v)
            }
            Err(E::GpuLost) => Read::Lost,
            Err(e @ (E::NotSupported | E::FailedToLoadSymbol(_) | E::FunctionNotFound)) => {
                if self.logs.first(&key) {
                    tracing::info!(device = %id, call, error = %e, "not available from this GPU or library version: not checked");
                }
                Read::NotThere
            }
            Err(e) => {
                if self.logs.first(&key) {
                    tracing::warn!(device = %id, call, error = %e, "NVML call failed: keeping the last state it gave");
                }
                Read::Failed
            }
        }
    }

    /// Reports the source's view: the recovery rule's faults plus the lanes'.
    fn publish(&mut self) {
        let now = Instant::now();
        let lanes: Vec<GpuLanes> = self.gpus.iter().map(|g| g.lanes.clone()).collect();
        let health = NodeHealth::merge([&self.recovery.health(now), &lanes::faults(&lanes)]);
        self.source.report(health);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Woke {
    Event,
    Timeout,
    GpuLost,
}

enum Read<T> {
    Value(T),
    Lost,
    NotThere,
    Failed,
}

/// What `nvmlDeviceGetRemappedRows` says of a GPU's memory rows.
pub(crate) struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// Remappings wait for the next GPU reset.
    pub pending: bool,
    /// A row could not be remapped.
    pub failed: bool,
}

/// `nvmlDeviceGetRemappedRows` (nvml-wrapper does not wrap it).
pub(crate) fn remapped_rows(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
) -> Result<RemappedRows, E> {
    use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;
    let get = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| E::FailedToLoadSymbol(e.to_string()))?;
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: live handle of this `nvml`; the four out-parameters are writable for the call.
    let ret = unsafe {
        get(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    };
    if ret != nvmlReturn_enum_NVML_SUCCESS {
        return Err(E::from(ret));
    }
    Ok(RemappedRows {
        correctable: corrected,
        uncorrectable: uncorrected,
        pending: pending != 0,
        failed: failure != 0,
    })
}
